//! The subscriber: receives a topic's batches, epoch by epoch, in its own batch size.

use std::ops::Range;
use std::time::{Duration, Instant};

use arrow::array::ArrayData;
use arrow::record_batch::RecordBatch;
use sluice_core::delivery::{Inbound, Outbound, ReceiverOptions, Subscription};
use sluice_core::{Columns, Inlet, Result, RowPosition, SluiceError, TopicName};
use sluice_flight::{ClientOptions, FlightInlet, FlightTarget};
use sluice_shm::{Namespace, OnMaxHeld, TopicSubscriber};

use crate::cursor::Cursor;
use crate::gpu::batch::DeviceBatch;
use crate::status::{Reporter, SubscriberReport, unix_now};

mod carried;
mod catch_up;
mod local;
mod mask;
mod payload;
mod port;

pub use carried::Carried;
use carried::CarriedInlet;
use catch_up::{Attach, CatchUp};
pub use catch_up::{CatchUpSender, LoaderCatchUp, catch_up_channel, remote_catch_up};
use local::LocalInlet;
use payload::Payload;
use port::Port;

pub use sluice_core::delivery::{EpochSummary, Join, OnLag};

/// How long a subscriber waits for a batch before it says which other subscriber holds
/// the stream back (see [`Subscriber::held_back_by`]).
const STALL_NOTE_AFTER: Duration = Duration::from_secs(10);

/// How to attach to a topic.
#[derive(Debug, Clone, Default)]
pub struct SubscribeOptions {
    /// Give up waiting (for the topic to appear, or for the next batch) after this long.
    pub timeout: Option<Duration>,
    /// The namespace; `None` uses [`Namespace::from_env`].
    pub namespace: Option<Namespace>,
    /// Rows per batch for this subscriber; `None` keeps the producer's batches. Batches
    /// inside one producer batch are zero-copy slices; one that spans two is copied once.
    pub batch_size: Option<usize>,
    /// Where to start in a running stream.
    pub join: Join,
    /// What to do after falling behind the producer's lag limit.
    pub on_lag: OnLag,
    /// When the producer is lost (a crash), wait up to this long for a restarted
    /// producer (`sluice run --resume`) and continue where this subscriber left off, with
    /// no duplicate and no missing row. `None`: fail with [`SluiceError::ProducerLost`].
    pub reconnect: Option<Duration>,
    /// The columns this subscriber receives, by name and in that order ([`Columns::All`]:
    /// every column). From a local topic only those are decoded and validated; the
    /// others stay untouched in shared memory, which is most of what decoding costs a
    /// subscriber that skips a string column. A name the topic lacks fails the first
    /// [`Subscriber::next_event`] with [`SluiceError::Config`], which lists the topic's
    /// columns, and so does an empty list; the subscriber then leaves the topic. A remote
    /// topic's server decodes and sends only those; on a GPU topic the batch's
    /// descriptor describes only those columns.
    pub columns: Columns,
    /// What happens once the subscriber holds `sluice.max_held` batches of a local
    /// topic: further batches are private copies (the default, with one warning), or
    /// receiving fails.
    pub on_max_held: OnMaxHeld,
    /// Start exactly after the rows a trainer had consumed when it saved this cursor
    /// ([`Subscriber::cursor`]), instead of joining as `join` says: from the topic's
    /// history where it still holds them, else (a plan's local topic) computed again in
    /// this process until the shared stream is reached. See docs/protocol.md, "Resuming
    /// a trainer".
    pub cursor: Option<Cursor>,
    /// This trainer's own subset of a shared stream: the rows a column of the plan's
    /// selects for it (a boolean column where true, then dropped; a numeric weight where
    /// above zero, kept for the trainer's loss). Positions and cursors still count every
    /// row of the stream; batches are the selected part of each batch (a batch of which
    /// nothing is selected is not handed out).
    pub mask: Option<String>,
    /// How this process computes again the batches of a topic fed by a loader that can
    /// make them again, for a cursor the topic no longer holds (the Python binding
    /// sets it); `None`: such a cursor is refused.
    pub loader_catch_up: Option<LoaderCatchUp>,
}

