//! Transport tests against real shared memory, producer and subscriber in one process.

use std::sync::Arc;
use std::sync::atomic::AtomicBool;
use std::time::{Duration, Instant};

use arrow::array::{ArrayRef, Int64Array};
use arrow::record_batch::RecordBatch;
use sluice_core::{FrameKind, SluiceError, TopicName, wire};

use crate::{
    BatchForm, Frame, FrameHeader, Namespace, TopicConfig, TopicPublisher, TopicSubscriber,
};

fn namespace(tag: &str) -> Namespace {
    Namespace::new(&format!("shm{}{tag}", std::process::id())).unwrap()
}

/// A topic "t" without a lag limit.
fn config(window: usize, max_subscribers: usize, max_held: usize, bytes: usize) -> TopicConfig {
    TopicConfig {
        topic: TopicName::new("t").unwrap(),
        window,
        max_subscribers,
        max_held,
        max_message_bytes: bytes,
        lag_limit: None,
    }
}

fn pair(ns: &Namespace, topic: &str) -> (TopicPublisher, TopicSubscriber) {
    let topic = TopicName::new(topic).unwrap();
    let config = TopicConfig {
        topic: topic.clone(),
        ..config(4, 2, 2, 4096)
    };
    let publisher = TopicPublisher::create(ns, config, Arc::new(AtomicBool::new(false))).unwrap();
    let subscriber =
        TopicSubscriber::connect(ns, &topic, Some(Duration::from_secs(10)), false).unwrap();
    (publisher, subscriber)
}

fn batch() -> RecordBatch {
    RecordBatch::try_from_iter([(
        "v",
        Arc::new(Int64Array::from_iter_values(0..10)) as ArrayRef,
    )])
    .unwrap()
}

fn recv(sub: &mut TopicSubscriber) -> Result<Frame, SluiceError> {
    sub.recv(Some(Duration::from_secs(10)))
}

/// Waits (10 s at most) until `done`.
fn eventually(mut done: impl FnMut() -> bool, what: &str) {
    let start = std::time::Instant::now();
    while !done() {
        assert!(start.elapsed() < Duration::from_secs(10), "{what}");
        std::thread::sleep(Duration::from_millis(10));
    }
}

/// Garbage in shared memory is reported as `Corrupt`, never a crash, and the subscriber
/// keeps working for the messages after it.
#[test]
fn corrupt_messages_are_errors_and_the_stream_goes_on() {
    let ns = namespace("c");
    {
        let (mut publisher, mut sub) = pair(&ns, "corrupt");
        let good = wire::encode(&batch()).unwrap();
        let garbage: Vec<u8> = (0..good.len()).map(|i| (i * 7 + 3) as u8).collect();
        let header = |kind: u32, rows: u64, len: u64| FrameHeader {
            kind,
            rows,
            len,
            ..Default::default()
        };

        publisher
            .send(
                header(FrameKind::Batch as u32, 10, garbage.len() as u64),
                garbage.len(),
                |dst| {
                    for (d, s) in dst.iter_mut().zip(&garbage) {
                        d.write(*s);
                    }
                    Ok(())
                },
            )
            .unwrap();
        assert!(matches!(recv(&mut sub), Err(SluiceError::Corrupt(_))));

        publisher.publish_batch(0, 0, 10, &good).unwrap();
        assert!(matches!(recv(&mut sub), Ok(Frame::Batch { .. })));

        publisher.send(header(99, 0, 0), 0, |_| Ok(())).unwrap();
        let err = recv(&mut sub).unwrap_err();
        assert!(err.to_string().contains("unknown frame kind 99"), "{err}");

        // The header claims more rows than the batch holds.
        publisher
            .send(
                header(FrameKind::Batch as u32, 11, good.len() as u64),
                good.len(),
                |dst| good.write_to(dst),
            )
            .unwrap();
        let err = recv(&mut sub).unwrap_err();
        assert!(err.to_string().contains("header says 11"), "{err}");

        // The header claims more bytes than the sample has.
        publisher
            .send(
                header(FrameKind::Batch as u32, 10, 1 << 40),
                good.len(),
                |dst| good.write_to(dst),
            )
            .unwrap();
        let err = recv(&mut sub).unwrap_err();
        assert!(err.to_string().contains("claims"), "{err}");

        publisher.publish_end_of_stream(1).unwrap();
        assert!(matches!(recv(&mut sub), Ok(Frame::EndOfStream)));
    }
    let left = ns.leftovers();
    ns.purge();
    assert!(left.is_empty(), "{left:?}");
}

/// The producer refuses a topic that needs more shared memory than /dev/shm has.
#[test]
fn a_topic_larger_than_dev_shm_is_refused_before_anything_is_created() {
    let ns = namespace("big");
    let config = TopicConfig {
        topic: TopicName::new("huge").unwrap(),
        window: 1 << 20,
        max_subscribers: 1 << 20,
        max_held: 1,
        max_message_bytes: 1 << 20,
        lag_limit: None,
    };
    let err = TopicPublisher::create(&ns, config, Arc::new(AtomicBool::new(false))).unwrap_err();
    assert!(matches!(err, SluiceError::ShmTooSmall { .. }), "{err}");
    assert!(
        err.to_string().contains("lower sluice.max_subscribers"),
        "{err}"
    );
    let left = ns.leftovers();
    ns.purge();
    assert!(left.is_empty(), "{left:?}");
}

/// Sizing: every chunk a subscriber may queue, hold, or receive to copy beyond what it
/// holds, the replay history, plus the producer's loans.
#[test]
fn shared_memory_is_sized_for_the_worst_case() {
    let config = config(8, 4, 2, 1000);
    assert_eq!(config.history(), 8);
    assert_eq!(config.chunks(), 4 * (8 + 2 + 1) + 8 + 2);
    assert_eq!(config.shm_bytes(), 54 * (1000 + 256));
    // Absurd options saturate (the topic is then too large for any /dev/shm), never
    // overflow.
    let absurd = TopicConfig {
        window: usize::MAX / 2,
        max_subscribers: usize::MAX,
        ..config
    };
    assert_eq!((absurd.chunks(), absurd.shm_bytes()), (u64::MAX, u64::MAX));
}

/// A message larger than planned grows the topic (a segment of as many chunks, each the
/// next power of two), unless `/dev/shm` cannot hold it: then an error that says what to
/// lower, not a SIGBUS when the producer writes pages that do not exist.
#[test]
fn a_topic_grows_for_a_larger_message_only_if_dev_shm_holds_it() {
    let config = config(8, 4, 2, 4096);
    let grown = config.grown_for(5000, u64::MAX).unwrap();
    assert_eq!(grown.max_message_bytes, 8192);
    assert_eq!(grown.shm_bytes(), config.chunks() * (8192 + 256));
    assert_eq!(
        config
            .grown_for(5000, grown.shm_bytes())
            .unwrap()
            .max_message_bytes,
        8192
    );
    match config.grown_for(5000, grown.shm_bytes() - 1) {
        Err(SluiceError::ShmTooSmall {
            needed, available, ..
        }) => {
            assert_eq!(
                (needed, available),
                (grown.shm_bytes(), grown.shm_bytes() - 1)
            );
        }
        other => panic!("expected ShmTooSmall, got {other:?}"),
    }
}

/// Messages of several batches may make a topic larger only where `/dev/shm` has room:
/// up to what one batch per message takes, or an eighth of the free shared memory.
#[test]
fn larger_messages_fit_beside_single_batches_only_where_dev_shm_has_room() {
    const MIB: usize = 1 << 20;
    // The benchmark's 107 KiB batches, planned with half again; 9 of them per message.
    let planned = |batches: usize| batches * 160 * 1024;
    let sized = |batches: usize, shm_free: u64| {
        let mut topic = config(1, 16, 4, planned(batches));
        topic.window = topic.auto_window(2, shm_free);
        topic
    };
    let plenty = 24 << 30;
    let single = sized(1, plenty);
    assert!(sized(9, plenty).fits_beside(&single, plenty));
    assert!(sized(9, plenty).shm_bytes() > single.shm_bytes());
    // A container's 64 MiB: only what fitted with one batch per message.
    let small = 64 * MIB as u64;
    let single = sized(1, small);
    assert!(single.fits_beside(&single, small));
    assert!(!sized(9, small).fits_beside(&single, small));
    assert!(!sized(2, small).fits_beside(&single, small));
}

