//! Comparisons 4 and 5: the transport floor. Publish→receive latency of small batches
//! against a hand-off of the same batch between two threads and against the bare
//! wake-up Sluice's subscribers sleep on, and the rate of batches from 1 KiB to 64 MiB to
//! N = 1 to 16 subscribers against `memcpy` of the same bytes and against N = 1.
//!
//! The publisher is a bare topic publisher (no plan): each batch is encoded and written
//! once into shared memory, and a `Subscriber` on another thread of this process
//! receives it (decoded in place, not touched further).

use std::sync::Arc;
use std::sync::atomic::AtomicBool;
use std::sync::mpsc;
use std::time::{Duration, Instant};

use anyhow::{Context, Result, anyhow, bail};
use arrow::array::{ArrayRef, Float32Array};
use arrow::datatypes::DataType;
use arrow::record_batch::RecordBatch;
use sluice::core::{TopicName, wire};
use sluice::prelude::*;
use sluice::shm::{TopicConfig, TopicPublisher};

const ACK_TIMEOUT: Duration = Duration::from_secs(30);

/// A benchmark's subscriber to `topic`: it waits up to a minute for its producer.
pub(crate) fn subscribe(ns: &Namespace, topic: &str) -> Result<Subscriber> {
    Ok(Subscriber::connect(
        topic,
        SubscribeOptions {
            timeout: Some(Duration::from_secs(60)),
            namespace: Some(ns.clone()),
            ..SubscribeOptions::default()
        },
    )?)
}

fn open_topic(
    ns: &Namespace,
    topic: &str,
    max_subscribers: usize,
    window: usize,
    max_message_bytes: usize,
) -> Result<(TopicPublisher, Arc<AtomicBool>)> {
    let stop = Arc::new(AtomicBool::new(false));
    let config = TopicConfig {
        topic: TopicName::new(topic)?,
        window,
        max_subscribers,
        max_held: 2,
        max_message_bytes,
        lag_limit: None,
    };
    Ok((TopicPublisher::create(ns, config, stop.clone())?, stop))
}

/// Publish→receive latencies in microseconds of `samples` batches (after `warmup`),
/// one at a time: the next is published once the subscriber has received the last.
/// Each sample is split in two: the publisher's encoding and copy into shared memory
/// (up to the header's `published_ns`, taken just before the sample is sent), and the
/// delivery (sending, the wake-up, receiving, decoding, up to `next_event`'s return).
pub fn sluice_latency(
    ns: &Namespace,
    batch: &RecordBatch,
    warmup: usize,
    samples: usize,
    topic: &str,
) -> Result<Latency> {
    let (mut publisher, stop) = open_topic(ns, topic, 1, 4, wire::encode(batch)?.len())?;
    let (sent_tx, sent_rx) = mpsc::channel::<Instant>();
    let (ack_tx, ack_rx) = mpsc::channel::<()>();
    let sub = {
        let ns = ns.clone();
        let topic = topic.to_string();
        std::thread::spawn(move || -> Result<Latency> {
            let mut sub = subscribe(&ns, &topic)?;
            let mut lat = Latency::default();
            let mut seen = 0;
            loop {
                match sub.next_event()? {
                    Event::Batch { batch, .. } => {
                        let (now, now_ns) = (Instant::now(), sluice::shm::monotonic_ns());
                        std::hint::black_box(batch.num_rows());
                        let sent = sent_rx.recv_timeout(ACK_TIMEOUT)?;
                        let published = sub
                            .last_published_ns()
                            .context("a batch without its publish time")?;
                        if seen >= warmup {
                            let total = now.duration_since(sent).as_secs_f64() * 1e6;
                            let delivery = now_ns.saturating_sub(published) as f64 / 1e3;
                            lat.total.push(total);
                            lat.delivery.push(delivery);
                            lat.publish.push((total - delivery).max(0.0));
                        }
                        seen += 1;
                        drop(batch);
                        ack_tx.send(())?;
                    }
                    Event::EpochEnd(_) => {}
                    Event::DeviceBatch { .. } => bail!("a CPU benchmark topic sent a GPU batch"),
                    Event::End => break,
                }
            }
            Ok(lat)
        })
    };
    let published = (|| -> Result<()> {
        publisher.wait_for_subscribers(1, Some(Duration::from_secs(60)), &stop)?;
        let mut encoder = wire::Encoder::new();
        for i in 0..warmup + samples {
            let sent = Instant::now();
            sent_tx.send(sent)?;
            let enc = encoder.encode(batch)?;
            publisher.publish_batch(0, i as u64, batch.num_rows() as u64, &enc)?;
            ack_rx
                .recv_timeout(ACK_TIMEOUT)
                .context("the subscriber did not answer")?;
        }
        let n = (warmup + samples) as u64;
        publisher.publish_end_of_epoch(0, n, n * batch.num_rows() as u64)?;
        publisher.publish_end_of_stream(1)?;
        publisher.drain(Duration::from_secs(10));
        Ok(())
    })();
    if published.is_err() {
        let _ = publisher.publish_error("the benchmark's publisher failed");
    }
    let lat = sub
        .join()
        .map_err(|_| anyhow!("the subscriber thread panicked"))?;
    published?;
    let lat = lat.context("the subscriber failed")?;
    if lat.total.len() != samples {
        bail!(
            "the subscriber timed {} batches, not {samples}",
            lat.total.len()
        );
    }
    Ok(lat)
}

