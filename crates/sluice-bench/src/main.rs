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

mod data;
mod fanout;
mod flight;
mod gpu;
mod plot;
mod python;
mod s3;
mod stats;
mod transport;

use std::fmt::Write as _;
use std::path::{Path, PathBuf};
use std::sync::Arc;
use std::time::Instant;

use anyhow::{Context, Result};
use arrow::record_batch::RecordBatch;
use clap::Parser;
use futures::StreamExt;
use sluice::core::Shaper;
use sluice::prelude::*;

use crate::plot::{Series, XAxis};
use crate::stats::{Machine, Summary, against, percentile};

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

const BATCH_ROWS: usize = 1024;
const NS: [usize; 5] = [1, 2, 4, 8, 16];
/// Index in `NS` of N = 4 and N = 8, where issue 18's goals are set.
const N4: usize = 2;
const N8: usize = 3;
const SMALL_ROWS: [usize; 3] = [1, 16, 64];
/// Subscribers alive during comparison 4's measurement of a reclaim (with their
/// producer, 20 nodes, all of this one process).
const RECLAIM_SUBSCRIBERS: usize = 19;
/// Batch sizes (rows of the dataset) of comparison 2b, total CPU at N = 8 against batch
/// size: about 13 KiB, 107 KiB and 860 KiB.
const CPU_BATCH_ROWS: [usize; 3] = [128, 1024, 8192];
/// The largest batch (KiB) comparison 5b sends to more than one subscriber.
const GRID_MAX_KIB: usize = 16 << 10;
/// Batches from this size (KiB) up are "large": the memcpy target applies to them.
const LARGE_KIB: usize = 4 << 10;
/// The most batches one batch-size measurement publishes (small batches would take
/// minutes at `large_bytes`).
const MAX_MESSAGES: usize = 20_000;

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

fn main() {
    let args = Args::parse();
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
    let scale = if args.quick {
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
    };
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
    let runs = |part: Part| !args.skip.contains(&part);
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

    let batches = Arc::new(materialize(&data)?);
    let bytes_per_epoch: usize = batches
        .iter()
        .map(|b| sluice::core::wire::encode(b).map(|e| e.len()))
        .sum::<sluice::Result<usize>>()?;
    let rows_per_epoch: u64 = batches.iter().map(|b| b.num_rows() as u64).sum();
    let batch_kib = bytes_per_epoch as f64 / batches.len() as f64 / 1024.0;
    let bytes_per_row = bytes_per_epoch as f64 / rows_per_epoch as f64;

    if runs(Part::Fanout) {
        step(
            start,
            "1-2. fan-out and CPU: Sluice against N independent pipelines",
        );
        let mut sl = vec![Vec::new(); NS.len()];
        let mut ind = vec![Vec::new(); NS.len()];
        for rep in 0..scale.reps {
            for (i, &n) in NS.iter().enumerate() {
                sl[i].push(fanout::sluice(
                    ns,
                    &data,
                    n,
                    scale.epochs,
                    BATCH_ROWS,
                    &format!("fan{n}r{rep}"),
                )?);
                ind[i].push(fanout::independent(&data, n, scale.epochs, BATCH_ROWS)?);
            }
        }
        report.fanout(&sl, &ind, scale.epochs, batch_kib, &img, font.is_ok())?;

        step(start, "2b. total CPU at N = 8 against batch size");
        let mut by_rows = Vec::new();
        for &rows in &CPU_BATCH_ROWS {
            let mut r = Vec::new();
            for rep in 0..scale.reps {
                let n = NS[N8];
                let s = fanout::sluice(
                    ns,
                    &data,
                    n,
                    scale.epochs,
                    rows,
                    &format!("cpu{rows}r{rep}"),
                )?;
                let d = fanout::independent(&data, n, scale.epochs, rows)?;
                r.push((s, d));
            }
            by_rows.push((rows, r));
        }
        report.cpu_by_batch(&by_rows, bytes_per_row, &img, font.is_ok())?;
    } else {
        report.skipped(Part::Fanout.title(), "left out with --skip");
    }

    if runs(Part::Flight) {
        flight_comparisons(
            ns,
            &mut report,
            &batches,
            &scale,
            rows_per_epoch,
            bytes_per_epoch,
            &img,
            font.is_ok(),
        )?;
    } else {
        report.skipped(Part::Flight.title(), "left out with --skip");
    }

    if runs(Part::Latency) {
        step(start, "4. small-batch latency");
        let mut lat = Vec::new();
        for &rows in &SMALL_ROWS {
            let batch = batches[0].slice(0, rows);
            let mut s = Vec::new();
            let mut h = Vec::new();
            for rep in 0..scale.reps {
                s.push(transport::sluice_latency(
                    ns,
                    &batch,
                    scale.latency_warmup,
                    scale.latency_samples,
                    &format!("lat{rows}r{rep}"),
                )?);
                h.push(transport::handoff_latency(
                    &batch,
                    scale.latency_warmup,
                    scale.latency_samples,
                )?);
            }
            lat.push((rows, s, h));
        }
        let mut wake = Vec::new();
        for rep in 0..scale.reps {
            wake.push(transport::event_latency(
                ns,
                scale.latency_warmup,
                scale.latency_samples,
                &format!("wake{rep}"),
            )?);
        }
        let mut encoding = Vec::new();
        for _ in 0..scale.reps {
            encoding.push(transport::encode_us(
                &batches[0].slice(0, SMALL_ROWS[SMALL_ROWS.len() - 1]),
                20_000,
            )?);
        }
        let mut decoding = Vec::new();
        for _ in 0..scale.reps {
            decoding.push(transport::decode_us(&batches[0], 20_000)?);
        }
        let mut reclaims = Vec::new();
        for _ in 0..scale.reps {
            reclaims.push(transport::reclaim_us(ns, RECLAIM_SUBSCRIBERS, 100)?);
        }
        report.latency(
            &lat,
            &wake,
            &Costs {
                encoding: &encoding,
                decoded_rows: batches[0].num_rows(),
                decoding: &decoding,
                reclaims: &reclaims,
            },
            &img,
            font.is_ok(),
        )?;
    } else {
        report.skipped(Part::Latency.title(), "left out with --skip");
    }

    if runs(Part::Batches) {
        step(start, "5. batch sizes and N against memcpy");
        let mut grid = Vec::new();
        for &kib in &scale.batch_kib {
            let batch = transport::large_batch(kib << 10)?;
            let messages = (scale.large_bytes / (kib << 10)).clamp(8, MAX_MESSAGES);
            let mut cells = Vec::new();
            for (i, &n) in NS.iter().enumerate() {
                // The largest batches go to one subscriber only: each subscriber of a
                // topic reserves chunks of the largest message (the curve to N stops at
                // 16 MiB, as issue 18 asks).
                if n > 1 && kib > GRID_MAX_KIB {
                    break;
                }
                let mut r = Vec::new();
                for rep in 0..scale.reps {
                    let s = transport::fanout_gbps(
                        ns,
                        &batch,
                        n,
                        8,
                        messages,
                        &format!("big{kib}kn{n}r{rep}"),
                    )?;
                    // memcpy is measured once per size and repetition, with N = 1.
                    let m = if i == 0 {
                        transport::memcpy_gbps(&batch, messages)?
                    } else {
                        f64::NAN
                    };
                    r.push((s, m));
                }
                cells.push((n, r));
            }
            grid.push((kib, cells));
        }
        report.large(&grid, &img, font.is_ok())?;
        report.grid(&grid, &img, font.is_ok())?;
    } else {
        report.skipped(Part::Batches.title(), "left out with --skip");
    }

    if runs(Part::S3) {
        s3_comparisons(&mut report, &repo, &data, &scale, &img, font.is_ok())?;
    } else {
        report.skipped(Part::S3.title(), "left out with --skip");
    }

    if runs(Part::Gpu) {
        step(start, "7. GPU");
        match gpu::run(&repo, args.quick) {
            gpu::Gpu::Skipped(why) => report.skipped("7. GPU", &why),
            gpu::Gpu::Ran { device, json } => report.gpu(&device, &json),
        }
    } else {
        report.skipped(Part::Gpu.title(), "left out with --skip");
    }

    if runs(Part::Python) {
        step(start, "8. Python trainers against Python loaders");
        let found = python::Python::find(&repo, "sluice, numpy, pyarrow, PIL").and_then(|py| {
            py.sluice_optimized()?;
            let sluice = python::sluice_binary()?;
            python::run(&repo, &py, &sluice, args.quick, scale.reps).map_err(|e| format!("{e:#}"))
        });
        match found {
            Ok(trainers) => report.python(&trainers)?,
            Err(why) => {
                report.skipped("8. Python trainers against Python loaders", &why);
                report.goal(IMAGE_GOAL.into(), "skipped".into(), "≤ 0.35", None);
            }
        }
    } else {
        report.skipped(Part::Python.title(), "left out with --skip");
        report.goal(IMAGE_GOAL.into(), "skipped".into(), "≤ 0.35", None);
    }

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

/// Comparisons 3 and 3b: the same batches through Sluice and through Arrow Flight.
#[allow(clippy::too_many_arguments)]
fn flight_comparisons(
    ns: &Namespace,
    report: &mut Report,
    batches: &Arc<Vec<RecordBatch>>,
    scale: &Scale,
    rows_per_epoch: u64,
    bytes_per_epoch: usize,
    img: &Path,
    plots: bool,
) -> Result<()> {
    eprintln!("3. Sluice against Arrow Flight over loopback");
    let server = flight::FlightServer::start(batches.clone(), scale.epochs)?;
    let mut fl = vec![Vec::new(); NS.len()];
    let mut remote = vec![Vec::new(); NS.len()];
    let mut floors = Vec::new();
    for rep in 0..scale.reps {
        floors.push(flight::copy_floor(batches, scale.epochs)?);
        for (i, &n) in NS.iter().enumerate() {
            let topic = format!("fl{n}r{rep}");
            let s = flight::sluice(ns, batches, n, scale.epochs, &topic, flight::Reach::Local)?;
            let f = server.fetch(n, rows_per_epoch * scale.epochs)?;
            let topic = format!("fr{n}r{rep}");
            let r = flight::sluice(ns, batches, n, scale.epochs, &topic, flight::Reach::Remote)?;
            fl[i].push((s, f));
            remote[i].push((r, f, s));
        }
    }
    drop(server);
    report.flight(
        &fl,
        &floors,
        bytes_per_epoch as f64 / rows_per_epoch as f64,
        img,
        plots,
    )?;
    report.remote(&remote)
}

/// Comparisons 6, 6b and 6c: S3 against local files and against pyarrow.
fn s3_comparisons(
    report: &mut Report,
    repo: &Path,
    data: &data::Dataset,
    scale: &Scale,
    img: &Path,
    plots: bool,
) -> Result<()> {
    eprintln!("6. S3 against local files");
    match s3::S3Server::find() {
        Ok(server) => {
            let (location, options) = server.upload(data, "data")?;
            let local = format!("{}/", data.dir.display());
            let mut python = python::Python::find(repo, "pyarrow.dataset, pyarrow.fs");
            let (runs, pyarrow, requests) = s3_passes(
                &server,
                (&location, &options),
                Some(&local),
                &mut python,
                repo,
                data,
                scale.reps,
            )?;
            report.s3(&server.description, &runs, img, plots)?;
            match &python {
                Ok(_) => report.s3_pyarrow(None, &pyarrow, &requests, data.files.len())?,
                Err(why) => {
                    report.skipped("6b. S3: Sluice against pyarrow", why);
                    report.goal(S3_GOAL.into(), "skipped".into(), "≥ 1.0", None);
                }
            }
        }
        Err(why) => {
            report.skipped("6. S3 against local files", &why);
            report.goal(S3_GOAL.into(), "skipped".into(), "≥ 1.0", None);
        }
    }
    // A real store answers in tens of milliseconds, not in the loopback server's fraction
    // of one: what read-ahead is for.
    match (
        s3::S3Server::started(S3_LATENCY_MS),
        python::Python::find(repo, "pyarrow.dataset, pyarrow.fs"),
    ) {
        (Ok(server), Ok(py)) => {
            let (location, options) = server.upload(data, "data")?;
            let mut python = Ok(py);
            let (_, pyarrow, requests) = s3_passes(
                &server,
                (&location, &options),
                None,
                &mut python,
                repo,
                data,
                scale.reps,
            )?;
            match python {
                Ok(_) => {
                    report.s3_pyarrow(Some(S3_LATENCY_MS), &pyarrow, &requests, data.files.len())?
                }
                Err(why) => report.skipped("6c. S3 with latency", &why),
            }
        }
        (Err(why), _) | (_, Err(why)) => report.skipped("6c. S3 with latency", &why),
    }

    Ok(())
}

/// The dataset's plan, run once and re-batched: the batches that the Flight and
/// transport comparisons serve.
fn materialize(data: &data::Dataset) -> Result<Vec<RecordBatch>> {
    let rt = tokio::runtime::Runtime::new()?;
    rt.block_on(async {
        let sql = data::plan_sql(
            "unused",
            &format!("{}/", data.dir.display()),
            "",
            BATCH_ROWS,
            1,
        );
        let plan = Plan::from_sql("bench.sql", &sql).await?;
        let mut shaper = Shaper::new(BATCH_ROWS, 0, None)?;
        let mut stream = plan.execute_epoch(0).await?;
        let mut out = Vec::new();
        while let Some(batch) = stream.next().await {
            out.extend(shaper.push(batch?)?);
        }
        out.extend(shaper.finish()?);
        Ok::<_, anyhow::Error>(out)
    })
}

/// One batch size's cells of comparison 5b: for each N, per repetition, every
/// subscriber's GB/s and (N = 1 only) memcpy's GB/s.
type GridCells = Vec<(usize, Vec<(Vec<f64>, f64)>)>;

/// Batches from this size (KiB) up carry the fan-out goal in comparison 5b.
const GRID_GOAL_KIB: usize = 64;

fn size_label(kib: usize) -> String {
    if kib >= 1024 {
        format!("{} MiB", kib >> 10)
    } else {
        format!("{kib} KiB")
    }
}

fn median(values: &[f64]) -> f64 {
    Summary::of(values).median
}

/// Comparison 4's measurements of single operations (see [`Report::latency`]).
#[derive(Clone, Copy)]
struct Costs<'a> {
    /// Encoding a small batch: (fresh stream, schema kept) µs, per repetition.
    encoding: &'a [(f64, f64)],
    /// Rows of the batch `decoding` decodes.
    decoded_rows: usize,
    decoding: &'a [transport::Decoding],
    /// (reclaim, iceoryx2's listing) µs, per repetition (`transport::reclaim_us`).
    reclaims: &'a [(f64, f64)],
}