/// `sluice.window = 'auto'`: about 2 MiB of queue per core (4 to 32 MiB), 4 to 128
/// messages, a power of two, within an eighth of the free shared memory.
#[test]
fn the_auto_window_is_sized_in_bytes_by_cores_and_bounded_by_dev_shm() {
    const MIB: usize = 1 << 20;
    let topic = |max_message_bytes: usize| config(1, 16, 4, max_message_bytes);
    let plenty = 64 << 30;
    // The benchmark's 1 024-row batches (107 KiB, planned with half again: 160 KiB).
    let batch = 160 * 1024;
    // 2 cores: a 4 MiB queue holds 25 such messages.
    assert_eq!(topic(batch).auto_window(2, plenty), 16);
    // 16 cores: 32 MiB, 204 messages, at most 128.
    assert_eq!(topic(batch).auto_window(16, plenty), 128);
    // More cores do not raise the queue past 32 MiB.
    assert_eq!(topic(4 * MIB).auto_window(256, plenty), 4);
    // (Each chunk carries 256 bytes of bookkeeping besides the message.)
    assert_eq!(topic(2 * MIB - 256).auto_window(256, plenty), 16);
    assert_eq!(topic(2 * MIB).auto_window(256, plenty), 8);
    // Large batches: never fewer than 4; small ones: never more than 128.
    assert_eq!(topic(8 * MIB).auto_window(2, plenty), 4);
    assert_eq!(topic(100).auto_window(2, plenty), 128);
    // A small /dev/shm (a container's 64 MiB): the topic keeps to an eighth of it (room
    // to grow when a batch is larger than planned), never below 4 messages.
    let small = 64 * MIB as u64;
    assert_eq!(topic(batch).auto_window(16, small), 4);
    let window = topic(4 * 1024).auto_window(16, small);
    assert_eq!(window, 64);
    let sized = |window| {
        TopicConfig {
            window,
            ..topic(4 * 1024)
        }
        .shm_bytes()
    };
    assert!(sized(window) <= small / 8, "{window}: {}", sized(window));
    assert!(
        sized(window * 2) > small / 8,
        "{window} could have been doubled"
    );
    // Nothing free at all: the least window (the topic then fails to be created, with
    // the size it needs).
    assert_eq!(topic(batch).auto_window(16, 0), 4);
}

/// Device messages carry their descriptor's bytes, and the chunk a message went out in is
/// not loaned again while any subscriber holds that message: the guarantee sluice-cuda's
/// slot ledger binds device slots to.
#[test]
fn a_held_device_message_keeps_its_chunk_until_released() {
    let ns = namespace("dev");
    {
        let (mut publisher, mut sub) = pair(&ns, "device");
        let chunks = publisher.config().chunks() as usize;
        let mut loaned = Vec::new();
        let publish = |publisher: &mut TopicPublisher, i: u64| {
            let mut chunk = 0;
            publisher
                .publish_device_batch(0, i, 3, |c| {
                    chunk = c;
                    Ok(format!("descriptor {i}").into_bytes())
                })
                .unwrap();
            chunk
        };
        let held_chunk = publish(&mut publisher, 0);
        loaned.push(held_chunk);
        let held = match recv(&mut sub).unwrap() {
            Frame::DeviceBatch {
                index: 0,
                rows: 3,
                payload,
                ..
            } => payload,
            other => panic!("expected device batch 0, got {other:?}"),
        };
        assert_eq!(held.bytes(), b"descriptor 0");
        // Many times the topic's chunks go by; the held one never comes back.
        for i in 1..(4 * chunks as u64) {
            let chunk = publish(&mut publisher, i);
            assert_ne!(chunk, held_chunk, "message {i} reused a held chunk");
            loaned.push(chunk);
            match recv(&mut sub).unwrap() {
                Frame::DeviceBatch { index, payload, .. } => {
                    assert_eq!(index, i);
                    assert_eq!(payload.bytes(), format!("descriptor {i}").as_bytes());
                }
                other => panic!("expected device batch {i}, got {other:?}"),
            }
        }
        // Chunks do come back (so the test above could fail): four rounds of the topic
        // went through at most its chunks. The held one comes back once it is released
        // and the history has moved past it.
        loaned.sort_unstable();
        loaned.dedup();
        assert!(
            loaned.len() <= chunks,
            "{} chunks for {chunks}",
            loaned.len()
        );
        drop(held);
        let back = (0..2 * chunks as u64).any(|i| {
            let chunk = publish(&mut publisher, 1000 + i);
            let _ = recv(&mut sub).unwrap();
            chunk == held_chunk
        });
        assert!(back, "a released chunk was never loaned again");

        // A descriptor larger than the topic's messages is refused, not grown into.
        let too_big = vec![0u8; publisher.config().max_message_bytes + 1];
        let err = publisher
            .publish_device_batch(0, 0, 1, |_| Ok(too_big))
            .unwrap_err();
        assert!(err.to_string().contains("does not fit"), "{err}");
        publisher.publish_end_of_stream(1).unwrap();
        assert!(matches!(recv(&mut sub), Ok(Frame::EndOfStream)));
    }
    let left = ns.leftovers();
    ns.purge();
    assert!(left.is_empty(), "{left:?}");
}

/// A subscriber that leaves while it holds batches (host or device) keeps its port, so
/// that the producer does not reuse their chunks, and registers its departure, so that
/// the producer neither counts it nor waits for it; the port goes with the last batch.
#[test]
fn a_subscriber_that_leaves_holding_batches_keeps_its_port_but_is_not_counted() {
    let ns = namespace("att");
    {
        let (mut publisher, mut sub) = pair(&ns, "attached");
        publisher
            .publish_batch(0, 0, 10, &wire::encode(&batch()).unwrap())
            .unwrap();
        let host = recv(&mut sub).unwrap();
        publisher
            .publish_device_batch(0, 1, 3, |_| Ok(b"descriptor".to_vec()))
            .unwrap();
        let device = match recv(&mut sub).unwrap() {
            Frame::DeviceBatch { payload, .. } => payload,
            other => panic!("expected a device batch, got {other:?}"),
        };
        assert_eq!(publisher.subscribers(), 1);
        // This subscriber is in the producer's process: a device producer does not wait
        // for it before freeing its slots (its views keep them alive themselves).
        assert_eq!(publisher.subscribers_in_other_processes(), 0);
        let port = sub.port_id().unwrap();
        sub.detach();
        // The producer reads departures at most every 50 ms.
        eventually(
            || publisher.subscribers() == 0,
            "a departed subscriber was counted",
        );
        assert_eq!(
            publisher.departed_subscribers(),
            1,
            "the port went with the detach"
        );
        let departed = crate::departed_subscribers(&ns, &TopicName::new("attached").unwrap());
        assert_eq!(departed.len(), 1);
        assert_eq!((departed[0].port, departed[0].held), (port, 2));
        drop(device);
        let departed = crate::departed_subscribers(&ns, &TopicName::new("attached").unwrap());
        assert_eq!(
            departed[0].held, 1,
            "the count of held batches was not updated"
        );
        assert_eq!(publisher.departed_subscribers(), 1);
        drop(host);
        assert_eq!(
            publisher.departed_subscribers(),
            0,
            "the last batch kept the port"
        );
        assert!(crate::departed_subscribers(&ns, &TopicName::new("attached").unwrap()).is_empty());
    }
    let left = ns.leftovers();
    ns.purge();
    assert!(left.is_empty(), "{left:?}");
}

