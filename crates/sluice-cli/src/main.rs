//! The `sluice` command: argument parsing and glue; the work happens in the libraries.

/// Writes a line to stderr, as `eprintln!` does, but without panicking where stderr is a
/// closed pipe (a killed parent, `2>&1 | head`): a message nobody reads is not an error.
macro_rules! say {
    ($($arg:tt)*) => {{
        use std::io::Write as _;
        let _ = writeln!(std::io::stderr(), $($arg)*);
    }};
}

mod ballista;
mod demo;
mod malloc;
mod serve;
mod status;
mod subscribe;

use std::path::PathBuf;
use std::process::ExitCode;
use std::sync::Arc;
use std::sync::atomic::{AtomicBool, Ordering};
use std::time::Duration;

use anyhow::Context;
use clap::{Parser, Subcommand};
use sluice::{Namespace, Plan, Producer, ProducerHandle, RunOptions, SluiceError};

/// Run one ML preprocessing pipeline and feed its output, zero-copy, to every trainer on
/// the machine.
#[derive(Debug, Parser)]
#[command(name = "sluice", version, about, long_about = None)]
struct Cli {
    #[command(subcommand)]
    command: Command,
}

#[derive(Debug, Subcommand)]
enum Command {
    /// Run a plan file and publish its batches on the plan's topic.
    Run {
        /// The plan file (DataFusion SQL).
        plan: PathBuf,
        /// Override sluice.epochs.
        #[arg(long)]
        epochs: Option<u64>,
        /// Wait for this many subscribers before the first batch (overrides sluice.min_subscribers).
        #[arg(long)]
        min_subscribers: Option<usize>,
        /// Give up waiting for --min-subscribers after this many seconds.
        #[arg(long)]
        wait_timeout: Option<f64>,
        /// After the end of the stream, wait for subscribers to finish reading; give up after this many seconds in which none takes a message.
        #[arg(long, default_value_t = 10.0)]
        linger: f64,
        /// Override sluice.topic.
        #[arg(long)]
        topic: Option<String>,
        /// Resume from the checkpoint a crashed run of this plan left (from the start if none).
        #[arg(long)]
        resume: bool,
        /// The checkpoint file (default: one per topic in the namespace's state directory).
        #[arg(long)]
        checkpoint: Option<PathBuf>,
        /// Read only shard RANK of WORLD (overrides sluice.shard), e.g. 0/4 on the first of four nodes.
        #[arg(long, value_name = "RANK/WORLD")]
        shard: Option<String>,
        /// Refuse to run over files other than this listing (`sluice explain` prints it;
        /// overrides sluice.listing): give every node of a sharded run the same one.
        #[arg(long, value_name = "DIGEST")]
        listing: Option<String>,
        /// No progress bar.
        #[arg(long, short)]
        quiet: bool,
    },
    /// Receive a topic and report what arrived.
    Subscribe(subscribe::SubscribeArgs),
    /// Serve this node's topics to trainers on other machines (Arrow Flight).
    Serve(serve::ServeArgs),
    /// Run an Apache DataFusion Ballista scheduler or executor that knows Sluice's
    /// functions, for plans with `SET sluice.engine = 'ballista://HOST:PORT'`.
    Ballista(ballista::BallistaArgs),
    /// Print a plan's resolved options, schema and DataFusion physical plan.
    Explain {
        /// The plan file.
        plan: PathBuf,
    },
    /// Compute the checksum of one epoch of a plan directly through DataFusion.
    Checksum {
        /// The plan file.
        plan: PathBuf,
        /// Checksum only shard RANK of WORLD (overrides sluice.shard).
        #[arg(long, value_name = "RANK/WORLD")]
        shard: Option<String>,
        /// Refuse files other than this listing (overrides sluice.listing).
        #[arg(long, value_name = "DIGEST")]
        listing: Option<String>,
        /// Print JSON.
        #[arg(long)]
        json: bool,
    },
    /// Show the topics of the namespace: producers, subscribers, positions, lag, rates.
    Status(status::StatusArgs),
    /// Run the demo: a local dataset, pipelines/demo.sql, one producer and several subscribers.
    Demo(demo::DemoArgs),
    /// Ask a local topic's producer (`sluice.trigger = 'manual'`) to start its next round.
    Round {
        /// The topic.
        topic: String,
    },
}

fn main() -> ExitCode {
    // Before any thread: a producer's batches reuse memory instead of faulting it in anew.
    malloc::tune();
    sluice::core::panics::install_quiet_hook();
    // The topic's shared-memory footprint is worth seeing by default.
    sluice::logging::log_to_stderr("warn,sluice_shm::publisher=info");
    let cli = Cli::parse();
    match run_with_deep_stack(cli) {
        Ok(()) => ExitCode::SUCCESS,
        Err(e) => {
            if is_broken_pipe(&e) {
                return ExitCode::SUCCESS;
            }
            // The exit code still says what went wrong where nobody reads this.
            say!("error: {}", error_text(&e));
            ExitCode::from(exit_code(&e))
        }
    }
}