/// What a subscriber receives.
#[derive(Debug)]
pub enum Event {
    /// A batch.
    Batch {
        /// Epoch of the batch.
        epoch: u64,
        /// Index of the batch in its epoch, in this subscriber's batches.
        index: u64,
        /// The rows.
        batch: RecordBatch,
        /// The shared-memory sample every buffer of the batch lies in, when the batch is
        /// zero-copy; `None` for a batch that was assembled from two producer batches.
        shm_range: Option<Range<usize>>,
    },
    /// A batch of a GPU topic (`sluice.device = 'cuda:N'`): its rows are in device
    /// memory, described by [`DeviceBatch`].
    DeviceBatch {
        /// Epoch of the batch.
        epoch: u64,
        /// Index of the batch in its epoch, in this subscriber's batches.
        index: u64,
        /// The rows, in the producer's device slots.
        batch: DeviceBatch,
    },
    /// An epoch ended.
    EpochEnd(EpochSummary),
    /// The stream ended.
    End,
}

/// Attaches a subscriber one slice of waiting at a time, so that the caller can act
/// between two (Python runs its signal handlers, so Ctrl-C works while a trainer waits for
/// its producer).
///
/// It declares the subscriber's interest in a local topic once, for the whole wait (see
/// `sluice_shm::Interest`): a producer that starts between two slices then waits for this
/// subscriber before its first batch, as it would for one that waited in one call.
#[derive(Debug)]
pub struct Connector {
    topic: String,
    options: SubscribeOptions,
    /// Withdrawn once attached (or when the connector is dropped).
    interest: Option<sluice_shm::Interest>,
    started: Instant,
}

impl Connector {
    /// Starts attaching to `topic` (a local topic, or `flight://HOST:PORT/TOPIC`): checks
    /// the name and declares the subscriber's interest. Waiting happens in
    /// [`Connector::attach`].
    pub fn new(topic: &str, mut options: SubscribeOptions) -> Result<Self> {
        if let Some(name) = &options.mask {
            mask::check(name, &options.columns)?;
        }
        let namespace = match options.namespace.clone() {
            Some(ns) => ns,
            None => Namespace::from_env()?,
        };
        let interest = match FlightTarget::parse(topic) {
            Some(target) => {
                target?;
                None
            }
            None => Some(sluice_shm::Interest::declare(
                &namespace,
                &TopicName::new(topic)?,
            )?),
        };
        options.namespace = Some(namespace);
        Ok(Self {
            topic: topic.to_string(),
            options,
            interest,
            started: Instant::now(),
        })
    }

    /// Waits up to `slice` (`None`: as long as it takes), and no longer than the
    /// options' `timeout` counted from [`Connector::new`], for the producer to create the
    /// topic, and attaches. A slice that runs out is a [`SluiceError::Timeout`]: nothing
    /// is lost, call again; [`Connector::timed_out`] tells whether the whole timeout ran
    /// out.
    pub fn attach(&mut self, slice: Option<Duration>) -> Result<Subscriber> {
        let left = self
            .options
            .timeout
            .map(|t| t.saturating_sub(self.started.elapsed()));
        let wait = match (left, slice) {
            (Some(left), Some(slice)) => Some(left.min(slice)),
            (left, slice) => left.or(slice),
        };
        // The declaration is withdrawn once attached.
        Subscriber::attach(&self.topic, &self.options, wait, &mut self.interest)
    }

    /// Whether the options' `timeout` has run out since [`Connector::new`].
    pub fn timed_out(&self) -> bool {
        self.options
            .timeout
            .is_some_and(|t| self.started.elapsed() >= t)
    }

    /// How long this connector has been waiting.
    pub fn waited(&self) -> Duration {
        self.started.elapsed()
    }
}

