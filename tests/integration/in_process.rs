//! A producer and a subscriber in one process (on two threads): the transport's
//! guarantees that need a look inside the subscriber's memory.

use std::time::Duration;

use arrow::array::{Array, ArrayData, AsArray};
use arrow::datatypes::Int64Type;
use sluice::prelude::*;

use crate::common::TestNamespace;

fn buffers(data: &ArrayData, out: &mut Vec<(usize, usize)>) {
    for b in data.buffers() {
        out.push((b.as_ptr() as usize, b.len()));
    }
    if let Some(nulls) = data.nulls() {
        out.push((nulls.buffer().as_ptr() as usize, nulls.buffer().len()));
    }
    for child in data.child_data() {
        buffers(child, out);
    }
}

fn spawn_producer(ns: Namespace, sql: String) -> std::thread::JoinHandle<Result<sluice::RunStats>> {
    spawn_producer_for(ns, sql, 1)
}

/// A producer of `sql` on a thread, waiting for `subscribers` before its first batch.
fn spawn_producer_for(
    ns: Namespace,
    sql: String,
    subscribers: usize,
) -> std::thread::JoinHandle<Result<sluice::RunStats>> {
    std::thread::spawn(move || {
        let rt = tokio::runtime::Runtime::new().unwrap();
        let plan = rt.block_on(Plan::from_sql("test.sql", &sql))?;
        let options = RunOptions {
            min_subscribers: Some(subscribers),
            subscriber_timeout: Some(Duration::from_secs(30)),
            ..RunOptions::default()
        };
        Producer::new(plan, ns).run(rt.handle(), &options, |_| {})
    })
}

/// Column buffers of received batches lie inside the shared-memory sample they arrived
/// in (nothing is copied), and stay valid after the subscriber and producer are gone.
#[test]
fn batches_are_decoded_in_place_and_outlive_their_subscriber() {
    let ns = TestNamespace::new();
    let sql = "SET sluice.topic = 'zc'; SET sluice.batch_rows = 100;\n\
               SELECT value AS v, CAST(value AS VARCHAR) AS s, make_array(value, value + 1) AS l, \
               CASE WHEN value % 3 = 0 THEN NULL ELSE value END AS n \
               FROM generate_series(1, 1050)"
        .to_string();
    let producer = spawn_producer(ns.0.clone(), sql.clone());
    let mut sub = Subscriber::connect(
        "zc",
        SubscribeOptions {
            timeout: Some(Duration::from_secs(30)),
            namespace: Some(ns.0.clone()),
            ..SubscribeOptions::default()
        },
    )
    .unwrap();
    let mut kept = Vec::new();
    let mut got = Checksum::default();
    let mut batches = 0;
    loop {
        match sub.next_event().unwrap() {
            Event::Batch {
                batch, shm_range, ..
            } => {
                let shm_range = shm_range.expect("producer-sized batches are zero-copy");
                let mut all = Vec::new();
                for col in batch.columns() {
                    buffers(&col.to_data(), &mut all);
                }
                assert!(all.len() >= 6);
                for (ptr, len) in all {
                    assert!(
                        ptr >= shm_range.start && ptr + len <= shm_range.end,
                        "a buffer at {ptr:#x}+{len} lies outside the sample {shm_range:x?}"
                    );
                }
                got.update(&batch).unwrap();
                batches += 1;
                // Keep a batch past the subscriber's and the producer's lifetime.
                if batches <= 2 {
                    kept.push(batch);
                }
            }
            Event::DeviceBatch { .. } => panic!("a CPU topic sent a GPU batch"),
            Event::EpochEnd(summary) => {
                assert!(summary.complete);
                assert_eq!(summary.rows, 1050);
            }
            Event::End => break,
        }
    }
    assert_eq!(batches, 11);
    drop(sub);
    producer.join().unwrap().unwrap();
    let rt = tokio::runtime::Runtime::new().unwrap();
    let plan = rt.block_on(Plan::from_sql("test.sql", &sql)).unwrap();
    assert_eq!(got, rt.block_on(plan.checksum()).unwrap());
    let first = kept[0].column(0).as_primitive::<Int64Type>();
    assert_eq!(first.len(), 100);
    assert_eq!(first.value(0), 1);
    assert_eq!(first.value(99), 100);
    let s = arrow::util::display::array_value_to_string(kept[1].column(1), 0).unwrap();
    assert_eq!(s, "101");
}

