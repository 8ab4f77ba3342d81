//! The subscriber end of a topic.

use std::ptr::NonNull;
use std::sync::Arc;
use std::sync::atomic::{AtomicUsize, Ordering};
use std::time::{Duration, Instant};

use arrow::buffer::Buffer;
use arrow::record_batch::RecordBatch;
use iceoryx2::port::ReceiveError;
use iceoryx2::port::listener::{Listener, ListenerWaitError};
use iceoryx2::port::notifier::Notifier;
use iceoryx2::port::subscriber::SubscriberCreateError;
use iceoryx2::prelude::*;
use iceoryx2::sample::Sample;
use iceoryx2::service::port_factory::publish_subscribe::PortFactory as DataService;
use sluice_core::{FrameKind, Result, SluiceError, TopicName, wire};

use crate::attach::{Attached, Search};
use crate::claim::GENERATIONS;
use crate::config::SPARE_BORROWS;
use crate::frame::{BatchForm, Frame, OnMaxHeld};
use crate::header::FrameHeader;
use crate::interest::Interest;
use crate::liveness::{producer_alive, producer_state};
use crate::namespace::Liveness;
use crate::namespace::{Namespace, ReclaimAfter};
use crate::naming::{events, service_name};
use crate::process::Local;
use crate::sample::{Port, PortHold, SampleOwner, SamplePayload};
use crate::{Ipc, transport};

/// How often a waiting subscriber checks that its producer is alive; bounds the time
/// to [`SluiceError::ProducerLost`].
const LIVENESS_INTERVAL: Duration = Duration::from_millis(100);
/// How often a subscriber that asked for the history looks for it, until it comes.
const HISTORY_POLL: Duration = Duration::from_millis(2);

/// `released` notifications per queue's worth of messages taken while the queue holds
/// more: a producer asleep on this subscriber's full queue is woken once a quarter of it
/// is free (see [`TopicSubscriber::recv`]).
const RELEASES_PER_QUEUE: usize = 4;

/// The longest a subscriber that takes messages goes without saying so on `released`,
/// however slowly it takes them: a finished producer waits for subscribers that still
/// take messages, and gives up on one it has not heard from for its linger
/// ([`crate::TopicPublisher::drain`]).
const RELEASE_AT_LEAST_EVERY: Duration = Duration::from_millis(250);

/// What a subscriber was told about handing its batches over.
pub(crate) struct Settings {
    columns: wire::Columns,
    form: BatchForm,
    on_max_held: OnMaxHeld,
}

/// The subscriber end of a topic.
pub struct TopicSubscriber {
    topic: TopicName,
    namespace: Namespace,
    // The iceoryx2 handles are `Local`: a forked child's copy of this subscriber neither
    // uses nor drops them (see `crate::process`).
    data: Local<DataService<Ipc, [u8], FrameHeader>>,
    /// The port; `None` once detached (see [`PortHold`]).
    subscriber: Local<Option<Port>>,
    /// Wakes this subscriber when data is queued; `None` once detached.
    ready: Local<Option<Listener<Ipc>>>,
    released: Local<Notifier<Ipc>>,
    next_seq: Option<u64>,
    /// When a subscriber that asked for the history attached, until its first message:
    /// iceoryx2 delivers the history when the producer next sends, without waking it.
    awaits_history: Option<Instant>,
    /// `published_ns` of the newest batch received.
    last_published_ns: Option<u64>,
    stashed: Local<Option<Sample<Ipc, [u8], FrameHeader>>>,
    ended: bool,
    held: Arc<AtomicUsize>,
    /// Messages taken from the queue since the last `released` notification.
    untold: usize,
    /// When `released` was last notified.
    told_at: Instant,
    /// How many messages are taken between two `released` notifications while the queue
    /// holds more (see [`TopicSubscriber::recv`]).
    tell_every: usize,
    /// Decodes batches, keeping the topic's schema from one message to the next.
    decoder: wire::Decoder,
    /// How batches are handed over.
    form: BatchForm,
    /// The port as the samples handed out keep it (see [`PortHold`]); `None` once
    /// detached (the samples still held keep it, and the port, alive).
    hold: Local<Option<Arc<PortHold>>>,
    /// Whether batches are received as private copies once `max_held` are held (see
    /// [`TopicSubscriber::recv`]).
    on_max_held: OnMaxHeld,
    /// Whether the copies of [`OnMaxHeld::Copy`] were warned of.
    warned_beyond_max_held: bool,
    // Dropped after the ports above: they belong to it.
    _node: Local<Node<Ipc>>,
    // Dropped last, once this subscriber has let go of the topic; the samples it handed
    // out share it, so that the last of them to go reclaims.
    reclaim: Arc<ReclaimAfter>,
}