/// What a subscriber keeps after leaving is never loaned again while the producer goes
/// on, for as long as it is kept (the chunk reuse that changed trainers' views), and the
/// producer does not wait for the departed subscriber's full queue.
#[test]
fn batches_kept_after_leaving_keep_their_chunks_while_the_producer_goes_on() {
    let ns = namespace("keep");
    {
        let (mut publisher, mut sub) = pair(&ns, "keep");
        let encoded = wire::encode(&batch()).unwrap();
        publisher.publish_batch(0, 0, 10, &encoded).unwrap();
        let kept = match recv(&mut sub).unwrap() {
            Frame::Batch {
                batch, shm_range, ..
            } => (batch, shm_range.unwrap()),
            other => panic!("expected a batch, got {other:?}"),
        };
        let before = sluice_core::rebatch::deep_copy(&kept.0).unwrap();
        sub.detach();
        drop(sub);
        // Many times the topic's chunks: without a live subscriber nothing waits, and
        // every chunk but the kept one is loaned again and again.
        let chunks = publisher.config().chunks();
        for i in 1..=(8 * chunks) {
            let other = RecordBatch::try_from_iter([(
                "v",
                Arc::new(Int64Array::from_iter_values(
                    (0..10).map(|v| v * 1000 + i as i64),
                )) as ArrayRef,
            )])
            .unwrap();
            publisher
                .publish_batch(0, i, 10, &wire::encode(&other).unwrap())
                .unwrap();
        }
        assert_eq!(
            kept.0, before,
            "a kept batch changed after its subscriber left"
        );
        assert!(kept.1.start < kept.1.end);
        drop(kept);
        assert_eq!(publisher.departed_subscribers(), 0);
    }
    let left = ns.leftovers();
    ns.purge();
    assert!(left.is_empty(), "{left:?}");
}

/// Beyond `max_held`, batches arrive as private copies (no sample range) and their
/// samples go back at once; with `OnMaxHeld::Error`, receiving fails and loses nothing.
#[test]
fn batches_beyond_max_held_are_private_copies_or_an_error() {
    let ns = namespace("held");
    {
        let topic = TopicName::new("held").unwrap();
        let config = TopicConfig {
            topic: topic.clone(),
            ..config(8, 2, 2, 4096)
        };
        let mut publisher =
            TopicPublisher::create(&ns, config, Arc::new(AtomicBool::new(false))).unwrap();
        let mut sub =
            TopicSubscriber::connect(&ns, &topic, Some(Duration::from_secs(10)), false).unwrap();
        let encoded = wire::encode(&batch()).unwrap();
        for i in 0..6 {
            publisher.publish_batch(0, i, 10, &encoded).unwrap();
        }
        let mut held = Vec::new();
        for i in 0..4 {
            match recv(&mut sub).unwrap() {
                Frame::Batch {
                    index,
                    batch,
                    shm_range,
                    ..
                } => {
                    assert_eq!(index, i);
                    assert_eq!(batch, self::batch());
                    // The first two are in shared memory, the next ones copies.
                    assert_eq!(shm_range.is_some(), i < 2, "batch {i}");
                    held.push(batch);
                }
                other => panic!("expected batch {i}, got {other:?}"),
            }
            assert_eq!(sub.held(), (i as usize + 1).min(2));
        }
        sub.set_on_max_held(crate::OnMaxHeld::Error);
        let err = recv(&mut sub).unwrap_err();
        assert!(err.to_string().contains("sluice.max_held = 2"), "{err}");
        held.truncate(1);
        match recv(&mut sub).unwrap() {
            Frame::Batch {
                index, shm_range, ..
            } => {
                assert_eq!(index, 4, "the failed receive lost a message");
                assert!(shm_range.is_some());
            }
            other => panic!("expected batch 4, got {other:?}"),
        }
        drop(held);
        publisher.publish_end_of_stream(1).unwrap();
        let _ = recv(&mut sub).unwrap();
    }
    let left = ns.leftovers();
    ns.purge();
    assert!(left.is_empty(), "{left:?}");
}

/// A subscriber that attaches after the end of the stream, while the producer lingers,
/// learns of the end at once (and a replaying one gets what the producer still holds),
/// not `ProducerLost` once the producer exits.
#[test]
fn a_subscriber_attaching_while_the_producer_lingers_gets_the_end_of_the_stream() {
    let ns = namespace("linger");
    {
        let (mut publisher, mut first) = pair(&ns, "linger");
        let encoded = wire::encode(&batch()).unwrap();
        publisher.publish_batch(0, 0, 10, &encoded).unwrap();
        publisher.publish_end_of_epoch(0, 1, 10).unwrap();
        publisher.publish_end_of_stream(1).unwrap();
        let topic = TopicName::new("linger").unwrap();
        let late = |replay| {
            let ns = ns.clone();
            let topic = topic.clone();
            std::thread::spawn(move || {
                let mut sub =
                    TopicSubscriber::connect(&ns, &topic, Some(Duration::from_secs(10)), replay)
                        .unwrap();
                let mut kinds = Vec::new();
                loop {
                    match sub.recv(Some(Duration::from_secs(10))).unwrap() {
                        Frame::EndOfStream => break,
                        Frame::Batch { .. } => kinds.push("batch"),
                        Frame::EndOfEpoch { .. } => kinds.push("end of epoch"),
                        other => panic!("unexpected {other:?}"),
                    }
                }
                kinds
            })
        };
        let (now, replay) = (late(false), late(true));
        // The first subscriber has not read the end yet: the producer drains.
        let drained = std::thread::spawn(move || {
            publisher.drain(Duration::from_secs(20));
            publisher
        });
        assert_eq!(now.join().unwrap(), Vec::<&str>::new());
        assert_eq!(replay.join().unwrap(), ["batch", "end of epoch"]);
        while !matches!(recv(&mut first).unwrap(), Frame::EndOfStream) {}
        drop(drained.join().unwrap());
    }
    let left = ns.leftovers();
    ns.purge();
    assert!(left.is_empty(), "{left:?}");
}

/// Batches published as one burst (their wake-up deferred) all arrive, in order, with
/// the subscriber waiting on another thread, also when the burst is longer than the
/// subscriber's queue (the producer then waits for it, paying the owed wake-up first);
/// a burst that never ends with `more = false` is delivered once `flush` runs.
#[test]
fn bursts_arrive_whole_and_in_order() {
    let ns = namespace("b");
    {
        let (mut publisher, mut sub) = pair(&ns, "burst");
        let encoded = wire::encode(&batch()).unwrap();
        let reader = std::thread::spawn(move || {
            let mut indexes = Vec::new();
            while indexes.len() < 41 {
                match recv(&mut sub).unwrap() {
                    Frame::Batch { index, .. } => indexes.push(index),
                    other => panic!("unexpected {other:?}"),
                }
            }
            indexes
        });
        // 40 batches in bursts of 10 (the queue holds 4), then one left owed.
        for index in 0..40u64 {
            let more = index % 10 != 9;
            publisher
                .publish_batch_in_burst(0, index, 10, &encoded, more)
                .unwrap();
        }
        publisher
            .publish_batch_in_burst(0, 40, 10, &encoded, true)
            .unwrap();
        publisher.flush().unwrap();
        let indexes = reader.join().unwrap();
        assert_eq!(indexes, (0..41).collect::<Vec<_>>());
    }
    ns.purge();
}