/// Publish → receive latencies of one run, in microseconds, sample by sample.
#[derive(Debug, Default, Clone)]
pub struct Latency {
    /// From just before encoding to `next_event`'s return.
    pub total: Vec<f64>,
    /// The publisher's part: encoding, loaning and the copy into shared memory.
    pub publish: Vec<f64>,
    /// The rest: send, notify, the subscriber's wake-up, receive, decode, the delivery
    /// protocol.
    pub delivery: Vec<f64>,
}

/// The baseline: the same batch handed to another thread over a channel, one at a time.
pub fn handoff_latency(batch: &RecordBatch, warmup: usize, samples: usize) -> Result<Vec<f64>> {
    let (tx, rx) = mpsc::sync_channel::<(Instant, RecordBatch)>(1);
    let (ack_tx, ack_rx) = mpsc::channel::<()>();
    let receiver = std::thread::spawn(move || -> Result<Vec<f64>> {
        let mut lat = Vec::with_capacity(samples);
        for (i, (sent, batch)) in rx.iter().enumerate() {
            let now = Instant::now();
            std::hint::black_box(batch.num_rows());
            if i >= warmup {
                lat.push(now.duration_since(sent).as_secs_f64() * 1e6);
            }
            drop(batch);
            ack_tx.send(())?;
        }
        Ok(lat)
    });
    for _ in 0..warmup + samples {
        tx.send((Instant::now(), batch.clone()))?;
        ack_rx
            .recv_timeout(ACK_TIMEOUT)
            .context("the receiver did not answer")?;
    }
    drop(tx);
    receiver
        .join()
        .map_err(|_| anyhow!("the receiver thread panicked"))?
}

/// A batch of one float32 column of `bytes` bytes.
pub fn large_batch(bytes: usize) -> Result<RecordBatch> {
    let values = Float32Array::from_iter_values((0..bytes / 4).map(|i| (i % 1000) as f32));
    Ok(RecordBatch::try_from_iter([(
        "x",
        Arc::new(values) as ArrayRef,
    )])?)
}

