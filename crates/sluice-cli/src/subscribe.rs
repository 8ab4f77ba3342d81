//! `sluice subscribe`: receive a topic and report what arrived.

use std::io::Write;
use std::time::{Duration, Instant};

use arrow::record_batch::RecordBatch;
use sluice::{Checksum, Columns, EpochSummary, Event, Join, OnLag, SubscribeOptions, Subscriber};

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
    /// Start exactly after the rows of the cursor saved in this file (`--save-cursor`,
    /// or a Python subscriber's `state_dict()` as JSON).
    #[arg(long, value_name = "FILE")]
    cursor: Option<std::path::PathBuf>,
    /// After each batch, save this subscriber's cursor to this file (atomically).
    #[arg(long, value_name = "FILE")]
    save_cursor: Option<std::path::PathBuf>,
    /// Leave after this many batches (a trainer that stops; with `--save-cursor`, one
    /// started again with `--cursor` continues where it stopped).
    #[arg(long)]
    batches: Option<u64>,
    /// Receive only the rows this column of the topic selects: a boolean mask (where
    /// true; the column is dropped) or a per-trainer weight (where above zero).
    #[arg(long, value_name = "COLUMN")]
    mask: Option<String>,
}

/// The cursor saved in `path`.
fn load_cursor(path: &std::path::Path) -> anyhow::Result<sluice::Cursor> {
    let text = std::fs::read_to_string(path)
        .map_err(|e| anyhow::anyhow!("cannot read the cursor {}: {e}", path.display()))?;
    Ok(sluice::Cursor::from_json(&text)?)
}

/// Saves `sub`'s cursor to `path`: written beside it, then renamed over it.
fn save_cursor(sub: &Subscriber, path: &std::path::Path) -> anyhow::Result<()> {
    let Some(cursor) = sub.cursor() else {
        return Ok(());
    };
    // Owner-only, never through a link left at PATH.tmp (another user's, in a shared
    // directory), as a checkpoint is written.
    sluice::checkpoint::write_state(path, cursor.to_json().as_bytes()).map_err(|e| {
        let mut tmp = path.as_os_str().to_owned();
        tmp.push(".tmp");
        let _ = std::fs::remove_file(&tmp);
        anyhow::anyhow!("cannot save the cursor (--save-cursor): {e}")
    })
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
            timeout: args
                .timeout
                .map(|s| crate::seconds("--timeout", s))
                .transpose()?,
            namespace: None,
            batch_size: args.batch_size,
            join: args.join,
            on_lag: args.on_lag,
            reconnect: args
                .reconnect
                .map(|s| crate::seconds("--reconnect", s))
                .transpose()?,
            columns: args.columns.as_ref().map_or(Columns::All, Columns::named),
            // The tool drops every batch once counted: it never holds `max_held`.
            on_max_held: Default::default(),
            cursor: args.cursor.as_deref().map(load_cursor).transpose()?,
            mask: args.mask.clone(),
            // A loader's batches are made again by Python trainers only.
            loader_catch_up: None,
        },
    )?;
    let delay = args.delay_ms.map(Duration::from_millis);
    let stdout = std::io::stdout();
    let mut out = stdout.lock();
    let mut report = Report::new(args.json, !args.no_checksum);
    let mut taken = 0u64;
    let ended = loop {
        if args.batches.is_some_and(|n| taken >= n) {
            break false;
        }
        match sub.next_event()? {
            Event::Batch { batch, .. } => report.batch(&batch)?,
            // The tool counts and checksums rows on the host: a GPU topic's batches are
            // copied back (trainers use them on the device, see docs/gpu.md).
            Event::DeviceBatch { batch, .. } => report.batch(&batch.to_host()?)?,
            Event::EpochEnd(summary) => {
                report.epoch_end(&summary, &mut out)?;
                continue;
            }
            Event::End => break true,
        }
        taken += 1;
        if let Some(path) = &args.save_cursor {
            save_cursor(&sub, path)?;
        }
        if let Some(delay) = delay {
            std::thread::sleep(delay);
        }
    };
    report.end(&mut out, ended)
}