impl Drop for TopicSubscriber {
    fn drop(&mut self) {
        if !self._node.is_here() {
            return;
        }
        if producer_state(&self.namespace, &self.data) == Liveness::Gone {
            self.producer_found_gone();
        }
        // Dropped without detaching (a subscriber object collected by Python's GC): the
        // batches it handed out keep their port, and the producer must be told it left.
        self.detach();
    }
}

impl std::fmt::Debug for TopicSubscriber {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.debug_struct("TopicSubscriber")
            .field("topic", &self.topic)
            .field("namespace", &self.namespace.name())
            .field("next_seq", &self.next_seq)
            .finish()
    }
}

impl TopicSubscriber {
    /// Attaches to `topic`, waiting for its producer to create it if needed.
    ///
    /// With `replay`, the subscriber first receives the messages the producer still
    /// holds (up to a queue's worth: `sluice.window`, or the lag limit) before the live
    /// ones; without, it starts with the next message published.
    ///
    /// With a `timeout`, gives up with [`SluiceError::Timeout`] once it has passed.
    pub fn connect(
        namespace: &Namespace,
        topic: &TopicName,
        timeout: Option<Duration>,
        replay: bool,
    ) -> Result<Self> {
        Self::connect_declared(namespace, topic, timeout, replay, &mut None)
    }

    /// [`Self::connect`] for a caller that waits in several calls (slices) and declares
    /// its interest once for them all (see `crate::interest`): `interest` is the
    /// declaration, made here if `None`, kept on a timeout and withdrawn once attached, so
    /// that one subscriber is never counted as several waiting ones.
    pub fn connect_declared(
        namespace: &Namespace,
        topic: &TopicName,
        timeout: Option<Duration>,
        replay: bool,
        interest: &mut Option<Interest>,
    ) -> Result<Self> {
        let node = namespace.node("subscriber")?;
        // Declared before the first look, so that a producer creating the topic from now
        // on waits for this subscriber before its first batch (see `crate::interest`).
        if interest.is_none() {
            *interest = Some(Interest::declare(namespace, topic)?);
        }
        let Attached {
            data,
            ready,
            released,
        } = Search::new(namespace, topic, &node).wait(timeout)?;
        let history = if replay {
            data.static_config().history_size()
        } else {
            0
        };
        let create = || data.subscriber_builder().history_request(history).create();
        let subscriber = match create() {
            // Dead subscribers may hold every place: reclaim them and try again.
            Err(SubscriberCreateError::ExceedsMaxSupportedSubscribers) => {
                namespace.reclaim_dead();
                create()
            }
            created => created,
        }
        .map_err(transport(format!(
            "cannot subscribe to topic '{topic}' (is it full? raise sluice.max_subscribers)"
        )))?;
        // Attached: withdraw the declaration, then let a producer waiting for subscribers
        // know that one arrived.
        *interest = None;
        let _ = released.notify_with_custom_event_id(EventId::new(events::RELEASED));
        let tell_every = (subscriber.buffer_size() / RELEASES_PER_QUEUE).max(1);
        let subscriber = Arc::new(subscriber);
        Ok(Self {
            topic: topic.clone(),
            namespace: namespace.clone(),
            data: Local::new(data),
            subscriber: Local::new(Some(subscriber.clone())),
            ready: Local::new(Some(ready)),
            released: Local::new(released),
            next_seq: None,
            awaits_history: replay.then(Instant::now),
            last_published_ns: None,
            stashed: Local::new(None),
            ended: false,
            held: Arc::new(AtomicUsize::new(0)),
            untold: 0,
            told_at: Instant::now(),
            tell_every,
            decoder: wire::Decoder::new(),
            form: BatchForm::Decoded,
            warned_beyond_max_held: false,
            hold: Local::new(Some(Arc::new(PortHold {
                port: std::sync::Mutex::new(Some(subscriber.clone())),
                departure: std::sync::Mutex::new(None),
            }))),
            on_max_held: OnMaxHeld::Copy,
            _node: Local::new(node),
            reclaim: Arc::new(ReclaimAfter::new(namespace, false)),
        })
    }