/// What a topic's messages hold: `(first batch index, batch_rows, rows)` per batch
/// message, read with the transport's own subscriber (below the delivery protocol), and
/// the producer's wake-ups of its subscribers.
fn messages_on(ns: &Namespace, topic: &str, sql: &str) -> (Vec<(u64, u64, u64)>, u64) {
    let producer = spawn_producer(ns.clone(), sql.to_string());
    let topic = sluice::core::TopicName::new(topic).unwrap();
    let mut sub =
        sluice::shm::TopicSubscriber::connect(ns, &topic, Some(Duration::from_secs(30)), false)
            .unwrap();
    let mut out = Vec::new();
    loop {
        match sub.recv(Some(Duration::from_secs(30))).unwrap() {
            sluice::shm::Frame::Batch {
                index,
                batch_rows,
                batch,
                ..
            } => out.push((index, batch_rows, batch.num_rows() as u64)),
            sluice::shm::Frame::EndOfEpoch { batches, rows, .. } => {
                assert_eq!((batches, rows), (11, 1050));
            }
            sluice::shm::Frame::EndOfStream => break,
            other => panic!("unexpected {other:?}"),
        }
    }
    drop(sub);
    let stats = producer.join().unwrap().unwrap();
    assert_eq!((stats.batches, stats.rows), (11, 1050));
    assert_eq!(stats.messages, out.len() as u64);
    (out, stats.wakeups)
}

/// Batches ready at once go as one message ('auto'), whose header names its first batch
/// and the rows of each; the subscriber still receives every batch alone, at its index.
/// `sluice.message_batches = 1` sends every batch alone.
#[test]
fn consecutive_batches_go_as_one_message_and_arrive_one_by_one() {
    let ns = TestNamespace::new();
    let sql = |topic: &str, most: &str| {
        format!(
            "SET sluice.topic = '{topic}'; SET sluice.batch_rows = 100; \
             SET sluice.message_batches = {most};\n\
             SELECT value AS v, CAST(value AS VARCHAR) AS s FROM generate_series(1, 1050)"
        )
    };
    let (grouped, _) = messages_on(&ns.0, "grouped", &sql("grouped", "'auto'"));
    // The first message sizes the topic and is one batch; the rest of that DataFusion
    // batch follows in fewer messages than batches.
    assert!(grouped.len() < 11, "{grouped:?}");
    let mut next = 0;
    for (i, &(index, batch_rows, rows)) in grouped.iter().enumerate() {
        assert_eq!(index, next, "{grouped:?}");
        let last = i + 1 == grouped.len();
        match batch_rows {
            0 => assert!(rows == 100 || (last && rows == 50), "{grouped:?}"),
            100 => assert!(rows > 100 && (rows % 100 == 0 || last), "{grouped:?}"),
            _ => panic!("{grouped:?}"),
        }
        next += rows.div_ceil(100);
    }
    assert_eq!(next, 11);
    let (alone, wakeups) = messages_on(&ns.0, "alone", &sql("alone", "1"));
    let expected: Vec<_> = (0..11u64)
        .map(|i| (i, 0, if i == 10 { 50 } else { 100 }))
        .collect();
    assert_eq!(alone, expected);
    // The 11 messages were cut from one DataFusion batch, ready at once: they went out
    // as bursts, each waking the subscriber once (the epoch's end and the stream's wake
    // it too).
    assert!(
        (1..11).contains(&wakeups),
        "{wakeups} wake-ups for 11 messages"
    );

    // Through the delivery protocol: batches of 100 at indexes 0 to 10, each in place in
    // the sample of the message it came in.
    let producer = spawn_producer(ns.0.clone(), sql("cut", "'auto'"));
    let mut sub = Subscriber::connect(
        "cut",
        SubscribeOptions {
            timeout: Some(Duration::from_secs(30)),
            namespace: Some(ns.0.clone()),
            ..SubscribeOptions::default()
        },
    )
    .unwrap();
    let mut seen = Vec::new();
    loop {
        match sub.next_event().unwrap() {
            Event::Batch {
                index,
                batch,
                shm_range,
                ..
            } => {
                let range = shm_range.expect("a batch cut from a message is zero-copy");
                assert!(sluice::lies_within(&batch, &range));
                let v = batch.column(0).as_primitive::<Int64Type>();
                seen.push((index, v.len(), v.value(0)));
            }
            Event::EpochEnd(summary) => {
                assert!(summary.complete, "{summary:?}");
                assert_eq!((summary.batches, summary.received_batches), (11, 11));
            }
            Event::DeviceBatch { .. } => panic!("a CPU topic sent a GPU batch"),
            Event::End => break,
        }
    }
    let expected: Vec<_> = (0..11u64)
        .map(|i| (i, if i == 10 { 50 } else { 100 }, i as i64 * 100 + 1))
        .collect();
    assert_eq!(seen, expected);
    drop(sub);
    producer.join().unwrap().unwrap();
}

