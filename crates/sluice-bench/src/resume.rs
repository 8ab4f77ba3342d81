//! Comparison 9: a trainer that restarts from its cursor. Two trainers read the stream,
//! at a fixed training step per batch (the stream is paced by them, as GPU-bound trainers
//! pace it) or as fast as the pipeline goes; a third stops and starts again from its
//! cursor: once while the topic's
//! history still holds it, once an epoch later (a catch-up, the plan run again in its
//! process). Measured in the same run: its time from the call to its first batch, against
//! the epoch's length, and the two others' rate while it catches up, against their rate
//! just before.

use std::fmt::Write as _;
use std::sync::{Arc, Mutex};
use std::time::{Duration, Instant};

use anyhow::{Context, Result, bail};
use sluice::prelude::*;
use sluice::{Cursor, RunOptions};

use crate::Bench;
use crate::report::{Report, ratio_summary};

/// Rows per batch.
const BATCH_ROWS: usize = 1024;

/// When each batch of a trainer arrived, and its epoch and rows.
type Arrivals = Arc<Mutex<Vec<(Instant, u64, u64)>>>;

struct Rep {
    /// Time to the first batch of a new subscriber (the baseline), from a cursor the
    /// history holds, and from one an epoch behind, against the epoch's length.
    fresh: f64,
    history: f64,
    catch_up: f64,
    /// The others' rows/s while the third trainer catches up, against their rate
    /// while it reads the shared stream (the same trainer without a catch-up).
    others: f64,
}

/// How the trainers run: a training step per batch (the stream paced by them, as
/// GPU-bound trainers pace it), or none (the pipeline paces them).
#[derive(Clone, Copy)]
struct Mode {
    name: &'static str,
    step: Duration,
    epochs: u64,
}

const MODES: [Mode; 2] = [
    Mode {
        name: "trainers at a 2 ms step",
        step: Duration::from_millis(2),
        epochs: 3,
    },
    Mode {
        name: "trainers as fast as the pipeline",
        step: Duration::ZERO,
        epochs: 8,
    },
];

pub(crate) fn compare(bench: &Bench<'_>, report: &mut Report) -> Result<()> {
    bench.step("9. a trainer restarting from its cursor");
    writeln!(
        report.body,
        "\n## 9. A trainer restarting from its cursor\n"
    )?;
    writeln!(
        report.body,
        "Two trainers read the stream ({BATCH_ROWS}-row batches); a third restarts from its \
         cursor (`sub.state_dict()`). Times are fractions of one epoch.\n"
    )?;
    writeln!(
        report.body,
        "| trainers | first batch: new subscriber | from the history | from a catch-up an \
         epoch behind | the others' rows/s during the catch-up / with the third trainer on \
         the shared stream |\n|---|---|---|---|---|"
    )?;
    for mode in MODES {
        let reps = (0..bench.scale.reps)
            .map(|rep| measure(bench, &format!("resume{}r{rep}", mode.epochs), mode))
            .collect::<Result<Vec<_>>>()?;
        let show = |f: fn(&Rep) -> f64, d| ratio_summary(reps.iter().map(|r| (f(r), 1.0))).show(d);
        let (fresh, history) = (show(|r| r.fresh, 3), show(|r| r.history, 3));
        let (catch_up, others) = (show(|r| r.catch_up, 3), show(|r| r.others, 2));
        writeln!(
            report.body,
            "| {} | {fresh} | {history} | {catch_up} | {others} |",
            mode.name
        )?;
        report.summary.push(format!(
            "9. restart ({}): first batch {catch_up} of an epoch from a catch-up; others at \
             {others}",
            mode.name
        ));
    }
    Ok(())
}

