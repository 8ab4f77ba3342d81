//! The producer end of a topic.

use std::sync::Arc;
use std::sync::atomic::{AtomicBool, AtomicU64, Ordering};
use std::time::{Duration, Instant};

use iceoryx2::port::BackpressureInfo;
use iceoryx2::port::listener::Listener;
use iceoryx2::port::publisher::Publisher;
use iceoryx2::port::update_connections::UpdateConnections;
use iceoryx2::prelude::*;
use sluice_core::wire::Encoded;
use sluice_core::{Burst, FrameKind, Outlet, Result, SluiceError, Wake};

use crate::backpressure::{BackpressureWaiter, DEAD_CHECK_INTERVAL, Wakeups};
use crate::claim::Claim;
use crate::config::{MAX_LOANED, SPARE_BORROWS, TopicConfig};
use crate::departure::Departed;
use crate::ending::{EndRecord, Ending};
use crate::header::FrameHeader;
use crate::interest::pending_interest;
use crate::namespace::{Namespace, ReclaimAfter, SHM_DIR, shm_available};
use crate::naming::{DataService, service_name};
use crate::pacing::PacingRecord;
use crate::process::Local;
use crate::reserve::reserve;
use crate::takeover::{Services, remember_generation, wait_for_dead_topic};
use crate::{Ipc, transport};

/// How often a producer waiting for declared subscribers looks at their registrations
/// when no attach wakes it.
const INTEREST_POLL_INTERVAL: Duration = Duration::from_millis(20);
/// The producer end of a topic: creates it, publishes messages, and removes it on drop.
pub struct TopicPublisher {
    namespace: Namespace,
    config: TopicConfig,
    // The iceoryx2 handles are `Local`: a forked child's copy of this publisher neither
    // uses nor drops them (see `crate::process`).
    data: Local<DataService>,
    publisher: Local<Publisher<Ipc, [u8], FrameHeader>>,
    /// Wakes subscribers, with the backpressure handler (see [`Wakeups`]).
    wakeups: Local<Arc<Wakeups>>,
    released: Local<Arc<Listener<Ipc>>>,
    sending_batch: Arc<AtomicBool>,
    /// Nanoseconds the backpressure handler spent on full queues.
    full_queue_ns: Arc<AtomicU64>,
    /// Subscribers that left while their batches still hold their ports (see
    /// [`crate::departure`]): neither waited for nor counted.
    departed: Arc<Departed>,
    /// Which subscriber the backpressure handler waits for (see [`crate::pacing`]).
    pacing: Local<Arc<PacingRecord>>,
    /// [`Self::seq`], for the backpressure handler.
    shared_seq: Arc<AtomicU64>,
    /// How the stream ended, once it did (see [`crate::ending`]).
    ended: Local<Option<EndRecord>>,
    /// When to wake subscribers for a burst of messages.
    burst: Burst,
    /// Bytes of host batches published (see [`Self::payload_bytes`]).
    payload_bytes: u64,
    seq: u64,
    /// Encodes the batches given as Arrow (the delivery protocol's [`Outlet`]), keeping
    /// their schema message from one to the next.
    ///
    /// [`Outlet`]: sluice_core::Outlet
    encoder: sluice_core::wire::Encoder,
    // Dropped after the ports above: they belong to it.
    _node: Local<Node<Ipc>>,
    // Given up after the publisher and the node: a producer that finds the claim free
    // never finds this one's publisher alive.
    _claim: Claim,
    // Dropped last: a producer that ends reclaims the subscribers that died meanwhile
    // (iceoryx2's own clean-up at a node's end is off, see `Namespace::new`).
    _reclaim: ReclaimAfter,
}

impl std::fmt::Debug for TopicPublisher {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.debug_struct("TopicPublisher")
            .field("namespace", &self.namespace.name())
            .field("config", &self.config)
            .field("seq", &self.seq)
            .finish()
    }
}