fn ratio_summary(pairs: impl IntoIterator<Item = (f64, f64)>) -> Summary {
    Summary::of(&pairs.into_iter().map(|(a, b)| a / b).collect::<Vec<_>>())
}

fn verdict(ok: bool) -> &'static str {
    if ok { "met" } else { "**not met**" }
}

const IMAGE_GOAL: &str =
    "image pipeline, 4 Python trainers against 4 independent Python loaders, CPU-seconds";
const S3_GOAL: &str =
    "loopback S3 scan: Sluice against pyarrow's S3 dataset scan of the same files, same server";

/// Latencies in microseconds, one list per repetition.
type Repetitions = Vec<Vec<f64>>;

/// The Markdown report, built section by section.
struct Report {
    head: String,
    dataset: String,
    body: String,
    notes: Vec<String>,
    summary: Vec<String>,
    /// Issue 18's table: what, now, goal, met (`None`: not measured).
    goals: Vec<(String, String, &'static str, Option<bool>)>,
}

impl Report {
    fn new(args: &Args, scale: &Scale, repo: &Path) -> Result<Self> {
        let m = Machine::describe();
        let (commit, dirty) = match &args.commit {
            Some(commit) => (commit.clone(), false),
            None => {
                let commit = stats::command_output(
                    "git",
                    &[
                        "-C",
                        &repo.to_string_lossy(),
                        "rev-parse",
                        "--short",
                        "HEAD",
                    ],
                )
                .unwrap_or_else(|| "unknown".into());
                // The report and plots this command writes do not make the tree dirty.
                let out = args.out.to_string_lossy();
                let dirty = stats::command_output(
                    "git",
                    &[
                        "-C",
                        &repo.to_string_lossy(),
                        "status",
                        "--porcelain",
                        "--",
                        ".",
                        &format!(":(exclude){out}/benchmarks-generated.md"),
                        &format!(":(exclude){out}/img"),
                    ],
                )
                .is_some_and(|s| !s.is_empty());
                (commit, dirty)
            }
        };
        let mut command = String::from("cargo run --release -p sluice-bench --");
        for a in std::env::args().skip(1) {
            command.push(' ');
            command.push_str(&a);
        }
        let mut head = String::new();
        writeln!(head, "# Benchmark results (generated)\n")?;
        writeln!(
            head,
            "Written by `sluice-bench`; do not edit by hand: run the command again. What each \
             comparison measures and how to read it: [benchmarks.md](benchmarks.md).\n"
        )?;
        writeln!(
            head,
            "* Command: `{command}`{}",
            if args.quick {
                " (quick mode: less data, fewer samples)"
            } else {
                ""
            }
        )?;
        writeln!(head, "* Date: {}", stats::utc_now()?)?;
        writeln!(
            head,
            "* Commit: `{commit}`{}",
            if dirty {
                " (with uncommitted changes)"
            } else {
                ""
            }
        )?;
        writeln!(
            head,
            "* Machine: {}, {} logical CPUs, {} RAM, {}; /dev/shm {}",
            m.cpu, m.cores, m.memory, m.os, m.shm
        )?;
        writeln!(
            head,
            "* Build: {}; {} repetitions of every measurement, reported as median (min–max)",
            if cfg!(debug_assertions) {
                "**debug** (figures not representative)"
            } else {
                "release"
            },
            scale.reps
        )?;
        writeln!(
            head,
            "* Topics of comparisons 1 to 3: `sluice.window = {}`{}",
            data::window_option(),
            match args.window.0 {
                None => " (the default; comparisons 1 and 2b say what it came to)",
                Some(_) => " (`--window`; the default is 'auto')",
            }
        )?;
        writeln!(
            head,
            "* Messages of comparisons 1 to 3: `sluice.message_batches = {}`{}",
            data::message_batches_option(),
            match args.message_batches.0 {
                None =>
                    " (the default: consecutive batches ready at once go as one message of about 1 MiB)",
                Some(_) => " (`--message-batches`; the default is 'auto')",
            }
        )?;
        if let Some(rows) = args.datafusion_batch_size {
            writeln!(
                head,
                "* Plans of comparisons 1, 2 and 2b (Sluice's and the independent pipelines'): \
                 `datafusion.execution.batch_size = {rows}` (`--datafusion-batch-size`; the \
                 default is DataFusion's, 8 192 rows)"
            )?;
        }
        if let Some(rows) = args.row_group_rows {
            writeln!(
                head,
                "* The dataset's Parquet row groups: {rows} rows (`--row-group-rows`; the default \
                 is {})",
                data::ROW_GROUP_ROWS
            )?;
        }
        if let Some(threads) = args.flight_threads {
            writeln!(
                head,
                "* Comparison 3b's `sluice-flight` server: {threads} worker threads \
                 (`--flight-threads`; the default is one per core)"
            )?;
        }
        writeln!(
            head,
            "* Everything runs in one process: producers, servers and consumers are threads \
             (each independent pipeline and each Flight client with a tokio runtime of its own)."
        )?;
        Ok(Self {
            head,
            dataset: String::new(),
            body: String::new(),
            notes: Vec::new(),
            summary: Vec::new(),
            goals: Vec::new(),
        })
    }