    /// Decodes only `columns` of the topic's batches from now on (see
    /// [`wire::Columns`]): the others stay in shared memory, neither decoded nor
    /// validated. A column the topic lacks makes [`TopicSubscriber::recv`] fail with
    /// [`SluiceError::Config`].
    pub fn set_columns(&mut self, columns: wire::Columns) {
        self.decoder = wire::Decoder::with_columns(columns);
    }

    /// Hands over host batches in `form` from now on. The encoded forms are for a
    /// relay that forwards the producer's IPC messages to a decoder elsewhere (the
    /// Flight server, for clients of every column); the columns set by
    /// [`TopicSubscriber::set_columns`] are the ones validated, and should be all.
    pub fn set_batch_form(&mut self, form: BatchForm) {
        self.form = form;
    }

    /// The topic's name.
    pub fn topic(&self) -> &TopicName {
        &self.topic
    }

    /// The namespace of the topic.
    pub(crate) fn namespace(&self) -> &Namespace {
        &self.namespace
    }

    /// How this subscriber hands its batches over, for its successor (see
    /// [`TopicSubscriber::successor`]).
    pub(crate) fn settings(&self) -> Settings {
        Settings {
            columns: self.decoder.columns().clone(),
            form: self.form,
            on_max_held: self.on_max_held,
        }
    }

    /// Hands batches over as `settings` say.
    pub(crate) fn apply(&mut self, settings: Settings) {
        self.set_columns(settings.columns);
        self.set_batch_form(settings.form);
        self.set_on_max_held(settings.on_max_held);
    }

    /// Batches received from this topic whose shared memory is still in use (some Arrow
    /// array of them is alive). Never less than iceoryx2 counts as borrowed: below
    /// [`TopicSubscriber::max_held`], the next receive cannot fail for too many held.
    pub fn held(&self) -> usize {
        self.held.load(Ordering::Acquire)
    }

    /// When the producer published the newest batch received
    /// ([`crate::FrameHeader::published_ns`]); `None` before the first.
    pub fn last_published_ns(&self) -> Option<u64> {
        self.last_published_ns
    }

    /// The sequence number of the next message expected: messages received so far from
    /// the topic's producer, counted from its first.
    pub fn next_seq(&self) -> u64 {
        self.next_seq.unwrap_or(0)
    }

    /// Messages this subscriber may hold (received, not yet dropped) at once.
    pub fn max_held(&self) -> usize {
        self.data
            .static_config()
            .subscriber_max_borrowed_samples()
            .saturating_sub(SPARE_BORROWS)
            .max(1)
    }

    /// What to do with batches received once `max_held` are held (default: copy them).
    pub fn set_on_max_held(&mut self, on_max_held: OnMaxHeld) {
        self.on_max_held = on_max_held;
    }

    /// Whether this subscriber left the topic (see [`TopicSubscriber::detach`]).
    pub fn is_detached(&self) -> bool {
        self.subscriber.is_none()
    }

    /// The id of this subscriber's port (as `sluice status` and the producer name it);
    /// `None` once detached.
    pub fn port_id(&self) -> Option<u128> {
        self.subscriber.as_ref().map(|port| port.id().value())
    }

