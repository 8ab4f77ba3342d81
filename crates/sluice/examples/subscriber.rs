//! A trainer's side: subscribes to a topic and reads it epoch by epoch, in its own batch
//! size, until the end of the stream.
//!
//! ```sh
//! cargo run -p sluice-cli -- run pipelines/demo.sql --min-subscribers 1 &   # a producer
//! cargo run -p sluice --example subscriber -- demo 256
//! ```

use sluice::prelude::*;

fn main() -> sluice::Result<()> {
    let mut args = std::env::args().skip(1);
    let topic = args.next().unwrap_or_else(|| "demo".into());
    let batch_size = match args.next() {
        Some(n) => Some(n.parse().map_err(|_| {
            SluiceError::Config(format!(
                "the batch size must be a number of rows, not {n:?}"
            ))
        })?),
        None => None,
    };
    let mut sub = Subscriber::connect(
        &topic,
        SubscribeOptions {
            batch_size,
            ..SubscribeOptions::default()
        },
    )?;
    let mut rows = 0;
    loop {
        match sub.next_event()? {
            // Zero-copy views of shared memory: every buffer of `batch` lies in the
            // sample the producer wrote once for all subscribers.
            Event::Batch { batch, .. } => rows += batch.num_rows(),
            Event::DeviceBatch { batch, .. } => rows += batch.num_rows(),
            Event::EpochEnd(summary) => {
                println!(
                    "epoch {}: {rows} rows, complete: {}",
                    summary.epoch, summary.complete
                );
                rows = 0;
            }
            Event::End => return Ok(()),
        }
    }
}