    fn image(
        &mut self,
        ok: bool,
        img: &Path,
        name: &str,
        alt: &str,
        draw: impl FnOnce(&Path) -> Result<()>,
    ) -> Result<()> {
        if !ok {
            return Ok(());
        }
        draw(&img.join(name))?;
        writeln!(self.body, "\n![{alt}](img/{name})")?;
        Ok(())
    }

    fn goal(&mut self, what: String, now: String, goal: &'static str, met: Option<bool>) {
        self.goals.push((what, now, goal, met));
    }

    fn skipped(&mut self, section: &str, why: &str) {
        eprintln!("  skipped: {why}");
        let _ = writeln!(self.body, "\n## {section}\n\nSkipped: {why}.");
        self.summary.push(format!("{section}: skipped ({why})"));
    }

    fn fanout(
        &mut self,
        sl: &[Vec<fanout::Run>],
        ind: &[Vec<fanout::Run>],
        epochs: u64,
        batch_kib: f64,
        img: &Path,
        plots: bool,
    ) -> Result<()> {
        let b = &mut self.body;
        writeln!(b, "\n## 1. Fan-out: one producer, N subscribers\n")?;
        writeln!(
            b,
            "A producer runs the plan (`SELECT id, label, text, features FROM train`, {epochs} epochs) and \
             publishes every batch once; N subscribers (the `Subscriber` API) receive every batch and count \
             its rows. Baseline: the same run with N = 1. Per-subscriber rows/s is from each subscriber's \
             first batch to its end of stream (median over subscribers). Producer CPU is the process's CPU \
             minus the subscribers' threads. The publishing thread (the producer's loop: it takes each \
             batch from DataFusion's threads, encodes it, copies it into shared memory, delivers it to \
             every subscriber's queue and wakes them) is busy for the share of the run's wall time \
             given; where it is near 1, that one thread is what paces every subscriber. The next two \
             columns are shares of the same wall time: the thread waiting for the plan's next batch \
             (DataFusion decoding on its own threads: the pipeline paces the run) and asleep on a \
             subscriber's full queue (the slowest subscriber paces it). The last two are how many \
             batches one message carried, and one wake-up of the subscribers covered, on average (a \
             burst of messages ready at once, cut from one DataFusion batch, shares a wake-up).\n"
        )?;
        writeln!(
            b,
            "| N | per-subscriber rows/s | vs N=1 | aggregate rows/s | producer CPU-s / epoch | publishing thread busy | waits for the pipeline | waits for a full queue | batches per message | batches per wake-up |"
        )?;
        writeln!(b, "|---:|---:|---:|---:|---:|---:|---:|---:|---:|---:|")?;
        let mut per_sub = Vec::new();
        let mut ratio_at_8 = Summary::of(&[]);
        for (i, &n) in NS.iter().enumerate() {
            let rates = Summary::of(&sl[i].iter().map(|r| r.per_consumer).collect::<Vec<_>>());
            let ratio = ratio_summary(
                sl[i]
                    .iter()
                    .zip(&sl[0])
                    .map(|(r, base)| (r.per_consumer, base.per_consumer)),
            );
            let agg = Summary::of(
                &sl[i]
                    .iter()
                    .map(|r| r.per_consumer * n as f64)
                    .collect::<Vec<_>>(),
            );
            let prod = Summary::of(
                &sl[i]
                    .iter()
                    .map(|r| (r.cpu - r.consumer_cpu).max(0.0) / epochs as f64)
                    .collect::<Vec<_>>(),
            );
            let busy = Summary::of(
                &sl[i]
                    .iter()
                    .map(|r| r.publisher.0 / r.publisher.1)
                    .collect::<Vec<_>>(),
            );
            // Shares of the publishing thread's wall time.
            let share = |f: fn(&fanout::Run) -> f64| {
                Summary::of(
                    &sl[i]
                        .iter()
                        .map(|r| f(r) / r.publisher.1)
                        .collect::<Vec<_>>(),
                )
            };
            writeln!(
                b,
                "| {n} | {} | {} | {} | {} | {} | {} | {} | {} | {} |",
                rates.show_count(),
                ratio.show(2),
                agg.show_count(),
                prod.show(3),
                busy.show(2),
                share(|r| r.waits.0).show(2),
                share(|r| r.waits.1).show(2),
                Summary::of(&sl[i].iter().map(|r| r.batches_per.0).collect::<Vec<_>>()).show(1),
                Summary::of(&sl[i].iter().map(|r| r.batches_per.1).collect::<Vec<_>>()).show(1),
            )?;
            per_sub.push((
                n as f64,
                Summary::of(
                    &sl[i]
                        .iter()
                        .map(|r| r.per_consumer / 1e6)
                        .collect::<Vec<_>>(),
                ),
            ));
            if i == N8 {
                ratio_at_8 = ratio;
            }
        }
        let target = ratio_at_8.median >= 0.9;
        let shown = against(ratio_at_8.median, 0.9, 2);
        writeln!(
            b,
            "\nPer-subscriber rate at N = 8: **{shown}** of N = 1 (target ≥ 0.90: {}). \
             The topics' window: {} messages (`sluice.window = {}`).",
            verdict(target),
            sl[N8].first().map_or(0, |r| r.window),
            data::window_option(),
        )?;
        self.goals.push((
            format!("per-subscriber rate, N = 8 against N = 1 (receive and release, {batch_kib:.0} KiB batches)"),
            ratio_at_8.show_against(0.9, 2),
            "≥ 0.90",
            Some(target),
        ));

        writeln!(
            b,
            "\n## 2. Total CPU: Sluice against N independent pipelines\n"
        )?;
        writeln!(
            b,
            "The status quo: N trainers each run the same plan themselves (DataFusion in-process: plan, scan, \
             re-batch to {BATCH_ROWS} rows), counting rows. Sluice: one producer and N subscribers as above. \
             CPU-seconds are the whole process's user + system time over the run; the baseline is the N \
             independent pipelines of the same repetition. Target: Sluice ≤ 1/N of the baseline plus a \
             small overhead.\n"
        )?;
        writeln!(
            b,
            "| N | Sluice CPU-s | independent CPU-s | Sluice / independent | 1/N | Sluice wall s | independent wall s | per-trainer rows/s (independent) |"
        )?;
        writeln!(b, "|---:|---:|---:|---:|---:|---:|---:|---:|")?;
        let mut cpu_s = Vec::new();
        let mut cpu_i = Vec::new();
        let mut per_ind = Vec::new();
        let mut last = Summary::of(&[]);
        for (i, &n) in NS.iter().enumerate() {
            let s = Summary::of(&sl[i].iter().map(|r| r.cpu).collect::<Vec<_>>());
            let d = Summary::of(&ind[i].iter().map(|r| r.cpu).collect::<Vec<_>>());
            let ratio = ratio_summary(sl[i].iter().zip(&ind[i]).map(|(a, b)| (a.cpu, b.cpu)));
            let sw = Summary::of(&sl[i].iter().map(|r| r.wall).collect::<Vec<_>>());
            let dw = Summary::of(&ind[i].iter().map(|r| r.wall).collect::<Vec<_>>());
            let rate = Summary::of(&ind[i].iter().map(|r| r.per_consumer).collect::<Vec<_>>());
            writeln!(
                b,
                "| {n} | {} | {} | {} | {:.2} | {} | {} | {} |",
                s.show(2),
                d.show(2),
                ratio.show(2),
                1.0 / n as f64,
                sw.show(2),
                dw.show(2),
                rate.show_count()
            )?;
            cpu_s.push((n as f64, s));
            cpu_i.push((n as f64, d));
            per_ind.push((
                n as f64,
                Summary::of(
                    &ind[i]
                        .iter()
                        .map(|r| r.per_consumer / 1e6)
                        .collect::<Vec<_>>(),
                ),
            ));
            if i == N8 {
                last = ratio;
            }
        }
        let target = last.median <= 1.0 / 8.0 + 0.05;
        let shown = against(last.median, 1.0 / 8.0 + 0.05, 2);
        writeln!(
            b,
            "\nAt N = 8 Sluice uses **{shown}×** the CPU of 8 independent pipelines (target ≤ 1/8 + 0.05 = 0.175: {}).",
            verdict(target)
        )?;
        self.goals.push((
            "total CPU, N = 8 against 8 independent DataFusion pipelines".into(),
            last.show_against(1.0 / 8.0 + 0.05, 2),
            "≤ 1/8 + 0.05",
            Some(target),
        ));
        self.image(
            plots,
            img,
            "bench-fanout.png",
            "per-consumer rows/s against N",
            |p| {
                plot::lines(
                    p,
                    "Rows/s per consumer against N",
                    "N (consumers)",
                    "million rows/s per consumer",
                    XAxis::Log2,
                    &[
                        Series {
                            name: "Sluice subscriber (1 shared producer)".into(),
                            points: per_sub,
                        },
                        Series {
                            name: "independent pipeline (each runs the plan)".into(),
                            points: per_ind,
                        },
                    ],
                )
            },
        )?;
        self.image(
            plots,
            img,
            "bench-cpu.png",
            "total CPU-seconds against N",
            |p| {
                plot::lines(
                    p,
                    "Total CPU-seconds against N",
                    "N (consumers)",
                    "CPU-seconds (user + system)",
                    XAxis::Log2,
                    &[
                        Series {
                            name: "Sluice: 1 producer + N subscribers".into(),
                            points: cpu_s,
                        },
                        Series {
                            name: "N independent pipelines".into(),
                            points: cpu_i,
                        },
                    ],
                )
            },
        )?;
        Ok(())
    }

