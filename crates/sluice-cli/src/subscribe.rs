//! `sluice subscribe`: receive a topic and report what arrived.

use std::io::Write;
use std::time::{Duration, Instant};

use sluice::{Checksum, Columns, Event, Join, OnLag, SubscribeOptions, Subscriber};

/// Arguments of `sluice subscribe`.
#[derive(Debug, clap::Args)]
pub(crate) struct SubscribeArgs {
    /// The topic (sluice.topic of the producer's plan), or flight://HOST:PORT/TOPIC for a
    /// topic served by `sluice serve --flight` on another machine (token: SLUICE_TOKEN;
    /// flight+tls://… for a TLS server, with its CA certificate in SLUICE_TLS_CA).
    topic: String,
    /// One JSON object per epoch (rows, batches, checksum) and one for the whole stream.
    #[arg(long)]
    json: bool,
    /// Give up after this many seconds without a message (or without a producer).
    #[arg(long)]
    timeout: Option<f64>,
    /// Rows per batch for this subscriber (default: the producer's batches).
    #[arg(long)]
    batch_size: Option<usize>,
    /// Where to start in a running stream: now, next_epoch, or replay (from the oldest
    /// message the producer still holds).
    #[arg(long, default_value = "now")]
    join: Join,
    /// After falling behind the producer's lag limit: error (detach), or skip and go on.
    #[arg(long, default_value = "error")]
    on_lag: OnLag,
    /// Sleep this many milliseconds after each batch (simulates a slow trainer).
    #[arg(long)]
    delay_ms: Option<u64>,
    /// Count rows only, without the checksum (for measuring the transport alone).
    #[arg(long)]
    no_checksum: bool,
    /// Receive only these columns, comma-separated, in this order (default: all). The
    /// others are neither decoded nor validated; the checksum covers the columns received.
    #[arg(long, value_delimiter = ',', num_args = 1)]
    columns: Option<Vec<String>>,
    /// When the producer is lost, wait this many seconds for a restarted one
    /// (`sluice run --resume`) and continue without duplicates or gaps.
    #[arg(long)]
    reconnect: Option<f64>,
}

/// What one epoch (or the whole stream) delivered.
#[derive(Default)]
struct Tally {
    rows: u64,
    batches: u64,
    checksum: Checksum,
}

impl Tally {
    fn checksum(&self, enabled: bool) -> serde_json::Value {
        if enabled {
            serde_json::Value::String(self.checksum.hex())
        } else {
            serde_json::Value::Null
        }
    }
}

pub(crate) fn run(args: SubscribeArgs) -> anyhow::Result<()> {
    // A local topic, or flight://HOST:PORT/TOPIC (the same contract, over Arrow Flight).
    let mut sub = Subscriber::connect(
        &args.topic,
        SubscribeOptions {
            timeout: args.timeout.map(Duration::from_secs_f64),
            namespace: None,
            batch_size: args.batch_size,
            join: args.join,
            on_lag: args.on_lag,
            reconnect: args.reconnect.map(Duration::from_secs_f64),
            columns: args.columns.as_ref().map_or(Columns::All, Columns::named),
            // The tool drops every batch once counted: it never holds `max_held`.
            on_max_held: Default::default(),
        },
    )?;
    let delay = args.delay_ms.map(Duration::from_millis);
    let checksums = !args.no_checksum;
    let stdout = std::io::stdout();
    let mut out = stdout.lock();
    let mut epoch = Tally::default();
    let mut total = Tally::default();
    let mut first_batch: Option<Instant> = None;
    let mut epoch_start: Option<Instant> = None;
    // The longest wait between two batches of an epoch: shows stalls (a crashed peer).
    let mut last_batch: Option<Instant> = None;
    let mut max_gap = Duration::ZERO;
    loop {
        let event = match sub.next_event()? {
            // The tool counts and checksums rows on the host: a GPU topic's batches are
            // copied back (trainers use them on the device, see docs/gpu.md).
            Event::DeviceBatch {
                epoch,
                index,
                batch,
            } => Event::Batch {
                epoch,
                index,
                batch: batch.to_host()?,
                shm_range: None,
            },
            event => event,
        };
        match event {
            Event::Batch { batch, .. } => {
                let now = Instant::now();
                first_batch.get_or_insert(now);
                epoch_start.get_or_insert(now);
                if let Some(last) = last_batch.replace(now) {
                    max_gap = max_gap.max(now - last);
                }
                if checksums {
                    epoch.checksum.update(&batch)?;
                }
                epoch.rows += batch.num_rows() as u64;
                epoch.batches += 1;
                if let Some(delay) = delay {
                    std::thread::sleep(delay);
                }
            }
            Event::EpochEnd(summary) => {
                let secs = epoch_start
                    .take()
                    .map_or(0.0, |s| s.elapsed().as_secs_f64());
                if args.json {
                    writeln!(
                        out,
                        "{}",
                        serde_json::json!({
                            "epoch": summary.epoch,
                            "rows": epoch.rows,
                            "batches": epoch.batches,
                            "checksum": epoch.checksum(checksums),
                            "complete": summary.complete,
                            "missed": summary.missed,
                            "producer_rows": summary.rows,
                            "producer_batches": summary.batches,
                            "seconds": secs,
                            "max_gap_ms": max_gap.as_secs_f64() * 1e3,
                        })
                    )?;
                } else {
                    let state = if summary.complete {
                        String::new()
                    } else if summary.missed > 0 {
                        format!(" (partial: missed {} batches)", summary.missed)
                    } else {
                        " (partial: joined late)".to_string()
                    };
                    writeln!(
                        out,
                        "epoch {}: {} rows in {} batches{state}{}  ({:.0} rows/s)",
                        summary.epoch,
                        epoch.rows,
                        epoch.batches,
                        if checksums {
                            format!("  checksum {}", epoch.checksum.hex())
                        } else {
                            String::new()
                        },
                        epoch.rows as f64 / secs.max(1e-9)
                    )?;
                }
                out.flush()?;
                total.rows += epoch.rows;
                total.batches += epoch.batches;
                total.checksum.merge(&epoch.checksum);
                epoch = Tally::default();
                max_gap = Duration::ZERO;
            }
            Event::DeviceBatch { .. } => anyhow::bail!("internal: a GPU batch was not copied back"),
            Event::End => break,
        }
    }
    let secs = first_batch.map_or(0.0, |s| s.elapsed().as_secs_f64());
    if args.json {
        writeln!(
            out,
            "{}",
            serde_json::json!({
                "end": true,
                "rows": total.rows,
                "batches": total.batches,
                "checksum": total.checksum(checksums),
                "seconds": secs,
            })
        )?;
    } else {
        writeln!(
            out,
            "end of stream: {} rows in {} batches in {:.2}s",
            total.rows, total.batches, secs
        )?;
    }
    Ok(())
}
