//! `sluice subscribe`: receive a topic and report what arrived.

use std::io::Write;
use std::time::{Duration, Instant};

use sluice::{Checksum, Event, Join, OnLag, SubscribeOptions, Subscriber};

pub(crate) fn run(
    topic: &str,
    json: bool,
    timeout: Option<Duration>,
    batch_size: Option<usize>,
    join: Join,
    on_lag: OnLag,
    delay: Option<Duration>,
) -> anyhow::Result<()> {
    let mut sub = Subscriber::connect(
        topic,
        SubscribeOptions {
            timeout,
            namespace: None,
            batch_size,
            join,
            on_lag,
        },
    )?;
    let stdout = std::io::stdout();
    let mut out = stdout.lock();
    let mut epoch_sum = Checksum::default();
    let mut total = Checksum::default();
    let (mut batches, mut total_batches) = (0u64, 0u64);
    let mut first_batch: Option<Instant> = None;
    let mut epoch_start: Option<Instant> = None;
    // The longest wait between two batches of an epoch: shows stalls (a crashed peer).
    let mut last_batch: Option<Instant> = None;
    let mut max_gap = Duration::ZERO;
    loop {
        match sub.next_event()? {
            Event::Batch { batch, .. } => {
                let now = Instant::now();
                first_batch.get_or_insert(now);
                epoch_start.get_or_insert(now);
                if let Some(last) = last_batch.replace(now) {
                    max_gap = max_gap.max(now - last);
                }
                epoch_sum.update(&batch)?;
                batches += 1;
                if let Some(delay) = delay {
                    std::thread::sleep(delay);
                }
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
                            "missed": summary.missed,
                            "producer_rows": summary.rows,
                            "producer_batches": summary.batches,
                            "seconds": secs,
                            "max_gap_ms": max_gap.as_secs_f64() * 1e3,
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
                max_gap = Duration::ZERO;
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