    fn flight(
        &mut self,
        runs: &[Vec<(f64, f64)>],
        floors: &[(f64, usize)],
        bytes_per_row: f64,
        img: &Path,
        plots: bool,
    ) -> Result<()> {
        let b = &mut self.body;
        writeln!(b, "\n## 3. Sluice against Arrow Flight over loopback\n")?;
        writeln!(
            b,
            "The same batches (the plan's output, computed once, {bytes_per_row:.0} bytes per row as Arrow IPC) \
             to N consumers. Sluice: a topic publisher groups consecutive batches into messages as `sluice run` \
             does (`sluice.message_batches = {}`), encodes each message and writes it once into shared memory \
             (an epoch's messages as one burst, as a producer publishes what it has ready: idle subscribers are \
             woken once per half window, not per message), N subscribers decode it in place and receive its \
             batches one by one. Flight: an arrow-flight 59 server (tonic, 127.0.0.1, HTTP/2 \
             windows of 8 MiB) answers each client's `do_get` with the batches; N `FlightClient`s decode them. \
             Baseline: Flight at the same N in the same repetition. Target: ≥ 10×.\n",
            data::message_batches_option(),
        )?;
        writeln!(
            b,
            "| N | Sluice rows/s per subscriber | Flight rows/s per client | Sluice / Flight | Sluice GB/s per subscriber | Flight GB/s per client |"
        )?;
        writeln!(b, "|---:|---:|---:|---:|---:|---:|")?;
        let mut ps = Vec::new();
        let mut pf = Vec::new();
        let mut worst = f64::INFINITY;
        let mut at4 = Summary::of(&[]);
        for (i, &n) in NS.iter().enumerate() {
            let s = Summary::of(&runs[i].iter().map(|r| r.0).collect::<Vec<_>>());
            let f = Summary::of(&runs[i].iter().map(|r| r.1).collect::<Vec<_>>());
            let ratio = ratio_summary(runs[i].iter().copied());
            writeln!(
                b,
                "| {n} | {} | {} | **{}** | {:.2} | {:.2} |",
                s.show_count(),
                f.show_count(),
                ratio.show(1),
                s.median * bytes_per_row / 1e9,
                f.median * bytes_per_row / 1e9
            )?;
            ps.push((
                n as f64,
                Summary::of(&runs[i].iter().map(|r| r.0 / 1e6).collect::<Vec<_>>()),
            ));
            pf.push((
                n as f64,
                Summary::of(&runs[i].iter().map(|r| r.1 / 1e6).collect::<Vec<_>>()),
            ));
            worst = worst.min(ratio.median);
            if i == N4 {
                at4 = ratio;
            }
        }
        let shown = against(at4.median, 10.0, 1);
        writeln!(
            b,
            "\nSluice / Flight is **{shown}×** at N = 4 and at least {worst:.1}× at every N (target ≥ 10× at N = 4: {}).",
            verdict(at4.median >= 10.0)
        )?;
        // The floor: one thread's copy of the same batches, per repetition; against it,
        // Sluice at N = 1 and what 10× Flight at N = 4 would take.
        let window = floors.first().map_or(0, |f| f.1);
        let floors: Vec<f64> = floors.iter().map(|f| f.0).collect();
        let floor = Summary::of(&floors);
        let at_floor = ratio_summary(runs[0].iter().map(|r| r.0).zip(floors.iter().copied()));
        let needed = ratio_summary(
            runs[N4]
                .iter()
                .map(|r| 10.0 * r.1)
                .zip(floors.iter().copied()),
        );
        writeln!(
            b,
            "\nThe publisher's floor, same repetitions: one thread copying the same encoded messages, \
             once each, into a ring as deep as the topic's window ({window} messages), what the publishing thread \
             does at the least for every batch. {} rows/s ({:.2} GB/s). Sluice at N = 1 receives \
             **{}** of it per subscriber; 10× Flight at N = 4 would take **{}** of it per subscriber, \
             which one publishing thread {}.",
            floor.show_count(),
            floor.median * bytes_per_row / 1e9,
            at_floor.show(2),
            needed.show(2),
            if needed.median > 1.0 {
                "cannot reach: each batch is copied once, by one thread"
            } else {
                "could reach"
            }
        )?;
        self.goals.push((
            "Sluice against Arrow Flight, per consumer at N = 4".into(),
            format!("{}×", at4.show_against(10.0, 1)),
            "≥ 10×",
            Some(at4.median >= 10.0),
        ));
        self.image(
            plots,
            img,
            "bench-flight.png",
            "Sluice against Arrow Flight",
            |p| {
                plot::lines(
                    p,
                    "Same batches to N consumers: Sluice against Arrow Flight",
                    "N (consumers)",
                    "million rows/s per consumer",
                    XAxis::Log2,
                    &[
                        Series {
                            name: "Sluice (shared memory)".into(),
                            points: ps,
                        },
                        Series {
                            name: "Arrow Flight (loopback gRPC)".into(),
                            points: pf,
                        },
                    ],
                )
            },
        )
    }

