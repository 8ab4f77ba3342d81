//! A producer started from code: runs a plan file on a thread of its own and reports its
//! progress until the run ends.
//!
//! ```sh
//! cargo run -p sluice --example producer -- pipelines/demo.sql
//! ```

use std::path::PathBuf;
use std::time::Duration;

use sluice::ProducerHandle;
use sluice::prelude::*;

fn main() -> sluice::Result<()> {
    let path: PathBuf = std::env::args()
        .nth(1)
        .unwrap_or_else(|| "pipelines/demo.sql".into())
        .into();
    let runtime = ProducerHandle::runtime("example")?;
    let plan = runtime.block_on(Plan::load(&path))?;
    println!(
        "publishing {} on topic '{}'",
        path.display(),
        plan.options().topic
    );
    let producer = Producer::new(plan, Namespace::from_env()?);
    let handle = ProducerHandle::spawn(producer, RunOptions::default(), runtime)?;
    while !handle.wait_finished(Duration::from_secs(1)) {
        let p = handle.progress();
        println!(
            "epoch {}: {} rows in {} batches, {} subscriber(s)",
            p.epoch, p.rows, p.batches, p.subscribers
        );
    }
    let stats = handle.join()?;
    println!(
        "published {} rows over {} epoch(s) in {:.2} s",
        stats.rows,
        stats.epochs,
        stats.elapsed.as_secs_f64()
    );
    Ok(())
}
