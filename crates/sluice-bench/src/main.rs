//! `sluice-bench`: every comparison of DESIGN.md's "Benchmarks that count" that this
//! machine supports, in one command, with plots.
//!
//! ```text
//! cargo run --release -p sluice-bench -- [--quick] [--out docs]
//! ```
//!
//! Writes `<out>/benchmarks-generated.md` and PNG plots under `<out>/img/`. Every figure
//! is a ratio against a baseline measured in the same run, reported as the median and
//! the range (min–max) over several repetitions, with the machine, the command, the date
//! and the commit. See `docs/benchmarks.md` for what each comparison measures.
//!
//! `main.rs` holds the command line and runs the comparisons in order; each comparison's
//! module measures it and renders its section of the report (`report.rs`).

mod batches;
mod data;
mod fanout;
mod flight;
mod gpu;
mod latency;
mod plot;
mod python;
mod report;
mod resume;
mod rounds;
mod s3;
mod stats;
mod transport;

use std::path::{Path, PathBuf};
use std::sync::Arc;
use std::time::Instant;

use anyhow::{Context, Result};
use arrow::record_batch::RecordBatch;
use clap::Parser;
use sluice::prelude::*;

use crate::report::Report;

/// Runs Sluice's benchmarks against their baselines and writes a report with plots.
#[derive(Debug, Parser)]
#[command(name = "sluice-bench", version)]
struct Args {
    /// A short run (under 2 minutes on 2 cores): less data, fewer samples.
    #[arg(long)]
    quick: bool,
    /// Where the report (benchmarks-generated.md) and the plots (img/) go.
    #[arg(long, default_value = "docs")]
    out: PathBuf,
    /// Repetitions of every measurement (default: 3 with --quick, 5 without).
    #[arg(long)]
    reps: Option<usize>,
    /// Rows of the dataset (default: 100 000 with --quick, 400 000 without). A machine
    /// with many cores runs the default in tenths of a second per run: give it more.
    #[arg(long)]
    rows: Option<usize>,
    /// `sluice.window` of the topics of comparisons 1 to 3: 'auto' (the default, as for
    /// any topic) or batches a subscriber may have queued; a burst wakes subscribers
    /// after half of it.
    #[arg(long, default_value = "auto", value_parser = parse_window)]
    window: WindowArg,
    /// `sluice.message_batches` of the topics of comparisons 1 to 3: 'auto' (the default,
    /// as for any topic) or the most consecutive batches one message carries (1: every
    /// batch alone, as before 2026-11-27's "Several batches per message").
    #[arg(long, default_value = "auto", value_parser = parse_window)]
    message_batches: WindowArg,
    /// `datafusion.execution.batch_size` of the plans of comparisons 1, 2 and 2b, Sluice's
    /// and the independent pipelines' alike (default: DataFusion's, 8 192 rows). Messages
    /// are cut from one DataFusion batch at a time, so this bounds the batches one message
    /// carries (with `--message-batches` above 'auto''s) and those a burst publishes at
    /// once (docs/history/benchmarks-2026-11.md, "Fan-out on 2 cores in a longer run, and DataFusion's batch
    /// size").
    #[arg(long, value_name = "ROWS")]
    datafusion_batch_size: Option<std::num::NonZeroUsize>,
    /// Rows per Parquet row group of the benchmark's dataset (default 10 000). DataFusion
    /// reads a row group in batches of 8 192 rows and a shorter last one, and each of its
    /// batches is at least one wake-up of the subscribers: a multiple of 8 192 leaves no
    /// short batches (docs/history/benchmarks-2026-11.md, "Wake-ups per DataFusion batch").
    #[arg(long, value_name = "ROWS")]
    row_group_rows: Option<std::num::NonZeroUsize>,
    /// Worker threads of comparison 3b's `sluice-flight` server (default: the server's
    /// own, one per core), to compare a server's thread counts on one machine.
    #[arg(long, value_name = "N")]
    flight_threads: Option<std::num::NonZeroUsize>,
    /// Comparisons to leave out, by name (the report says which were skipped).
    #[arg(long, value_enum, value_delimiter = ',')]
    skip: Vec<Part>,
    /// The repository's checkout: where `benches/`, `pipelines/` and `.venv/` are (default:
    /// the checkout this binary was built from, else the working directory; set it where
    /// the binary was copied to another machine).
    #[arg(long)]
    repo: Option<PathBuf>,
    /// The commit the binary was built from, for the report, where the checkout's own git
    /// history does not tell (a copy on another machine; scripts/bench-bundle.sh passes it).
    #[arg(long)]
    commit: Option<String>,
}

