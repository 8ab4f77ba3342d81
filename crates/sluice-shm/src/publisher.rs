//! The producer end of a topic.

use std::sync::Arc;
use std::sync::atomic::{AtomicBool, AtomicU64, Ordering};
use std::time::{Duration, Instant};

use iceoryx2::port::listener::Listener;
use iceoryx2::port::notifier::{Notifier, NotifierNotifyError};
use iceoryx2::port::publisher::Publisher;
use iceoryx2::port::update_connections::UpdateConnections;
use iceoryx2::port::{BackpressureAction, BackpressureInfo};
use iceoryx2::prelude::*;
use iceoryx2::service::builder::event::EventCreateError;
use iceoryx2::service::builder::publish_subscribe::{
    PublishSubscribeCreateError, PublishSubscribeOpenError as OpenError,
};
use iceoryx2::service::port_factory::publish_subscribe::PortFactory as PubSubFactory;
use sluice_core::wire::{ALIGNMENT, Encoded};
use sluice_core::{FrameKind, Result, SluiceError, TopicName};

use crate::claim::{Claim, GENERATIONS};
use crate::departure::Departed;
use crate::header::FrameHeader;
use crate::interest::pending_interest;
use crate::namespace::{Liveness, Namespace, ReclaimAfter, SHM_DIR, shm_available};
use crate::pacing::PacingRecord;
use crate::process::Local;
use crate::subscriber::SPARE_BORROWS;
use crate::{Ipc, permission_denied, transport};

pub(crate) type DataService = PubSubFactory<Ipc, [u8], FrameHeader>;

/// How often a producer waiting for declared subscribers looks at their registrations
/// when no attach wakes it.
const INTEREST_POLL_INTERVAL: Duration = Duration::from_millis(20);
/// How long a waiting producer sleeps on the `released` event before it looks for dead
/// subscribers again; bounds the stall a killed subscriber causes.
const DEAD_CHECK_INTERVAL: Duration = Duration::from_millis(50);
/// Loaned samples a producer may have in flight.
const MAX_LOANED: usize = 2;
/// Per-sample bookkeeping iceoryx2 adds to each chunk (header, user header, alignment).
const CHUNK_OVERHEAD: u64 = 256;

/// Smallest shared-memory chunk a topic is planned with.
const MIN_MESSAGE_BYTES: usize = 4096;

/// A topic's `max_message_bytes` for messages of at most `len` bytes: at least 4 KiB, a
/// multiple of the payload alignment.
pub fn message_bytes(len: usize) -> usize {
    len.max(MIN_MESSAGE_BYTES).next_multiple_of(ALIGNMENT)
}

/// A topic's `max_message_bytes` planned from its first batch of `first` encoded bytes:
/// half again, since later batches may carry longer strings or lists (a larger one still
/// grows the topic, see [`TopicConfig::grown_for`]).
pub fn planned_message_bytes(first: usize) -> usize {
    message_bytes(first.saturating_add(first / 2))
}

/// How a topic is sized. Fixed when the topic is created.
#[derive(Debug, Clone)]
pub struct TopicConfig {
    /// The topic's name.
    pub topic: TopicName,
    /// Messages a subscriber may have queued; the producer's lead over the slowest one.
    pub window: usize,
    /// Most subscribers at once.
    pub max_subscribers: usize,
    /// Messages a subscriber may hold (received, not yet dropped) at once.
    pub max_held: usize,
    /// Expected largest message in bytes; larger ones make the topic grow its memory.
    pub max_message_bytes: usize,
    /// `None`: the slowest subscriber sets the pace (queues hold `window` messages).
    /// `Some(n)`: queues hold `n` messages and the producer waits for no one: a
    /// subscriber `n` messages behind misses the next message. End-of-epoch, end-of-stream
    /// and error messages are always delivered.
    pub lag_limit: Option<usize>,
}

