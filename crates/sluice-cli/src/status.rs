//! `sluice status`: the topics of a namespace, their producers and subscribers.

use std::io::{IsTerminal, Write};
use std::time::Duration;

use sluice::Namespace;
use sluice::status::{TopicStatus, snapshot};

/// Arguments of `sluice status`.
#[derive(Debug, clap::Args)]
pub(crate) struct StatusArgs {
    /// Print one JSON snapshot and exit (for scripts).
    #[arg(long)]
    json: bool,
    /// Print the table once and exit (the default when stdout is not a terminal).
    #[arg(long)]
    once: bool,
    /// Seconds between refreshes.
    #[arg(long, default_value_t = 1.0)]
    interval: f64,
}

pub(crate) fn run(args: StatusArgs) -> anyhow::Result<()> {
    let namespace = Namespace::from_env()?;
    // What crashed processes left is reclaimed by the next Sluice process that looks at
    // the namespace; in a namespace nobody runs in any more, this one.
    let reclaimed = namespace.reclaim_dead();
    if reclaimed > 0 {
        tracing::info!(reclaimed, "reclaimed the resources of dead processes");
    }
    if args.json {
        let topics = snapshot(&namespace)?;
        println!(
            "{}",
            serde_json::json!({"namespace": namespace.name(), "topics": topics})
        );
        return Ok(());
    }
    let stdout = std::io::stdout();
    let live = !args.once && stdout.is_terminal();
    let interval = Duration::try_from_secs_f64(args.interval)
        .ok()
        .filter(|d| !d.is_zero())
        .ok_or_else(|| anyhow::anyhow!("--interval must be a positive number of seconds"))?;
    loop {
        let table = render(namespace.name(), &snapshot(&namespace)?);
        let mut out = stdout.lock();
        if live {
            // Clear the screen and go home, then draw: a simple live view.
            write!(out, "\x1b[2J\x1b[H")?;
        }
        write!(out, "{table}")?;
        out.flush()?;
        if !live {
            return Ok(());
        }
        drop(out);
        std::thread::sleep(interval);
    }
}

fn render(namespace: &str, topics: &[TopicStatus]) -> String {
    use std::fmt::Write;
    let mut s = String::new();
    if topics.is_empty() {
        let _ = writeln!(s, "namespace {namespace}: no topics");
        return s;
    }
    let _ = writeln!(s, "namespace {namespace}");
    for t in topics {
        let _ = writeln!(s);
        match &t.producer {
            Some(p) => {
                let _ = writeln!(
                    s,
                    "topic {}  producer pid {} {}  epoch {}/{} batch {}  {} rows  {:.0} rows/s  {} subscriber(s)  window {}{}  {}",
                    t.topic,
                    p.pid,
                    p.state,
                    p.epoch + 1,
                    p.epochs,
                    match p.epoch_size.batches {
                        Some(n) => format!("{}/{n}", p.batch),
                        None => p.batch.to_string(),
                    },
                    p.rows,
                    p.rows_per_s,
                    p.subscribers,
                    p.window,
                    if p.lag_limit > 0 {
                        format!(" lag limit {}", p.lag_limit)
                    } else {
                        String::new()
                    },
                    crate::human_bytes(p.shm_bytes),
                );
            }
            None => {
                let _ = writeln!(s, "topic {}  no producer", t.topic);
            }
        }
        if let Some(p) = &t.paced_by {
            let _ = writeln!(
                s,
                "  the producer has waited {:.0} s for the subscriber in process {} (port {}): \
                 its queue is full and it reads nothing",
                p.waited_s, p.pid, p.port
            );
        }
        if !t.subscribers.is_empty() {
            let _ = writeln!(
                s,
                "  {:>8}  {:>6}  {:>12}  {:>12}  {:>6}  {:>5}  {:>7}",
                "pid", "epoch", "rows", "rows/s", "lag", "held", "missed"
            );
        }
        for sub in &t.subscribers {
            let r = &sub.report;
            let _ = writeln!(
                s,
                "  {:>8}  {:>6}  {:>12}  {:>12.0}  {:>6}  {:>5}  {:>7}{}",
                r.pid,
                r.epoch,
                r.rows,
                r.rows_per_s,
                sub.lag.map_or("-".to_string(), |l| l.to_string()),
                r.held,
                r.missed,
                if sub.pacing {
                    "  <- paces the producer"
                } else {
                    ""
                }
            );
        }
        for d in &t.departed {
            let _ = writeln!(
                s,
                "  {:>8}  left the topic; still holds {} batch(es) (their shared memory stays \
                 until they are dropped)",
                d.pid, d.held
            );
        }
    }
    s
}