/// The service directory is on the RAM file system beside the segments, owner-only; a
/// file directly in /dev/shm that others may write is reported, one inside the 0700
/// directory is not (nobody else can reach it).
#[test]
fn service_directory_in_dev_shm_and_owner_only() {
    use std::os::unix::fs::PermissionsExt;

    let ns = namespace("root");
    let (publisher, subscriber) = pair(&ns, "rooted");
    let root = ns.root();
    assert_eq!(
        root.parent(),
        Some(std::path::Path::new(crate::namespace::SHM_DIR))
    );
    let mode = std::fs::metadata(&root).unwrap().permissions().mode() & 0o777;
    assert_eq!(mode, 0o700, "{}", root.display());
    assert!(
        ns.loose_permissions().is_empty(),
        "{:?}",
        ns.loose_permissions()
    );
    // iceoryx2 put the subscriber's event socket there.
    let sockets = std::fs::read_dir(&root)
        .unwrap()
        .flatten()
        .filter(|e| e.file_name().to_string_lossy().ends_with(".event"))
        .count();
    assert!(sockets >= 1, "no event socket in {}", root.display());
    // A root others may enter is reported.
    std::fs::set_permissions(&root, std::fs::Permissions::from_mode(0o777)).unwrap();
    assert_eq!(ns.loose_permissions(), vec![(root.clone(), 0o777)]);
    std::fs::set_permissions(&root, std::fs::Permissions::from_mode(0o700)).unwrap();

    let inside = root.join("inside");
    let outside = std::path::Path::new(crate::namespace::SHM_DIR)
        .join(format!("{}{HASH}_loose", ns.shm_prefix()));
    for path in [&inside, &outside] {
        std::fs::write(path, b"").unwrap();
        std::fs::set_permissions(path, std::fs::Permissions::from_mode(0o666)).unwrap();
    }
    let loose: Vec<_> = ns.loose_permissions().into_iter().map(|(p, _)| p).collect();
    assert_eq!(loose, vec![outside.clone()]);

    std::fs::remove_file(&inside).unwrap();
    std::fs::remove_file(&outside).unwrap();
    drop(subscriber);
    drop(publisher);
    ns.purge();
}

/// A namespace is refused when its event sockets' paths could outgrow a Unix socket
/// address (108 bytes), whatever the listener id; the longest accepted one works.
#[test]
fn namespace_names_fit_a_socket_path() {
    let max = Namespace::max_name_len();
    if std::path::Path::new(crate::namespace::SHM_DIR).is_dir() {
        // "/dev/shm/sluice-<n>/iox2_sluice_<n>_<39 digits>.event" = 75 + 2n bytes.
        assert_eq!(max, 16);
    }
    let err = Namespace::new(&"n".repeat(max + 1))
        .unwrap_err()
        .to_string();
    assert!(err.contains(&format!("1 to {max} characters")), "{err}");
    assert!(Namespace::new(&"n".repeat(32)).is_err());
    assert!(Namespace::new("").is_err());
    assert!(Namespace::new("a/b").is_err());

    // The longest name works end to end: a topic, a subscriber, a batch.
    let name = format!("L{}", std::process::id());
    let ns = Namespace::new(&format!("{name}{}", "x".repeat(max - name.len()))).unwrap();
    let (mut publisher, mut subscriber) = pair(&ns, "long");
    let encoded = wire::encode(&batch()).unwrap();
    publisher.publish_batch(0, 0, 10, &encoded).unwrap();
    assert!(matches!(
        subscriber.recv(Some(Duration::from_secs(10))),
        Ok(Frame::Batch { .. })
    ));
    drop(subscriber);
    drop(publisher);
    ns.purge();
}

/// A subscriber of encoded batches gets the producer's bytes as they were written;
/// unchecked, even garbage in a batch message is handed over as it is (for the reader
/// elsewhere to refuse), validated, it is an error as for decoded batches. Each payload
/// holds its sample: `held` counts it until the last clone is dropped, on whichever
/// thread, and below `max_held` the next receive succeeds.
#[test]
fn encoded_batches_are_the_producers_bytes_and_hold_their_samples() {
    let ns = namespace("e");
    {
        let (mut publisher, mut sub) = pair(&ns, "encoded");
        sub.set_batch_form(BatchForm::EncodedUnchecked);
        assert_eq!(sub.max_held(), 2);
        let good = wire::encode(&batch()).unwrap();
        for index in 0..2 {
            publisher.publish_batch(0, index, 10, &good).unwrap();
        }
        let Ok(Frame::Encoded {
            index: 0,
            rows: 10,
            payload: first,
            ..
        }) = recv(&mut sub)
        else {
            panic!("not an encoded batch");
        };
        assert_eq!(first.bytes(), good.to_vec().as_slice());
        assert_eq!(wire::split(first.bytes()).unwrap().rows, 10);
        assert_eq!(sub.held(), 1);
        let Ok(Frame::Encoded {
            index: 1,
            payload: second,
            ..
        }) = recv(&mut sub)
        else {
            panic!("not an encoded batch");
        };
        assert_eq!(sub.held(), 2);
        // Dropped on another thread, as gRPC's workers drop what they have sent.
        let clone = second.clone();
        std::thread::spawn(move || drop((second, clone)))
            .join()
            .unwrap();
        assert_eq!(sub.held(), 1);

        // Garbage is handed over undecoded; decoding again refuses it.
        let garbage: Vec<u8> = (0..good.len()).map(|i| (i * 7 + 3) as u8).collect();
        let header = FrameHeader {
            kind: FrameKind::Batch as u32,
            rows: 10,
            len: garbage.len() as u64,
            ..Default::default()
        };
        let send_garbage = |publisher: &mut TopicPublisher| {
            publisher
                .send(header, garbage.len(), |dst| {
                    for (d, s) in dst.iter_mut().zip(&garbage) {
                        d.write(*s);
                    }
                    Ok(())
                })
                .unwrap();
        };
        send_garbage(&mut publisher);
        let Ok(Frame::Encoded { payload, .. }) = recv(&mut sub) else {
            panic!("not an encoded batch");
        };
        assert_eq!(payload.bytes(), garbage.as_slice());
        assert!(matches!(
            wire::split(payload.bytes()),
            Err(SluiceError::Corrupt(_))
        ));
        drop((payload, first));
        assert_eq!(sub.held(), 0);

        // Validated: garbage is refused, a good batch handed over encoded.
        sub.set_batch_form(BatchForm::EncodedValidated);
        send_garbage(&mut publisher);
        assert!(matches!(recv(&mut sub), Err(SluiceError::Corrupt(_))));
        publisher.publish_batch(0, 2, 10, &good).unwrap();
        let Ok(Frame::Encoded { payload, .. }) = recv(&mut sub) else {
            panic!("not an encoded batch");
        };
        assert_eq!(payload.bytes(), good.to_vec().as_slice());
        assert_eq!(sub.held(), 1);
        drop(payload);
        assert_eq!(sub.held(), 0);

        sub.set_batch_form(BatchForm::Decoded);
        publisher.publish_batch(0, 3, 10, &good).unwrap();
        assert!(matches!(recv(&mut sub), Ok(Frame::Batch { batch, .. }) if batch == self::batch()));
        publisher.publish_end_of_stream(1).unwrap();
        assert!(matches!(recv(&mut sub), Ok(Frame::EndOfStream)));
    }
    let left = ns.leftovers();
    ns.purge();
    assert!(left.is_empty(), "{left:?}");
}

/// The environment variable that makes [`a_node_of_a_process_to_be_killed`] a helper.
const NODE_HELPER_NAMESPACE: &str = "SLUICE_TEST_NODE_HELPER_NAMESPACE";

/// This test binary, to run only its ignored helper test `name` (a process of its own,
/// that the caller may kill), with `var` set to `value` to tell it what to do; its
/// standard output piped, for what it says.
fn helper(name: &str, var: &str, value: &str) -> std::process::Command {
    let mut command = std::process::Command::new(std::env::current_exe().unwrap());
    command
        .args(["--ignored", "--exact", &format!("tests::{name}")])
        .args(["--nocapture", "--test-threads=1"])
        .env(var, value)
        .stdout(std::process::Stdio::piped());
    command
}

/// Helper process of the liveness test below, run by it from this test binary: creates a
/// node in the namespace it is given, says its id, and waits to be killed.
#[test]
#[ignore = "a helper process of `node_liveness_answers_as_iceoryx2s_state_of_does`"]
fn a_node_of_a_process_to_be_killed() {
    let Ok(name) = std::env::var(NODE_HELPER_NAMESPACE) else {
        return;
    };
    let node = Namespace::new(&name).unwrap().node("producer").unwrap();
    println!("node {}", node.id().value());
    std::thread::sleep(Duration::from_secs(120));
}