impl TopicPublisher {
    /// Creates the topic, after checking that `/dev/shm` can hold it.
    ///
    /// Fails with [`SluiceError::TopicBusy`] if a live producer already serves the topic
    /// (holds its claim, see the `claim` module). If the topic's previous producer died
    /// with subscribers attached, waits for them to take what it queued and let go, for
    /// as long as they are alive (saying so every 15 s) or until `stop` is set; then
    /// creates the topic's services under a free generation.
    pub fn create(
        namespace: &Namespace,
        config: TopicConfig,
        stop: Arc<AtomicBool>,
    ) -> Result<Self> {
        let topic = &config.topic;
        // A child forked after its parent used iceoryx2 shares the parent's identity: the
        // parent (and its other children) would never see this producer die, nor it them.
        if let Some(parent) = crate::process::forked_identity() {
            return Err(SluiceError::ForkedIdentity { parent });
        }
        let claim = Claim::take(namespace, topic)?;
        let node = namespace.node(crate::namespace::PRODUCER)?;
        namespace.reclaim_dead();
        let generation = wait_for_dead_topic(namespace, &node, topic, &stop)?;
        // After the wait: a dead predecessor's segments are freed once its subscribers
        // have taken what it queued and let go.
        let needed = config.shm_bytes();
        let available = shm_available()?;
        if needed > available {
            return Err(SluiceError::ShmTooSmall {
                topic: config.topic.to_string(),
                needed,
                available,
                path: SHM_DIR.into(),
            });
        }
        let Services {
            ready,
            released,
            data,
        } = Services::create(namespace, &node, &config, generation)?;
        remember_generation(namespace, topic, generation);

        let wakeups = Arc::new(Wakeups::new(
            ready
                .notifier_builder()
                .create()
                .map_err(transport("cannot create ready notifier"))?,
        ));
        let released = Arc::new(
            released
                .listener_builder()
                .create()
                .map_err(transport("cannot create released listener"))?,
        );

        let sending_batch = Arc::new(AtomicBool::new(false));
        let full_queue_ns = Arc::new(AtomicU64::new(0));
        let departed = Arc::new(Departed::new(namespace, topic));
        let pacing = Arc::new(PacingRecord::new(namespace, topic));
        let shared_seq = Arc::new(AtomicU64::new(0));
        let handler = BackpressureWaiter {
            departed: departed.clone(),
            pacing: pacing.clone(),
            seq: shared_seq.clone(),
            queue_depth: config.queue_depth(),
            released: released.clone(),
            // A second handle to the data service: the handler outlives this borrow.
            data: node
                .service_builder(&service_name(topic, generation, "data")?)
                .publish_subscribe::<[u8]>()
                .user_header::<FrameHeader>()
                .open()
                .map_err(transport("cannot reopen the data service"))?,
            namespace: namespace.clone(),
            stop,
            last_check: std::sync::Mutex::new(Instant::now()),
            lag_limit: config.lag_limit.is_some(),
            sending_batch: sending_batch.clone(),
            wakeups: wakeups.clone(),
            waited_ns: full_queue_ns.clone(),
        };
        let publisher = data
            .publisher_builder()
            .initial_max_slice_len(config.max_message_bytes)
            .allocation_strategy(AllocationStrategy::PowerOfTwo)
            .max_loaned_samples(MAX_LOANED)
            .backpressure_strategy(BackpressureStrategy::RetryUntilDelivered)
            .set_backpressure_handler(move |info: &BackpressureInfo| handler.on_full_queue(info))
            .create()
            .map_err(transport("cannot create publisher"))?;
        // A /dev/shm filled from now on must be an error, not a SIGBUS mid-stream.
        reserve(
            &publisher,
            config.topic.as_str(),
            config.max_message_bytes,
            config.chunks(),
        )?;
        log_created(&config, generation, available);
        let burst = Burst::new(config.window, config.lag_limit.is_some());
        Ok(Self {
            namespace: namespace.clone(),
            config,
            data: Local::new(data),
            publisher: Local::new(publisher),
            wakeups: Local::new(wakeups),
            released: Local::new(released),
            sending_batch,
            full_queue_ns,
            departed,
            pacing: Local::new(pacing),
            shared_seq,
            ended: Local::new(None),
            burst,
            payload_bytes: 0,
            seq: 0,
            encoder: sluice_core::wire::Encoder::new(),
            _node: Local::new(node),
            _claim: claim,
            _reclaim: ReclaimAfter::new(namespace, true),
        })
    }

    /// The topic's sizing.
    pub fn config(&self) -> &TopicConfig {
        &self.config
    }

    /// Messages published so far (the next sequence number).
    pub fn seq(&self) -> u64 {
        self.seq
    }