/// A subscriber that never finds a producer gives up with a timeout error.
#[test]
fn connecting_without_a_producer_times_out() {
    let ns = TestNamespace::new();
    let err = Subscriber::connect(
        "nobody",
        SubscribeOptions {
            timeout: Some(Duration::from_millis(300)),
            namespace: Some(ns.0.clone()),
            ..SubscribeOptions::default()
        },
    )
    .unwrap_err();
    assert!(matches!(err, SluiceError::Timeout { .. }), "{err}");
}

/// An empty result is an empty epoch, not a hang: the subscriber sees the epoch end and
/// the stream end.
#[test]
fn empty_results_give_empty_epochs() {
    let ns = TestNamespace::new();
    let sql = "SET sluice.topic = 'empty'; SET sluice.epochs = 2;\n\
               SELECT value FROM generate_series(1, 10) WHERE value > 100"
        .to_string();
    let producer = spawn_producer(ns.0.clone(), sql);
    let mut sub = Subscriber::connect(
        "empty",
        SubscribeOptions {
            timeout: Some(Duration::from_secs(30)),
            namespace: Some(ns.0.clone()),
            ..SubscribeOptions::default()
        },
    )
    .unwrap();
    let mut ends = Vec::new();
    loop {
        match sub.next_event().unwrap() {
            Event::Batch { .. } => panic!("no batch expected"),
            Event::DeviceBatch { .. } => panic!("a CPU topic sent a GPU batch"),
            Event::EpochEnd(s) => ends.push((s.epoch, s.rows, s.complete)),
            Event::End => break,
        }
    }
    assert_eq!(ends, vec![(0, 0, true), (1, 0, true)]);
    drop(sub);
    producer.join().unwrap().unwrap();
}