    /// Receives the next message, waiting for it without spinning.
    ///
    /// With a `timeout`, returns [`SluiceError::Timeout`] once it has passed with nothing
    /// received. A producer that dies makes this fail with [`SluiceError::ProducerLost`]
    /// within about `LIVENESS_INTERVAL` (100 ms); a producer that fails makes it return
    /// [`SluiceError::ProducerFailed`] with the producer's message. After the end of the
    /// stream (or an error) the subscriber detaches and keeps returning
    /// [`Frame::EndOfStream`].
    pub fn recv(&mut self, timeout: Option<Duration>) -> Result<Frame> {
        self._node.here("subscriber")?;
        let start = Instant::now();
        if let Some(sample) = self.stashed.take() {
            self.next_seq = Some(sample.user_header().seq);
            return self.frame(sample);
        }
        loop {
            let Some(subscriber) = &*self.subscriber else {
                return Ok(Frame::EndOfStream);
            };
            if self.on_max_held == OnMaxHeld::Error && self.held() >= self.max_held() {
                return Err(self.too_many_held());
            }
            let received = match subscriber.receive() {
                Ok(sample) => sample,
                Err(ReceiveError::ExceedsMaxBorrows) => return Err(self.too_many_held()),
                Err(e) => return Err(transport("receive failed")(e)),
            };
            // Taking a message frees a place in this subscriber's queue, which a producer
            // asleep on that full queue waits for (`released`). Telling it costs a
            // system call, so it is told once every `tell_every` messages (or sooner
            // where those come slowly: a finished producer draining the topic hears that
            // this subscriber still reads), and whenever the queue runs empty, before this
            // subscriber sleeps. A producer waiting on this queue is then woken after at
            // most a quarter of the queue was taken, while this subscriber is still busy
            // with the rest: the two keep overlapping, and a subscriber that stops taking
            // messages has told of all it took before it waits (or it is slow, and the
            // producer's bounded sleep looks again; see `crate::backpressure`).
            if let Some(sample) = received {
                self.awaits_history = None;
                self.untold += 1;
                if self.untold >= self.tell_every
                    || self.told_at.elapsed() >= RELEASE_AT_LEAST_EVERY
                {
                    self.tell_released();
                }
                return self.frame(sample);
            }
            if self.untold > 0 {
                self.tell_released();
            }
            let elapsed = start.elapsed();
            if let Some(t) = timeout
                && elapsed >= t
            {
                return Err(SluiceError::Timeout {
                    what: format!("the next batch on topic '{}'", self.topic),
                    seconds: elapsed.as_secs_f64(),
                });
            }
            let wait = timeout.map_or(self.idle_wait(), |t| (t - elapsed).min(self.idle_wait()));
            let Some(ready) = &*self.ready else {
                return Ok(Frame::EndOfStream);
            };
            let woken = match ready.timed_wait(|_| {}, wait) {
                Ok(n) => n,
                // A signal (Ctrl-C, SIGCHLD, a stop and continue) ends the wait early:
                // check again, as after any wake-up. Callers that want to react to the
                // signal (Python) do so between calls.
                Err(ListenerWaitError::InterruptSignal) => 1,
                Err(e) => return Err(transport("waiting for data failed")(e)),
            };
            if woken == 0 {
                self.check_producer()?;
                if let Some(end) = self.ended_before_attaching() {
                    return end;
                }
            }
        }
    }

    /// How long to sleep on `ready` before looking again: [`LIVENESS_INTERVAL`], or
    /// [`HISTORY_POLL`] for the first second of a subscriber that waits for the
    /// history, which no notification announces.
    fn idle_wait(&self) -> Duration {
        match self.awaits_history {
            Some(since) if since.elapsed() < Duration::from_secs(1) => HISTORY_POLL,
            _ => LIVENESS_INTERVAL,
        }
    }

    /// The error for a receive beyond `max_held` under [`OnMaxHeld::Error`].
    fn too_many_held(&self) -> SluiceError {
        SluiceError::Transport(format!(
            "this subscriber holds {} batches of topic '{}' at once (sluice.max_held = {}); \
             drop older batches (or copy what you keep), raise sluice.max_held, or let \
             further batches be copied (the default)",
            self.held(),
            self.topic,
            self.max_held()
        ))
    }