    /// Subscribers currently attached, but for those that left while their batches
    /// still hold their ports (see `departure.rs`).
    pub fn subscribers(&self) -> usize {
        let all = self.data.dynamic_config().number_of_subscribers();
        let departed = self.departed.ports();
        if departed.is_empty() {
            return all;
        }
        let mut gone = 0;
        self.data.dynamic_config().list_subscribers(|details| {
            gone += usize::from(departed.contains(&details.subscriber_id.value()));
            CallbackProgression::Continue
        });
        all.saturating_sub(gone)
    }

    /// Subscribers that left while batches they received still hold their ports.
    pub fn departed_subscribers(&self) -> usize {
        self.data
            .dynamic_config()
            .number_of_subscribers()
            .saturating_sub(self.subscribers())
    }

    /// Subscribers currently attached from processes other than this one.
    ///
    /// A device topic's producer frees its slots only once these have detached. A
    /// subscriber in the producer's own process reads the slots directly (the process-wide
    /// registry of `sluice-cuda`), and its views keep the memory alive by themselves: the
    /// producer need not wait for it, and must not, since that subscriber may be the very
    /// code waiting for the producer to finish. A subscriber whose process cannot be told
    /// counts as another process's (waiting is the safe side).
    pub fn subscribers_in_other_processes(&self) -> usize {
        let me = std::process::id();
        let mut others = 0;
        self.data.dynamic_config().list_subscribers(|details| {
            let here = details
                .node_id
                .pid::<Ipc>()
                .is_ok_and(|pid| u32::try_from(pid.value()).is_ok_and(|pid| pid == me));
            if !here {
                others += 1;
            }
            CallbackProgression::Continue
        });
        others
    }

    /// Waits until at least `n` subscribers are attached, or `stop` is set, or `timeout`.
    pub fn wait_for_subscribers(
        &self,
        n: usize,
        timeout: Option<Duration>,
        stop: &AtomicBool,
    ) -> Result<()> {
        let start = Instant::now();
        let attached = self.subscribers();
        if attached < n {
            // Says why nothing is published yet: a subscriber killed before it attached
            // is not counted, and the producer waits for another to take its place.
            tracing::info!(
                topic = %self.config.topic,
                attached,
                "waiting for {n} subscribers before the first batch"
            );
        }
        while self.subscribers() < n {
            if stop.load(Ordering::Relaxed) {
                return Err(SluiceError::Stopped("while waiting for subscribers".into()));
            }
            if timeout.is_some_and(|t| start.elapsed() >= t) {
                return Err(SluiceError::Timeout {
                    what: format!("{n} subscribers on topic '{}'", self.config.topic),
                    seconds: start.elapsed().as_secs_f64(),
                });
            }
            // Subscribers announce themselves on `released` once connected. Dead ones
            // count until reclaimed; a reclaim reads the namespace's directories (about
            // a millisecond), so a waiting producer does it every RECLAIM_EVERY, not at
            // every look.
            let _ = self.released.timed_wait(|_| {}, DEAD_CHECK_INTERVAL);
            self.namespace.reclaim_dead_now_and_then();
        }
        Ok(())
    }

    /// Waits until every subscriber that declared interest in the topic (one waiting
    /// for it, see [`crate::Interest`]) has attached, for at most `grace`, so that
    /// subscribers started before their producer receive the stream from its first
    /// batch. Registrations of dead processes never count. Returns how many live
    /// subscribers had still not attached when `grace` ran out (0: all did).
    pub fn wait_for_interested(&self, grace: Duration, stop: &AtomicBool) -> Result<usize> {
        let start = Instant::now();
        loop {
            let pending = pending_interest(&self.namespace, &self.config.topic);
            if pending == 0 {
                return Ok(0);
            }
            if stop.load(Ordering::Relaxed) {
                return Err(SluiceError::Stopped("while waiting for subscribers".into()));
            }
            if start.elapsed() >= grace {
                return Ok(pending);
            }
            // Subscribers announce themselves on `released` once connected.
            let _ = self.released.timed_wait(|_| {}, INTEREST_POLL_INTERVAL);
        }
    }

    /// Publishes one record batch, already encoded, and wakes idle subscribers.
    pub fn publish_batch(
        &mut self,
        epoch: u64,
        index: u64,
        rows: u64,
        encoded: &Encoded,
    ) -> Result<()> {
        self.publish_batch_in_burst(epoch, index, rows, encoded, false)
    }