/// Runs the command on a thread with the stack of Sluice's runtime threads: commands
/// plan queries on the calling thread too (a deep expression needs more than the main
/// thread's 8 MiB).
fn run_with_deep_stack(cli: Cli) -> anyhow::Result<()> {
    sluice::core::threads::on_deep_stack("sluice-main", move || run(cli))?
}

/// One place that maps errors to exit codes: 2 for a bad plan or configuration, 3 for a
/// lost or failed producer, 4 for a timeout, 5 for a subscriber detached for lagging
/// (or, remote, for stalling its server),
/// 1 otherwise.
fn exit_code(e: &anyhow::Error) -> u8 {
    match e.downcast_ref::<SluiceError>() {
        Some(SluiceError::Plan { .. } | SluiceError::Config(_)) => 2,
        Some(
            SluiceError::ProducerLost(_)
            | SluiceError::ProducerFailed(_)
            | SluiceError::ResumeGap { .. },
        ) => 3,
        Some(SluiceError::Timeout { .. }) => 4,
        Some(SluiceError::Lagged { .. } | SluiceError::Stalled { .. }) => 5,
        _ => 1,
    }
}

/// `e` and its causes, each once: Sluice's errors already end with their source's text
/// (`cannot read plan file p.sql: No such file or directory`), which anyhow's `{:#}`
/// would write again.
fn error_text(e: &anyhow::Error) -> String {
    let mut text = String::new();
    for cause in e.chain() {
        let part = cause.to_string();
        if text.ends_with(&part) {
            continue;
        }
        if !text.is_empty() {
            text.push_str(": ");
        }
        text.push_str(&part);
    }
    text
}

fn is_broken_pipe(e: &anyhow::Error) -> bool {
    e.chain().any(|c| {
        c.downcast_ref::<std::io::Error>()
            .is_some_and(|io| io.kind() == std::io::ErrorKind::BrokenPipe)
    })
}

pub(crate) fn runtime() -> anyhow::Result<tokio::runtime::Runtime> {
    tokio::runtime::Builder::new_multi_thread()
        .enable_all()
        // Panics on these threads are caught where their task is joined and reported as
        // errors: the quiet panic hook keeps them off stderr (sluice::core::panics).
        .thread_name(sluice::core::panics::RUNTIME_THREAD_PREFIX)
        .thread_stack_size(sluice::core::threads::RUNTIME_THREAD_STACK)
        .build()
        .context("cannot start the async runtime")
}

/// Completes on SIGINT or SIGTERM (never, where the handlers cannot be installed).
pub(crate) async fn stop_signal() {
    let Ok(mut term) = tokio::signal::unix::signal(tokio::signal::unix::SignalKind::terminate())
    else {
        return std::future::pending().await;
    };
    tokio::select! {
        _ = tokio::signal::ctrl_c() => {}
        _ = term.recv() => {}
    }
}

/// A flag set by SIGINT/SIGTERM, so the producer can tell its subscribers it stopped.
pub(crate) fn stop_flag(rt: &tokio::runtime::Runtime) -> Arc<AtomicBool> {
    let stop = Arc::new(AtomicBool::new(false));
    let flag = stop.clone();
    rt.spawn(async move {
        stop_signal().await;
        flag.store(true, Ordering::Relaxed);
    });
    stop
}

fn run(cli: Cli) -> anyhow::Result<()> {
    match cli.command {
        Command::Run {
            plan,
            epochs,
            min_subscribers,
            wait_timeout,
            linger,
            topic,
            resume,
            checkpoint,
            shard,
            listing,
            quiet,
        } => {
            let rt = runtime()?;
            let mut plan = load_for_run(&rt, &plan, &topic, min_subscribers, wait_timeout, linger)?;
            set_shard(&mut plan, shard, listing)?;
            if let Some(e) = epochs {
                plan.options_mut().epochs = e;
            }
            if let Some(t) = topic {
                plan.options_mut().topic = t;
            }
            let options = RunOptions {
                min_subscribers,
                subscriber_timeout: wait_timeout
                    .map(|s| seconds("--wait-timeout", s))
                    .transpose()?,
                linger: seconds("--linger", linger)?,
                stop: stop_flag(&rt),
                resume,
                checkpoint,
            };
            let stats = run_producer(rt, plan, options, quiet)?;
            if !quiet {
                say!(
                    "published {} rows in {} batches ({} messages, {} wake-ups of the subscribers) over {} epoch(s) in {:.2}s ({:.0} rows/s, {} of shared memory)",
                    stats.rows,
                    stats.batches,
                    stats.messages,
                    stats.wakeups,
                    stats.epochs,
                    stats.elapsed.as_secs_f64(),
                    stats.rows as f64 / stats.elapsed.as_secs_f64().max(1e-9),
                    human_bytes(stats.shm_bytes)
                );
            }
            Ok(())
        }
        Command::Subscribe(args) => subscribe::run(args),
        Command::Serve(args) => serve::run(args),
        Command::Ballista(args) => ballista::run(args),
        Command::Explain { plan } => {
            let rt = runtime()?;
            let plan = rt.block_on(Plan::load(&plan))?;
            print!("{}", rt.block_on(plan.explain())?);
            Ok(())
        }
        Command::Checksum {
            plan,
            shard,
            listing,
            json,
        } => {
            let rt = runtime()?;
            let mut plan = rt.block_on(Plan::load(&plan))?;
            set_shard(&mut plan, shard, listing)?;
            let sum = rt.block_on(plan.checksum())?;
            if json {
                println!(
                    "{}",
                    serde_json::json!({"rows": sum.rows(), "checksum": sum.hex()})
                );
            } else {
                println!("rows {}  checksum {}", sum.rows(), sum.hex());
            }
            Ok(())
        }
        Command::Status(args) => status::run(args),
        Command::Demo(args) => demo::run(args),
        Command::Round { topic } => {
            sluice::request_round(&Namespace::from_env()?, &topic)?;
            Ok(())
        }
    }
}