impl TopicConfig {
    /// Shared-memory chunks the producer preallocates: enough that it can always loan
    /// one, whatever its subscribers hold or have queued, and the replay history.
    /// Saturates: absurd options (`SET sluice.window = 1e18`) make a topic too large for
    /// any `/dev/shm` (`ShmTooSmall`), not an overflow.
    pub fn chunks(&self) -> u64 {
        let per_subscriber = (self.queue_depth() as u64)
            .saturating_add(self.max_held as u64)
            .saturating_add(SPARE_BORROWS as u64);
        (self.max_subscribers as u64)
            .saturating_mul(per_subscriber)
            .saturating_add(self.history() as u64)
            .saturating_add(MAX_LOANED as u64)
    }

    /// Messages the topic keeps for subscribers that join with replay (and for
    /// subscribers that reconnect to a restarted producer): as many as a queue holds.
    pub fn history(&self) -> usize {
        self.queue_depth()
    }

    /// Messages a subscriber's queue holds.
    pub fn queue_depth(&self) -> usize {
        self.lag_limit.unwrap_or(self.window)
    }

    /// Bytes of shared memory the topic's data segment takes.
    pub fn shm_bytes(&self) -> u64 {
        self.chunks()
            .saturating_mul((self.max_message_bytes as u64).saturating_add(CHUNK_OVERHEAD))
    }

    /// The topic after a message of `len` bytes, more than planned: iceoryx2 adds a
    /// segment of as many chunks, each the next power of two, beside the one in use.
    /// Fails with [`SluiceError::ShmTooSmall`] if `/dev/shm` (`shm_free` bytes free) cannot
    /// hold it: its pages are only used when written, so a segment larger than the free
    /// space would be created and then kill this process with SIGBUS mid-stream.
    pub fn grown_for(&self, len: usize, shm_free: u64) -> Result<Self> {
        let grown = Self {
            max_message_bytes: len.next_power_of_two(),
            ..self.clone()
        };
        let needed = grown.shm_bytes();
        if needed > shm_free {
            return Err(SluiceError::ShmTooSmall {
                topic: self.topic.to_string(),
                needed,
                available: shm_free,
                path: SHM_DIR.into(),
            });
        }
        Ok(grown)
    }

    /// Whether this topic may take its size to carry larger messages than `single`, the
    /// same topic with one batch per message (`sluice.message_batches`): it may take as
    /// much as `single` takes, or up to an eighth of the free shared memory (`shm_free`
    /// bytes), the share [`Self::auto_window`] keeps to. Messages of several batches
    /// make every chunk larger, including those the subscribers may hold (which do not
    /// shrink with the window), so where `/dev/shm` is small (a container's 64 MiB) the
    /// producer keeps the messages of one batch that fitted before.
    pub fn fits_beside(&self, single: &TopicConfig, shm_free: u64) -> bool {
        self.shm_bytes() <= single.shm_bytes().max(shm_free / AUTO_SHM_SHARE)
    }

    /// The window `sluice.window = 'auto'` gives this topic (its other fields set) on this
    /// machine: its CPU cores and the bytes free in `/dev/shm` now.
    ///
    /// A subscriber's queue holds about 2 MiB of messages per core, from 4 to 32 MiB, as
    /// a power of two of 4 to 128 messages; then the window is halved (not below 4) while
    /// the topic would take more than an eighth of the free shared memory. An eighth,
    /// because a batch larger than planned makes iceoryx2 add a segment of the same
    /// chunks at the next power of two while the first may still be in use: the topic
    /// must be able to triple.
    ///
    /// Why bytes and cores: a deeper queue absorbs the moments a subscriber is late (a
    /// wake-up, a preempted core) and wakes subscribers once per longer burst, so
    /// fan-out and CPU improve with depth, but only up to what the caches hold on a small
    /// machine. Measured (docs/benchmarks.md, "The window in bytes"): 107 KiB batches on 2
    /// cores were best at 16 to 32 messages (128 cost CPU); on 16 cores 128 took fan-out
    /// at N = 8 from 0.64 (8) and 0.68 (32) to 0.84.
    pub fn auto_window_here(&self) -> Result<usize> {
        let cores = std::thread::available_parallelism().map_or(1, |n| n.get());
        Ok(self.auto_window(cores, shm_available()?))
    }