/// A subscriber may choose any batch size: every row arrives exactly once, batches are
/// exactly that size but the last of each epoch, and batches that fall inside one
/// producer batch are still zero-copy.
#[test]
fn subscribers_choose_their_own_batch_size() {
    let ns = TestNamespace::new();
    let sql = "SET sluice.topic = 'sizes'; SET sluice.batch_rows = 100; SET sluice.epochs = 2;\n\
               SELECT value AS v, CAST(value AS VARCHAR) AS s FROM generate_series(1, 1000)"
        .to_string();
    let rt = tokio::runtime::Runtime::new().unwrap();
    let expected = rt
        .block_on(async { Plan::from_sql("t.sql", &sql).await?.checksum().await })
        .unwrap();
    for batch_size in [1usize, 7, 64, 100, 250, 5000] {
        let producer = spawn_producer(ns.0.clone(), sql.clone());
        let mut sub = Subscriber::connect(
            "sizes",
            SubscribeOptions {
                timeout: Some(Duration::from_secs(30)),
                namespace: Some(ns.0.clone()),
                batch_size: Some(batch_size),
                ..SubscribeOptions::default()
            },
        )
        .unwrap();
        let mut epochs = Vec::new();
        let mut sum = Checksum::default();
        let mut sizes = Vec::new();
        let mut zero_copy = 0;
        loop {
            match sub.next_event().unwrap() {
                Event::Batch {
                    batch, shm_range, ..
                } => {
                    sum.update(&batch).unwrap();
                    sizes.push(batch.num_rows());
                    if let Some(range) = shm_range {
                        assert!(sluice::lies_within(&batch, &range));
                        zero_copy += 1;
                    }
                }
                Event::DeviceBatch { .. } => panic!("a CPU topic sent a GPU batch"),
                Event::EpochEnd(s) => {
                    assert!(s.complete, "{s:?}");
                    assert_eq!(s.received_rows, 1000);
                    assert_eq!(sum, expected, "batch size {batch_size}");
                    let (last, rest) = sizes.split_last().unwrap();
                    assert!(rest.iter().all(|&n| n == batch_size.min(1000)), "{sizes:?}");
                    assert_eq!(*last, 1000 - rest.len() * batch_size.min(1000));
                    assert_eq!(s.received_batches as usize, sizes.len());
                    epochs.push(s.epoch);
                    sum = Checksum::default();
                    sizes.clear();
                }
                Event::End => break,
            }
        }
        assert_eq!(epochs, vec![0, 1]);
        if batch_size <= 100 && 100 % batch_size == 0 {
            assert_eq!(zero_copy, 2 * 1000 / batch_size, "batch size {batch_size}");
        }
        drop(sub);
        producer.join().unwrap().unwrap();
    }
}

fn epoch_orders(ns: &Namespace, topic: &str, sql: &str) -> Vec<Vec<i64>> {
    let producer = spawn_producer(ns.clone(), sql.to_string());
    let mut sub = Subscriber::connect(
        topic,
        SubscribeOptions {
            timeout: Some(Duration::from_secs(30)),
            namespace: Some(ns.clone()),
            ..SubscribeOptions::default()
        },
    )
    .unwrap();
    let mut epochs = vec![Vec::new()];
    loop {
        match sub.next_event().unwrap() {
            Event::Batch { batch, .. } => epochs.last_mut().unwrap().extend(
                batch
                    .column(0)
                    .as_primitive::<Int64Type>()
                    .values()
                    .iter()
                    .copied(),
            ),
            Event::DeviceBatch { .. } => panic!("a CPU topic sent a GPU batch"),
            Event::EpochEnd(_) => epochs.push(Vec::new()),
            Event::End => break,
        }
    }
    epochs.pop();
    drop(sub);
    producer.join().unwrap().unwrap();
    epochs
}

/// With a shuffle seed, each epoch's order is a function of the seed and the epoch:
/// the same on every run, different between epochs, and a permutation of the source.
#[test]
fn seeded_shuffle_is_reproducible_and_differs_per_epoch() {
    let ns = TestNamespace::new();
    let sql = |seed: &str| {
        format!(
            "SET sluice.topic = 'shuf'; SET sluice.batch_rows = 128; SET sluice.epochs = 3;\n\
             {seed}\nSET datafusion.execution.batch_size = 100;\n\
             SELECT value AS v FROM generate_series(0, 2999)"
        )
    };
    let shuffled = sql("SET sluice.shuffle_seed = 42; SET sluice.shuffle_buffer = 500;");
    let a = epoch_orders(&ns.0, "shuf", &shuffled);
    let b = epoch_orders(&ns.0, "shuf", &shuffled);
    assert_eq!(a.len(), 3);
    assert_eq!(a, b, "same seed, same order");
    assert_ne!(a[0], a[1]);
    assert_ne!(a[1], a[2]);
    let source: Vec<i64> = (0..3000).collect();
    for epoch in &a {
        assert_ne!(epoch, &source);
        let mut sorted = epoch.clone();
        sorted.sort_unstable();
        assert_eq!(sorted, source);
    }
    let plain = epoch_orders(&ns.0, "shuf", &sql(""));
    assert!(
        plain.iter().all(|e| e == &source),
        "no seed keeps source order"
    );
}