    /// Tells a producer that may be asleep on a full queue that this subscriber took
    /// messages from it.
    fn tell_released(&mut self) {
        self.untold = 0;
        self.told_at = Instant::now();
        let _ = self
            .released
            .notify_with_custom_event_id(EventId::new(events::RELEASED));
    }

    fn frame(&mut self, sample: Sample<Ipc, [u8], FrameHeader>) -> Result<Frame> {
        // The header lives in shared memory: copy it once, then validate the copy.
        let header = *sample.user_header();
        if let Some(expected) = self.next_seq
            && header.seq != expected
        {
            if header.seq < expected {
                return Err(SluiceError::Corrupt(format!(
                    "message {} arrived after message {} on topic '{}'",
                    header.seq,
                    expected - 1,
                    self.topic
                )));
            }
            // The producer dropped messages for this subscriber: it fell behind more
            // than the topic's lag limit (or the producer is stopping, in which case
            // its error says more than the gap). Report the gap, then this message.
            if header.kind != FrameKind::Error as u32 {
                self.next_seq = Some(expected);
                *self.stashed = Some(sample);
                return Ok(Frame::Missed {
                    messages: header.seq - expected,
                });
            }
        }
        self.next_seq = Some(header.seq + 1);
        let kind = FrameKind::try_from(header.kind)?;
        if matches!(kind, FrameKind::Batch | FrameKind::DeviceBatch) {
            self.last_published_ns = Some(header.published_ns);
        }
        let payload = sample.payload();
        let len = usize::try_from(header.len).unwrap_or(usize::MAX);
        if len > payload.len() {
            return Err(SluiceError::Corrupt(format!(
                "header claims {} bytes but the sample holds {}",
                header.len,
                payload.len()
            )));
        }
        // Counted before this sample: `max_held` held already, so this one is copied.
        let held = self.held();
        let beyond_max_held = self.on_max_held == OnMaxHeld::Copy && held >= self.max_held();
        match kind {
            FrameKind::Batch => {
                let copy = beyond_max_held.then_some(held);
                self.batch_frame(&header, sample, len, copy)
            }
            FrameKind::DeviceBatch => {
                if beyond_max_held {
                    self.warn_beyond_max_held(held);
                }
                Ok(Frame::DeviceBatch {
                    epoch: header.epoch,
                    index: header.index,
                    rows: header.rows,
                    payload: self.hold(sample, len)?,
                    beyond_max_held,
                })
            }
            FrameKind::EndOfEpoch => Ok(Frame::EndOfEpoch {
                epoch: header.epoch,
                batches: header.index,
                rows: header.rows,
            }),
            FrameKind::EndOfStream => {
                self.detach();
                Ok(Frame::EndOfStream)
            }
            FrameKind::Error => {
                let message = String::from_utf8_lossy(&payload[..len]).into_owned();
                self.detach();
                Err(SluiceError::ProducerFailed(message))
            }
        }
    }