/// The comparisons `--skip` can leave out.
#[derive(Debug, Clone, Copy, PartialEq, Eq, clap::ValueEnum)]
enum Part {
    /// 1, 2 and 2b: fan-out and total CPU against independent pipelines.
    Fanout,
    /// 3 and 3b: Arrow Flight.
    Flight,
    /// 4: small-batch latency.
    Latency,
    /// 5 and 5b: batch sizes and N against memcpy.
    Batches,
    /// 6, 6b and 6c: S3.
    S3,
    /// 7: GPU.
    Gpu,
    /// 8: Python trainers.
    Python,
    /// 9: a trainer restarting from its cursor.
    Resume,
    /// 10: rounds, selection over data and feedback.
    Rounds,
}

impl Part {
    fn title(self) -> &'static str {
        match self {
            Part::Fanout => "1-2. Fan-out and total CPU",
            Part::Flight => "3. Sluice against Arrow Flight over loopback",
            Part::Latency => "4. Transport floor: small-batch latency",
            Part::Batches => "5. Transport floor: batch sizes against memcpy",
            Part::S3 => "6. S3 against local files",
            Part::Gpu => "7. GPU",
            Part::Python => "8. Python trainers against Python loaders",
            Part::Resume => "9. A trainer restarting from its cursor",
            Part::Rounds => "10. Rounds: a selection over the data and the trainers' feedback",
        }
    }
}

/// Sizes of one run.
struct Scale {
    rows: usize,
    epochs: u64,
    reps: usize,
    latency_warmup: usize,
    latency_samples: usize,
    /// Batch sizes of comparison 5, in KiB: the curve from 1 KiB to 16 MiB (64 MiB in a
    /// full run); the memcpy target applies from `LARGE_KIB` up.
    batch_kib: Vec<usize>,
    /// Bytes each batch-size measurement moves (at least 8 and at most `MAX_MESSAGES`
    /// batches).
    large_bytes: usize,
}

impl Scale {
    /// The sizes of a run with `--quick` or without, and the options that change them.
    fn new(args: &Args) -> Self {
        if args.quick {
            Scale {
                rows: args.rows.unwrap_or(100_000),
                epochs: 2,
                reps: args.reps.unwrap_or(3),
                latency_warmup: 20,
                latency_samples: 200,
                batch_kib: vec![1, 16, 256, 4 << 10, 16 << 10],
                large_bytes: 256 << 20,
            }
        } else {
            Scale {
                rows: args.rows.unwrap_or(400_000),
                epochs: 3,
                reps: args.reps.unwrap_or(5),
                latency_warmup: 50,
                latency_samples: 1000,
                batch_kib: vec![1, 16, 256, 1 << 10, 4 << 10, 16 << 10, 64 << 10],
                large_bytes: 1 << 30,
            }
        }
    }
}

const BATCH_ROWS: usize = 1024;
const NS: [usize; 5] = [1, 2, 4, 8, 16];
/// Index in `NS` of N = 4 and N = 8, where issue 18's goals are set.
const N4: usize = 2;
const N8: usize = 3;

/// Removes the benchmark's shared memory however it ends.
struct NamespaceGuard(Namespace);

impl Drop for NamespaceGuard {
    fn drop(&mut self) {
        self.0.purge();
    }
}

