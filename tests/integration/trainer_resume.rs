//! A trainer that stops and starts again from its saved cursor gets exactly the rows after
//! it, while the shared stream goes on for the others: from the topic's history where it
//! still holds them, else from a catch-up computed in the trainer's process until the
//! shared stream is reached.

use std::sync::Arc;
use std::sync::atomic::{AtomicU64, Ordering};
use std::time::Duration;

use arrow::array::AsArray;
use arrow::datatypes::Int64Type;
use arrow::record_batch::RecordBatch;
use sluice::flight::{FlightServer, ServeOptions};
use sluice::prelude::*;
use sluice::{Cursor, Join, RunStats};

use crate::common::{Harness, TestNamespace};

const ROWS: i64 = 600;
const EPOCHS: usize = 3;

fn plan(topic: &str, window: usize) -> String {
    format!(
        "SET sluice.topic = '{topic}'; SET sluice.batch_rows = 10; SET sluice.epochs = {EPOCHS};\n\
         SET sluice.shuffle_seed = 7; SET sluice.shuffle_buffer = 100; SET sluice.window = {window};\n\
         SET sluice.message_batches = 1;\n\
         SELECT value AS v, repeat('x', 2000) AS pad FROM generate_series(1, {ROWS})"
    )
}

fn producer(
    ns: Namespace,
    sql: String,
    subscribers: usize,
) -> std::thread::JoinHandle<Result<RunStats>> {
    std::thread::spawn(move || {
        let rt = tokio::runtime::Runtime::new().unwrap();
        let plan = rt.block_on(Plan::from_sql("resume.sql", &sql))?;
        let options = RunOptions {
            min_subscribers: Some(subscribers),
            subscriber_timeout: Some(Duration::from_secs(30)),
            ..RunOptions::default()
        };
        Producer::new(plan, ns).run(rt.handle(), &options, |_| {})
    })
}

fn options(ns: &TestNamespace, batch_size: usize, cursor: Option<Cursor>) -> SubscribeOptions {
    SubscribeOptions {
        timeout: Some(Duration::from_secs(60)),
        namespace: Some(ns.0.clone()),
        batch_size: Some(batch_size),
        cursor,
        ..SubscribeOptions::default()
    }
}

fn values(batch: &RecordBatch) -> impl Iterator<Item = i64> + '_ {
    batch
        .column(0)
        .as_primitive::<Int64Type>()
        .values()
        .iter()
        .copied()
}

/// A trainer reading every epoch, `pause` per batch, its epoch published in `at`.
/// How far a trainer is: its epoch, and the batches it took in all.
#[derive(Default)]
struct Progress {
    epoch: AtomicU64,
    batches: AtomicU64,
}

fn pacer(
    sub: Subscriber,
    pause: Duration,
    at: Arc<Progress>,
) -> std::thread::JoinHandle<Vec<Vec<i64>>> {
    std::thread::spawn(move || {
        let mut sub = sub;
        let mut epochs = vec![Vec::new(); EPOCHS];
        loop {
            match sub.next_event().unwrap() {
                Event::Batch { epoch, batch, .. } => {
                    at.epoch.store(epoch, Ordering::Relaxed);
                    at.batches.fetch_add(1, Ordering::Relaxed);
                    epochs[epoch as usize].extend(values(&batch));
                    std::thread::sleep(pause);
                }
                Event::End => return epochs,
                _ => {}
            }
        }
    })
}

/// Every epoch as the trainer saw it across its stop: the rows before the cursor, then
/// the rows after it from a subscriber started there (whose summaries are checked),
/// which takes 2 ms per batch (faster than the other trainer, so it meets the stream).
fn resumed(first: &[i64], mut sub: Subscriber, epoch: u64, must_meet: bool) -> Vec<Vec<i64>> {
    let mut epochs = vec![Vec::new(); EPOCHS];
    epochs[epoch as usize].extend_from_slice(first);
    loop {
        match sub.next_event().unwrap() {
            Event::Batch { epoch, batch, .. } => {
                epochs[epoch as usize].extend(values(&batch));
                std::thread::sleep(Duration::from_millis(2));
            }
            Event::EpochEnd(summary) => assert_eq!(
                summary.complete,
                summary.epoch != epoch,
                "{summary:?}: only the epoch resumed mid-way is partial in this process"
            ),
            Event::End => break,
            Event::DeviceBatch { .. } => unreachable!("a host topic"),
        }
    }
    assert!(
        !must_meet || !sub.catching_up(),
        "the trainer never reached the shared stream"
    );
    epochs
}