    /// Remote subscribers through `sluice serve --flight` against plain Arrow Flight (the
    /// same N, same repetition), and against local shared memory.
    fn remote(&mut self, runs: &[Vec<(f64, f64, f64)>]) -> Result<()> {
        let b = &mut self.body;
        writeln!(b, "\n### 3b. Remote Sluice subscribers over Arrow Flight\n")?;
        writeln!(
            b,
            "The same stream to N subscribers through `sluice-flight`'s server on 127.0.0.1 (the \
             producer's topic in shared memory, one shared-memory subscriber per remote client in \
             the server, the delivery protocol on the client), against the plain Flight server \
             of comparison 3 at the same N (what the protocol and the extra hop cost: goal ≈ 1×), \
             and local shared-memory subscribers of the same stream (what staying on the machine \
             saves).\n"
        )?;
        writeln!(
            b,
            "| N | remote Sluice rows/s per subscriber | remote / plain Flight | local / remote |"
        )?;
        writeln!(b, "|---:|---:|---:|---:|")?;
        let mut worst = f64::INFINITY;
        for (i, &n) in NS.iter().enumerate() {
            let r = Summary::of(&runs[i].iter().map(|x| x.0).collect::<Vec<_>>());
            let vs_flight = ratio_summary(runs[i].iter().map(|x| (x.0, x.1)));
            let local = ratio_summary(runs[i].iter().map(|x| (x.2, x.0)));
            writeln!(
                b,
                "| {n} | {} | **{}** | {} |",
                r.show_count(),
                vs_flight.show(2),
                local.show(1)
            )?;
            worst = worst.min(vs_flight.median);
        }
        self.summary.push(format!(
            "Remote Sluice subscribers over Arrow Flight: ≥ {worst:.2}× plain Arrow Flight per consumer at every N"
        ));
        Ok(())
    }

    fn latency(
        &mut self,
        lat: &[(usize, Vec<transport::Latency>, Repetitions)],
        wake: &[(Vec<f64>, f64)],
        costs: &Costs<'_>,
        img: &Path,
        plots: bool,
    ) -> Result<()> {
        let Costs {
            encoding,
            decoded_rows,
            decoding,
            reclaims,
        } = *costs;
        let b = &mut self.body;
        writeln!(b, "\n## 4. Transport floor: small-batch latency\n")?;
        writeln!(
            b,
            "One batch at a time (the next once the last was received): the time from just before the \
             publisher encodes a batch to the subscriber's `next_event` returning it, for slices of 1, 16 and \
             64 rows of the dataset. Baseline: the same batch handed to another thread over a channel \
             (`std::sync::mpsc`), the cost of waking a thread in one process. Percentiles are per \
             repetition; the table gives their median (min–max).\n"
        )?;
        let pct = |runs: &Repetitions, p: f64| -> Vec<f64> {
            runs.iter()
                .map(|r| {
                    let mut v = r.clone();
                    v.sort_by(f64::total_cmp);
                    percentile(&v, p)
                })
                .collect()
        };
        let wake_cpu = Summary::of(&wake.iter().map(|(_, cpu)| *cpu).collect::<Vec<_>>());
        let wake: Repetitions = wake.iter().map(|(lat, _)| lat.clone()).collect();
        let (w50, w90, w99) = (
            Summary::of(&pct(&wake, 50.0)),
            Summary::of(&pct(&wake, 90.0)),
            Summary::of(&pct(&wake, 99.0)),
        );
        writeln!(
            b,
            "The floor under Sluice's figure, same run: the wake-up alone. Sluice's subscribers sleep \
             on an iceoryx2 event (a Unix datagram socket per listener); one thread notifying such an \
             event and another waiting on it, one notification at a time, with no message: p50 \
             **{}** µs, p90 {} µs, p99 **{}** µs; each round trip (two wake-ups) costs {} µs of CPU.\n",
            w50.show(1),
            w90.show(1),
            w99.show(1),
            wake_cpu.show(1)
        )?;
        writeln!(
            b,
            "Each Sluice sample is split at the header's `published_ns` (taken just before the \
             sample is sent): the publisher's part (encoding, loan, the copy into shared memory) and \
             the delivery (send and notify, the wake-up, receive, decode, the delivery protocol).\n"
        )?;
        let fresh = Summary::of(&encoding.iter().map(|e| e.0).collect::<Vec<_>>());
        let kept = Summary::of(&encoding.iter().map(|e| e.1).collect::<Vec<_>>());
        let ratio = ratio_summary(encoding.iter().map(|e| (e.1, e.0)));
        writeln!(
            b,
            "Encoding a {}-row batch, 20 000 times: as a fresh IPC stream (`wire::encode`, the \
             baseline) {} µs; with the topic's schema message kept (`wire::Encoder`, what producers \
             use) {} µs: **{}** of the baseline.\n",
            SMALL_ROWS[SMALL_ROWS.len() - 1],
            fresh.show(2),
            kept.show(2),
            ratio.show(2)
        )?;
        let decode = Summary::of(&decoding.iter().map(|d| d.decode_us).collect::<Vec<_>>());
        let arrow = Summary::of(&decoding.iter().map(|d| d.arrow_us).collect::<Vec<_>>());
        let deferred = ratio_summary(decoding.iter().map(|d| (d.decode_us, d.arrow_us)));
        let validate = Summary::of(&decoding.iter().map(|d| d.validate_us).collect::<Vec<_>>());
        let share = ratio_summary(decoding.iter().map(|d| (d.validate_us, d.arrow_us)));
        writeln!(
            b,
            "What a subscriber's decoding costs, 20 000 times, a {}-row batch of comparison 3 \
             ({} KiB): `wire::Decoder::decode`, in place and with the schema kept, as subscribers \
             decode, {} µs, against the same decoder validating every array as arrow-ipc builds \
             it (`with_arrow_validation`, the baseline) {} µs: **{}** of the baseline. Both \
             check the same (the safety promise: nothing in shared memory is trusted); the \
             subscribers' decoder validates the batch once it is built and checks the strings' \
             offsets with plain loops. Arrow's validation of the columns alone \
             (`ArrayData::validate_full`: UTF-8, offsets, null counts) {} µs, {} of the \
             baseline.\n",
            decoded_rows,
            decoding.first().map_or(0, |d| d.bytes) >> 10,
            decode.show(2),
            arrow.show(2),
            deferred.show(2),
            validate.show(2),
            share.show(2)
        )?;
        let named = Summary::of(&decoding.iter().map(|d| d.named_us).collect::<Vec<_>>());
        let named_share = ratio_summary(decoding.iter().map(|d| (d.named_us, d.decode_us)));
        writeln!(
            b,
            "A subscriber that names its columns decodes and validates only those: the same \
             batch by a `wire::Decoder` of its columns that are not strings ({}), what a trainer \
             that never reads the text asks for, {} µs, **{}** of decoding every column.\n",
            decoding
                .first()
                .map(|d| d.named.join(", "))
                .unwrap_or_default(),
            named.show(2),
            named_share.show(2)
        )?;
        let reclaim = Summary::of(&reclaims.iter().map(|r| r.0).collect::<Vec<_>>());
        let listing = Summary::of(&reclaims.iter().map(|r| r.1).collect::<Vec<_>>());
        let reclaim_share = ratio_summary(reclaims.iter().copied());
        writeln!(
            b,
            "What looking for dead processes costs a producer's publishing thread, which does \
             it at the end of every epoch (at most every 250 ms) and every 50 ms while a queue \
             is full: one `Namespace::reclaim_dead` with a producer and {RECLAIM_SUBSCRIBERS} \
             subscribers alive and nothing dead, {} µs, against iceoryx2's own listing of the \
             same nodes (`Node::list`, the baseline) {} µs: **{}** of the baseline. All of \
             them are threads of this process, whose nodes' states iceoryx2 knows without \
             reading their monitors' files: another process's node costs both sides a \
             monitor read more (about 30 µs, docs/benchmarks.md).\n",
            reclaim.show(0),
            listing.show(0),
            reclaim_share.show(2)
        )?;
        writeln!(
            b,
            "| rows | Sluice p50 µs | p90 µs | p99 µs | publisher's part p50 µs | publisher's part p99 µs | delivery p50 µs | delivery p99 µs | hand-off p50 µs | hand-off p99 µs | Sluice / hand-off (p50) |"
        )?;
        writeln!(
            b,
            "|---:|---:|---:|---:|---:|---:|---:|---:|---:|---:|---:|"
        )?;
        let mut hist = Vec::new();
        let mut p50_64 = f64::NAN;
        let mut p99_64 = Summary::of(&[]);
        for (rows, runs, h) in lat {
            let s: Repetitions = runs.iter().map(|r| r.total.clone()).collect();
            let publish: Repetitions = runs.iter().map(|r| r.publish.clone()).collect();
            let delivery: Repetitions = runs.iter().map(|r| r.delivery.clone()).collect();
            let s = &s;
            let (s50, s90, s99) = (pct(s, 50.0), pct(s, 90.0), pct(s, 99.0));
            let (h50, h99) = (pct(h, 50.0), pct(h, 99.0));
            let ratio = ratio_summary(s50.iter().copied().zip(h50.iter().copied()));
            writeln!(
                b,
                "| {rows} | {} | {} | {} | {} | {} | {} | {} | {} | {} | {} |",
                Summary::of(&s50).show(1),
                Summary::of(&s90).show(1),
                Summary::of(&s99).show(1),
                Summary::of(&pct(&publish, 50.0)).show(1),
                Summary::of(&pct(&publish, 99.0)).show(1),
                Summary::of(&pct(&delivery, 50.0)).show(1),
                Summary::of(&pct(&delivery, 99.0)).show(1),
                Summary::of(&h50).show(1),
                Summary::of(&h99).show(1),
                ratio.show(1)
            )?;
            hist.push((format!("Sluice, {rows}-row batches"), s.concat()));
            p50_64 = Summary::of(&s50).median;
            p99_64 = Summary::of(&s99);
            if *rows == SMALL_ROWS[SMALL_ROWS.len() - 1] {
                hist.push((
                    format!("thread hand-off, {rows} rows (baseline)"),
                    h.concat(),
                ));
            }
        }
        hist.push(("event wake-up alone (floor)".into(), wake.concat()));
        self.summary.push(format!(
            "small-batch latency: p50 {p50_64:.1} µs publish→receive for 64-row batches; \
             the wake-up alone: p50 {:.1} µs, p99 {:.1} µs",
            w50.median, w99.median
        ));
        self.goals.push((
            "publish → receive, 64-row batches, p99".into(),
            format!("{} µs", p99_64.show_against(50.0, 0)),
            "< 50 µs",
            Some(p99_64.median < 50.0),
        ));
        self.image(
            plots,
            img,
            "bench-latency.png",
            "small-batch latency distribution",
            |p| plot::histogram(p, "Publish → receive latency of small batches", &hist),
        )
    }