/// `--window`: 'auto' (`None`) or a number of batches.
#[derive(Debug, Clone, Copy)]
struct WindowArg(Option<usize>);

/// Parses `--window`: 'auto' or 1 to 1024 batches.
fn parse_window(text: &str) -> std::result::Result<WindowArg, String> {
    if text.eq_ignore_ascii_case("auto") {
        return Ok(WindowArg(None));
    }
    match text.parse::<usize>() {
        Ok(n @ 1..=1024) => Ok(WindowArg(Some(n))),
        _ => Err(format!("'{text}': give 'auto' or 1 to 1024 batches")),
    }
}

/// What every comparison's step reads: the run's start and sizes, its shared memory, the
/// checkout, the dataset and its batches, and where the plots go.
struct Bench<'a> {
    start: Instant,
    /// `--quick`.
    quick: bool,
    scale: &'a Scale,
    ns: &'a Namespace,
    repo: &'a Path,
    data: &'a data::Dataset,
    /// The dataset's plan, run once and re-batched (`data::materialize`).
    batches: &'a Arc<Vec<RecordBatch>>,
    rows_per_epoch: u64,
    /// KiB per batch and bytes per row of `batches`, encoded as Arrow IPC.
    batch_kib: f64,
    bytes_per_row: f64,
    img: &'a Path,
    /// Whether plots are drawn (a font was found).
    plots: bool,
}

impl Bench<'_> {
    fn step(&self, what: &str) {
        step(self.start, what);
    }
}

fn main() {
    let args = Args::parse();
    // Sluice's own log (`SLUICE_LOG=info`: a round's start, split into its parts) on
    // stderr beside the steps; errors only by default.
    sluice::logging::log_to_stderr("error");
    if let Err(e) = run(&args) {
        eprintln!("error: {e:#}");
        std::process::exit(1);
    }
}

fn step(start: Instant, what: &str) {
    eprintln!("[{:6.1} s] {what}", start.elapsed().as_secs_f64());
}

fn run(args: &Args) -> Result<()> {
    let start = Instant::now();
    let scale = Scale::new(args);
    let repo = checkout(args)?;
    set_topic_options(args);
    let img = args.out.join("img");
    std::fs::create_dir_all(&img).with_context(|| format!("cannot create {}", img.display()))?;
    if cfg!(debug_assertions) {
        eprintln!("warning: this is a debug build; run with --release for figures worth reporting");
    }
    let font = plot::init_font();
    let tmp = tempfile::tempdir().context("cannot create a temporary directory")?;
    let ns = NamespaceGuard(Namespace::new(&format!("bench{}", std::process::id()))?);
    let ns = &ns.0;
    let mut report = Report::new(args, &scale, &repo)?;
    if let Err(why) = &font {
        report.notes.push(format!("Plots skipped: {why}."));
    }

    step(start, "writing the dataset");
    let data = data::write(
        &tmp.path().join("data"),
        scale.rows,
        args.row_group_rows
            .map_or(data::ROW_GROUP_ROWS, std::num::NonZeroUsize::get),
    )?;
    report.dataset = format!(
        "the demo dataset of `sluice demo` (id, label, a short string, 16 float32 features): {} rows in {} Parquet files ({:.1} MiB), `batch_rows = {BATCH_ROWS}`",
        data.rows,
        data.files.len(),
        data.bytes as f64 / (1 << 20) as f64
    );

    let batches = Arc::new(data::materialize(&data)?);
    let (bytes_per_epoch, rows_per_epoch) = data::epoch_size(&batches)?;
    let bench = Bench {
        start,
        quick: args.quick,
        scale: &scale,
        ns,
        repo: &repo,
        data: &data,
        batches: &batches,
        rows_per_epoch,
        batch_kib: bytes_per_epoch as f64 / batches.len() as f64 / 1024.0,
        bytes_per_row: bytes_per_epoch as f64 / rows_per_epoch as f64,
        img: &img,
        plots: font.is_ok(),
    };
    comparisons(args, &bench, &mut report)?;

    let left = ns.leftovers();
    if !left.is_empty() {
        report
            .notes
            .push(format!("Shared memory left behind (removed): {left:?}."));
    }
    let elapsed = start.elapsed().as_secs_f64();
    let path = args.out.join("benchmarks-generated.md");
    std::fs::write(&path, report.finish(elapsed))
        .with_context(|| format!("cannot write {}", path.display()))?;
    step(
        start,
        &format!("wrote {} and plots in {}", path.display(), img.display()),
    );
    Ok(())
}