    /// Publishes one record batch, already encoded; with `more` (another batch is ready
    /// to follow at once), idle subscribers may be woken once for the burst instead of
    /// once per batch, as [`sluice_core::Burst`] decides. An owed wake-up is paid before
    /// the producer ever waits for a full queue, with the last batch of the burst
    /// (`more = false`), and with every control message.
    pub(crate) fn publish_batch_in_burst(
        &mut self,
        epoch: u64,
        index: u64,
        rows: u64,
        encoded: &Encoded,
        more: bool,
    ) -> Result<()> {
        self.publish_batches_in_burst(epoch, index, rows, 0, encoded, more)
    }

    /// Publishes a message of consecutive producer batches of `batch_rows` rows (the last
    /// may be shorter) from batch `index` on, already encoded as one record batch of
    /// `rows` rows, as `publish_batch_in_burst` publishes one. Subscribers cut it
    /// into its batches (`sluice_core::Receiver`): every cost per message, in the
    /// publisher and in each subscriber, is paid once for them all. `batch_rows` 0, or
    /// as many rows as the message, is one batch.
    pub fn publish_batches_in_burst(
        &mut self,
        epoch: u64,
        index: u64,
        rows: u64,
        batch_rows: u32,
        encoded: &Encoded,
        more: bool,
    ) -> Result<()> {
        if encoded.len() > self.config.max_message_bytes {
            let grown = self.config.grown_for(encoded.len(), shm_available()?)?;
            tracing::warn!(
                topic = %self.config.topic,
                bytes = encoded.len(),
                planned = self.config.max_message_bytes,
                segment_bytes = grown.shm_bytes(),
                "batch is larger than planned; the topic's shared memory grows"
            );
            self.config = grown;
            reserve(
                &self.publisher,
                self.config.topic.as_str(),
                self.config.max_message_bytes,
                self.config.chunks(),
            )?;
        }
        let header = FrameHeader {
            kind: FrameKind::Batch as u32,
            batch_rows,
            epoch,
            index,
            rows,
            len: encoded.len() as u64,
            ..Default::default()
        };
        self.sending_batch.store(true, Ordering::Relaxed);
        let sent = self.send_with(
            header,
            encoded.len(),
            |_, dst, _| encoded.write_to(dst).map(|()| encoded.len()),
            more,
        );
        self.sending_batch.store(false, Ordering::Relaxed);
        if sent.is_ok() {
            self.payload_bytes += encoded.len() as u64;
        }
        sent
    }

    /// Bytes of host batches (Arrow IPC) published since the topic was created.
    pub fn payload_bytes(&self) -> u64 {
        self.payload_bytes
    }

    /// How long this publisher has spent, in all, on subscribers' full queues (asleep
    /// until one frees, or checking whether its subscriber died): the slowest subscriber
    /// pacing the producer. Counted since the topic was created.
    pub fn full_queue_wait(&self) -> Duration {
        Duration::from_nanos(self.full_queue_ns.load(Ordering::Relaxed))
    }

    /// Wakes subscribers for messages sent in a burst whose wake-up is still owed.
    pub fn flush(&mut self) -> Result<()> {
        self.burst.woken();
        self.wakeups
            .pay()
            .map_err(transport("cannot wake subscribers"))
    }

    /// How many times subscribers were woken since the topic was created (one
    /// notification of every subscriber each), for messages of batches and control
    /// messages alike, with those the wait on a full queue pays for a burst.
    pub fn wakeups(&self) -> u64 {
        self.wakeups.count()
    }

    /// Publishes the end of `epoch`, with its totals.
    pub fn publish_end_of_epoch(&mut self, epoch: u64, batches: u64, rows: u64) -> Result<()> {
        // Once an epoch (at most every 250 ms: a reclaim takes about a millisecond),
        // whatever else happens: the services of a dead predecessor go once the last
        // trainer holding one of its batches lets go, and nobody else may be there to
        // remove them then.
        self.namespace.reclaim_dead_now_and_then();
        let header = FrameHeader {
            kind: FrameKind::EndOfEpoch as u32,
            epoch,
            index: batches,
            rows,
            ..Default::default()
        };
        self.send(header, 0, |_| Ok(()))
    }

    /// Publishes the end of the stream.
    pub fn publish_end_of_stream(&mut self, epochs: u64) -> Result<()> {
        self.record_end(Ending::Stream);
        let header = FrameHeader {
            kind: FrameKind::EndOfStream as u32,
            epoch: epochs,
            ..Default::default()
        };
        self.send(header, 0, |_| Ok(()))
    }