/// What one subscriber thread saw: every value of column 0 in order, and per epoch
/// whether it was complete.
struct Seen {
    values: Vec<i64>,
    complete: Vec<bool>,
}

/// Makes a reader stop after `after` batches, say so on `reached`, and wait for `resume`.
struct Pause {
    after: usize,
    reached: std::sync::mpsc::Sender<()>,
    resume: std::sync::mpsc::Receiver<()>,
}

fn read_all(mut sub: Subscriber, pause_after: Option<Pause>) -> Seen {
    let mut seen = Seen {
        values: Vec::new(),
        complete: Vec::new(),
    };
    let mut batches = 0;
    let (pause_at, pause) = match pause_after {
        Some(pause) => (Some(pause.after), Some(pause)),
        None => (None, None),
    };
    loop {
        match sub.next_event().unwrap() {
            Event::Batch { batch, .. } => {
                let col = batch.column(0).as_primitive::<Int64Type>();
                seen.values.extend(col.values().iter().copied());
                batches += 1;
                if Some(batches) == pause_at
                    && let Some(pause) = &pause
                {
                    pause.reached.send(()).unwrap();
                    pause.resume.recv().unwrap();
                }
            }
            Event::DeviceBatch { .. } => panic!("a CPU topic sent a GPU batch"),
            Event::EpochEnd(summary) => seen.complete.push(summary.complete),
            Event::End => return seen,
        }
    }
}

/// `join = replay` starts with the messages the producer still holds (a window's worth)
/// while `join = now` starts with the next one: a replaying subscriber that attaches
/// with a `now` subscriber starts earlier, and both then receive every later row once,
/// in order.
#[test]
fn replay_starts_with_the_messages_the_producer_still_holds() {
    let ns = TestNamespace::new();
    // One batch per message: the window counts messages, and this test counts batches.
    let sql = "SET sluice.topic = 'replay'; SET sluice.batch_rows = 100; SET sluice.window = 4;\n\
               SET sluice.message_batches = 1;\n\
               SELECT value AS v FROM generate_series(0, 9999)"
        .to_string();
    let producer = spawn_producer(ns.0.clone(), sql);
    let options = |join| SubscribeOptions {
        timeout: Some(Duration::from_secs(30)),
        namespace: Some(ns.0.clone()),
        join,
        ..SubscribeOptions::default()
    };
    // The pace-setter reads 10 batches, then stops until told: the producer blocks with
    // a full window.
    let pacer = Subscriber::connect("replay", options(Join::Now)).unwrap();
    let (go, resume) = std::sync::mpsc::channel();
    let (reached, paused) = std::sync::mpsc::channel();
    let pause = Pause {
        after: 10,
        reached,
        resume,
    };
    let pacer = std::thread::spawn(move || read_all(pacer, Some(pause)));
    paused.recv().unwrap();
    // Give the producer time to fill its window behind the paused pacer.
    std::thread::sleep(Duration::from_millis(300));
    let replay = Subscriber::connect("replay", options(Join::Replay)).unwrap();
    let now = Subscriber::connect("replay", options(Join::Now)).unwrap();
    let replay = std::thread::spawn(move || read_all(replay, None));
    let now = std::thread::spawn(move || read_all(now, None));
    std::thread::sleep(Duration::from_millis(100));
    go.send(()).unwrap();
    let pacer = pacer.join().unwrap();
    let (replay, now) = (replay.join().unwrap(), now.join().unwrap());
    producer.join().unwrap().unwrap();

    assert_eq!(pacer.values, (0..10_000).collect::<Vec<i64>>());
    assert_eq!(pacer.complete, vec![true]);
    // Batch indexes count this subscriber's batches; the rows tell the producer's.
    let (r, n) = (replay.values[0] / 100, now.values[0] / 100);
    assert!(r < n, "replay started at batch {r}, now at batch {n}");
    assert!(
        n - r <= 4,
        "replay reaches back at most a window: {r} vs {n}"
    );
    for (seen, first) in [(&replay, r), (&now, n)] {
        let start = first * 100;
        assert_eq!(seen.values, (start..10_000).collect::<Vec<i64>>());
        assert_eq!(seen.complete, vec![first == 0]);
    }
}