/// Receives a topic's stream: the delivery protocol (`sluice_core::Subscription`) over
/// the topic's transport, local shared memory or a remote server.
#[derive(Debug)]
pub struct Subscriber {
    subscription: Subscription<Payload, Port>,
    topic: TopicName,
    namespace: Namespace,
    timeout: Option<Duration>,
    /// Reports for `sluice status` (local topics).
    reporter: Option<Reporter>,
    join: Join,
    /// The columns delivered.
    columns: Columns,
    /// Since when this subscriber has waited for a batch (set at its first timeout).
    waiting_since: Option<Instant>,
    /// Whether the stall that `waiting_since` measures was warned of.
    stall_noted: bool,
    /// What this subscriber's cursors say besides the position: the stream's identity
    /// (from its first batch, or the cursor it started from) and the batch size.
    identity: Cursor,
    /// Whether the stream's first batch was looked at (and checked against the cursor
    /// this subscriber started from).
    identified: bool,
    /// The column that selects this subscriber's rows (see [`SubscribeOptions::mask`]).
    mask: Option<String>,
}

impl Subscriber {
    /// When the producer published the newest producer batch this subscriber received
    /// (`CLOCK_MONOTONIC` nanoseconds, see [`sluice_shm::monotonic_ns`]): with
    /// `monotonic_ns()` taken when a batch is usable, the publish-to-use latency.
    pub fn last_published_ns(&self) -> Option<u64> {
        self.subscription
            .inlet()
            .local()
            .and_then(TopicSubscriber::last_published_ns)
    }

    /// Attaches to `topic`, waiting for its producer if it has not started yet.
    ///
    /// `flight://HOST:PORT/TOPIC` (or `flight+tls://…`) subscribes to a topic that
    /// `sluice serve --flight` serves on another machine, with the same contract; the
    /// bearer token comes from `SLUICE_TOKEN`, a TLS server's CA from `SLUICE_TLS_CA`
    /// (see docs/scale-out.md).
    pub fn connect(topic: &str, options: SubscribeOptions) -> Result<Self> {
        let wait = options.timeout;
        Connector::new(topic, options)?.attach(wait)
    }

    /// Attaches to `topic` once, waiting up to `wait` (`None`: as long as it takes) for
    /// its producer, under the declaration `interest` of a local topic (see
    /// [`TopicSubscriber::connect_declared`]); `options.timeout` is kept for the batches.
    fn attach(
        topic: &str,
        options: &SubscribeOptions,
        wait: Option<Duration>,
        interest: &mut Option<sluice_shm::Interest>,
    ) -> Result<Self> {
        let namespace = match options.namespace.clone() {
            Some(ns) => ns,
            None => Namespace::from_env()?,
        };
        if let Some(target) = FlightTarget::parse(topic) {
            let target = target?;
            if options.join == Join::CatchUp {
                return Err(SluiceError::Config(format!(
                    "join='catch_up' needs a topic on this machine, not {target}: its plan is \
                     computed again in the trainer's process"
                )));
            }
            let inlet = FlightInlet::connect(
                &target,
                ClientOptions {
                    replay: options.join == Join::Replay || options.cursor.is_some(),
                    from: options.cursor.as_ref().map(|c| c.position().batch()),
                    wait,
                    reconnect: options.reconnect,
                    columns: options.columns.clone(),
                    ..ClientOptions::from_env()?
                },
            )?;
            let topic = TopicName::new(&target.topic)?;
            let shown = target.to_string();
            let port = Port::Remote(Some(Box::new(inlet)));
            let start = options.cursor.as_ref().map(Cursor::position);
            return Self::new(
                topic,
                shown,
                namespace,
                options,
                port,
                usize::MAX / 4,
                start,
            );
        }
        let topic = TopicName::new(topic)?;
        if options.cursor.is_some() || options.join == Join::CatchUp {
            return Self::attach_at(topic, namespace, options, wait, interest);
        }
        let replay = options.join == Join::Replay;
        let mut inner =
            TopicSubscriber::connect_declared(&namespace, &topic, wait, replay, interest)?;
        inner.set_columns(options.columns.clone());
        inner.set_on_max_held(options.on_max_held);
        let max_held = inner.max_held();
        let port = Port::Local(Box::new(LocalInlet::new(
            inner,
            options.reconnect,
            options.columns.clone(),
        )));
        let shown = topic.to_string();
        Self::new(topic, shown, namespace, options, port, max_held, None)
    }