    /// Tells subscribers that the producer failed, and why.
    pub fn publish_error(&mut self, message: &str) -> Result<()> {
        self.record_end(Ending::Failed(message.to_string()));
        let bytes = message.as_bytes();
        let header = FrameHeader {
            kind: FrameKind::Error as u32,
            len: bytes.len() as u64,
            ..Default::default()
        };
        self.send(header, bytes.len(), |dst| {
            for (d, s) in dst.iter_mut().zip(bytes) {
                d.write(*s);
            }
            Ok(())
        })
    }

    /// Says how the stream ended where subscribers that attach afterwards (while this
    /// producer lingers) find it (see [`crate::ending`]).
    fn record_end(&mut self, ending: Ending) {
        if self.ended.is_none() {
            *self.ended = EndRecord::register(&self.namespace, &self.config.topic, &ending);
        }
    }

    /// Publishes one batch whose buffers live in GPU memory; the message carries only its
    /// device descriptor.
    ///
    /// `describe` gets the address of the shared-memory chunk the descriptor goes into and
    /// returns the descriptor's bytes. The address identifies the chunk for as long as the
    /// topic lives: iceoryx2 loans a chunk again only after every subscriber released the
    /// message it carried and the history dropped it, which is what sluice-cuda's slot
    /// ledger binds device slots to. Device messages are loaned at the topic's fixed
    /// message size, so the data segment never grows under a device topic (a descriptor
    /// larger than [`TopicConfig::max_message_bytes`] is an error, not a reallocation).
    pub fn publish_device_batch(
        &mut self,
        epoch: u64,
        index: u64,
        rows: u64,
        describe: impl FnOnce(usize) -> Result<Vec<u8>>,
    ) -> Result<()> {
        let header = FrameHeader {
            kind: FrameKind::DeviceBatch as u32,
            epoch,
            index,
            rows,
            ..Default::default()
        };
        let capacity = self.config.max_message_bytes;
        self.sending_batch.store(true, Ordering::Relaxed);
        let sent = self.send_with(
            header,
            capacity,
            |chunk, dst, header| {
                let bytes = describe(chunk)?;
                if bytes.len() > dst.len() {
                    return Err(SluiceError::Internal(format!(
                        "a {}-byte device descriptor does not fit the topic's {}-byte messages",
                        bytes.len(),
                        dst.len()
                    )));
                }
                for (d, s) in dst.iter_mut().zip(&bytes) {
                    d.write(*s);
                }
                header.len = bytes.len() as u64;
                Ok(bytes.len())
            },
            false,
        );
        self.sending_batch.store(false, Ordering::Relaxed);
        sent
    }

    pub(crate) fn send(
        &mut self,
        header: FrameHeader,
        len: usize,
        fill: impl FnOnce(&mut [std::mem::MaybeUninit<u8>]) -> Result<()>,
    ) -> Result<()> {
        self.send_with(header, len, |_, dst, _| fill(dst).map(|()| len), false)
    }

    /// Loans `capacity` bytes (at least one), lets `fill` write a prefix of them (it gets
    /// the chunk's address and the header, and returns the prefix's length), zeroes the
    /// rest, and sends the message; wakes subscribers unless `defer_wake` and the burst
    /// may grow (see [`TopicPublisher::publish_batches_in_burst`]).
    pub(crate) fn send_with(
        &mut self,
        mut header: FrameHeader,
        capacity: usize,
        fill: impl FnOnce(usize, &mut [std::mem::MaybeUninit<u8>], &mut FrameHeader) -> Result<usize>,
        defer_wake: bool,
    ) -> Result<()> {
        self._node.here("producer")?;
        header.seq = self.seq;
        // iceoryx2 does not loan empty slices; control messages carry one unused byte.
        let mut sample = self
            .publisher
            .loan_slice_uninit(capacity.max(1))
            .map_err(transport("cannot loan shared memory for a message"))?;
        let payload = sample.payload_mut();
        let chunk = payload.as_ptr() as usize;
        let len = fill(chunk, &mut payload[..capacity], &mut header)?;
        if len > capacity {
            return Err(SluiceError::Internal(format!(
                "a message wrote {len} bytes into {capacity}"
            )));
        }
        for b in &mut payload[len..] {
            b.write(0);
        }
        header.published_ns = crate::monotonic_ns();
        *sample.user_header_mut() = header;
        // SAFETY: every byte of the payload was written above: `fill` wrote the first
        // `len` bytes (Encoded::write_to checks it covers its destination exactly, error
        // messages and descriptors write all of theirs) and the loop zeroed the rest,
        // including the single byte of an empty message.
        let sample = unsafe { sample.assume_init() };
        sample
            .send()
            .map_err(transport("cannot deliver a message"))?;
        self.pacing.resumed();
        self.seq += 1;
        self.shared_seq.store(self.seq, Ordering::Relaxed);
        // (The backpressure handler runs on this thread, inside `send`: the flag needs
        // no ordering, only sharing with the handler's closure.)
        self.wakeups.owe();
        match self.burst.sent(defer_wake) {
            Wake::Later => Ok(()),
            Wake::Now => self.flush(),
        }
    }