    /// [`Self::auto_window_here`] on a machine with `cores` CPU cores and `shm_free` bytes
    /// free in `/dev/shm`: the rule itself, a pure function.
    pub fn auto_window(&self, cores: usize, shm_free: u64) -> usize {
        let queue_bytes = (cores.max(1) as u64 * AUTO_QUEUE_BYTES_PER_CORE)
            .clamp(AUTO_QUEUE_BYTES.0, AUTO_QUEUE_BYTES.1);
        let chunk = self.max_message_bytes as u64 + CHUNK_OVERHEAD;
        let fits = queue_bytes / chunk;
        let mut window = match fits {
            0 => AUTO_WINDOW.0,
            n => (1usize << n.ilog2()).clamp(AUTO_WINDOW.0, AUTO_WINDOW.1),
        };
        while window > AUTO_WINDOW.0 {
            let sized = Self {
                window,
                lag_limit: None,
                ..self.clone()
            };
            if sized.shm_bytes() <= shm_free / AUTO_SHM_SHARE {
                break;
            }
            window /= 2;
        }
        window
    }
}

/// Bytes of queued messages per CPU core that `sluice.window = 'auto'` aims for, per
/// subscriber (see [`TopicConfig::auto_window`]).
const AUTO_QUEUE_BYTES_PER_CORE: u64 = 2 << 20;
/// The least and most bytes of a queue under `sluice.window = 'auto'`.
const AUTO_QUEUE_BYTES: (u64, u64) = (4 << 20, 32 << 20);
/// `sluice.window = 'auto'` keeps a topic to this fraction (1/n) of the free `/dev/shm`.
const AUTO_SHM_SHARE: u64 = 8;
/// The least and most messages of a queue under `sluice.window = 'auto'`.
const AUTO_WINDOW: (usize, usize) = (4, 128);

/// The name of one of the services of `topic`'s `generation` (see [`crate::claim`]).
pub(crate) fn service_name(topic: &TopicName, generation: u32, part: &str) -> Result<ServiceName> {
    let name = format!("sluice/{topic}/{generation}/{part}");
    ServiceName::new(&name).map_err(transport("invalid service name"))
}