/// Per-subscriber GB/s of `messages` batches published once and received by each of `n`
/// subscriber threads, after `warmup` batches that fault in the topic's memory: for each
/// subscriber, from the start of the first timed publish (once every subscriber has
/// received every warm-up batch) to its receipt of the last batch. One value per
/// subscriber.
pub fn fanout_gbps(
    ns: &Namespace,
    batch: &RecordBatch,
    n: usize,
    warmup: usize,
    messages: usize,
    topic: &str,
) -> Result<Vec<f64>> {
    if warmup == 0 {
        bail!("the batch-size curve needs warm-up batches");
    }
    let len = wire::encode(batch)?.len();
    let (mut publisher, stop) = open_topic(ns, topic, n, 4, len)?;
    let total = warmup + messages;
    let (warm_tx, warm_rx) = mpsc::channel::<()>();
    let subs: Vec<_> = (0..n)
        .map(|_| {
            let (ns, topic, warm_tx) = (ns.clone(), topic.to_string(), warm_tx.clone());
            std::thread::spawn(move || -> Result<Vec<Instant>> {
                let mut sub = subscribe(&ns, &topic)?;
                let mut times = Vec::with_capacity(total);
                loop {
                    match sub.next_event()? {
                        Event::Batch { batch, .. } => {
                            std::hint::black_box(batch.num_rows());
                            drop(batch);
                            times.push(Instant::now());
                            if times.len() == warmup {
                                warm_tx.send(())?;
                            }
                        }
                        Event::EpochEnd(_) => {}
                        Event::DeviceBatch { .. } => {
                            bail!("a CPU benchmark topic sent a GPU batch")
                        }
                        Event::End => break,
                    }
                }
                Ok(times)
            })
        })
        .collect();
    drop(warm_tx);
    let published = (|| -> Result<Instant> {
        publisher.wait_for_subscribers(n, Some(Duration::from_secs(60)), &stop)?;
        let mut encoder = wire::Encoder::new();
        let mut start = Instant::now();
        for i in 0..total {
            if i == warmup {
                for _ in 0..n {
                    warm_rx
                        .recv_timeout(ACK_TIMEOUT)
                        .context("a subscriber did not receive the warm-up")?;
                }
                start = Instant::now();
            }
            let enc = encoder.encode(batch)?;
            publisher.publish_batch(0, i as u64, batch.num_rows() as u64, &enc)?;
        }
        publisher.publish_end_of_epoch(0, total as u64, (total * batch.num_rows()) as u64)?;
        publisher.publish_end_of_stream(1)?;
        publisher.drain(Duration::from_secs(30));
        Ok(start)
    })();
    if published.is_err() {
        let _ = publisher.publish_error("the benchmark's publisher failed");
    }
    let mut all = Vec::with_capacity(n);
    for s in subs {
        all.push(
            s.join()
                .map_err(|_| anyhow!("a subscriber thread panicked"))?,
        );
    }
    let start = published?;
    let mut rates = Vec::with_capacity(n);
    for times in all {
        let times = times.context("a subscriber failed")?;
        if times.len() != total {
            bail!("a subscriber received {} of {total} batches", times.len());
        }
        let secs = times[total - 1].duration_since(start).as_secs_f64();
        rates.push((messages * len) as f64 / secs / 1e9);
    }
    Ok(rates)
}

/// One-way wake-up latencies in microseconds of the mechanism Sluice's subscribers sleep
/// on, without Sluice: an iceoryx2 event (the `ready` service's kind: a Unix datagram
/// per notification) notified on this thread and waited for by another, one at a time,
/// as [`sluice_latency`] publishes. What the transport cannot go below on this machine.
/// Also returns the CPU time of this process per round trip (two wake-ups), in
/// microseconds: nothing else runs meanwhile.
pub fn event_latency(
    ns: &Namespace,
    warmup: usize,
    samples: usize,
    topic: &str,
) -> Result<(Vec<f64>, f64)> {
    use iceoryx2::prelude::*;
    let node = NodeBuilder::new()
        .config(ns.config())
        .signal_handling_mode(SignalHandlingMode::Disabled)
        .create::<iceoryx2::service::ipc_threadsafe::Service>()
        .map_err(|e| anyhow!("cannot create an iceoryx2 node: {e:?}"))?;
    let event = |part: &str| -> Result<_> {
        let name = ServiceName::new(&format!("sluice-bench/{topic}/{part}"))
            .map_err(|e| anyhow!("bad service name: {e:?}"))?;
        node.service_builder(&name)
            .event()
            .open_or_create()
            .map_err(|e| anyhow!("cannot create the event service: {e:?}"))
    };
    // Each side notifies on one event and listens on the other.
    let ends = |name: &str| -> Result<_> {
        let service = event(name)?;
        let notifier = service
            .notifier_builder()
            .create()
            .map_err(|e| anyhow!("cannot create a notifier: {e:?}"))?;
        let listener = service
            .listener_builder()
            .create()
            .map_err(|e| anyhow!("cannot create a listener: {e:?}"))?;
        Ok((notifier, listener))
    };
    let (ping_tx, ping_rx) = ends("ping")?;
    let (pong_tx, pong_rx) = ends("pong")?;
    let (sent_tx, sent_rx) = mpsc::channel::<Instant>();
    let total = warmup + samples;
    let cpu0 = crate::stats::process_cpu_seconds()?;
    let waiter = std::thread::spawn(move || -> Result<Vec<f64>> {
        let mut lat = Vec::with_capacity(samples);
        for i in 0..total {
            let woken = ping_rx
                .timed_wait(|_| {}, ACK_TIMEOUT)
                .map_err(|e| anyhow!("waiting for the event failed: {e:?}"))?;
            let now = Instant::now();
            if woken == 0 {
                bail!("no wake-up within {ACK_TIMEOUT:?}");
            }
            let sent = sent_rx.recv_timeout(ACK_TIMEOUT)?;
            if i >= warmup {
                lat.push(now.duration_since(sent).as_secs_f64() * 1e6);
            }
            pong_tx
                .notify()
                .map_err(|e| anyhow!("cannot answer: {e:?}"))?;
        }
        Ok(lat)
    });
    let pinged = (|| -> Result<()> {
        for _ in 0..total {
            sent_tx.send(Instant::now())?;
            ping_tx
                .notify()
                .map_err(|e| anyhow!("cannot notify: {e:?}"))?;
            if pong_rx
                .timed_wait(|_| {}, ACK_TIMEOUT)
                .map_err(|e| anyhow!("waiting for the answer failed: {e:?}"))?
                == 0
            {
                bail!("no answer within {ACK_TIMEOUT:?}");
            }
        }
        Ok(())
    })();
    let lat = waiter
        .join()
        .map_err(|_| anyhow!("the waiting thread panicked"))?;
    pinged?;
    let cpu = crate::stats::process_cpu_seconds()? - cpu0;
    Ok((lat?, cpu / total as f64 * 1e6))
}

