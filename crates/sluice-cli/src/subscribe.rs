//! `sluice subscribe`: receive a topic and report what arrived.

use std::io::Write;
use std::time::{Duration, Instant};

use sluice::{Checksum, Event, Join, SubscribeOptions, Subscriber};

pub(crate) fn run(
    topic: &str,
    json: bool,
    timeout: Option<Duration>,
    batch_size: Option<usize>,
    join: Join,
) -> anyhow::Result<()> {
    let mut sub = Subscriber::connect(
        topic,
        SubscribeOptions {
            timeout,
            namespace: None,
            batch_size,
            join,
        },
    )?;
    let stdout = std::io::stdout();
    let mut out = stdout.lock();
    let mut epoch_sum = Checksum::default();
    let mut total = Checksum::default();
    let (mut batches, mut total_batches) = (0u64, 0u64);
    let mut first_batch: Option<Instant> = None;
    let mut epoch_start: Option<Instant> = None;
    loop {
        match sub.next_event()? {
            Event::Batch { batch, .. } => {
                let now = Instant::now();
                first_batch.get_or_insert(now);
                epoch_start.get_or_insert(now);
                epoch_sum.update(&batch)?;
                batches += 1;
            }
            Event::EpochEnd(summary) => {
                let secs = epoch_start
                    .take()
                    .map_or(0.0, |s| s.elapsed().as_secs_f64());
                if json {
                    writeln!(
                        out,
                        "{}",
                        serde_json::json!({
                            "epoch": summary.epoch,
                            "rows": epoch_sum.rows(),
                            "batches": batches,
                            "checksum": epoch_sum.hex(),
                            "complete": summary.complete,
                            "producer_rows": summary.rows,
                            "producer_batches": summary.batches,
                            "seconds": secs,
                        })
                    )?;
                } else {
                    writeln!(
                        out,
                        "epoch {}: {} rows in {} batches{}  checksum {}  ({:.0} rows/s)",
                        summary.epoch,
                        epoch_sum.rows(),
                        batches,
                        if summary.complete {
                            ""
                        } else {
                            " (partial: joined late)"
                        },
                        epoch_sum.hex(),
                        epoch_sum.rows() as f64 / secs.max(1e-9)
                    )?;
                }
                out.flush()?;
                total.merge(&epoch_sum);
                total_batches += batches;
                epoch_sum = Checksum::default();
                batches = 0;
            }
            Event::End => break,
        }
    }
    let secs = first_batch.map_or(0.0, |s| s.elapsed().as_secs_f64());
    if json {
        writeln!(
            out,
            "{}",
            serde_json::json!({
                "end": true,
                "rows": total.rows(),
                "batches": total_batches,
                "checksum": total.hex(),
                "seconds": secs,
            })
        )?;
    } else {
        writeln!(
            out,
            "end of stream: {} rows in {} batches in {:.2}s",
            total.rows(),
            total_batches,
            secs
        )?;
    }
    Ok(())
}