/// The comparisons, in order: each measures and renders its section, unless `--skip`
/// leaves it out.
fn comparisons(args: &Args, bench: &Bench<'_>, report: &mut Report) -> Result<()> {
    let runs = |part: Part| !args.skip.contains(&part);
    let skip = |report: &mut Report, part: Part| {
        report.skipped(part.title(), "left out with --skip");
    };
    if runs(Part::Fanout) {
        fanout::compare(bench, report)?;
    } else {
        skip(report, Part::Fanout);
    }
    if runs(Part::Flight) {
        flight::compare(bench, report)?;
    } else {
        skip(report, Part::Flight);
    }
    if runs(Part::Latency) {
        latency::compare(bench, report)?;
    } else {
        skip(report, Part::Latency);
    }
    if runs(Part::Batches) {
        batches::compare(bench, report)?;
    } else {
        skip(report, Part::Batches);
    }
    if runs(Part::S3) {
        s3::compare(bench, report)?;
    } else {
        skip(report, Part::S3);
    }
    if runs(Part::Gpu) {
        gpu::compare(bench, report);
    } else {
        skip(report, Part::Gpu);
    }
    if runs(Part::Python) {
        python::compare(bench, report)?;
    } else {
        skip(report, Part::Python);
        report.goal(python::IMAGE_GOAL.into(), "skipped".into(), "≤ 0.35", None);
    }
    if runs(Part::Resume) {
        resume::compare(bench, report)?;
    } else {
        skip(report, Part::Resume);
    }
    if runs(Part::Rounds) {
        rounds::compare(bench, report)?;
    } else {
        skip(report, Part::Rounds);
    }
    Ok(())
}

/// The repository's checkout: `--repo`, else the one this binary was built from, else the
/// working directory.
fn checkout(args: &Args) -> Result<PathBuf> {
    let repo = match &args.repo {
        Some(dir) => dir.clone(),
        None => {
            let built = Path::new(env!("CARGO_MANIFEST_DIR")).join("../..");
            built
                .canonicalize()
                .or_else(|_| std::env::current_dir())
                .context("cannot find the repository: pass --repo")?
        }
    };
    if !repo.join("pipelines").is_dir() {
        anyhow::bail!(
            "{} is not a Sluice checkout (no pipelines/): pass --repo",
            repo.display()
        );
    }
    Ok(repo)
}

/// Hands the topics' options (`--window`, `--message-batches`, `--datafusion-batch-size`,
/// `--flight-threads`) to the comparisons' plans and servers.
fn set_topic_options(args: &Args) {
    data::WINDOW.store(
        args.window.0.unwrap_or(0),
        std::sync::atomic::Ordering::Relaxed,
    );
    data::MESSAGE_BATCHES.store(
        args.message_batches.0.unwrap_or(0),
        std::sync::atomic::Ordering::Relaxed,
    );
    data::DATAFUSION_BATCH_SIZE.store(
        args.datafusion_batch_size
            .map_or(0, std::num::NonZeroUsize::get),
        std::sync::atomic::Ordering::Relaxed,
    );
    data::FLIGHT_THREADS.store(
        args.flight_threads.map_or(0, std::num::NonZeroUsize::get),
        std::sync::atomic::Ordering::Relaxed,
    );
}