    /// Attaches to a local topic at a position of this subscriber's own: the options'
    /// cursor, or (`Join::CatchUp`) the start of the epoch the stream is in. The topic is
    /// attached with replay, and its first message says whether its history reaches
    /// back there; if not, a catch-up computes the rest (see [`CatchUp`]).
    fn attach_at(
        topic: TopicName,
        namespace: Namespace,
        options: &SubscribeOptions,
        wait: Option<Duration>,
        interest: &mut Option<sluice_shm::Interest>,
    ) -> Result<Self> {
        if let Some(cursor) = &options.cursor
            && cursor.topic != topic.as_str()
        {
            return Err(SluiceError::Config(format!(
                "the cursor was taken on topic '{}', not '{topic}'",
                cursor.topic
            )));
        }
        let attach = Attach {
            namespace: namespace.clone(),
            topic: topic.clone(),
            reconnect: options.reconnect,
            columns: options.columns.clone(),
            on_max_held: options.on_max_held,
        };
        let mut live = attach.replaying(wait, interest)?;
        let max_held = live.inner.as_ref().map_or(1, TopicSubscriber::max_held);
        let first = match &options.cursor {
            // The history comes when the producer sends again, which a trainer that
            // reads nothing can hold off: after a while a cursor is caught up on anyway.
            Some(_) => match live.recv(Some(catch_up::HISTORY_WAIT)) {
                Ok(first) => Some(first),
                Err(SluiceError::Timeout { .. }) => None,
                Err(e) => return Err(e),
            },
            None => Some(live.recv(options.timeout)?),
        };
        // After the first message (or the wait for it): the producer reports before it
        // publishes, and a subscriber that waited for the topic attached before that.
        if let Some(cursor) = &options.cursor {
            within_run(&namespace, &topic, cursor.position())?;
        }
        let start = match (&options.cursor, &first) {
            (Some(cursor), _) => Some(cursor.position()),
            (None, Some(Inbound::Batch { epoch, .. })) => Some(RowPosition::new(*epoch, 0, 0)),
            (None, Some(Inbound::EndOfEpoch { epoch, .. })) => {
                Some(RowPosition::new(epoch.saturating_add(1), 0, 0))
            }
            (None, _) => None,
        };
        let from = start.map(RowPosition::batch);
        let loader = options.loader_catch_up.as_ref();
        let port = Port::CatchUp(Box::new(CatchUp::start(attach, live, first, from, loader)?));
        let shown = topic.to_string();
        Self::new(topic, shown, namespace, options, port, max_held, start)
    }