/// Event ids on the `released` service.
pub(crate) mod events {
    /// A subscriber took a message off its queue.
    pub const RELEASED: usize = 1;
}

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
    /// Messages sent since the last wake-up.
    unwoken: usize,
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
        // Every subscriber may hold a node in a dead generation (through a batch it keeps)
        // while a node of its own looks for the live one, and a producer or observer
        // looks too: room for all, so that nobody is refused for nodes that are merely
        // holding on.
        let max_nodes = 2 * config.max_subscribers + 2;

        let ready_name = service_name(topic, generation, "ready")?;
        let ready_service = create_or_rescue(
            namespace,
            topic,
            &ready_name,
            MessagingPattern::Event,
            || {
                node.service_builder(&ready_name)
                    .event()
                    .max_notifiers(1)
                    .max_listeners(config.max_subscribers)
                    .max_nodes(max_nodes)
                    .create()
            },
        )?;
        let released_name = service_name(topic, generation, "released")?;
        let released_service = create_or_rescue(
            namespace,
            topic,
            &released_name,
            MessagingPattern::Event,
            || {
                node.service_builder(&released_name)
                    .event()
                    .max_notifiers(config.max_subscribers)
                    .max_listeners(1)
                    .max_nodes(max_nodes)
                    .create()
            },
        )?;
        let alignment = Alignment::new(ALIGNMENT)
            .ok_or_else(|| SluiceError::Internal("invalid alignment".into()))?;
        let data_name = service_name(topic, generation, "data")?;
        let data = create_or_rescue(
            namespace,
            topic,
            &data_name,
            MessagingPattern::PublishSubscribe,
            || {
                node.service_builder(&data_name)
                    .publish_subscribe::<[u8]>()
                    .user_header::<FrameHeader>()
                    .payload_alignment(alignment)
                    .enable_safe_overflow(false)
                    .history_size(config.history())
                    .subscriber_max_buffer_size(config.queue_depth())
                    .subscriber_max_borrowed_samples(config.max_held.saturating_add(SPARE_BORROWS))
                    .max_subscribers(config.max_subscribers)
                    .max_publishers(1)
                    .max_nodes(max_nodes)
                    .create()
            },
        )?;

        let wakeups = Arc::new(Wakeups {
            ready: ready_service
                .notifier_builder()
                .create()
                .map_err(transport("cannot create ready notifier"))?,
            owed: AtomicBool::new(false),
            count: AtomicU64::new(0),
        });
        let released = Arc::new(
            released_service
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
        tracing::info!(
            generation,
            "topic '{}' created: {:.1} MiB of shared memory ({} chunks of {} KiB: {} subscribers x ({} queued + {} held + {SPARE_BORROWS} copied) + {} kept for replay + {} loaned); {:.1} MiB free in {SHM_DIR}",
            config.topic,
            needed as f64 / (1 << 20) as f64,
            config.chunks(),
            config.max_message_bytes.div_ceil(1024),
            config.max_subscribers,
            config.queue_depth(),
            config.max_held,
            config.history(),
            MAX_LOANED,
            available as f64 / (1 << 20) as f64,
        );
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
            unwoken: 0,
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
    /// still hold their ports (see [`crate::departure`]).
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
    /// once per batch.
    ///
    /// Every wake-up of an idle subscriber costs the producer a system call and the
    /// subscriber a context switch, for each subscriber: with a fast subscriber (idle
    /// between batches) that is a large part of a batch's cost on both sides (profiles
    /// in docs/benchmarks.md). A burst owes its wake-up for at most half the window (so
    /// that subscribers start on a burst before their queues fill; with a lag limit it
    /// owes none, see `burst_limit`), and the wake-up is paid before the producer ever
    /// waits for a full queue, with the last batch of the burst (`more = false`), and
    /// with every control message.
    pub fn publish_batch_in_burst(
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
    /// `rows` rows, as [`Self::publish_batch_in_burst`] publishes one. Subscribers cut it
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
        sent
    }

    /// Messages a burst may send before it wakes subscribers: half a queue, so that they
    /// start on it before their queues fill. With a lag limit, none: a subscriber asleep
    /// through a burst would have less than the limit to catch up before it misses a
    /// batch.
    fn burst_limit(&self) -> usize {
        match self.config.lag_limit {
            Some(_) => 0,
            None => self.config.window / 2,
        }
    }

    /// How long this publisher has spent, in all, on subscribers' full queues (asleep
    /// until one frees, or checking whether its subscriber died): the slowest subscriber
    /// pacing the producer. Counted since the topic was created.
    pub fn full_queue_wait(&self) -> Duration {
        Duration::from_nanos(self.full_queue_ns.load(Ordering::Relaxed))
    }

    /// Wakes subscribers for messages sent in a burst whose wake-up is still owed.
    pub fn flush(&mut self) -> Result<()> {
        self.unwoken = 0;
        self.wakeups
            .pay()
            .map_err(transport("cannot wake subscribers"))
    }

    /// How many times subscribers were woken since the topic was created (one
    /// notification of every subscriber each), for messages of batches and control
    /// messages alike, with those the wait on a full queue pays for a burst.
    pub fn wakeups(&self) -> u64 {
        self.wakeups.count.load(Ordering::Relaxed)
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
        let header = FrameHeader {
            kind: FrameKind::EndOfStream as u32,
            epoch: epochs,
            ..Default::default()
        };
        self.send(header, 0, |_| Ok(()))
    }

    /// Tells subscribers that the producer failed, and why.
    pub fn publish_error(&mut self, message: &str) -> Result<()> {
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
    /// may grow (see [`TopicPublisher::publish_batch_in_burst`]).
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
        self.unwoken += 1;
        // (The backpressure handler runs on this thread, inside `send`: the flag needs
        // no ordering, only sharing with the handler's closure.)
        self.wakeups.owed.store(true, Ordering::Relaxed);
        if defer_wake && self.unwoken < self.burst_limit() {
            return Ok(());
        }
        self.flush()
    }

    /// Waits (bounded by `timeout`) until every subscriber has read everything, so that a
    /// clean exit does not cut off the end of the stream. Call it before dropping the
    /// publisher: what it queued for a subscriber that has not received from it yet goes
    /// with it (iceoryx2 maps a publisher's segment on a subscriber's first receive from
    /// it), and that subscriber gets [`SluiceError::ProducerLost`](sluice_core::SluiceError::ProducerLost).
    pub fn drain(&self, timeout: Duration) {
        let start = Instant::now();
        // Subscribers detach after the end of the stream; dead ones are reclaimed (every
        // RECLAIM_EVERY, as in `wait_for_subscribers`).
        while self.subscribers() > 0 && start.elapsed() < timeout {
            // A subscriber that attached meanwhile gets the topic's history (and with it
            // the end of the stream) only when the publisher looks at its connections,
            // which it otherwise does only when it sends.
            let _ = self.publisher.update_connections();
            let _ = self.released.timed_wait(|_| {}, DEAD_CHECK_INTERVAL);
            self.namespace.reclaim_dead_now_and_then();
        }
    }
}