    /// Comparison 5: the N = 1 row of the batch-size grid against memcpy.
    fn large(&mut self, grid: &[(usize, GridCells)], img: &Path, plots: bool) -> Result<()> {
        let b = &mut self.body;
        writeln!(b, "\n## 5. Transport floor: batch sizes against memcpy\n")?;
        writeln!(
            b,
            "Batches of one float32 column, from 1 KiB to 16 MiB or more, published (encoded and written \
             once into shared memory) and received (decoded in place, not read further) by one subscriber, \
             after 8 warm-up batches that fault in the topic's memory; timed from the first publish to the \
             last receipt. Baseline: a single-threaded `memcpy` of the same bytes into 8 destinations \
             already written once. Target: ≥ 80% of memcpy for batches of 4 MiB and more; below that the \
             per-message cost (a few µs: encode, notify, wake-up, decode) dominates, and the batches/s \
             column shows it.\n"
        )?;
        writeln!(
            b,
            "| batch | Sluice GB/s | memcpy GB/s | Sluice / memcpy | Sluice batches/s |"
        )?;
        writeln!(b, "|---:|---:|---:|---:|---:|")?;
        let mut ps = Vec::new();
        let mut pm = Vec::new();
        let mut worst = f64::INFINITY;
        for (kib, cells) in grid {
            let Some((_, r)) = cells.first() else {
                continue;
            };
            let r: Vec<(f64, f64)> = r.iter().map(|(s, m)| (s[0], *m)).collect();
            let s = Summary::of(&r.iter().map(|x| x.0).collect::<Vec<_>>());
            let m = Summary::of(&r.iter().map(|x| x.1).collect::<Vec<_>>());
            let ratio = ratio_summary(r.iter().copied());
            let size = size_label(*kib);
            let per_s = s.median * 1e9 / (*kib as f64 * 1024.0);
            writeln!(
                b,
                "| {size} | {} | {} | **{}** | {} |",
                s.show(2),
                m.show(2),
                ratio.show(2),
                crate::stats::metric(per_s)
            )?;
            ps.push((*kib as f64, s));
            pm.push((*kib as f64, m));
            if *kib >= LARGE_KIB {
                worst = worst.min(ratio.median);
            }
        }
        writeln!(
            b,
            "\nFrom 4 MiB up, Sluice reaches at least **{}%** of memcpy (target ≥ 80%: {}).",
            against(worst * 100.0, 80.0, 0),
            verdict(worst >= 0.8)
        )?;
        self.summary.push(format!(
            "batches of 4 MiB and more: at least {}% of memcpy (target ≥ 80%: {})",
            against(worst * 100.0, 80.0, 0),
            verdict(worst >= 0.8)
        ));
        self.image(
            plots,
            img,
            "bench-large.png",
            "large-batch GB/s against memcpy",
            |p| {
                plot::lines(
                    p,
                    "Batch sizes: Sluice against memcpy",
                    "batch size (KiB)",
                    "GB/s",
                    XAxis::Log2,
                    &[
                        Series {
                            name: "Sluice publish → receive".into(),
                            points: ps,
                        },
                        Series {
                            name: "memcpy of the same bytes".into(),
                            points: pm,
                        },
                    ],
                )
            },
        )
    }

    /// Comparison 5b: per-subscriber GB/s of every batch size at every N, against N = 1
    /// and against memcpy.
    fn grid(&mut self, grid: &[(usize, GridCells)], img: &Path, plots: bool) -> Result<()> {
        let b = &mut self.body;
        writeln!(b, "\n### 5b. Batch size and N: the scale curves\n")?;
        writeln!(
            b,
            "As comparison 5, with N = 1 to 16 subscriber threads receiving every batch (batches up \
             to {} MiB; the topic reserves chunks of the largest message for every subscriber). \
             Per-subscriber GB/s is from the first timed publish to that subscriber's last receipt \
             (median over subscribers); baselines: the same size at N = 1 (the fan-out ratio, \
             goal ≥ 0.90 from 64 KiB), and memcpy of the same bytes, both in the same repetition. \
             Every batch wakes every idle subscriber (`publish_batch`), as a producer whose \
             batches arrive one at a time does.\n",
            GRID_MAX_KIB >> 10
        )?;
        let ns: Vec<usize> = NS.to_vec();
        write!(b, "| batch |")?;
        for n in &ns {
            write!(b, " N = {n} GB/s (vs N = 1) |")?;
        }
        writeln!(b, " N = 8 / memcpy |")?;
        write!(b, "|---:|")?;
        for _ in &ns {
            write!(b, "---:|")?;
        }
        writeln!(b, "---:|")?;
        let mut lines: Vec<Series> = ns
            .iter()
            .map(|n| Series {
                name: format!("N = {n}"),
                points: Vec::new(),
            })
            .collect();
        let mut worst = (f64::INFINITY, 0usize);
        for (kib, cells) in grid {
            write!(b, "| {} |", size_label(*kib))?;
            let Some((_, base)) = cells.first() else {
                writeln!(b)?;
                continue;
            };
            let base_rate = |rep: usize| median(&base[rep].0);
            let mut vs_memcpy = String::from("—");
            for (col, n) in ns.iter().enumerate() {
                let Some((_, runs)) = cells.iter().find(|(m, _)| m == n) else {
                    write!(b, " — |")?;
                    continue;
                };
                let rate = Summary::of(&runs.iter().map(|(s, _)| median(s)).collect::<Vec<_>>());
                let ratio = Summary::of(
                    &runs
                        .iter()
                        .enumerate()
                        .map(|(rep, (s, _))| median(s) / base_rate(rep))
                        .collect::<Vec<_>>(),
                );
                write!(b, " {} ({}) |", rate.show(2), ratio.show(2))?;
                lines[col].points.push((*kib as f64, rate));
                if *n == NS[N8] {
                    let m = Summary::of(
                        &runs
                            .iter()
                            .enumerate()
                            .map(|(rep, (s, _))| median(s) / base[rep].1)
                            .collect::<Vec<_>>(),
                    );
                    vs_memcpy = m.show(2);
                }
                if *n == NS[N8] && *kib >= GRID_GOAL_KIB && ratio.median < worst.0 {
                    worst = (ratio.median, *kib);
                }
            }
            writeln!(b, " {vs_memcpy} |")?;
        }
        if worst.0.is_finite() {
            writeln!(
                b,
                "\nAt N = 8 the per-subscriber rate is at least **{}** of N = 1 for batches of 64 KiB \
                 and more (lowest at {}; goal ≥ 0.90: {}).",
                against(worst.0, 0.9, 2),
                size_label(worst.1),
                verdict(worst.0 >= 0.9)
            )?;
            self.summary.push(format!(
                "batch-size curve at N = 8: at least {:.2} of N = 1 from 64 KiB (lowest at {})",
                worst.0,
                size_label(worst.1)
            ));
        }
        self.image(
            plots,
            img,
            "bench-grid.png",
            "per-subscriber GB/s against batch size, N = 1 to 16",
            |p| {
                plot::lines(
                    p,
                    "Per-subscriber GB/s against batch size, for each N",
                    "batch size (KiB)",
                    "GB/s per subscriber",
                    XAxis::Log2,
                    &lines,
                )
            },
        )
    }