    /// A subscriber of `topic` over any transport (`inlet`) of host batches
    /// ([`RecordBatch`]) or of batches in device slots ([`Carried`]), with the options'
    /// batch size, join, lag policy and columns: the in-memory transport of
    /// `sluice_core::delivery::memory`, or a transport of one's own. The conformance
    /// tests run every transport through this, the subscriber users run.
    pub fn over<P: Into<Carried> + 'static>(
        topic: &str,
        options: &SubscribeOptions,
        inlet: Box<dyn Inlet<P> + Send>,
    ) -> Result<Self> {
        let name = TopicName::new(topic)?;
        let namespace = match options.namespace.clone() {
            Some(ns) => ns,
            None => Namespace::from_env()?,
        };
        let port = Port::Other(Some(Box::new(CarriedInlet::new(
            inlet,
            options.columns.clone(),
        ))));
        let start = options.cursor.as_ref().map(Cursor::position);
        Self::new(
            name,
            topic.to_string(),
            namespace,
            options,
            port,
            usize::MAX / 4,
            start,
        )
    }

    /// A subscriber on a connected port; `shown` names the topic in errors, `max_held`
    /// bounds the producer batches the protocol keeps while it cuts batches; it starts
    /// at `start` if given.
    fn new(
        topic: TopicName,
        shown: String,
        namespace: Namespace,
        options: &SubscribeOptions,
        port: Port,
        max_held: usize,
        start: Option<RowPosition>,
    ) -> Result<Self> {
        let reporter = port
            .local()
            .map(|_| Reporter::new(&namespace, &topic, "subscriber"));
        let receiver = ReceiverOptions {
            topic: shown,
            batch_size: options.batch_size,
            join: options.join,
            on_lag: options.on_lag,
            max_held,
            start,
        };
        let mut identity = options
            .cursor
            .clone()
            .unwrap_or_else(|| Cursor::new(topic.as_str(), RowPosition::default()));
        identity.batch_size = options.batch_size.map(|b| b as u64);
        Ok(Self {
            identity,
            identified: false,
            subscription: Subscription::new(receiver, port)?,
            topic,
            namespace,
            timeout: options.timeout,
            reporter,
            join: options.join,
            columns: options.columns.clone(),
            waiting_since: None,
            stall_noted: false,
            mask: options.mask.clone(),
        })
    }

    /// Where this subscriber is, to save with a trainer's model: every row before it
    /// was handed out by [`Subscriber::next_event`], none from it on. A subscriber
    /// started from it ([`SubscribeOptions::cursor`]) gets exactly the rows after it.
    /// `None` before the first batch (unless it started from a cursor).
    pub fn cursor(&self) -> Option<Cursor> {
        self.consumed().map(|at| self.cursor_at(at))
    }

    /// The position of [`Subscriber::cursor`] alone (no allocation: for callers that
    /// track it per batch and build the cursor when asked, with [`Subscriber::cursor_at`]).
    pub fn consumed(&self) -> Option<RowPosition> {
        self.subscription.receiver().consumed()
    }

    /// This subscriber's cursor at `at` (a position [`Subscriber::consumed`] gave).
    pub fn cursor_at(&self, at: RowPosition) -> Cursor {
        let mut cursor = self.identity.clone();
        (cursor.epoch, cursor.batch, cursor.row) = (at.epoch, at.index, at.row);
        cursor
    }

    /// Whether this subscriber's rows come from a catch-up computed in this process (it
    /// started from a cursor, or with `Join::CatchUp`, before what the topic still
    /// holds), not yet from the shared stream.
    pub fn catching_up(&self) -> bool {
        matches!(self.subscription.inlet(), Port::CatchUp(c) if c.catching_up())
    }

    /// Takes the stream's identity from its first batch; a stream other than the one
    /// the cursor this subscriber started from was taken on is refused.
    fn identify(&mut self, schema: &arrow::datatypes::Schema) -> Result<()> {
        self.identified = true;
        if self.identity.plan.is_some() {
            let checked = self.identity.check_stream(schema);
            if checked.is_err() {
                self.close();
            }
            return checked;
        }
        self.identity.identify(schema);
        Ok(())
    }

    /// The topic.
    pub fn topic(&self) -> &str {
        self.topic.as_str()
    }

    /// The columns this subscriber receives.
    pub fn columns(&self) -> &Columns {
        &self.columns
    }

    /// How this subscriber joins a running stream.
    pub fn join_mode(&self) -> Join {
        self.join
    }

    /// The next event, waiting up to the subscriber's timeout.
    ///
    /// Errors: the producer failed or vanished, a timeout, a corrupt message.
    pub fn next_event(&mut self) -> Result<Event> {
        self.next_event_within(self.timeout)
    }

    /// The next event, waiting up to `timeout` (`None`: as long as it takes) for each
    /// message. A timeout loses nothing: call again to keep waiting.
    pub fn next_event_within(&mut self, timeout: Option<Duration>) -> Result<Event> {
        loop {
            let event = self.next_unmasked_within(timeout)?;
            if let (Some(mask), Event::DeviceBatch { .. }) = (&self.mask, &event) {
                return Err(SluiceError::Config(format!(
                    "mask='{mask}' filters host batches; this topic's batches are on a GPU: \
                     index them with the mask column there"
                )));
            }
            let (
                Some(mask),
                Event::Batch {
                    epoch,
                    index,
                    batch,
                    shm_range,
                },
            ) = (&self.mask, &event)
            else {
                return Ok(event);
            };
            let selected = mask::apply(batch, mask)?;
            if selected.num_rows() == 0 {
                continue;
            }
            let whole = selected.num_rows() == batch.num_rows();
            return Ok(Event::Batch {
                epoch: *epoch,
                index: *index,
                shm_range: shm_range.clone().filter(|_| whole),
                batch: selected,
            });
        }
    }

    fn next_unmasked_within(&mut self, timeout: Option<Duration>) -> Result<Event> {
        if self.reporter.as_ref().is_some_and(Reporter::due) {
            self.report();
        }
        match self.subscription.next(timeout) {
            Ok(out) => {
                self.waiting_since = None;
                self.stall_noted = false;
                let event = event(out);
                if let Event::Batch { batch, .. } = &event
                    && !self.identified
                {
                    self.identify(&batch.schema())?;
                }
                Ok(event)
            }
            Err(SluiceError::Timeout { what, seconds }) => Err(self.timed_out(what, seconds)),
            // The protocol failed (lag, a resume gap, a corrupt stream), or a column asked
            // for is not the topic's, which every message would fail alike: leave the
            // topic rather than hold the producer.
            Err(e)
                if self.subscription.receiver().is_closed()
                    || matches!(e, SluiceError::Config(_)) =>
            {
                self.close();
                Err(e)
            }
            Err(e) => Err(e),
        }
    }

    /// A wait for the next batch timed out: says who holds the stream back, if another
    /// subscriber does (in the error, and in a warning once a wait has lasted
    /// [`STALL_NOTE_AFTER`]: a wait without a timeout would otherwise never say).
    fn timed_out(&mut self, what: String, seconds: f64) -> SluiceError {
        let since = *self.waiting_since.get_or_insert_with(Instant::now);
        let note = self.held_back_by();
        if let Some(note) = &note
            && since.elapsed() >= STALL_NOTE_AFTER
            && !std::mem::replace(&mut self.stall_noted, true)
        {
            tracing::warn!(topic = %self.topic, "no batch for {:.0} s: {note}", since.elapsed().as_secs_f64());
        }
        let what = match note {
            Some(note) => format!("{what} ({note})"),
            None => what,
        };
        SluiceError::Timeout { what, seconds }
    }

    /// Why no batch comes, if another subscriber of the topic paces the producer: the
    /// one whose full queue it waits for (see `sluice_shm::pacing`). `None` for a remote
    /// topic, or when nobody but the pipeline itself holds the stream back.
    pub fn held_back_by(&self) -> Option<String> {
        let inner = self.subscription.inlet().local()?;
        let pacing = sluice_shm::pacing(&self.namespace, &self.topic)?;
        if inner.port_id() == Some(pacing.port) {
            return None;
        }
        let who = match pacing.pid {
            0 => "another subscriber".to_string(),
            pid if pid == std::process::id() => {
                format!(
                    "another subscriber in this process (port {:032x})",
                    pacing.port
                )
            }
            pid => format!("a subscriber in process {pid} (port {:032x})", pacing.port),
        };
        Some(format!(
            "the producer has waited {:.0} s for {who}, whose queue of {} messages is full: a \
             subscriber that is kept but no longer read holds every other one back; close it \
             (or read it), or set sluice.lag_limit so that no one subscriber paces the stream",
            pacing.waited_s, pacing.queued
        ))
    }

    fn report(&mut self) {
        let (seq, held, port) = self
            .subscription
            .inlet()
            .local()
            .map_or((0, 0, None), |i| (i.next_seq(), i.held(), i.port_id()));
        let topic = self.topic.to_string();
        let receiver = self.subscription.receiver();
        let (epoch, rows, missed) = (
            receiver.epoch(),
            receiver.total_rows(),
            receiver.total_missed(),
        );
        let Some(reporter) = &mut self.reporter else {
            return;
        };
        reporter.write(rows, |rows_per_s| SubscriberReport {
            pid: std::process::id(),
            started: crate::status::this_process_start(),
            topic,
            epoch,
            seq,
            rows,
            rows_per_s,
            held,
            missed,
            port: port.map_or_else(String::new, |p| format!("{p:032x}")),
            updated: unix_now(),
        });
    }

    /// Leaves the topic now; the producer stops waiting for this subscriber. Batches
    /// already received stay valid.
    pub fn close(&mut self) {
        self.subscription.receiver_mut().close();
        self.subscription.inlet_mut().leave();
    }
}