/// Each epoch is every row once (the oracle: the numbers 1..=ROWS, not Sluice's own
/// checksum), and in the order the trainer that never stopped saw.
fn check(trainer: &[Vec<i64>], reference: &[Vec<i64>]) {
    for (e, (rows, expected)) in trainer.iter().zip(reference).enumerate() {
        let mut sorted = rows.clone();
        sorted.sort_unstable();
        assert_eq!(
            sorted,
            (1..=ROWS).collect::<Vec<_>>(),
            "epoch {e}: every row once"
        );
        assert_eq!(rows, expected, "epoch {e}: in the stream's order");
    }
}

/// Where a restarted trainer runs.
#[derive(Clone, Copy, PartialEq, Eq)]
enum Trainer {
    /// On this machine: a catch-up is computed in its process.
    Local,
    /// On another, through a Flight server: the server computes its catch-up.
    Remote,
}

/// A trainer that stops mid-epoch, inside a producer batch, and starts again from its
/// cursor: from the topic's history when it is still there (`window` 64), from a
/// catch-up that then meets the shared stream when it is long gone (`window` 2, and the
/// other trainer an epoch further).
fn stop_and_resume(window: usize, wait_for_epoch: u64, restarted_as: Trainer) {
    let ns = TestNamespace::new();
    let topic = format!("resume{window}");
    let producer = producer(ns.0.clone(), plan(&topic, window), 2);
    let at = Arc::new(Progress::default());
    let other = pacer(
        Subscriber::connect(&topic, options(&ns, 10, None)).unwrap(),
        Duration::from_millis(15),
        at.clone(),
    );
    let mut trainer = Subscriber::connect(&topic, options(&ns, 7, None)).unwrap();
    let mut before = Vec::new();
    while before.len() < 13 * 7 {
        if let Event::Batch { batch, .. } = trainer.next_event().unwrap() {
            before.extend(values(&batch));
        }
    }
    let cursor = Cursor::from_json(&trainer.cursor().unwrap().to_json()).unwrap();
    assert_eq!((cursor.epoch, cursor.batch, cursor.row), (0, 9, 1));
    assert!(
        cursor.plan.is_some() && cursor.shuffle_seed == Some(7),
        "{cursor:?}"
    );
    drop(trainer);
    while at.epoch.load(Ordering::Relaxed) < wait_for_epoch {
        std::thread::sleep(Duration::from_millis(5));
    }
    let server = (restarted_as == Trainer::Remote).then(|| {
        let options = ServeOptions {
            catch_up: Some(sluice::remote_catch_up(ns.0.clone())),
            ..ServeOptions::new(ns.0.clone())
        };
        FlightServer::start("127.0.0.1:0".parse().unwrap(), options).unwrap()
    });
    let at_topic = match &server {
        Some(server) => format!("flight://{}/{topic}", server.local_addr()),
        None => topic.clone(),
    };
    let restarted = Subscriber::connect(&at_topic, options(&ns, 7, Some(cursor))).unwrap();
    // A remote subscriber's catch-up runs in the server, out of its sight.
    let trainer = resumed(&before, restarted, 0, restarted_as == Trainer::Local);
    let reference = other.join().unwrap();
    check(&trainer, &reference);
    producer.join().unwrap().unwrap();
}

#[test]
fn a_trainer_resumes_from_the_topic_s_history() {
    stop_and_resume(64, 0, Trainer::Local);
}

#[test]
fn a_trainer_an_epoch_behind_catches_up_and_meets_the_shared_stream() {
    stop_and_resume(2, 1, Trainer::Local);
}