/// `Namespace::node_liveness` reads one node's monitor where iceoryx2's `Node::state_of`
/// lists them all: for a live node, a node whose process was SIGKILLed, and a node
/// removed (by the reclaim), both say the same, among other nodes of the namespace.
#[test]
fn node_liveness_answers_as_iceoryx2s_state_of_does() {
    use std::io::BufRead;

    use iceoryx2::prelude::{CallbackProgression, Node, NodeState};

    use crate::Ipc;
    use crate::namespace::Liveness;

    // A short tag: namespace names hold 16 characters, and the process id takes up to 7.
    let ns = namespace("live");
    // Nodes that are not asked about, so that `state_of` has more than one to list.
    let others: Vec<_> = (0..3).map(|_| ns.node("subscriber").unwrap()).collect();
    let state_of = |id| match Node::<Ipc>::state_of(ns.config(), id) {
        Ok(Some(NodeState::Alive(_))) => Liveness::Alive,
        Ok(Some(NodeState::Dead(_)) | None) => Liveness::Gone,
        Ok(Some(_)) | Err(_) => Liveness::Unknown,
    };

    /// Kills the helper at the end, whatever fails before.
    struct Helper(std::process::Child);
    impl Drop for Helper {
        fn drop(&mut self) {
            let _ = self.0.kill();
            let _ = self.0.wait();
        }
    }
    let mut child = Helper(
        helper(
            "a_node_of_a_process_to_be_killed",
            NODE_HELPER_NAMESPACE,
            ns.name(),
        )
        .spawn()
        .unwrap(),
    );
    let stdout = std::io::BufReader::new(child.0.stdout.take().unwrap());
    let value: u128 = stdout
        .lines()
        .map_while(|l| l.ok())
        // libtest writes the test's name on the same line first.
        .find_map(|l| {
            let (_, id) = l.rsplit_once("node ")?;
            Some(id.trim().parse().expect("a node id in decimal"))
        })
        .expect("the helper process said its node id");
    let mut found = None;
    Node::<Ipc>::list(ns.config(), |state| {
        if state.node_id().value() == value {
            found = Some(*state.node_id());
        }
        CallbackProgression::Continue
    })
    .unwrap();
    let helper = found.expect("the helper's node is listed");

    assert_eq!(ns.node_liveness(&helper), Liveness::Alive);
    assert_eq!(state_of(helper), Liveness::Alive);
    assert_eq!(
        monitor_states_as_iceoryx2_lists_them(&ns),
        [Liveness::Alive; 4],
        "the helper's node and this process's three"
    );
    for node in &others {
        assert_eq!(ns.node_liveness(node.id()), Liveness::Alive);
    }

    child.0.kill().unwrap();
    child.0.wait().unwrap();
    assert_eq!(state_of(helper), Liveness::Gone);
    assert_eq!(ns.node_liveness(&helper), Liveness::Gone);
    assert_eq!(
        monitor_states_as_iceoryx2_lists_them(&ns),
        [
            Liveness::Alive,
            Liveness::Alive,
            Liveness::Alive,
            Liveness::Gone
        ]
    );
    assert!(
        ns.reclaim_dead() >= 1,
        "the dead helper's node is reclaimed"
    );
    assert!(matches!(
        Node::<Ipc>::state_of(ns.config(), helper),
        Ok(None)
    ));
    assert_eq!(ns.node_liveness(&helper), Liveness::Gone);

    // The nodes of this process, dropped, are gone too; until then they live.
    let ids: Vec<_> = others.iter().map(|n| *n.id()).collect();
    assert_eq!(ns.node_liveness(&ids[0]), Liveness::Alive);
    drop(others);
    for id in ids {
        assert_eq!(state_of(id), Liveness::Gone);
        assert_eq!(ns.node_liveness(&id), Liveness::Gone);
    }
    ns.purge();
}

/// `Namespace::monitor_states`, sorted, after checking that it finds the monitors that
/// iceoryx2's own listing (`list_cfg` of the node monitoring) finds, with the same states.
fn monitor_states_as_iceoryx2_lists_them(ns: &Namespace) -> Vec<crate::namespace::Liveness> {
    use iceoryx2_cal::named_concept::NamedConceptMgmt;

    use crate::namespace::{Liveness, NodeMonitor, monitor_state};

    let config = ns.monitor_config();
    let mut listed: Vec<Liveness> = <NodeMonitor as NamedConceptMgmt>::list_cfg(&config)
        .unwrap()
        .iter()
        .map(|name| monitor_state(&config, name))
        .collect();
    let mut states = ns.monitor_states().expect("the monitors can be listed");
    listed.sort_by_key(|s| format!("{s:?}"));
    states.sort_by_key(|s| format!("{s:?}"));
    assert_eq!(states, listed);
    states
}

/// A node directory without a monitor (a process killed while creating its node) is
/// removed by a reclaim once it is older than iceoryx2's creation timeout; a younger one,
/// which may be a node being created, and the directories of live nodes stay.
#[test]
fn a_reclaim_removes_an_old_node_directory_without_a_monitor_and_nothing_else() {
    let ns = namespace("unmon");
    let nodes: Vec<_> = (0..3).map(|_| ns.node("subscriber").unwrap()).collect();
    let dir = ns
        .root()
        .join(ns.config().global.node.directory.to_string());
    let details = ns.config().global.node.static_config_suffix.to_string();
    let age = |path: &std::path::Path, age: Duration| {
        std::fs::File::open(path)
            .unwrap()
            .set_modified(std::time::SystemTime::now() - age)
            .unwrap();
    };
    let orphan = |id: &str, how_old: Duration| {
        let path = dir.join(id);
        std::fs::create_dir(&path).unwrap();
        std::fs::write(path.join(format!("node{details}")), b"").unwrap();
        age(&path, how_old);
        path
    };
    let old = orphan("123456789", Duration::from_secs(3600));
    let young = orphan("987654321", Duration::ZERO);
    let live: Vec<_> = nodes
        .iter()
        .map(|n| dir.join(n.id().value().to_string()))
        .collect();
    assert!(
        live.iter().all(|p| p.is_dir()),
        "live nodes have directories"
    );
    // As old as the orphan: only their monitors keep them.
    for path in &live {
        age(path, Duration::from_secs(3600));
    }

    assert_eq!(ns.reclaim_dead(), 1, "the old directory, and only it");
    assert!(!old.exists());
    assert!(young.exists(), "a node may be being created there");
    assert!(live.iter().all(|p| p.is_dir()));
    for node in &nodes {
        assert_eq!(
            ns.node_liveness(node.id()),
            crate::namespace::Liveness::Alive
        );
    }
    drop(nodes);
    ns.purge();
}

/// Tells `a_claimant_to_be_run` which namespace to use and what to do.
const CLAIM_HELPER: &str = "SLUICE_TEST_CLAIM_HELPER";

/// Helper process of the two claim tests below, run by them from this test binary.
/// `fork <namespace>`: claims topic "t", declares interest in it, forks a child that
/// only sleeps, says the child's process id, and waits to be killed. `take <namespace>`:
/// says whether it could claim "t" and how many live subscribers declared interest.
#[test]
#[ignore = "a helper process of the claim tests"]
fn a_claimant_to_be_run() {
    use crate::claim::Claim;
    use crate::interest::{Interest, pending_interest};

    let Ok(how) = std::env::var(CLAIM_HELPER) else {
        return;
    };
    let (mode, name) = how.split_once(' ').unwrap();
    let ns = Namespace::new(name).unwrap();
    let topic = TopicName::new("t").unwrap();
    match mode {
        "fork" => {
            let _claim = Claim::take(&ns, &topic).unwrap();
            let _interest = Interest::declare(&ns, &topic).unwrap();
            // SAFETY: the child runs nothing but `pause`, which is async-signal-safe, so
            // the locks other threads of this process may hold at the fork do not matter.
            let child = unsafe { libc::fork() };
            if child == 0 {
                loop {
                    // SAFETY: no preconditions; it returns only when a signal is caught.
                    unsafe { libc::pause() };
                }
            }
            assert!(child > 0, "fork failed");
            println!("child {child}");
            std::thread::sleep(Duration::from_secs(120));
        }
        "take" => {
            let took = match Claim::take(&ns, &topic) {
                Ok(_) => "took",
                Err(SluiceError::TopicBusy(_)) => "busy",
                Err(e) => panic!("{e}"),
            };
            println!("claim {took} interest {}", pending_interest(&ns, &topic));
        }
        other => panic!("unknown mode {other}"),
    }
}