    /// Comparison 2b: total CPU at N = 8 against the batch size.
    fn cpu_by_batch(
        &mut self,
        runs: &[(usize, Vec<(fanout::Run, fanout::Run)>)],
        bytes_per_row: f64,
        img: &Path,
        plots: bool,
    ) -> Result<()> {
        let n = NS[N8];
        let b = &mut self.body;
        writeln!(b, "\n### 2b. Total CPU at N = {n} against batch size\n")?;
        writeln!(
            b,
            "Comparison 2 at N = {n} with other `batch_rows`: what each batch costs the subscribers \
             (their cost is per batch, the pipeline's per row). Baseline: {n} independent pipelines \
             with the same batch size, same repetition.\n"
        )?;
        writeln!(
            b,
            "| batch_rows | KiB per batch | window (messages) | Sluice CPU-s | independent CPU-s | Sluice / independent | subscribers' CPU µs per batch |"
        )?;
        writeln!(b, "|---:|---:|---:|---:|---:|---:|---:|")?;
        let mut points = Vec::new();
        for (rows, r) in runs {
            let s = Summary::of(&r.iter().map(|(s, _)| s.cpu).collect::<Vec<_>>());
            let d = Summary::of(&r.iter().map(|(_, d)| d.cpu).collect::<Vec<_>>());
            let ratio = ratio_summary(r.iter().map(|(s, d)| (s.cpu, d.cpu)));
            let batches = |run: &fanout::Run| run.rows as f64 / *rows as f64;
            let per_batch = Summary::of(
                &r.iter()
                    .map(|(s, _)| s.consumer_cpu / n as f64 / batches(s) * 1e6)
                    .collect::<Vec<_>>(),
            );
            writeln!(
                b,
                "| {rows} | {:.0} | {} | {} | {} | **{}** | {} |",
                *rows as f64 * bytes_per_row / 1024.0,
                r.first().map_or(0, |(s, _)| s.window),
                s.show(2),
                d.show(2),
                ratio.show(3),
                per_batch.show(1)
            )?;
            points.push((*rows as f64, ratio));
        }
        self.image(
            plots,
            img,
            "bench-cpu-batch.png",
            "total CPU at N = 8 against batch size",
            |p| {
                plot::lines(
                    p,
                    &format!("Total CPU at N = {n}: Sluice / {n} independent pipelines"),
                    "batch_rows",
                    "CPU ratio",
                    XAxis::Log2,
                    &[Series {
                        name: format!("Sluice (1 producer + {n} subscribers) / {n} pipelines"),
                        points,
                    }],
                )
            },
        )
    }

    fn s3(&mut self, server: &str, runs: &[(f64, f64)], img: &Path, plots: bool) -> Result<()> {
        let b = &mut self.body;
        writeln!(b, "\n## 6. S3 against local files\n")?;
        writeln!(
            b,
            "The dataset streamed once per pass through the producer's pipeline without shared memory (plan, \
             DataFusion scan, re-batching), from local disk and from {server} (the same files, uploaded). \
             Baseline: local disk in the same repetition. More detail (requests, bytes, memory): \
             `cargo bench -p sluice-cli --bench object_store`.\n"
        )?;
        let l = Summary::of(&runs.iter().map(|r| r.0).collect::<Vec<_>>());
        let s = Summary::of(&runs.iter().map(|r| r.1).collect::<Vec<_>>());
        let ratio = ratio_summary(runs.iter().map(|r| (r.1, r.0)));
        writeln!(b, "| source | rows/s | vs local |")?;
        writeln!(b, "|---|---:|---:|")?;
        writeln!(b, "| local disk | {} | 1.00 |", l.show_count())?;
        writeln!(
            b,
            "| S3 (loopback) | {} | **{}** |",
            s.show_count(),
            ratio.show(2)
        )?;
        self.summary.push(format!(
            "S3 (loopback) streams at {:.2} of local disk",
            ratio.median
        ));
        let mb = |v: Summary| Summary {
            median: v.median / 1e6,
            min: v.min / 1e6,
            max: v.max / 1e6,
            n: v.n,
        };
        self.image(plots, img, "bench-s3.png", "S3 against local files", |p| {
            plot::bars(
                p,
                "Scan rate: S3 (loopback) against local disk",
                "million rows/s",
                &[
                    ("local disk".into(), mb(l)),
                    ("S3 (loopback)".into(), mb(s)),
                ],
            )
        })
    }

    fn s3_pyarrow(
        &mut self,
        latency_ms: Option<u64>,
        runs: &[(f64, f64, f64)],
        requests: &S3Requests,
        files: usize,
    ) -> Result<()> {
        let b = &mut self.body;
        if let Some(ms) = latency_ms {
            writeln!(
                b,
                "\n### 6c. S3 with {ms} ms of latency: Sluice against pyarrow\n"
            )?;
            writeln!(
                b,
                "As 6b, on a second server started with `--latency-ms {ms}`: every response \
                 waits {ms} ms, a loopback stand-in for the first-byte latency of a real object \
                 store, where every request round trip counts.\n"
            )?;
        } else {
            writeln!(b, "\n### 6b. S3: Sluice against pyarrow\n")?;
        }
        writeln!(
            b,
            "The same files on the same server, in the same repetition: pyarrow's S3 dataset scan \
             (`pyarrow.dataset` over `pyarrow.fs.S3FileSystem`, the same four columns, {BATCH_ROWS}-row \
             batches, one Python process) against Sluice's pass above, and the same pass with \
             `sluice.read_ahead = '0'`. All are timed after planning (Sluice) or dataset discovery \
             (pyarrow). Requests, bytes and concurrency come from the server's request log, for the \
             whole pass of the last repetition, planning or discovery included ({files} files).\n"
        )?;
        let s = Summary::of(&runs.iter().map(|r| r.0).collect::<Vec<_>>());
        let p = Summary::of(&runs.iter().map(|r| r.1).collect::<Vec<_>>());
        let o = Summary::of(&runs.iter().map(|r| r.2).collect::<Vec<_>>());
        let ratio = ratio_summary(runs.iter().map(|r| (r.0, r.1)));
        let off_ratio = ratio_summary(runs.iter().map(|r| (r.2, r.1)));
        let show = |r: Option<s3::Requests>| match r {
            Some(r) => format!(
                "{} | {} | {} | {:.1} MiB | {}",
                r.gets,
                r.heads,
                r.lists,
                r.bytes as f64 / (1 << 20) as f64,
                r.most_at_once
            ),
            None => "– | – | – | – | –".into(),
        };
        writeln!(
            b,
            "| reader | rows/s | vs pyarrow | GETs | HEADs | LISTs | bytes | most requests at once |"
        )?;
        writeln!(b, "|---|---:|---:|---:|---:|---:|---:|---:|")?;
        writeln!(
            b,
            "| pyarrow S3 dataset scan | {} | 1.00 | {} |",
            p.show_count(),
            show(requests.pyarrow)
        )?;
        writeln!(
            b,
            "| Sluice (DataFusion + object_store, read-ahead) | {} | **{}** | {} |",
            s.show_count(),
            ratio.show(2),
            show(requests.sluice)
        )?;
        writeln!(
            b,
            "| Sluice without read-ahead | {} | {} | {} |",
            o.show_count(),
            off_ratio.show(2),
            show(requests.no_read_ahead)
        )?;
        if latency_ms.is_none() {
            self.goals.push((
                S3_GOAL.into(),
                format!("{}×", ratio.show_against(1.0, 2)),
                "≥ 1.0",
                Some(ratio.median >= 1.0),
            ));
        }
        Ok(())
    }