/// What the protocol hands out, as the subscriber's user sees it.
fn event(out: Outbound<Payload>) -> Event {
    match out {
        Outbound::Batch {
            epoch,
            index,
            payload: Payload::Host { batch, shm },
        } => {
            // Looking at every buffer took 4 % of a subscriber's CPU
            // (docs/history/benchmarks-2026-11.md, "UTF-8 with SIMD"); debug builds,
            // and so the tests, still look.
            debug_assert!(shm.as_ref().is_none_or(|r| lies_within(&batch, r)));
            Event::Batch {
                epoch,
                index,
                batch,
                shm_range: shm,
            }
        }
        Outbound::Batch {
            epoch,
            index,
            payload: Payload::Device(batch),
        } => Event::DeviceBatch {
            epoch,
            index,
            batch,
        },
        Outbound::EpochEnd(summary) => Event::EpochEnd(summary),
        Outbound::End => Event::End,
    }
}

/// Whether every buffer of `batch` lies inside `range`.
pub fn lies_within(batch: &RecordBatch, range: &Range<usize>) -> bool {
    fn check(data: &ArrayData, range: &Range<usize>) -> bool {
        let inside = |ptr: *const u8, len: usize| {
            let p = ptr as usize;
            len == 0 || (p >= range.start && p + len <= range.end)
        };
        data.buffers().iter().all(|b| inside(b.as_ptr(), b.len()))
            && data
                .nulls()
                .is_none_or(|n| inside(n.buffer().as_ptr(), n.buffer().len()))
            && data.child_data().iter().all(|c| check(c, range))
    }
    batch.columns().iter().all(|c| check(&c.to_data(), range))
}

/// A cursor past the end of the producer's run (as its report says, where it has written
/// one yet) has nothing to receive: said at once, rather than after every epoch of the
/// run has gone by. One just at its end (a trainer that had every epoch) is not refused.
fn within_run(namespace: &Namespace, topic: &TopicName, at: RowPosition) -> Result<()> {
    let Ok(Some(report)) = crate::status::producer_report(namespace, topic) else {
        return Ok(());
    };
    let end = RowPosition::new(report.epochs, 0, 0);
    if report.epochs > 0 && (at.epoch, at.index, at.row) > (end.epoch, end.index, end.row) {
        return Err(SluiceError::Config(format!(
            "the cursor is at epoch {} of topic '{topic}', whose producer runs epochs 0 to {}: \
             nothing of the run is left for it; start the trainer without its saved state, \
             or run the producer for more epochs",
            at.epoch,
            report.epochs - 1
        )));
    }
    Ok(())
}