/// How long a new producer waits for the subscribers of a dead producer before it says
/// why it is still waiting.
const TAKEOVER_WAIT: Duration = Duration::from_secs(5);
/// How often it says so again afterwards.
const TAKEOVER_NOTE_EVERY: Duration = Duration::from_secs(15);

/// Chooses the generation of the topic's services for a producer that has claimed the
/// topic (see [`crate::claim`]): the first one that does not exist, or that a producer
/// killed while creating it left half-created (`create_or_rescue` removes that).
///
/// First waits until no live subscriber is attached to a dead producer's generation:
/// they are taking what it queued for them, and those with `reconnect` declare their
/// interest before they let go (see [`crate::interest`]), so that this producer waits for
/// them before its first batch and none of them misses the start of the resumed
/// stream. A trainer with a deep window and a slow step takes a while, so the wait lasts
/// as long as live subscribers are attached, saying so every so often, until `stop`.
/// What holds a dead generation without being attached to it (a trainer holding one of
/// its batches) is not waited for.
fn wait_for_dead_topic(
    namespace: &Namespace,
    node: &Node<Ipc>,
    topic: &TopicName,
    stop: &AtomicBool,
) -> Result<u32> {
    let exists = |name: &ServiceName, pattern| {
        matches!(
            <Ipc as iceoryx2::prelude::Service>::does_exist(name, namespace.config(), pattern),
            Ok(true)
        )
    };
    let start = Instant::now();
    let mut next_note = TAKEOVER_WAIT;
    loop {
        let mut free = None;
        let mut attached = 0;
        let mut unknown = false;
        for generation in 0..GENERATIONS {
            let name = service_name(topic, generation, "data")?;
            let events = ["ready", "released"].into_iter().any(|part| {
                service_name(topic, generation, part)
                    .is_ok_and(|name| exists(&name, MessagingPattern::Event))
            });
            if !exists(&name, MessagingPattern::PublishSubscribe) && !events {
                free.get_or_insert(generation);
                continue;
            }
            match node
                .service_builder(&name)
                .publish_subscribe::<[u8]>()
                .user_header::<FrameHeader>()
                .open()
            {
                Ok(service) => match producer_state(namespace, &service) {
                    // Its claim was free: a producer that does not claim its topic
                    // (another Sluice version) serves it.
                    Liveness::Alive => {
                        tracing::debug!(topic = %topic, generation, "the topic's producer is alive");
                        return Err(SluiceError::TopicBusy(topic.to_string()));
                    }
                    // Its monitor cannot be read right now (an interrupted read, or
                    // not this user's): look again, for a while.
                    Liveness::Unknown if start.elapsed() >= TAKEOVER_WAIT => {
                        return Err(SluiceError::TopicBusy(topic.to_string()));
                    }
                    Liveness::Unknown => unknown = true,
                    Liveness::Gone => attached += live_subscribers(namespace, topic, &service),
                },
                // Left half-created by a producer killed while creating its data service
                // (its events, created before, go with the dead producer's node).
                Err(OpenError::HangsInCreation) if !events => {
                    free.get_or_insert(generation);
                }
                // No room to look: its subscribers may still be attached.
                Err(OpenError::ExceedsMaxNumberOfNodes) => attached += 1,
                // Its data service is gone, or going; its events are being removed too.
                Err(_) => {}
            }
        }
        if let (Some(generation), 0, false) = (free, attached, unknown) {
            return Ok(generation);
        }
        if stop.load(Ordering::Relaxed) {
            let why = if attached > 0 {
                format!(
                    "while waiting for the {attached} subscriber(s) of topic '{topic}' still \
                     attached to its previous producer (gone) to let go"
                )
            } else if unknown {
                format!("while waiting to learn whether topic '{topic}' has a live producer")
            } else {
                format!(
                    "while waiting for the processes that keep batches of topic '{topic}''s \
                     earlier producers to let go"
                )
            };
            return Err(SluiceError::Stopped(why));
        }
        let waited = start.elapsed();
        if waited >= next_note {
            if attached > 0 {
                tracing::warn!(
                    topic = %topic,
                    "{attached} subscriber(s) are still attached to the topic's previous \
                     producer, which is gone: each lets go once it has taken what that \
                     producer queued for it (a trainer that asks for no batch keeps it); \
                     waiting ({} s so far) — stop a trainer that hangs",
                    waited.as_secs()
                );
            } else if free.is_none() {
                tracing::warn!(
                    topic = %topic,
                    "all {GENERATIONS} generations of the topic's services are held by \
                     processes that keep batches of producers that died; waiting for them \
                     to let go ({} s so far)",
                    waited.as_secs()
                );
            }
            next_note = waited + TAKEOVER_NOTE_EVERY;
        }
        std::thread::sleep(Duration::from_millis(20));
        namespace.reclaim_dead_now_and_then();
    }
}