/// A subscriber that names its columns receives those, in its order, decoded in place
/// from the sample, with every row exactly once, in any batch size; another subscriber
/// of the same stream still receives every column. A name the topic lacks fails the
/// first event with a configuration error that lists the topic's columns, and the
/// subscriber leaves the topic.
#[test]
fn subscribers_receive_the_columns_they_name() {
    let ns = TestNamespace::new();
    let select = |columns: &str| {
        format!(
            "SET sluice.topic = 'cols'; SET sluice.batch_rows = 100; SET sluice.epochs = 2;\n\
             SELECT {columns} FROM (SELECT value AS v, CAST(value AS VARCHAR) AS s, \
             make_array(value, value + 1) AS l FROM generate_series(1, 1050))"
        )
    };
    let rt = tokio::runtime::Runtime::new().unwrap();
    let checksum = |sql: String| {
        rt.block_on(async { Plan::from_sql("t.sql", &sql).await?.checksum().await })
            .unwrap()
    };
    let (whole, projected) = (
        checksum(select("v, s, l")).hex(),
        checksum(select("l, v")).hex(),
    );
    // All four, the one that will fail among them.
    let producer = spawn_producer_for(ns.0.clone(), select("v, s, l"), 4);
    let connect = |columns: Columns, batch_size: Option<usize>| {
        Subscriber::connect(
            "cols",
            SubscribeOptions {
                timeout: Some(Duration::from_secs(30)),
                namespace: Some(ns.0.clone()),
                batch_size,
                columns,
                ..SubscribeOptions::default()
            },
        )
        .unwrap()
    };
    let mut wrong = connect(Columns::named(["v", "label"]), None);
    let readers: Vec<_> = [
        (Columns::All, None),
        (Columns::named(["l", "v"]), None),
        (Columns::named(["l", "v"]), Some(37)),
    ]
    .into_iter()
    .map(|(columns, batch_size)| {
        let mut sub = connect(columns, batch_size);
        std::thread::spawn(move || {
            let mut sums = Vec::new();
            let mut sum = Checksum::default();
            let mut names = std::collections::BTreeSet::new();
            let mut zero_copy = 0;
            loop {
                match sub.next_event().unwrap() {
                    Event::Batch {
                        batch, shm_range, ..
                    } => {
                        names.insert(
                            batch
                                .schema()
                                .fields()
                                .iter()
                                .map(|f| f.name().clone())
                                .collect::<Vec<_>>()
                                .join(","),
                        );
                        if let Some(range) = shm_range {
                            assert!(sluice::lies_within(&batch, &range));
                            zero_copy += 1;
                        }
                        sum.update(&batch).unwrap();
                    }
                    Event::DeviceBatch { .. } => panic!("a CPU topic sent a GPU batch"),
                    Event::EpochEnd(s) => {
                        assert!(s.complete, "{s:?}");
                        assert_eq!(s.received_rows, 1050);
                        sums.push(std::mem::take(&mut sum).hex());
                    }
                    Event::End => break,
                }
            }
            (sums, names, zero_copy)
        })
    })
    .collect();
    match wrong.next_event() {
        Err(SluiceError::Config(what)) => {
            assert!(what.contains("'label'"), "{what}");
            assert!(what.contains("v, s, l"), "{what}");
        }
        other => panic!("expected a configuration error, got {other:?}"),
    }
    // It left the topic: the others get the whole stream without waiting for it.
    let results: Vec<_> = readers.into_iter().map(|r| r.join().unwrap()).collect();
    producer.join().unwrap().unwrap();
    assert_eq!(results[0].0, vec![whole.clone(), whole]);
    assert_eq!(results[0].1, ["v,s,l".to_string()].into());
    for (sums, names, zero_copy) in &results[1..] {
        assert_eq!(*sums, vec![projected.clone(), projected.clone()]);
        assert_eq!(*names, ["l,v".to_string()].into());
        assert!(*zero_copy > 0);
    }
    // Producer-sized batches are all zero-copy.
    assert_eq!(results[1].2, 22);
}