/// Runs `a_claimant_to_be_run` in `mode` on `ns`.
fn claimant(mode: &str, ns: &Namespace) -> std::process::Command {
    helper(
        "a_claimant_to_be_run",
        CLAIM_HELPER,
        &format!("{mode} {}", ns.name()),
    )
}

/// What a `take` helper said (libtest writes the test's name on the same line first).
fn claimant_says(ns: &Namespace) -> String {
    let out = claimant("take", ns).output().unwrap();
    let stdout = String::from_utf8_lossy(&out.stdout);
    let line = stdout
        .lines()
        .find_map(|l| l.split_once("claim ").map(|(_, s)| s));
    format!("claim {}", line.expect("the helper said what it found"))
}

/// A producer's claim and a subscriber's declared interest are its process's alone: a
/// child it forked keeps neither once it is killed (with `flock`, the child held both:
/// a restarted producer failed with `TopicBusy` for as long as the child lived).
#[test]
fn a_forked_child_keeps_neither_the_claim_nor_the_interest_of_its_killed_parent() {
    use std::io::BufRead;

    use crate::claim::Claim;
    use crate::interest::pending_interest;

    let ns = namespace("fork");
    let topic = TopicName::new("t").unwrap();

    /// Kills the helper and its forked child at the end, whatever fails before.
    struct Helper(std::process::Child, Option<libc::pid_t>);
    impl Drop for Helper {
        fn drop(&mut self) {
            let _ = self.0.kill();
            let _ = self.0.wait();
            if let Some(pid) = self.1 {
                // SAFETY: sends a signal; no memory is involved. The pid is the forked
                // child's, which nothing reaps (its parent was killed), so it cannot
                // have been reused while the child is a zombie of init's.
                unsafe { libc::kill(pid, libc::SIGKILL) };
            }
        }
    }
    let mut helper = Helper(claimant("fork", &ns).spawn().unwrap(), None);
    let stdout = std::io::BufReader::new(helper.0.stdout.take().unwrap());
    let child: libc::pid_t = stdout
        .lines()
        .map_while(|l| l.ok())
        .find_map(|l| Some(l.rsplit_once("child ")?.1.trim().parse().unwrap()))
        .expect("the helper said its child's process id");
    helper.1 = Some(child);

    assert!(matches!(
        Claim::take(&ns, &topic),
        Err(SluiceError::TopicBusy(_))
    ));
    assert_eq!(pending_interest(&ns, &topic), 1);

    helper.0.kill().unwrap();
    helper.0.wait().unwrap();
    // SAFETY: signal 0 only checks that the process exists.
    let alive = unsafe { libc::kill(child, 0) };
    assert_eq!(alive, 0, "the forked child still lives");
    assert_eq!(pending_interest(&ns, &topic), 0);
    let claim = Claim::take(&ns, &topic).expect("the killed process's claim is free");
    drop(claim);
    drop(helper);
    ns.purge();
}

/// Record locks never conflict within a process, and closing any descriptor of a file
/// drops the process's locks on it: a process's own producers, subscribers and sweeps
/// must see its claims and registrations as held, and keep them held for others.
#[test]
fn a_process_keeps_its_claims_and_interest_through_its_own_looks() {
    use crate::claim::Claim;
    use crate::interest::{Interest, pending_interest};

    let ns = namespace("own");
    let topic = TopicName::new("t").unwrap();
    let claim = Claim::take(&ns, &topic).unwrap();
    assert!(matches!(
        Claim::take(&ns, &topic),
        Err(SluiceError::TopicBusy(_))
    ));
    let interest = Interest::declare(&ns, &topic).unwrap();
    let second = Interest::declare(&ns, &topic).unwrap();
    assert_eq!(pending_interest(&ns, &topic), 2);
    ns.reclaim_dead();
    assert_eq!(pending_interest(&ns, &topic), 2);
    drop(second);
    // Another process finds both held, after those looks of this one.
    assert_eq!(claimant_says(&ns), "claim busy interest 1");

    drop(claim);
    drop(interest);
    assert_eq!(pending_interest(&ns, &topic), 0);
    assert_eq!(claimant_says(&ns), "claim took interest 0");
    ns.purge();
}

/// Helper process of the fork test below, run by it from this test binary: a publisher
/// and a subscriber holding a batch fork a child, which tries the subscriber and the
/// publisher, drops them and the batch (as a child that exits normally does), and
/// exits; then the parent receives the rest. Prints what each found.
#[test]
#[ignore = "a helper process of `a_forked_child_neither_uses_nor_lets_go_of_its_parents_ports`"]
fn a_process_that_forks_while_it_holds_ports() {
    let Ok(name) = std::env::var(NODE_HELPER_NAMESPACE) else {
        return;
    };
    let ns = Namespace::new(&name).unwrap();
    let (mut publisher, mut sub) = pair(&ns, "fork");
    let encoded = wire::encode(&batch()).unwrap();
    for index in 0..3 {
        publisher.publish_batch(0, index, 10, &encoded).unwrap();
    }
    let held = match recv(&mut sub).unwrap() {
        Frame::Batch { batch, .. } => batch,
        other => panic!("unexpected {other:?}"),
    };
    // SAFETY: the child runs Rust code after the fork: glibc's allocator is safe in a
    // forked child, and this helper runs its one test with no other thread of its own
    // that could hold a lock the child needs.
    let child = unsafe { libc::fork() };
    if child == 0 {
        let topic = TopicName::new("fork").unwrap();
        // Its parent's identity (iceoryx2's, settled at its first use): it may neither
        // subscribe to the parent's topic nor produce. (The error names the parent by
        // its pid outside any PID namespace, which `getppid` may not be.)
        let forked = |e: SluiceError| matches!(e, SluiceError::ForkedIdentity { .. });
        let used = matches!(recv(&mut sub), Err(SluiceError::Forked { .. }))
            && matches!(
                publisher.publish_batch(0, 3, 10, &encoded),
                Err(SluiceError::Forked { .. })
            )
            && TopicSubscriber::connect(&ns, &topic, Some(Duration::from_secs(5)), false)
                .is_err_and(forked)
            && TopicPublisher::create(&ns, config(4, 1, 1, 4096), Arc::new(AtomicBool::new(false)))
                .is_err_and(forked);
        drop(held);
        drop(sub);
        drop(publisher);
        // SAFETY: ends the child at once, as `os._exit` does, after its drops.
        unsafe { libc::_exit(if used { 0 } else { 1 }) };
    }
    let mut status = 0;
    // SAFETY: waits for the child just forked; `status` is a valid out-pointer.
    assert_eq!(unsafe { libc::waitpid(child, &mut status, 0) }, child);
    println!(
        "child refused {}",
        libc::WIFEXITED(status) && libc::WEXITSTATUS(status) == 0
    );
    let mut indexes = Vec::new();
    // The queue (a window of 4) holds batches 1 to 3 and the end.
    publisher.publish_batch(0, 3, 10, &encoded).unwrap();
    publisher.publish_end_of_stream(1).unwrap();
    loop {
        match recv(&mut sub) {
            Ok(Frame::Batch { index, .. }) => indexes.push(index),
            Ok(Frame::EndOfStream) => break,
            Ok(other) => panic!("unexpected {other:?}"),
            Err(e) => {
                println!("parent failed: {e}");
                break;
            }
        }
    }
    println!("parent received {indexes:?}");
    println!("held unchanged {}", held == batch());
}