/// Subscribers of the data service whose process is not known to be dead, but for those
/// that left while batches they keep hold their ports (see [`crate::departure`]).
fn live_subscribers(namespace: &Namespace, topic: &TopicName, data: &DataService) -> usize {
    let departed = crate::departure::departed_ports(namespace, topic);
    let mut nodes = Vec::new();
    data.dynamic_config().list_subscribers(|details| {
        if !departed.contains(&details.subscriber_id.value()) {
            nodes.push(details.node_id);
        }
        CallbackProgression::Continue
    });
    nodes
        .into_iter()
        .filter(|id| namespace.node_liveness(id) != Liveness::Gone)
        .count()
}

/// The state of the data service's publisher's process: [`Liveness::Gone`] also where
/// there is no publisher. Removes nothing: a dead producer's resources are left to
/// [`Namespace::reclaim_dead`], which keeps them while its subscribers may still have to
/// take what it queued.
pub(crate) fn producer_state(namespace: &Namespace, data: &DataService) -> Liveness {
    let mut producer = None;
    data.dynamic_config().list_publishers(|details| {
        producer = Some(details.node_id);
        CallbackProgression::Stop
    });
    match producer {
        Some(node_id) => namespace.node_liveness(&node_id),
        None => Liveness::Gone,
    }
}

/// Whether the data service has a publisher whose process is alive (or may be).
pub(crate) fn producer_alive(namespace: &Namespace, data: &DataService) -> bool {
    producer_state(namespace, data) != Liveness::Gone
}

/// How creating one of a topic's services failed, read from iceoryx2's error enums.
trait CreateFailure: std::fmt::Debug {
    /// Another producer has the topic, or is creating it right now.
    fn busy(&self) -> bool;
    /// The namespace's files belong to someone else.
    fn denied(&self) -> bool;
}

/// iceoryx2's create errors of both service kinds have the same variants for this.
macro_rules! create_failure {
    ($($error:ty),*) => {$(
        impl CreateFailure for $error {
            fn busy(&self) -> bool {
                matches!(self, Self::AlreadyExists | Self::IsBeingCreatedByAnotherInstance)
            }
            fn denied(&self) -> bool {
                matches!(self, Self::InsufficientPermissions)
            }
        }
    )*};
}
create_failure!(EventCreateError, PublishSubscribeCreateError);