    /// A batch message as its [`Frame`]: decoded in place (and validated) unless this
    /// subscriber hands over encoded batches; `copy` (the batches held) when it is
    /// received beyond `max_held` and is to be copied (see [`OnMaxHeld::Copy`]).
    fn batch_frame(
        &mut self,
        header: &FrameHeader,
        sample: Sample<Ipc, [u8], FrameHeader>,
        len: usize,
        copy: Option<usize>,
    ) -> Result<Frame> {
        let payload = self.hold(sample, len)?;
        let encoded = |payload| Frame::Encoded {
            epoch: header.epoch,
            index: header.index,
            batch_rows: header.batch_rows.into(),
            rows: header.rows,
            payload,
        };
        if self.form == BatchForm::EncodedUnchecked {
            return Ok(encoded(payload));
        }
        let start = payload.ptr.as_ptr() as usize;
        // SAFETY: `payload.ptr` points to the sample's payload, valid for `len`
        // bytes (checked against the sample's length above) as long as the
        // sample lives; the buffer owns an `Arc` of the sample's owner, so the
        // memory stays mapped until the last Arrow array that points into it is
        // dropped. Nobody writes to a sent sample.
        let buffer =
            unsafe { Buffer::from_custom_allocation(payload.ptr, len, payload._owner.clone()) };
        let batch = self.decoder.decode(buffer)?;
        if batch.num_rows() as u64 != header.rows {
            return Err(SluiceError::Corrupt(format!(
                "batch has {} rows but its header says {}",
                batch.num_rows(),
                header.rows
            )));
        }
        if self.form == BatchForm::EncodedValidated {
            return Ok(encoded(payload));
        }
        let (batch, shm_range) = if let Some(held) = copy {
            // The copy owns its memory: the sample (which `batch` and `payload`
            // hold) goes back when they are dropped here.
            self.warn_beyond_max_held(held);
            let copy = sluice_core::rebatch::deep_copy(&batch)
                .map_err(|e| SluiceError::Internal(format!("cannot copy a batch: {e}")))?;
            (copy, None)
        } else {
            (batch, Some(start..start + len))
        };
        Ok(Frame::Batch {
            epoch: header.epoch,
            index: header.index,
            batch_rows: header.batch_rows.into(),
            batch,
            shm_range,
        })
    }

    /// Says once that this subscriber holds `max_held` batches and copies the next ones.
    fn warn_beyond_max_held(&mut self, held: usize) {
        if std::mem::replace(&mut self.warned_beyond_max_held, true) {
            return;
        }
        tracing::warn!(
            topic = %self.topic,
            "this subscriber holds {} batches of topic '{}' (sluice.max_held = {}): further \
             batches are private copies until it drops some. Keep fewer batches (or copy what \
             you keep: batch.copy(), np.array(column)) to stay zero-copy, or raise \
             sluice.max_held",
            held,
            self.topic,
            self.max_held()
        );
    }

    /// The first `len` bytes of `sample`'s payload (checked against its length by the
    /// caller), kept in shared memory, with the port it came through, for as long as the
    /// payload or a clone lives (see [`SampleOwner`]).
    fn hold(&self, sample: Sample<Ipc, [u8], FrameHeader>, len: usize) -> Result<SamplePayload> {
        let ptr = NonNull::new(sample.payload().as_ptr().cast_mut())
            .ok_or_else(|| SluiceError::Corrupt("null payload".into()))?;
        let hold = self.hold.as_ref().cloned().ok_or_else(|| {
            SluiceError::Internal("a sample was received after the subscriber detached".into())
        })?;
        self.held.fetch_add(1, Ordering::Relaxed);
        let owner = Arc::new(SampleOwner {
            sample: Local::new(Some(sample)),
            held: self.held.clone(),
            hold: Local::new(hold),
            _reclaim: self.reclaim.clone(),
        });
        Ok(SamplePayload {
            _owner: owner,
            ptr,
            len,
        })
    }

    /// Leaves the topic: the producer stops waiting for this subscriber. Batches already
    /// received stay valid.
    pub fn detach(&mut self) {
        // A forked child's copy: the ports are the parent's (see `crate::process`).
        if !self._node.is_here() {
            return;
        }
        self.ended = true;
        *self.stashed = None;
        *self.ready = None;
        *self.subscriber = None;
        if let Some(hold) = self.hold.take() {
            // Batches handed out still hold the port: the producer must not wait for it.
            if Arc::strong_count(&hold) > 1 {
                hold.depart(&self.namespace, &self.topic, self.held());
            }
        }
        let _ = self
            .released
            .notify_with_custom_event_id(EventId::new(events::RELEASED));
    }

    /// Whether the topic's producer is gone (its process exited or died), whatever is
    /// still queued for this subscriber; [`Self::recv`] says so only once it has taken
    /// everything. For a subscriber whose own consumer has stopped taking batches (a
    /// stalled remote client): it must take what is queued and let go of the topic, or a
    /// restarted producer cannot create the topic again.
    pub fn producer_gone(&self) -> bool {
        // Removing nothing: other subscribers may still have to receive what the dead
        // producer queued for them.
        self.subscriber.is_some() && producer_state(&self.namespace, &self.data) == Liveness::Gone
    }