/// The same for a trainer restarted on another machine: the Flight server computes its
/// catch-up (before, a position out of the server's history was a `ResumeGap`).
#[test]
fn a_remote_trainer_an_epoch_behind_is_caught_up_by_the_server() {
    stop_and_resume(2, 1, Trainer::Remote);
}

/// `Join::CatchUp`: a trainer that starts mid-epoch gets that epoch whole.
#[test]
fn a_late_trainer_that_catches_up_gets_its_first_epoch_whole() {
    let ns = TestNamespace::new();
    let producer = producer(ns.0.clone(), plan("late", 2), 1);
    let at = Arc::new(Progress::default());
    let other = pacer(
        Subscriber::connect("late", options(&ns, 10, None)).unwrap(),
        Duration::from_millis(8),
        at.clone(),
    );
    while at.epoch.load(Ordering::Relaxed) < 1 {
        std::thread::sleep(Duration::from_millis(5));
    }
    let late = Subscriber::connect(
        "late",
        SubscribeOptions {
            join: Join::CatchUp,
            ..options(&ns, 7, None)
        },
    )
    .unwrap();
    let mut sub = late;
    let mut epochs = vec![Vec::new(); EPOCHS];
    let mut summaries = Vec::new();
    loop {
        match sub.next_event().unwrap() {
            Event::Batch { epoch, batch, .. } => epochs[epoch as usize].extend(values(&batch)),
            Event::EpochEnd(s) => summaries.push((s.epoch, s.complete)),
            Event::End => break,
            Event::DeviceBatch { .. } => unreachable!(),
        }
    }
    let reference = other.join().unwrap();
    let first = summaries[0].0 as usize;
    assert!(first >= 1, "joined in epoch {first}");
    assert!(
        summaries.iter().all(|s| s.1),
        "every epoch whole: {summaries:?}"
    );
    check(&epochs[first..], &reference[first..]);
    producer.join().unwrap().unwrap();
}

/// A cursor taken on another plan's stream is refused, not used at the wrong rows.
#[test]
fn a_cursor_of_another_plan_is_refused() {
    let ns = TestNamespace::new();
    let producer = producer(ns.0.clone(), plan("other", 64), 1);
    let mut cursor = Cursor::new("other", sluice::core::RowPosition::new(0, 0, 0));
    cursor.plan = Some("0123456789abcdef".into());
    let mut sub = Subscriber::connect("other", options(&ns, 7, Some(cursor))).unwrap();
    let err = loop {
        match sub.next_event() {
            Ok(Event::End) => panic!("the stream was taken"),
            Ok(_) => {}
            Err(e) => break e,
        }
    };
    assert!(matches!(err, SluiceError::Config(_)), "{err}");
    assert!(err.to_string().contains("0123456789abcdef"), "{err}");
    drop(sub);
    // The producer goes on without the refused subscriber.
    let _ = producer.join().unwrap();
}