/// GB/s of a plain `memcpy` of the same bytes, `messages` times, into 8 destinations
/// already written once (as the topic's shared memory is after the warm-up).
pub fn memcpy_gbps(batch: &RecordBatch, messages: usize) -> Result<f64> {
    let src = batch
        .column(0)
        .to_data()
        .buffers()
        .first()
        .cloned()
        .context("the batch has no buffer")?;
    let src = src.as_slice();
    let mut dst = vec![vec![1u8; src.len()]; 8];
    let start = Instant::now();
    for i in 0..messages {
        let d = &mut dst[i % 8];
        d.copy_from_slice(src);
        std::hint::black_box(d.as_ptr());
    }
    Ok((messages * src.len()) as f64 / start.elapsed().as_secs_f64() / 1e9)
}

/// Microseconds per encoding of `batch`, `times` times: as a fresh IPC stream each time
/// ([`wire::encode`], the baseline) and with the topic's schema message kept
/// ([`wire::Encoder`], what producers use).
pub fn encode_us(batch: &RecordBatch, times: usize) -> Result<(f64, f64)> {
    let start = Instant::now();
    for _ in 0..times {
        std::hint::black_box(wire::encode(batch)?);
    }
    let fresh = start.elapsed().as_secs_f64() / times as f64 * 1e6;
    let mut encoder = wire::Encoder::new();
    let start = Instant::now();
    for _ in 0..times {
        std::hint::black_box(encoder.encode(batch)?);
    }
    let kept = start.elapsed().as_secs_f64() / times as f64 * 1e6;
    Ok((fresh, kept))
}

/// What a subscriber's decoding of `batch` costs, measured `times` times.
pub struct Decoding {
    /// Bytes of the batch's fragment.
    pub bytes: usize,
    /// Microseconds per [`wire::Decoder::decode`] of the fragment: in place, from 64-byte
    /// aligned memory, with the schema kept as subscribers keep it.
    pub decode_us: f64,
    /// Microseconds per decode of the fragment by a [`wire::Decoder`] that validates
    /// every array as arrow-ipc builds it (`with_arrow_validation`), as arrow's
    /// `StreamDecoder` does: the baseline of [`Self::decode_us`].
    pub arrow_us: f64,
    /// Microseconds per `ArrayData::validate_full` of the decoded columns alone: arrow's
    /// validation, which the baseline decoding does for every message (the safety
    /// promise: UTF-8, offsets, null counts; [`wire::Decoder`] checks the same).
    pub validate_us: f64,
    /// The columns that are not strings or binary, which a subscriber that names them
    /// (`Columns::Named`) decodes alone.
    pub named: Vec<String>,
    /// Microseconds per decode of the fragment by a [`wire::Decoder`] of [`Self::named`]
    /// only: what a trainer that skips the string columns pays.
    pub named_us: f64,
}