/// Creates one of the topic's services. A service that "already exists" although no
/// live producer has the topic (`wait_for_dead_topic` made sure) may be one a producer
/// was killed while creating: iceoryx2 then reports it as existing to creators and as
/// hanging in creation to openers, forever. Once it is older than iceoryx2's creation
/// timeout, such a leftover is removed and the service created again.
fn create_or_rescue<T, E: CreateFailure>(
    namespace: &Namespace,
    topic: &TopicName,
    name: &ServiceName,
    pattern: MessagingPattern,
    mut create: impl FnMut() -> std::result::Result<T, E>,
) -> Result<T> {
    let e = match create() {
        Ok(service) => return Ok(service),
        Err(e) if e.busy() => e,
        Err(e) => return Err(busy_or(namespace, topic, e)),
    };
    // A creator has `creation_timeout` to finish; one that takes longer died.
    let timeout = namespace.config().global.creation_timeout;
    let deadline = Instant::now() + timeout + Duration::from_millis(500);
    loop {
        match namespace.half_created_for(name, pattern) {
            None => return Err(busy_or(namespace, topic, e)),
            Some((file, age)) if age > timeout => {
                if std::fs::remove_file(&file).is_err() {
                    return Err(busy_or(namespace, topic, e));
                }
                tracing::warn!(
                    topic = %topic,
                    "removed the remains of '{}', which a killed producer left half-created",
                    name.as_str()
                );
                return create().map_err(|e| busy_or(namespace, topic, e));
            }
            Some(_) if Instant::now() >= deadline => return Err(busy_or(namespace, topic, e)),
            Some(_) => std::thread::sleep(Duration::from_millis(50)),
        }
    }
}

fn busy_or(namespace: &Namespace, topic: &TopicName, e: impl CreateFailure) -> SluiceError {
    if e.busy() {
        // The creator holds the topic's claim: no other producer is creating it.
        SluiceError::Transport(format!(
            "cannot create topic '{topic}': one of its services is left over from a producer \
             that is gone ({e:?}), and is neither removable yet nor held by a live subscriber; \
             try again in a moment, or stop the processes of namespace '{}' and remove {}",
            namespace.name(),
            namespace.root().display()
        ))
    } else if e.denied() {
        permission_denied(namespace, topic)
    } else {
        SluiceError::Transport(format!("cannot create topic '{topic}': {e:?}"))
    }
}

/// A topic's wake-ups of its subscribers, shared by the publishing thread and its
/// backpressure handler (which runs on that thread, inside `send`: the atomics need no
/// ordering, only sharing with the handler's closure).
struct Wakeups {
    /// Notifies every subscriber's `ready` listener.
    ready: Notifier<Ipc>,
    /// Messages were sent whose wake-up is still owed (see
    /// [`TopicPublisher::publish_batch_in_burst`]).
    owed: AtomicBool,
    /// Wake-ups paid so far ([`TopicPublisher::wakeups`]).
    count: AtomicU64,
}

impl Wakeups {
    /// Wakes the subscribers if a wake-up is owed, and counts it.
    fn pay(&self) -> std::result::Result<(), NotifierNotifyError> {
        if self.owed.swap(false, Ordering::Relaxed) {
            self.count.fetch_add(1, Ordering::Relaxed);
            self.ready.notify()?;
        }
        Ok(())
    }
}

/// Decides what the producer does when a subscriber's queue is full.
struct BackpressureWaiter {
    /// Subscribers that left (their queues are never waited for).
    departed: Arc<Departed>,
    /// Says which subscriber a long wait is for.
    pacing: Arc<PacingRecord>,
    /// Messages published so far (the publisher's next sequence number).
    seq: Arc<AtomicU64>,
    /// Messages a subscriber's queue holds.
    queue_depth: usize,
    released: Arc<Listener<Ipc>>,
    data: DataService,
    namespace: Namespace,
    stop: Arc<AtomicBool>,
    last_check: std::sync::Mutex<Instant>,
    /// Whether a full queue means "too far behind" rather than "wait".
    lag_limit: bool,
    /// Set while a batch (not a control message) is being sent.
    sending_batch: Arc<AtomicBool>,
    /// The topic's wake-ups, and whether one is owed for a burst.
    wakeups: Arc<Wakeups>,
    /// Nanoseconds spent on full queues (see [`TopicPublisher::full_queue_wait`]).
    waited_ns: Arc<AtomicU64>,
}