/// What `sluice subscribe` prints: a line (or JSON object) per epoch, one for the stream.
struct Report {
    json: bool,
    checksums: bool,
    epoch: Tally,
    total: Tally,
    first_batch: Option<Instant>,
    epoch_start: Option<Instant>,
    /// The longest wait between two batches of an epoch: shows stalls (a crashed peer).
    last_batch: Option<Instant>,
    max_gap: Duration,
}

impl Report {
    fn new(json: bool, checksums: bool) -> Self {
        Self {
            json,
            checksums,
            epoch: Tally::default(),
            total: Tally::default(),
            first_batch: None,
            epoch_start: None,
            last_batch: None,
            max_gap: Duration::ZERO,
        }
    }

    fn batch(&mut self, batch: &RecordBatch) -> anyhow::Result<()> {
        let now = Instant::now();
        self.first_batch.get_or_insert(now);
        self.epoch_start.get_or_insert(now);
        if let Some(last) = self.last_batch.replace(now) {
            self.max_gap = self.max_gap.max(now - last);
        }
        if self.checksums {
            self.epoch.checksum.update(batch)?;
        }
        self.epoch.rows += batch.num_rows() as u64;
        self.epoch.batches += 1;
        Ok(())
    }

    fn epoch_end(&mut self, summary: &EpochSummary, out: &mut impl Write) -> anyhow::Result<()> {
        let secs = self
            .epoch_start
            .take()
            .map_or(0.0, |s| s.elapsed().as_secs_f64());
        let epoch = std::mem::take(&mut self.epoch);
        if self.json {
            writeln!(
                out,
                "{}",
                serde_json::json!({
                    "epoch": summary.epoch,
                    "rows": epoch.rows,
                    "batches": epoch.batches,
                    "checksum": epoch.checksum(self.checksums),
                    "complete": summary.complete,
                    "missed": summary.missed,
                    "producer_rows": summary.rows,
                    "producer_batches": summary.batches,
                    "seconds": secs,
                    "max_gap_ms": self.max_gap.as_secs_f64() * 1e3,
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
            let checksum = match self.checksums {
                true => format!("  checksum {}", epoch.checksum.hex()),
                false => String::new(),
            };
            writeln!(
                out,
                "epoch {}: {} rows in {} batches{state}{checksum}  ({:.0} rows/s)",
                summary.epoch,
                epoch.rows,
                epoch.batches,
                epoch.rows as f64 / secs.max(1e-9)
            )?;
        }
        out.flush()?;
        self.total.rows += epoch.rows;
        self.total.batches += epoch.batches;
        self.total.checksum.merge(&epoch.checksum);
        self.max_gap = Duration::ZERO;
        Ok(())
    }

    /// The line for the whole stream, or for what was taken of it where `--batches` ended
    /// it first (`ended` false): the epoch under way counts too.
    fn end(&self, out: &mut impl Write, ended: bool) -> anyhow::Result<()> {
        let secs = self.first_batch.map_or(0.0, |s| s.elapsed().as_secs_f64());
        let mut checksum = Checksum::default();
        checksum.merge(&self.total.checksum);
        checksum.merge(&self.epoch.checksum);
        let total = Tally {
            rows: self.total.rows + self.epoch.rows,
            batches: self.total.batches + self.epoch.batches,
            checksum,
        };
        if self.json {
            writeln!(
                out,
                "{}",
                serde_json::json!({
                    "end": true,
                    "stopped": !ended,
                    "rows": total.rows,
                    "batches": total.batches,
                    "checksum": total.checksum(self.checksums),
                    "seconds": secs,
                })
            )?;
        } else {
            let what = match ended {
                true => "end of stream".to_string(),
                false => format!("stopped after {} batches", total.batches),
            };
            writeln!(
                out,
                "{what}: {} rows in {} batches in {:.2}s",
                total.rows, total.batches, secs
            )?;
        }
        Ok(())
    }
}