    /// Lets go of what only a live producer needs held (the port that the batches handed
    /// out keep), and reclaims once everything of this subscriber is let go.
    fn producer_found_gone(&self) {
        if let Some(hold) = &*self.hold {
            hold.let_go();
        }
        self.reclaim.due.store(true, Ordering::Relaxed);
    }

    /// The end of the stream (or the producer's error) for a subscriber that attached
    /// after it was published, while the producer lingers for its other subscribers:
    /// it would otherwise wait for the producer to exit and take that for a crash. Asked
    /// when nothing is queued: the producer marks the end only once every batch was
    /// delivered (see [`crate::ending`]).
    fn ended_before_attaching(&mut self) -> Option<Result<Frame>> {
        let subscriber = self.subscriber.as_ref()?;
        if subscriber.has_samples().unwrap_or(true) {
            return None;
        }
        let ending = crate::ending::ending(&self.namespace, &self.topic)?;
        self.detach();
        Some(match ending {
            crate::ending::Ending::Stream => Ok(Frame::EndOfStream),
            crate::ending::Ending::Failed(message) => Err(SluiceError::ProducerFailed(message)),
        })
    }

    /// Fails with `ProducerLost` if the producer is gone.
    fn check_producer(&mut self) -> Result<()> {
        // Alive, or its node cannot be read right now. (Its publisher was there and alive
        // when this subscriber attached, so one that is gone since has exited or died.)
        if producer_alive(&self.namespace, &self.data) {
            return Ok(());
        }
        // Data may have arrived just before the producer exited.
        if let Some(subscriber) = &*self.subscriber
            && subscriber.has_samples().unwrap_or(false)
        {
            return Ok(());
        }
        self.producer_found_gone();
        self.detach();
        Err(SluiceError::ProducerLost(self.topic.to_string()))
    }
}

/// Subscribers attached to `topic` now (to its live producer's generation, if it has one), or
/// `None` if the topic does not exist.
pub fn subscriber_count(namespace: &Namespace, topic: &TopicName) -> Result<Option<usize>> {
    let node = namespace.node("observer")?;
    let mut found = None;
    for generation in 0..GENERATIONS {
        let Ok(service) = node
            .service_builder(&service_name(topic, generation, "data")?)
            .publish_subscribe::<[u8]>()
            .user_header::<FrameHeader>()
            .open()
        else {
            continue;
        };
        let count = service.dynamic_config().number_of_subscribers();
        // The generation of the live producer, if there is one.
        if producer_state(namespace, &service) == Liveness::Alive {
            return Ok(Some(count));
        }
        found.get_or_insert(count);
    }
    Ok(found)
}

/// The topic as a transport of the delivery protocol (`sluice_core::delivery`): host
/// batches only (device messages need `sluice::Subscriber`, which imports them).
impl sluice_core::Inlet<RecordBatch> for TopicSubscriber {
    fn recv(&mut self, timeout: Option<Duration>) -> Result<sluice_core::Inbound<RecordBatch>> {
        match TopicSubscriber::recv(self, timeout)?.control() {
            Ok(message) => Ok(message),
            Err(Frame::Batch {
                epoch,
                index,
                batch_rows,
                batch,
                ..
            }) => Ok(sluice_core::Inbound::Batch {
                epoch,
                index,
                batch_rows,
                payload: batch,
            }),
            Err(Frame::Encoded { .. }) => Err(SluiceError::Internal(format!(
                "a subscriber of topic '{}' that hands over encoded batches was used as an \
                 inlet, which takes decoded batches: set BatchForm::Decoded first",
                self.topic
            ))),
            Err(_) => Err(SluiceError::Device(format!(
                "topic '{}' carries GPU batches: subscribe with sluice::Subscriber",
                self.topic
            ))),
        }
    }
}