impl BackpressureWaiter {
    /// Counts the whole time spent on a full queue (the dead-subscriber checks included)
    /// in [`TopicPublisher::full_queue_wait`].
    fn on_full_queue(&self, info: &BackpressureInfo) -> BackpressureAction {
        let entered = Instant::now();
        let action = self.decide(info);
        self.waited_ns
            .fetch_add(entered.elapsed().as_nanos() as u64, Ordering::Relaxed);
        action
    }

    fn decide(&self, info: &BackpressureInfo) -> BackpressureAction {
        // A subscriber that left: its queue stays full until its batches are dropped.
        // Checked first, so that its full queue costs nothing more, burst wake-ups
        // included.
        if self.departed.known(info.receiver_port_id) {
            return BackpressureAction::DiscardData;
        }
        // A subscriber whose queue is full may be asleep, waiting for the wake-up of a
        // burst: pay it before waiting for (or skipping) that subscriber.
        let _ = self.wakeups.pay();
        if self.stop.load(Ordering::Relaxed) {
            return BackpressureAction::DiscardData;
        }
        // Dead subscribers are looked for at most every DEAD_CHECK_INTERVAL.
        let check = {
            let mut last = self.last_check.lock().unwrap_or_else(|p| p.into_inner());
            let due = last.elapsed() >= DEAD_CHECK_INTERVAL;
            if due {
                *last = Instant::now();
            }
            due
        };
        if check {
            if self.departed.contains(info.receiver_port_id) {
                return BackpressureAction::DiscardData;
            }
            self.namespace.reclaim_dead();
            // A listing taken while another process edits the subscriber list can miss
            // an entry: a subscriber counts as gone only if two listings agree.
            if !self.subscriber_attached(info.receiver_port_id)
                && !{
                    std::thread::sleep(Duration::from_millis(2));
                    self.subscriber_attached(info.receiver_port_id)
                }
            {
                tracing::warn!("a subscriber went away with a full queue; continuing without it");
                return BackpressureAction::DiscardData;
            }
        }
        if self.lag_limit && self.sending_batch.load(Ordering::Relaxed) {
            // The subscriber is a whole queue (the lag limit) behind: it misses this
            // batch, and notices the gap in sequence numbers.
            return BackpressureAction::DiscardData;
        }
        let port = info.receiver_port_id;
        self.pacing.waiting(
            port,
            self.seq.load(Ordering::Relaxed),
            self.queue_depth,
            || self.subscriber_pid(port),
        );
        // Sleep until some subscriber takes a message (or the interval passes).
        let _ = self.released.timed_wait(|_| {}, DEAD_CHECK_INTERVAL);
        BackpressureAction::Retry
    }

    /// The process of the subscriber with port `port_id` (0 if unknown).
    fn subscriber_pid(&self, port_id: u128) -> u32 {
        let mut pid = 0;
        self.data.dynamic_config().list_subscribers(|details| {
            if details.subscriber_id.value() == port_id {
                pid = details
                    .node_id
                    .pid::<Ipc>()
                    .map_or(0, |p| u32::try_from(p.value()).unwrap_or(0));
                CallbackProgression::Stop
            } else {
                CallbackProgression::Continue
            }
        });
        pid
    }

    fn subscriber_attached(&self, port_id: u128) -> bool {
        let mut found = false;
        self.data.dynamic_config().list_subscribers(|details| {
            if details.subscriber_id.value() == port_id {
                found = true;
                CallbackProgression::Stop
            } else {
                CallbackProgression::Continue
            }
        });
        found
    }
}

/// The topic as a transport of the delivery protocol (`sluice_core::delivery`): each
/// batch is encoded and written once into shared memory.
impl sluice_core::Outlet<arrow::record_batch::RecordBatch> for TopicPublisher {
    fn batch(
        &mut self,
        epoch: u64,
        index: u64,
        payload: &arrow::record_batch::RecordBatch,
    ) -> Result<()> {
        let encoded = self.encoder.encode(payload)?;
        self.publish_batch(epoch, index, payload.num_rows() as u64, &encoded)
    }

    fn end_of_epoch(&mut self, epoch: u64, batches: u64, rows: u64) -> Result<()> {
        self.publish_end_of_epoch(epoch, batches, rows)
    }

    fn end_of_stream(&mut self, epochs: u64) -> Result<()> {
        self.publish_end_of_stream(epochs)
    }
}