    fn python(&mut self, t: &python::Trainers) -> Result<()> {
        let f = |v: &serde_json::Value, path: &[&str]| -> f64 {
            path.iter()
                .fold(v, |v, k| &v[*k])
                .as_f64()
                .unwrap_or(f64::NAN)
        };
        let b = &mut self.body;
        writeln!(b, "\n## 8. Python trainers against Python loaders\n")?;
        writeln!(
            b,
            "Separate processes, CPU-seconds of all of them (their rusage). \
             `benches/python_loaders.py`, one run: {} rows of the demo dataset, {} epochs; each trainer sums \
             `(x - 0.5) / 0.25` over the 16 float32 features of every row; Sluice: `sluice run` and N \
             Python subscribers (`np.from_dlpack`), loaders: N Python processes reading the Parquet \
             files with pyarrow. One subscriber that only counts rows: Python {} rows/s, Rust {} \
             rows/s ({:.2} of Rust).\n",
            t.loaders["rows"],
            t.loaders["epochs"],
            stats::metric(f(&t.loaders, &["python_rows_s"])),
            stats::metric(f(&t.loaders, &["rust_rows_s"])),
            f(&t.loaders, &["python_rows_s"]) / f(&t.loaders, &["rust_rows_s"]),
        )?;
        writeln!(
            b,
            "| trainers | Sluice CPU-s | loaders CPU-s | CPU Sluice / loaders | Sluice wall s | loaders wall s |"
        )?;
        writeln!(b, "|---:|---:|---:|---:|---:|---:|")?;
        for row in t.loaders["trainers"].as_array().into_iter().flatten() {
            let (sc, lc) = (f(row, &["sluice", "cpu"]), f(row, &["loaders", "cpu"]));
            writeln!(
                b,
                "| {} | {sc:.2} | {lc:.2} | **{:.2}** | {:.2} | {:.2} |",
                row["n"],
                sc / lc,
                f(row, &["sluice", "wall"]),
                f(row, &["loaders", "wall"])
            )?;
        }
        let i = &t.images;
        let runs: Vec<&serde_json::Value> = i["runs"].as_array().into_iter().flatten().collect();
        if runs.is_empty() {
            anyhow::bail!("benches/image_pipeline.py reported no repetitions (\"runs\")");
        }
        writeln!(
            b,
            "\n`benches/image_pipeline.py`: pipelines/images.sql on {} generated JPEGs, {} epochs, {} \
             trainers. Sluice: `sluice run` and Python trainers that sum every pixel and target \
             (`np.from_dlpack`); loaders: Python processes doing the same augmentation with Pillow + \
             numpy. One core, one pass: Sluice {:.2} CPU-s, Pillow + numpy {:.2} CPU-s. {} \
             repetitions, Sluice and the loaders alternated (one run's producer has taken from 1.3 \
             to 1.8 CPU-s for the same work on 2 vCPUs); the goal is judged on the median.\n",
            i["images"],
            i["epochs"],
            i["trainers"],
            f(i, &["per_core", "sluice_cpu"]),
            f(i, &["per_core", "pillow_cpu"]),
            runs.len(),
        )?;
        writeln!(
            b,
            "| repetition | loaders CPU-s | loaders wall s | Sluice CPU-s | of which the producer | Sluice wall s | CPU vs loaders |"
        )?;
        writeln!(b, "|---:|---:|---:|---:|---:|---:|---:|")?;
        for (k, r) in runs.iter().enumerate() {
            writeln!(
                b,
                "| {} | {:.2} | {:.2} | {:.2} | {:.2} | {:.2} | {:.2} |",
                k + 1,
                f(r, &["loaders", "cpu"]),
                f(r, &["loaders", "wall"]),
                f(r, &["sluice", "cpu"]),
                f(r, &["sluice", "producer_cpu"]),
                f(r, &["sluice", "wall"]),
                f(r, &["cpu_ratio"]),
            )?;
        }
        let ratio = Summary::of(
            &runs
                .iter()
                .map(|r| f(r, &["cpu_ratio"]))
                .collect::<Vec<_>>(),
        );
        let steady = Summary::of(
            &runs
                .iter()
                .map(|r| f(r, &["cpu_ratio_without_startup"]))
                .collect::<Vec<_>>(),
        );
        // The top level holds the median repetition's figures.
        let list = |key: &str| -> Vec<f64> {
            i["sluice"][key]
                .as_array()
                .into_iter()
                .flatten()
                .filter_map(serde_json::Value::as_f64)
                .collect()
        };
        let (trainers, startup) = (list("trainer_cpu"), list("trainer_startup_cpu"));
        writeln!(
            b,
            "\nCPU vs loaders: **{}**. In the median repetition, of Sluice's CPU-s: the producer \
             {:.2}, the trainers {:.2} in all, of which {:.2} is their Python start-up (CPU to the \
             end of their imports: the interpreter and numpy, whose OpenBLAS starts a thread per \
             core); the loaders' start-up: {:.2}. Without the Python processes' start-up on both \
             sides (a long run amortises it): **{}**.",
            ratio.show(2),
            f(i, &["sluice", "producer_cpu"]),
            trainers.iter().sum::<f64>(),
            startup.iter().sum::<f64>(),
            f(i, &["loaders", "startup_cpu"]),
            steady.show(2),
        )?;
        self.goals.push((
            IMAGE_GOAL.into(),
            ratio.show_against(0.35, 2),
            "≤ 0.35",
            Some(ratio.median <= 0.35),
        ));
        Ok(())
    }

    fn gpu(&mut self, device: &str, json: &str) {
        let _ = writeln!(
            self.body,
            "\n## 7. GPU ({device})\n\nOutput of `benches/gpu.py`:\n\n```json\n{}\n```",
            json.trim()
        );
        self.summary
            .push(format!("GPU: ran on {device} (see section 7)"));
    }

    fn finish(mut self, elapsed: f64) -> String {
        let mut out = self.head;
        let _ = writeln!(out, "* Dataset: {}", self.dataset);
        let _ = writeln!(out, "* Wall time of the whole command: {elapsed:.0} s\n");
        let _ = writeln!(out, "## Goals\n");
        let _ = writeln!(out, "| comparison (same run) | now | goal | |");
        let _ = writeln!(out, "|---|---|---|---|");
        for (what, now, goal, met) in &self.goals {
            let met = match met {
                Some(ok) => verdict(*ok),
                None => "not measured",
            };
            let _ = writeln!(out, "| {what} | {now} | {goal} | {met} |");
        }
        let _ = writeln!(out, "\n## Summary\n");
        for s in &self.summary {
            let _ = writeln!(out, "* {s}");
        }
        for n in self.notes.drain(..) {
            let _ = writeln!(out, "\n{n}");
        }
        out.push_str(&self.body);
        out
    }
}

/// Comparison 6b's request counts (from the server's log, when it has one).
#[derive(Debug, Default)]
struct S3Requests {
    sluice: Option<s3::Requests>,
    no_read_ahead: Option<s3::Requests>,
    pyarrow: Option<s3::Requests>,
}

/// Milliseconds comparison 6c's server adds to every response.
const S3_LATENCY_MS: u64 = 20;

/// Comparison 6's passes over `server`, `reps` times: (local rows/s, Sluice rows/s) when
/// `local` is given, (Sluice, pyarrow, Sluice without read-ahead) rows/s while `python`
/// works (it becomes the reason when pyarrow fails), and the last repetition's requests.
#[allow(clippy::type_complexity)]
fn s3_passes(
    server: &s3::S3Server,
    (location, options): (&str, &str),
    local: Option<&str>,
    python: &mut Result<python::Python, String>,
    repo: &Path,
    data: &data::Dataset,
    reps: usize,
) -> Result<(Vec<(f64, f64)>, Vec<(f64, f64, f64)>, S3Requests)> {
    let mut runs = Vec::new();
    let mut pyarrow = Vec::new();
    let mut requests = S3Requests::default();
    for _ in 0..reps {
        let l = match local {
            Some(local) => Some(s3::pass(local, "", "", BATCH_ROWS, data.rows)?),
            None => None,
        };
        let mark = server.log_mark();
        let s = s3::pass(location, options, "", BATCH_ROWS, data.rows)?;
        requests.sluice = server.requests(mark);
        if let Some(l) = l {
            runs.push((l, s));
        }
        if let Ok(py) = &*python {
            // The same pass without read-ahead: what `sluice.read_ahead` gains.
            let mark = server.log_mark();
            let off = s3::pass(
                location,
                options,
                "SET sluice.read_ahead = '0';\n",
                BATCH_ROWS,
                data.rows,
            )?;
            requests.no_read_ahead = server.requests(mark);
            let mark = server.log_mark();
            match server.pyarrow_pass(py, repo, data, "data", BATCH_ROWS) {
                Ok(p) => {
                    requests.pyarrow = server.requests(mark);
                    pyarrow.push((s, p, off));
                }
                Err(e) => *python = Err(format!("pyarrow's scan failed: {e:#}")),
            }
        }
    }
    Ok((runs, pyarrow, requests))
}