/// A forked child's copies of its parent's ports refuse to be used (`Forked`), and
/// dropping them lets go of nothing of the parent's: the parent receives every batch
/// after the child exits, and the batch it held is intact. The child, which has its
/// parent's iceoryx2 identity, may neither subscribe to the parent's topic nor produce
/// (`ForkedIdentity`).
#[test]
fn a_forked_child_neither_uses_nor_lets_go_of_its_parents_ports() {
    let ns = namespace("frk");
    let out = helper(
        "a_process_that_forks_while_it_holds_ports",
        NODE_HELPER_NAMESPACE,
        ns.name(),
    )
    .output()
    .unwrap();
    let stdout = String::from_utf8_lossy(&out.stdout);
    assert!(out.status.success(), "{stdout}");
    for expected in [
        "child refused true",
        "parent received [1, 2, 3]",
        "held unchanged true",
    ] {
        assert!(stdout.contains(expected), "{expected:?} not in {stdout}");
    }
    ns.purge();
}

/// What a publisher queued for a subscriber that has not received from it yet goes with
/// the publisher (iceoryx2 maps a publisher's segment on a subscriber's first receive
/// from it), so a publisher drains before it lets go: then nothing is lost.
#[test]
fn a_publisher_that_drains_loses_nothing_a_subscriber_has_not_received_yet() {
    let ns = namespace("drain");
    let (mut publisher, mut sub) = pair(&ns, "drain");
    publisher.publish_end_of_epoch(0, 0, 0).unwrap();
    publisher.publish_end_of_stream(1).unwrap();
    let subscriber = std::thread::spawn(move || {
        // Its first receive comes after the publisher has published everything.
        std::thread::sleep(Duration::from_millis(200));
        (recv(&mut sub), recv(&mut sub))
    });
    publisher.drain(Duration::from_secs(30));
    drop(publisher);
    let (first, second) = subscriber.join().unwrap();
    assert!(
        matches!(first, Ok(Frame::EndOfEpoch { epoch: 0, .. })),
        "{first:?}"
    );
    assert!(matches!(second, Ok(Frame::EndOfStream)), "{second:?}");
    ns.purge();
}

/// The state directory (checkpoints, status reports) is this user's alone: a link in its
/// place, or one another user made first, is refused with an error that says what to
/// do; one of ours that others may enter is narrowed to owner-only.
#[test]
fn a_state_directory_that_is_a_link_or_another_users_is_refused() {
    use std::os::unix::fs::{MetadataExt, PermissionsExt};
    let ns = namespace("state");
    let dir = ns.state_dir();
    let _ = std::fs::remove_dir_all(&dir);
    std::fs::create_dir(&dir).unwrap();
    std::fs::set_permissions(&dir, std::fs::Permissions::from_mode(0o777)).unwrap();
    assert_eq!(ns.prepare_state_dir().unwrap(), dir);
    assert_eq!(std::fs::metadata(&dir).unwrap().mode() & 0o777, 0o700);
    std::fs::remove_dir(&dir).unwrap();

    let elsewhere = std::env::temp_dir().join(format!("sluice-elsewhere-{}", std::process::id()));
    std::fs::create_dir_all(&elsewhere).unwrap();
    std::os::unix::fs::symlink(&elsewhere, &dir).unwrap();
    let err = ns.prepare_state_dir().unwrap_err().to_string();
    assert!(err.contains("not a directory owned by you"), "{err}");
    std::fs::remove_file(&dir).unwrap();
    std::fs::remove_dir(&elsewhere).unwrap();

    // SAFETY: geteuid has no preconditions and cannot fail.
    if unsafe { libc::geteuid() } == 0 {
        std::fs::create_dir(&dir).unwrap();
        std::os::unix::fs::chown(&dir, Some(65534), Some(65534)).unwrap();
        let err = ns.prepare_state_dir().unwrap_err().to_string();
        assert!(err.contains("another user may have made it"), "{err}");
        std::fs::remove_dir(&dir).unwrap();
    } else {
        eprintln!("not root: the directory of another user is not tried");
    }
    ns.purge();
}

/// State is written as a new file of this user's and renamed into place: a link planted
/// where the temporary file goes is replaced, and what it points to is not written.
#[test]
fn state_is_never_written_through_a_planted_link() {
    let dir = std::env::temp_dir().join(format!("sluice-planted-{}", std::process::id()));
    std::fs::create_dir_all(&dir).unwrap();
    let victim = dir.join("victim");
    std::fs::write(&victim, b"precious").unwrap();
    let tmp = dir.join("report.json.tmp");
    std::os::unix::fs::symlink(&victim, &tmp).unwrap();
    crate::write_private(&tmp, &dir.join("report.json"), b"{}").unwrap();
    assert_eq!(std::fs::read(&victim).unwrap(), b"precious");
    assert_eq!(std::fs::read(dir.join("report.json")).unwrap(), b"{}");
    std::fs::remove_dir_all(&dir).unwrap();
}

/// The default namespace of a user whose `u<uid>` another user took first (its service
/// directory, or a shared-memory file of its prefix) is a private name drawn once, kept
/// in the user's private directory, the same for every later process; untaken, it is
/// `u<uid>` (finding 6 of issue 50: a squatter denied the user every topic).
#[test]
fn a_default_namespace_another_user_took_first_falls_back_to_a_private_name() {
    use std::os::unix::fs::MetadataExt;
    let scratch = std::env::temp_dir().join(format!("sluice-squat-{}", std::process::id()));
    let _ = std::fs::remove_dir_all(&scratch);
    let (base, shm, keep) = (
        scratch.join("base"),
        scratch.join("shm"),
        scratch.join("keep"),
    );
    for dir in [&base, &shm, &keep] {
        std::fs::create_dir_all(dir).unwrap();
    }
    let uid = std::fs::metadata(&scratch).unwrap().uid();
    let kept = || Ok(keep.clone());
    let name = crate::namespace::default_name(&base, &shm, uid, kept).unwrap();
    assert_eq!(name, format!("u{uid}"));
    // Ours: still the default.
    std::fs::create_dir(base.join(format!("sluice-u{uid}"))).unwrap();
    std::fs::write(
        shm.join(format!("iox2_sluice_u{uid}_{HASH}_node.global_mgmt")),
        b"",
    )
    .unwrap();
    // Another namespace whose name starts with this one's and `_` (anyone's) is not it.
    let longer = shm.join(format!("iox2_sluice_u{uid}_x_{HASH}_node.global_mgmt"));
    std::fs::write(&longer, b"").unwrap();
    assert_eq!(
        crate::namespace::default_name(&base, &shm, uid, kept).unwrap(),
        name
    );

    // SAFETY: geteuid has no preconditions and cannot fail.
    if unsafe { libc::geteuid() } != 0 {
        eprintln!("not root: a namespace taken by another user is not tried");
        std::fs::remove_dir_all(&scratch).unwrap();
        return;
    }
    for taken in [
        base.join(format!("sluice-u{uid}")),
        shm.join(format!("iox2_sluice_u{uid}_{HASH}_node.global_mgmt")),
    ] {
        std::os::unix::fs::chown(&taken, Some(65534), Some(65534)).unwrap();
        let first = crate::namespace::default_name(&base, &shm, uid, kept).unwrap();
        assert!(
            first.starts_with(&format!("u{uid}x")) && first.len() == name.len() + 7,
            "{first}"
        );
        assert!(Namespace::new(&first).is_ok(), "{first}");
        let again = crate::namespace::default_name(&base, &shm, uid, kept).unwrap();
        assert_eq!(
            first, again,
            "every process of the user takes the same name"
        );
        std::os::unix::fs::chown(&taken, Some(uid), Some(uid)).unwrap();
    }
    std::os::unix::fs::chown(&longer, Some(65534), Some(65534)).unwrap();
    assert_eq!(
        crate::namespace::default_name(&base, &shm, uid, kept).unwrap(),
        name,
        "namespace u{uid}_x of another user's split u{uid}"
    );
    std::fs::remove_dir_all(&scratch).unwrap();
}