fn measure(bench: &Bench<'_>, topic: &str, mode: Mode) -> Result<Rep> {
    let ns = bench.ns;
    let sql = format!(
        "SET sluice.shuffle_seed = 1; SET sluice.message_batches = 1; SET sluice.window = 8;\n{}",
        crate::data::plan_sql(
            topic,
            &format!("{}/", bench.data.dir.display()),
            "",
            BATCH_ROWS,
            mode.epochs
        )
    );
    let rt = tokio::runtime::Runtime::new()?;
    let plan = rt.block_on(Plan::from_sql("resume.sql", &sql))?;
    let producer = Producer::new(plan, ns.clone());
    let handle = rt.handle().clone();
    let options = RunOptions {
        min_subscribers: Some(3),
        subscriber_timeout: Some(Duration::from_secs(60)),
        ..RunOptions::default()
    };
    let publishing = std::thread::spawn(move || producer.run(&handle, &options, |_| {}));
    let arrivals: Vec<Arrivals> = (0..2).map(|_| Arrivals::default()).collect();
    let others = arrivals
        .iter()
        .map(|a| {
            let (sub, a) = (subscribe(ns, topic, None)?, a.clone());
            Ok(std::thread::spawn(move || pace(sub, &a, mode.step)))
        })
        .collect::<Result<Vec<_>>>()?;
    let mut trainer = subscribe(ns, topic, None)?;
    for _ in 0..50 {
        trainer.next_event()?;
    }
    let cursor = trainer.cursor().context("no cursor after 50 events")?;
    drop(trainer);
    let from_history = first_batch(ns, topic, Some(cursor.clone()))?;
    let fresh = first_batch(ns, topic, None)?;
    // An epoch later: the cursor is out of the history. The others' rate is measured
    // over half an epoch while a third trainer reads the shared stream, then over half
    // an epoch after the catch-up's first batch.
    let epoch = wait_for_epoch(&arrivals[0], cursor.epoch + 1)?;
    let window = epoch / 2;
    let mut third = subscribe(ns, topic, None)?;
    let joined = Instant::now();
    first_of(&mut third, joined)?;
    let from = Instant::now();
    while from.elapsed() < window {
        third.next_event()?;
        std::thread::sleep(mode.step);
    }
    let before = rate(&arrivals, from, Instant::now());
    drop(third);
    let start = Instant::now();
    let mut late = subscribe(ns, topic, Some(cursor))?;
    let from_catch_up = first_of(&mut late, start)?;
    let caught = late.catching_up();
    while start.elapsed() < window + from_catch_up {
        late.next_event()?;
        std::thread::sleep(mode.step);
    }
    let during = rate(&arrivals, start + from_catch_up, Instant::now());
    drop(late);
    if !caught {
        bail!("the restarted trainer did not catch up: its cursor was still in the history");
    }
    for o in others {
        o.join()
            .map_err(|_| anyhow::anyhow!("a trainer panicked"))??;
    }
    publishing
        .join()
        .map_err(|_| anyhow::anyhow!("the producer panicked"))??;
    Ok(Rep {
        fresh: fresh.as_secs_f64() / epoch.as_secs_f64(),
        history: from_history.as_secs_f64() / epoch.as_secs_f64(),
        catch_up: from_catch_up.as_secs_f64() / epoch.as_secs_f64(),
        others: during / before,
    })
}

fn subscribe(ns: &Namespace, topic: &str, cursor: Option<Cursor>) -> Result<Subscriber> {
    Ok(Subscriber::connect(
        topic,
        SubscribeOptions {
            timeout: Some(Duration::from_secs(60)),
            namespace: Some(ns.clone()),
            batch_size: Some(BATCH_ROWS),
            cursor,
            ..SubscribeOptions::default()
        },
    )?)
}

/// A trainer at a fixed step per batch, to the end of the stream.
fn pace(mut sub: Subscriber, arrivals: &Arrivals, step: Duration) -> Result<()> {
    loop {
        match sub.next_event()? {
            Event::Batch { epoch, batch, .. } => {
                let mut a = arrivals
                    .lock()
                    .unwrap_or_else(std::sync::PoisonError::into_inner);
                a.push((Instant::now(), epoch, batch.num_rows() as u64));
                drop(a);
                std::thread::sleep(step);
            }
            Event::End => return Ok(()),
            _ => {}
        }
    }
}

/// The time from `start` to `sub`'s first batch.
fn first_of(sub: &mut Subscriber, start: Instant) -> Result<Duration> {
    loop {
        if let Event::Batch { .. } = sub.next_event()? {
            return Ok(start.elapsed());
        }
    }
}

fn first_batch(ns: &Namespace, topic: &str, cursor: Option<Cursor>) -> Result<Duration> {
    let start = Instant::now();
    let mut sub = subscribe(ns, topic, cursor)?;
    first_of(&mut sub, start)
}

/// Waits until the trainer reached `epoch`; the mean length of its epochs so far.
fn wait_for_epoch(arrivals: &Arrivals, epoch: u64) -> Result<Duration> {
    let deadline = Instant::now() + Duration::from_secs(300);
    loop {
        {
            let a = arrivals
                .lock()
                .unwrap_or_else(std::sync::PoisonError::into_inner);
            let first = a.first().map(|x| x.0);
            if let (Some(first), Some(next)) = (first, a.iter().find(|x| x.1 >= epoch)) {
                return Ok((next.0 - first) / u32::try_from(epoch.max(1))?);
            }
        }
        if Instant::now() > deadline {
            bail!("the trainers did not reach epoch {epoch}");
        }
        std::thread::sleep(Duration::from_millis(5));
    }
}

/// Rows per second of all the trainers between `from` and `to`.
fn rate(arrivals: &[Arrivals], from: Instant, to: Instant) -> f64 {
    let rows: u64 = arrivals
        .iter()
        .map(|a| {
            let a = a.lock().unwrap_or_else(std::sync::PoisonError::into_inner);
            a.iter()
                .filter(|x| x.0 >= from && x.0 < to)
                .map(|x| x.2)
                .sum::<u64>()
        })
        .sum();
    rows as f64 / (to - from).as_secs_f64()
}