/// A cursor taken before its producer was SIGKILLed works after the producer's
/// `--resume`, here from a catch-up of the restarted producer's plan (the cursor is long
/// out of its history); the trainer gets exactly the rows after the cursor, in the order
/// a trainer that reconnected across the crash saw.
#[test]
fn a_cursor_taken_before_a_producer_crash_works_after_resume() {
    const LIMIT: Duration = Duration::from_secs(120);
    let mut h = Harness::new();
    let data = h.dataset(600);
    let sql = format!(
        "SET sluice.topic = 'crash'; SET sluice.batch_rows = 10; SET sluice.epochs = {EPOCHS};\n\
         SET sluice.window = 2; SET sluice.message_batches = 1;\n\
         SET sluice.shuffle_seed = 3; SET sluice.shuffle_buffer = 200;\n\
         CREATE EXTERNAL TABLE train STORED AS PARQUET LOCATION '{}/';\n\
         SELECT id AS v FROM train;\n",
        data.display()
    );
    h.plan("p.sql", &sql);
    let first = h.spawn_producer(2, &[]);
    let ns = h.ns.clone();
    let subscribe = |batch_size, cursor| SubscribeOptions {
        timeout: Some(Duration::from_secs(60)),
        namespace: Some(ns.clone()),
        batch_size: Some(batch_size),
        reconnect: Some(Duration::from_secs(60)),
        cursor,
        ..SubscribeOptions::default()
    };
    let at = Arc::new(Progress::default());
    let other = pacer(
        Subscriber::connect("crash", subscribe(10, None)).unwrap(),
        Duration::from_millis(10),
        at.clone(),
    );
    let mut trainer = Subscriber::connect("crash", subscribe(7, None)).unwrap();
    let mut before = Vec::new();
    while before.len() < 13 * 7 {
        if let Event::Batch { batch, .. } = trainer.next_event().unwrap() {
            before.extend(values(&batch));
        }
    }
    let cursor = trainer.cursor().unwrap();
    drop(trainer);
    // The cursor is then out of the restarted producer's history (two messages).
    while at.epoch.load(Ordering::Relaxed) < 1 {
        std::thread::sleep(Duration::from_millis(5));
    }
    first.kill9();
    first.wait(LIMIT);
    let second = h.spawn(&["run", "p.sql", "--quiet", "--resume"]);
    let restarted = Subscriber::connect("crash", subscribe(7, Some(cursor))).unwrap();
    let trainer = resumed(&before, restarted, 0, false);
    let reference = other.join().unwrap();
    for (e, (rows, expected)) in trainer.iter().zip(&reference).enumerate() {
        let mut sorted = rows.clone();
        sorted.sort_unstable();
        sorted.dedup();
        assert_eq!(sorted.len(), 600, "epoch {e}: every row once");
        assert_eq!(rows, expected, "epoch {e}: in the stream's order");
    }
    let out = second.wait(LIMIT);
    assert!(out.status.success(), "{}", out.stderr);
}

/// A catching-up trainer that stops reading for a while (an evaluation, a checkpoint
/// write) holds nobody back: its catch-up is its own, and what it attaches to the shared
/// stream to look for its history is let go before it returns a batch.
#[test]
fn a_catching_up_trainer_that_stops_reading_holds_nobody_back() {
    let ns = TestNamespace::new();
    let producer = producer(ns.0.clone(), plan("pause", 2), 2);
    let at = Arc::new(Progress::default());
    let other = pacer(
        Subscriber::connect("pause", options(&ns, 10, None)).unwrap(),
        Duration::from_millis(5),
        at.clone(),
    );
    let mut trainer = Subscriber::connect("pause", options(&ns, 7, None)).unwrap();
    while !matches!(trainer.next_event().unwrap(), Event::Batch { .. }) {}
    let cursor = trainer.cursor().unwrap();
    drop(trainer);
    // Out of the history (two messages), in the same epoch: the catch-up looks for it.
    while at.batches.load(Ordering::Relaxed) < 30 {
        std::thread::sleep(Duration::from_millis(5));
    }
    let mut late = Subscriber::connect("pause", options(&ns, 7, Some(cursor))).unwrap();
    for _ in 0..5 {
        late.next_event().unwrap();
    }
    assert!(late.catching_up());
    let before = at.batches.load(Ordering::Relaxed);
    std::thread::sleep(Duration::from_millis(1_000));
    let taken = at.batches.load(Ordering::Relaxed) - before;
    // 5 ms a batch: about 200 in a second if nothing holds it; a held stream takes at
    // most the window (2) and what the other trainer holds.
    assert!(
        taken > 50,
        "the other trainer took {taken} batches in a second"
    );
    drop(late);
    other.join().unwrap();
    producer.join().unwrap().unwrap();
}