/// Loads the plan of `sluice run`. When it cannot be loaded, the subscribers waiting for
/// the plan's topic are told why, rather than left waiting for a topic that never comes.
fn load_for_run(
    rt: &tokio::runtime::Runtime,
    path: &std::path::Path,
    topic: &Option<String>,
    min_subscribers: Option<usize>,
    wait_timeout: Option<f64>,
    linger: f64,
) -> anyhow::Result<Plan> {
    let options = RunOptions {
        min_subscribers,
        subscriber_timeout: wait_timeout
            .map(|s| seconds("--wait-timeout", s))
            .transpose()?,
        linger: seconds("--linger", linger)?,
        stop: stop_flag(rt),
        ..RunOptions::default()
    };
    let namespace = Namespace::from_env()?;
    Ok(Producer::load_for_run(
        rt.handle(),
        path,
        topic.as_deref(),
        &namespace,
        &options,
    )?)
}

/// Applies `--shard RANK/WORLD` and `--listing DIGEST`.
fn set_shard(
    plan: &mut Plan,
    shard: Option<String>,
    listing: Option<String>,
) -> anyhow::Result<()> {
    if let Some(shard) = shard {
        sluice::Shard::parse(&shard)?;
        plan.options_mut().shard = shard;
    }
    if let Some(listing) = listing {
        plan.options_mut().listing = listing;
        plan.options().listing()?;
    }
    Ok(())
}

/// Runs `plan` on `rt` to its end (or a stop), showing its progress on stderr unless
/// `quiet`.
pub(crate) fn run_producer(
    rt: tokio::runtime::Runtime,
    plan: Plan,
    options: RunOptions,
    quiet: bool,
) -> anyhow::Result<sluice::RunStats> {
    let namespace = Namespace::from_env()?;
    let epochs = plan.options().total_epochs();
    let handle = ProducerHandle::spawn(Producer::new(plan, namespace), options, rt)?;
    let bar = if quiet {
        indicatif::ProgressBar::hidden()
    } else {
        let bar = indicatif::ProgressBar::new_spinner();
        bar.set_style(
            indicatif::ProgressStyle::with_template("{spinner} {elapsed_precise} {msg}")
                .unwrap_or_else(|_| indicatif::ProgressStyle::default_spinner()),
        );
        bar.enable_steady_tick(Duration::from_millis(200));
        bar
    };
    while !handle.wait_finished(Duration::from_millis(200)) {
        let p = handle.progress();
        bar.set_message(format!(
            "epoch {}/{}  {} rows  {} batches  {}  {} subscriber(s)",
            p.epoch + 1,
            epochs,
            p.rows,
            p.batches,
            human_bytes(p.bytes),
            p.subscribers
        ));
    }
    bar.finish_and_clear();
    Ok(handle.join()?)
}

/// A number of seconds given as `flag`: at least 0 (`inf`: as long as it takes).
pub(crate) fn seconds(flag: &str, value: f64) -> anyhow::Result<Duration> {
    if value.is_infinite() && value > 0.0 {
        return Ok(Duration::MAX);
    }
    Duration::try_from_secs_f64(value).map_err(|_| {
        anyhow::anyhow!(SluiceError::Config(format!(
            "{flag} must be a number of seconds >= 0, not {value}"
        )))
    })
}

pub(crate) fn human_bytes(b: u64) -> String {
    const UNITS: [&str; 5] = ["B", "KiB", "MiB", "GiB", "TiB"];
    let mut v = b as f64;
    let mut unit = 0;
    while v >= 1024.0 && unit + 1 < UNITS.len() {
        v /= 1024.0;
        unit += 1;
    }
    format!("{v:.1} {}", UNITS[unit])
}