/// A service's hash, as iceoryx2 names the segments of a namespace in /dev/shm.
const HASH: &str = "9204dd183d1c4d8e1ff592a30766ffa6765aa8b5";

/// Narrowing the namespace's node counter never changes the mode of a file a link
/// under the namespace's prefix points to (a link another user may have left, with
/// the target anyone's), nor touches another namespace's files that share the prefix.
#[test]
fn narrowing_a_namespace_follows_no_link_and_stays_in_its_namespace() {
    use std::os::unix::fs::{MetadataExt, PermissionsExt};
    let ns = namespace("nw");
    ns.prepare_root().unwrap();
    let shm = std::path::Path::new(crate::namespace::SHM_DIR);
    let target = std::env::temp_dir().join(format!("sluice-narrow-{}", std::process::id()));
    std::fs::write(&target, b"someone's").unwrap();
    std::fs::set_permissions(&target, std::fs::Permissions::from_mode(0o644)).unwrap();
    let link = shm.join(format!("{}{HASH}_planted.global_mgmt", ns.shm_prefix()));
    let own = shm.join(format!("{}{HASH}_node.global_mgmt", ns.shm_prefix()));
    let other = shm.join(format!("{}x_{HASH}_node.global_mgmt", ns.shm_prefix()));
    std::os::unix::fs::symlink(&target, &link).unwrap();
    for path in [&own, &other] {
        std::fs::write(path, b"").unwrap();
        std::fs::set_permissions(path, std::fs::Permissions::from_mode(0o644)).unwrap();
    }
    ns.reclaim_dead();
    let mode = |p: &std::path::Path| std::fs::metadata(p).unwrap().mode() & 0o777;
    assert_eq!(mode(&target), 0o644, "a link's target was narrowed");
    assert_eq!(mode(&own), 0o600);
    assert_eq!(mode(&other), 0o644, "another namespace's file was narrowed");
    for path in [&link, &own, &other, &target] {
        std::fs::remove_file(path).unwrap();
    }
    ns.purge();
}

/// iceoryx2's errors reach the caller as their own types (SluiceError::SharedMemory),
/// which can be matched without reading their text.
#[test]
fn iceoryx2s_errors_keep_their_type() {
    use iceoryx2::port::LoanError;
    let err = crate::transport("cannot loan")(LoanError::OutOfMemory);
    let SluiceError::SharedMemory { what, source } = &err else {
        panic!("not iceoryx2's error: {err:?}");
    };
    assert_eq!(what, "cannot loan");
    assert_eq!(
        source.downcast_ref::<LoanError>(),
        Some(&LoanError::OutOfMemory)
    );
    assert_eq!(
        err.to_string(),
        "transport error: cannot loan: LoanError::OutOfMemory"
    );
}

/// Tells the helper of the full-/dev/shm test to run.
const FULL_SHM_HELPER: &str = "SLUICE_TEST_FULL_SHM";

/// Helper process of `a_dev_shm_filled_after_the_topic_was_created_is_an_error_not_a_crash`,
/// run in a mount namespace of its own with a small tmpfs on /dev/shm: creates a topic,
/// fills what is left of /dev/shm with a file of another program, and publishes into
/// every chunk of the topic. Prints what each message did; a crash (SIGBUS) is the bug.
#[test]
#[ignore = "a helper process of `a_dev_shm_filled_after_the_topic_was_created_is_an_error_not_a_crash`"]
fn a_topic_in_a_dev_shm_filled_to_be_run() {
    use std::io::Write;
    if std::env::var(FULL_SHM_HELPER).is_err() {
        return;
    }
    let ns = namespace("fill");
    let config = config(4, 4, 2, 64 << 10);
    let chunks = config.chunks();
    let stop = Arc::new(AtomicBool::new(false));
    let mut publisher = TopicPublisher::create(&ns, config, stop).unwrap();
    // Another program takes every page left.
    let mut filler = std::fs::File::create("/dev/shm/filler").unwrap();
    let block = vec![1u8; 64 << 10];
    while filler
        .write_all(&block)
        .and_then(|()| filler.sync_all())
        .is_ok()
    {}
    let batch = RecordBatch::try_from_iter([(
        "v",
        Arc::new(Int64Array::from_iter_values(0..6000)) as ArrayRef,
    )])
    .unwrap();
    let encoded = wire::encode(&batch).unwrap();
    // No subscriber: iceoryx2 hands the chunks out in turn, so 2 × chunks messages touch
    // every one of them.
    for i in 0..2 * chunks {
        match publisher.publish_batch(0, i, 6000, &encoded) {
            Ok(()) => println!("sent {i}"),
            Err(e) => {
                println!("error {i}: {e}");
                break;
            }
        }
    }
    println!("no crash");
}

/// A /dev/shm that another program fills after the topic was created (its free space
/// checked then) is a clear error of the producer, or no error at all, never a SIGBUS:
/// the topic's pages are allocated when it is created. Runs its helper in a mount
/// namespace of its own with a 3 MiB tmpfs on /dev/shm (needs root or user namespaces;
/// skipped with a message otherwise).
#[test]
fn a_dev_shm_filled_after_the_topic_was_created_is_an_error_not_a_crash() {
    let exe = std::env::current_exe().unwrap();
    let probe = std::process::Command::new("unshare")
        .args(["--mount", "--propagation", "private", "sh", "-c"])
        .arg("mount -t tmpfs -o size=3M tmpfs /dev/shm")
        .output();
    if !probe.is_ok_and(|o| o.status.success()) {
        eprintln!("skipped: cannot mount a small tmpfs on /dev/shm in a mount namespace here");
        return;
    }
    let script = format!(
        "mount -t tmpfs -o size=3M tmpfs /dev/shm && exec '{}' --ignored --exact \
         tests::a_topic_in_a_dev_shm_filled_to_be_run --nocapture --test-threads=1",
        exe.display()
    );
    let out = std::process::Command::new("unshare")
        .args(["--mount", "--propagation", "private", "sh", "-c", &script])
        .env(FULL_SHM_HELPER, "1")
        .output()
        .unwrap();
    let said = String::from_utf8_lossy(&out.stdout);
    assert!(
        out.status.success() && said.contains("no crash"),
        "the producer crashed on a full /dev/shm ({:?}):\n{said}\n{}",
        out.status,
        String::from_utf8_lossy(&out.stderr)
    );
}

/// A subscriber that waits in slices (the Flight server's, a facade `Connector`, a
/// successor's wait) is one waiting subscriber to a producer, not one per layer that
/// waits: its declaration is made once and withdrawn once it is attached.
#[test]
fn a_subscriber_waiting_in_slices_declares_its_interest_once() {
    use crate::interest::pending_interest;

    let ns = namespace("once");
    let topic = TopicName::new("t").unwrap();
    let waiting = {
        let (ns, topic) = (ns.clone(), topic.clone());
        std::thread::spawn(move || {
            crate::connect_while(&ns, &topic, Some(Duration::from_secs(60)), false, || true)
        })
    };
    let start = Instant::now();
    while pending_interest(&ns, &topic) == 0 {
        assert!(
            start.elapsed() < Duration::from_secs(30),
            "no interest declared"
        );
        std::thread::sleep(Duration::from_millis(5));
    }
    // Across several slices of the wait.
    for _ in 0..(3 * crate::CONNECT_SLICE.as_millis() / 50) {
        assert_eq!(pending_interest(&ns, &topic), 1);
        std::thread::sleep(Duration::from_millis(50));
    }
    let stop = Arc::new(AtomicBool::new(false));
    let publisher = TopicPublisher::create(&ns, config(4, 4, 2, 4 << 10), stop).unwrap();
    let subscriber = waiting.join().unwrap().unwrap();
    assert!(subscriber.is_some());
    assert_eq!(pending_interest(&ns, &topic), 0);
    drop((subscriber, publisher));
    ns.purge();
}