/// A cursor past its epoch's end (edited, or of data that changed) is a clear error of
/// the catch-up, not a hang or a crash.
#[test]
fn a_cursor_past_its_epoch_is_a_clear_error() {
    let ns = TestNamespace::new();
    let producer = producer(ns.0.clone(), plan("past", 2), 1);
    let at = Arc::new(Progress::default());
    let other = pacer(
        Subscriber::connect("past", options(&ns, 10, None)).unwrap(),
        Duration::from_millis(5),
        at.clone(),
    );
    while at.batches.load(Ordering::Relaxed) < 10 {
        std::thread::sleep(Duration::from_millis(5));
    }
    let mut cursor = Cursor::new("past", sluice::core::RowPosition::new(0, 10_000, 0));
    cursor.plan = None;
    let mut sub = Subscriber::connect("past", options(&ns, 7, Some(cursor))).unwrap();
    let err = loop {
        match sub.next_event() {
            Ok(Event::End) => panic!("the stream ended without an error"),
            Ok(_) => {}
            Err(e) => break e,
        }
    };
    assert!(err.to_string().contains("10000"), "{err}");
    drop(sub);
    other.join().unwrap();
    producer.join().unwrap().unwrap();
}

/// A trainer restarted from its cursor while the producer drains for a slow subscriber
/// (it has published everything) gets the rest of its rows from a catch-up: the run's
/// plan record stays until the drain ends. It was removed before, and the trainer was
/// refused ("runs no plan that this process could compute again").
#[test]
fn a_trainer_restarted_while_the_producer_drains_gets_the_rest() {
    const LIMIT: Duration = Duration::from_secs(120);
    let mut h = Harness::new();
    let data = h.dataset(300);
    let sql = format!(
        "SET sluice.topic = 'drain'; SET sluice.batch_rows = 10; SET sluice.epochs = 2;\n\
         SET sluice.window = 20; SET sluice.message_batches = 1;\n\
         CREATE EXTERNAL TABLE train STORED AS PARQUET LOCATION '{}/';\n\
         SELECT id AS v FROM train;\n",
        data.display()
    );
    h.plan("p.sql", &sql);
    let ns = h.ns.clone();
    let subscribe = |cursor| SubscribeOptions {
        timeout: Some(Duration::from_secs(60)),
        namespace: Some(ns.clone()),
        batch_size: Some(10),
        cursor,
        ..SubscribeOptions::default()
    };
    // A first run: the trainer stops after 7 batches and keeps its cursor.
    let first = h.spawn_producer(1, &[]);
    let mut trainer = Subscriber::connect("drain", subscribe(None)).unwrap();
    let mut before = Vec::new();
    while before.len() < 70 {
        if let Event::Batch { batch, .. } = trainer.next_event().unwrap() {
            before.extend(values(&batch));
        }
    }
    let cursor = trainer.cursor().unwrap();
    drop(trainer);
    assert!(first.wait(LIMIT).status.success());
    // A second run, drained for seconds by a slow subscriber: the cursor is out of its
    // history (20 messages), so the restarted trainer catches up.
    let slow = h.spawn(&["subscribe", "drain", "--delay-ms", "200", "--timeout", "60"]);
    let second = h.spawn_producer(1, &[]);
    let topic = sluice::core::TopicName::new("drain").unwrap();
    let start = std::time::Instant::now();
    while sluice::status::producer_report(&h.ns, &topic)
        .unwrap()
        .is_none_or(|r| r.state != "draining")
    {
        assert!(start.elapsed() < LIMIT, "the producer never drained");
        std::thread::sleep(Duration::from_millis(20));
    }
    let mut restarted = Subscriber::connect("drain", subscribe(Some(cursor))).unwrap();
    let mut after = [Vec::new(), Vec::new()];
    loop {
        match restarted.next_event().unwrap() {
            Event::Batch { epoch, batch, .. } => after[epoch as usize].extend(values(&batch)),
            Event::End => break,
            _ => {}
        }
    }
    let mut epoch0: Vec<i64> = before.iter().chain(&after[0]).copied().collect();
    epoch0.sort_unstable();
    epoch0.dedup();
    assert_eq!(
        (epoch0.len(), after[0].len()),
        (300, 230),
        "epoch 0: the rest, once"
    );
    after[1].sort_unstable();
    after[1].dedup();
    assert_eq!(after[1].len(), 300, "epoch 1: every row once");
    assert!(slow.wait(LIMIT).status.success());
    assert!(second.wait(LIMIT).status.success());
}