    /// Waits until every subscriber has read everything, so that a clean exit does not
    /// cut off the end of the stream; `quiet` bounds a wait in which no subscriber takes
    /// a message (one that stopped reading), not the wait for a slow one that still reads.
    /// Call it before dropping the publisher: what it queued for a subscriber that has
    /// not received from it yet goes with it (iceoryx2 maps a publisher's segment on a
    /// subscriber's first receive from it, and a segment grown for larger messages is a
    /// new one), and that subscriber gets
    /// [`SluiceError::ProducerLost`](sluice_core::SluiceError::ProducerLost).
    pub fn drain(&self, quiet: Duration) {
        let mut heard = Instant::now();
        // Subscribers detach after the end of the stream; dead ones are reclaimed (every
        // RECLAIM_EVERY, as in `wait_for_subscribers`).
        while self.subscribers() > 0 && heard.elapsed() < quiet {
            // A subscriber that attached meanwhile gets the topic's history (and with it
            // the end of the stream) only when the publisher looks at its connections,
            // which it otherwise does only when it sends.
            let _ = self.publisher.update_connections();
            // Subscribers say on `released` that they took messages (every quarter queue
            // or 250 ms, whichever comes first, and when theirs runs empty).
            let mut progress = false;
            let _ = self
                .released
                .timed_wait(|_| progress = true, DEAD_CHECK_INTERVAL);
            if progress {
                heard = Instant::now();
            }
            self.namespace.reclaim_dead_now_and_then();
        }
    }
}

/// Says how much shared memory a topic takes, and why.
fn log_created(config: &TopicConfig, generation: u32, available: u64) {
    tracing::info!(
        generation,
        "topic '{}' created: {:.1} MiB of shared memory ({} chunks of {} KiB: {} subscribers x ({} queued + {} held + {SPARE_BORROWS} copied) + {} kept for replay + {} loaned); {:.1} MiB free in {SHM_DIR}",
        config.topic,
        config.shm_bytes() as f64 / (1 << 20) as f64,
        config.chunks(),
        config.max_message_bytes.div_ceil(1024),
        config.max_subscribers,
        config.queue_depth(),
        config.max_held,
        config.history(),
        MAX_LOANED,
        available as f64 / (1 << 20) as f64,
    );
}

/// The topic as a transport of the delivery protocol (`sluice_core::delivery`): each
/// batch is encoded and written once into shared memory.
impl Outlet<arrow::record_batch::RecordBatch> for TopicPublisher {
    fn batch(
        &mut self,
        epoch: u64,
        index: u64,
        payload: &arrow::record_batch::RecordBatch,
    ) -> Result<()> {
        let encoded = self.encoder.encode(payload)?;
        self.publish_batch(epoch, index, payload.num_rows() as u64, &encoded)
    }

    fn message(
        &mut self,
        epoch: u64,
        index: u64,
        batch_rows: usize,
        payload: &arrow::record_batch::RecordBatch,
        more: bool,
    ) -> Result<()> {
        let rows = payload.num_rows() as u64;
        // 0, or at least the message's rows: one batch.
        let header_rows = match batch_rows as u64 {
            n if n == 0 || n >= rows => 0,
            n => u32::try_from(n).map_err(|_| {
                SluiceError::Config(format!(
                    "batches of {n} rows: a message's batches hold at most {} rows",
                    u32::MAX
                ))
            })?,
        };
        let encoded = self.encoder.encode(payload)?;
        self.publish_batches_in_burst(epoch, index, rows, header_rows, &encoded, more)
    }

    fn end_of_epoch(&mut self, epoch: u64, batches: u64, rows: u64) -> Result<()> {
        self.publish_end_of_epoch(epoch, batches, rows)
    }

    fn end_of_stream(&mut self, epochs: u64) -> Result<()> {
        self.publish_end_of_stream(epochs)
    }
}