/// Measures [`Decoding`] of `batch`, `times` times.
pub fn decode_us(batch: &RecordBatch, times: usize) -> Result<Decoding> {
    let encoded = wire::encode(batch)?;
    // Copied once into a fresh (64-byte aligned) buffer, as shared memory holds it.
    let mut bytes = arrow::buffer::MutableBuffer::new(encoded.len());
    bytes.extend_from_slice(&encoded.to_vec());
    let fragment = arrow::buffer::Buffer::from(bytes);
    let mut decoder = wire::Decoder::new();
    let decoded = decoder.decode(fragment.clone())?;
    let start = Instant::now();
    for _ in 0..times {
        std::hint::black_box(decoder.decode(fragment.clone())?);
    }
    let decode_us = start.elapsed().as_secs_f64() / times as f64 * 1e6;
    let mut arrow = wire::Decoder::new().with_arrow_validation();
    if arrow.decode(fragment.clone())? != decoded {
        bail!("the two ways of validating decoded different batches");
    }
    let start = Instant::now();
    for _ in 0..times {
        std::hint::black_box(arrow.decode(fragment.clone())?);
    }
    let arrow_us = start.elapsed().as_secs_f64() / times as f64 * 1e6;
    let columns: Vec<_> = decoded.columns().iter().map(|c| c.to_data()).collect();
    let start = Instant::now();
    for _ in 0..times {
        for c in &columns {
            std::hint::black_box(c).validate_full()?;
        }
    }
    let validate_us = start.elapsed().as_secs_f64() / times as f64 * 1e6;
    let named: Vec<String> = batch
        .schema()
        .fields()
        .iter()
        .filter(|f| {
            !matches!(
                f.data_type(),
                DataType::Utf8
                    | DataType::LargeUtf8
                    | DataType::Utf8View
                    | DataType::Binary
                    | DataType::LargeBinary
                    | DataType::BinaryView
            )
        })
        .map(|f| f.name().clone())
        .collect();
    let mut decoder = wire::Decoder::with_columns(wire::Columns::named(&named));
    decoder.decode(fragment.clone())?;
    let start = Instant::now();
    for _ in 0..times {
        std::hint::black_box(decoder.decode(fragment.clone())?);
    }
    let named_us = start.elapsed().as_secs_f64() / times as f64 * 1e6;
    Ok(Decoding {
        bytes: encoded.len(),
        decode_us,
        arrow_us,
        validate_us,
        named,
        named_us,
    })
}

/// What one [`Namespace::reclaim_dead`] costs in a namespace where a topic's producer
/// and `subscribers` subscribers, all threads of this process, are alive, and nothing
/// is dead (an error otherwise: a dead node would make the reclaim list them all, as
/// the baseline does): what a producer runs at
/// the end of every epoch (at most every 250 ms) and every 50 ms on a full queue, on its
/// publishing thread. Baseline, same namespace: iceoryx2's own listing of the nodes
/// (`Node::list`, which reads every node's state and details). Microseconds, mean of
/// `times` each: (reclaim, listing).
pub fn reclaim_us(ns: &Namespace, subscribers: usize, times: usize) -> Result<(f64, f64)> {
    use iceoryx2::prelude::{CallbackProgression, Node, NodeState};
    let topic = format!("reclaim{subscribers}");
    let (_publisher, _stop) = open_topic(ns, &topic, subscribers, 4, 1024)?;
    // Alive until the end; dropped before their publisher, which was declared first.
    let _subscribers = (0..subscribers)
        .map(|_| subscribe(ns, &topic))
        .collect::<Result<Vec<_>>>()?;
    ns.reclaim_dead();
    let start = Instant::now();
    for _ in 0..times {
        std::hint::black_box(ns.reclaim_dead());
    }
    let reclaim = start.elapsed().as_secs_f64() * 1e6 / times as f64;
    let start = Instant::now();
    for _ in 0..times {
        let (mut nodes, mut dead) = (0usize, 0usize);
        Node::<iceoryx2::service::ipc_threadsafe::Service>::list(ns.config(), |state| {
            nodes += 1;
            dead += usize::from(matches!(state, NodeState::Dead(_)));
            CallbackProgression::Continue
        })
        .map_err(|e| anyhow!("cannot list the namespace's nodes: {e:?}"))?;
        if dead > 0 {
            bail!(
                "{dead} dead node(s) in the namespace: a reclaim would not be the idle one measured"
            );
        }
        if nodes < subscribers + 1 {
            bail!(
                "iceoryx2 listed {nodes} nodes, fewer than the topic's {}",
                subscribers + 1
            );
        }
    }
    let listing = start.elapsed().as_secs_f64() * 1e6 / times as f64;
    Ok((reclaim, listing))
}
