//! A trainer's way back onto a running stream from a position the topic no longer holds:
//! the plan is computed again in the trainer's process from that position
//! ([`CatchUpFeed`], the same [`PlanSource`] the producer runs, so the same batches at the
//! same positions), until the shared stream's history reaches back to where the catch-up
//! is; then the trainer attaches to the shared stream with replay and the protocol drops
//! what it already had ([`CatchUp`]).
//!
//! ```text
//! cursor ─► catch-up: (e,c) (e,c+1) … (e,k)        live history: (e,k−w) … (e,k) (e,k+1) …
//!                                         └─ meets ─► duplicates dropped ─┘ deliver …
//! ```

use std::collections::VecDeque;
use std::sync::Arc;
use std::sync::atomic::{AtomicBool, Ordering};
use std::sync::mpsc::{Receiver, RecvTimeoutError, SyncSender, sync_channel};
use std::time::{Duration, Instant};

use arrow::record_batch::RecordBatch;
use sluice_core::delivery::Inbound;
use sluice_core::{Columns, Inlet, Position, Result, SluiceError, TopicName};
use sluice_plan::Plan;
use sluice_shm::{Namespace, OnMaxHeld, TopicSubscriber};
use tokio::runtime::{Handle, Runtime};

use super::local::LocalInlet;
use super::payload::Payload;
use crate::checkpoint::DataListing;
use crate::cursor::{LoaderRecord, PlanRecord, plan_hash};
use crate::producer::{PlanSource, Source};

/// How often, at most, a catch-up looks at the producer's report to see whether the
/// shared stream is within reach (a catch-up can run ahead of it: a trainer faster than
/// the others, a stream they pace).
const LOOK_EVERY: Duration = Duration::from_millis(20);
/// How long a catch-up waits after an attempt to attach that found the shared stream's
/// history starting after it.
const RETRY_AFTER: Duration = Duration::from_millis(100);
/// How long a look waits for the shared stream's first message.
const FIRST_MESSAGE_WAIT: Duration = Duration::from_millis(20);
/// How long a subscriber started at a cursor waits for the topic's history before it
/// catches up without knowing where the history starts (a producer held by a trainer
/// that reads nothing sends nothing).
pub(crate) const HISTORY_WAIT: Duration = Duration::from_secs(1);

/// How to attach to the shared stream.
#[derive(Debug, Clone)]
pub(crate) struct Attach {
    pub namespace: Namespace,
    pub topic: TopicName,
    pub reconnect: Option<Duration>,
    pub columns: Columns,
    pub on_max_held: OnMaxHeld,
}

impl Attach {
    /// A port on the shared stream that replays what the topic holds, waiting up to
    /// `wait` for the topic.
    pub(crate) fn replaying(
        &self,
        wait: Option<Duration>,
        interest: &mut Option<sluice_shm::Interest>,
    ) -> Result<LocalInlet> {
        let mut inner =
            TopicSubscriber::connect_declared(&self.namespace, &self.topic, wait, true, interest)?;
        inner.set_columns(self.columns.clone());
        inner.set_on_max_held(self.on_max_held);
        Ok(LocalInlet::new(inner, self.reconnect, self.columns.clone()))
    }
}

/// Where a message is in the stream (`None`: the end of the stream).
fn position_of<P>(message: &Inbound<P>) -> Option<Position> {
    match message {
        Inbound::Batch { epoch, index, .. } => Some(Position::new(*epoch, *index)),
        Inbound::EndOfEpoch { epoch, batches, .. } => Some(Position::new(*epoch, *batches)),
        _ => None,
    }
}

/// A subscriber's transport that starts at a position of its own: the shared stream where
/// its history reaches back to it, else a catch-up until it does.
pub(crate) struct CatchUp {
    attach: Attach,
    /// The shared stream, once on it.
    live: Option<Box<LocalInlet>>,
    /// The catch-up, until the shared stream is reached.
    feed: Option<Box<dyn Inlet<RecordBatch> + Send>>,
    /// Messages to deliver first.
    pending: VecDeque<Inbound<Payload>>,
    /// The next position the catch-up delivers.
    at: Position,
    /// The pause after a probe that got nothing.
    pause: Duration,
    /// When to look again whether the shared stream is within reach.
    next_try: Instant,
}

impl CatchUp {
    /// Starts at `start` on the shared stream `live` (attached with replay), whose first
    /// message `first` it looked at: on it if that message is not after `start` (or
    /// there is no start), else with a catch-up of the plan the topic's producer
    /// recorded. A stream that already ended is after any start. With no first message
    /// (the producer sent nothing for [`HISTORY_WAIT`]) a plan's topic is caught up on,
    /// and another one waited on.
    pub(crate) fn start(
        attach: Attach,
        live: LocalInlet,
        first: Option<Inbound<Payload>>,
        start: Option<Position>,
        loader: Option<&LoaderCatchUp>,
    ) -> Result<Self> {
        let Some(start) = start else {
            return Ok(Self::on(attach, live, first));
        };
        let found = match &first {
            Some(m) if position_of(m).is_some_and(|p| p <= start) => {
                return Ok(Self::on(attach, live, first));
            }
            Some(m) => position_of(m).map_or("the topic's stream has ended".into(), |p| {
                format!("the topic holds its stream from {p} on")
            }),
            // Only a plan's topic: a loader made again for a producer that is only slow
            // would compute the epoch up to the cursor for nothing.
            None if PlanRecord::load(&attach.namespace, &attach.topic)?.is_none() => {
                return Ok(Self::on(attach, live, None));
            }
            None => "the topic's producer has sent nothing for a second (a subscriber that \
                     reads nothing holds it)"
                .into(),
        };
        let mut this = Self {
            attach,
            live: None,
            feed: None,
            pending: VecDeque::new(),
            at: start,
            pause: RETRY_AFTER,
            next_try: Instant::now(),
        };
        // The topic's history starts after `start`: let go of it while catching up.
        drop(live);
        let (namespace, topic) = (&this.attach.namespace, &this.attach.topic);
        let columns = &this.attach.columns;
        let feed = match LoaderRecord::load(namespace, topic)? {
            Some(record) if PlanRecord::load(namespace, topic)?.is_none() => {
                let Some(loader) = loader else {
                    return Err(SluiceError::Config(format!(
                        "{found}, not {start}, the position asked for on topic '{topic}', \
                         which a loader feeds that only a Python trainer can make again \
                         ({}): subscribe through sluice.subscribe, or start without the \
                         saved state",
                        record.factory
                    )));
                };
                (loader.0)(&record, start, columns)?
            }
            _ => plan_feed(namespace, topic, start, columns, &found)?,
        };
        tracing::info!(topic = %this.attach.topic, "catching up from {start} ({found})");
        this.feed = Some(feed);
        Ok(this)
    }

    /// On the shared stream `live` from its first message `first`.
    fn on(attach: Attach, live: LocalInlet, first: Option<Inbound<Payload>>) -> Self {
        Self {
            attach,
            live: Some(Box::new(live)),
            feed: None,
            pending: first.into_iter().collect(),
            at: Position::default(),
            pause: RETRY_AFTER,
            next_try: Instant::now(),
        }
    }

    /// Whether rows come from the catch-up (not yet from the shared stream).
    pub(crate) fn catching_up(&self) -> bool {
        self.feed.is_some()
    }

    /// The shared stream's port, once on it.
    pub(crate) fn live(&self) -> Option<&LocalInlet> {
        self.live.as_deref()
    }

    /// Leaves the topic (and stops the catch-up).
    pub(crate) fn leave(&mut self) {
        self.feed = None;
        if let Some(live) = &mut self.live
            && let Some(inner) = &mut live.inner
        {
            inner.detach();
        }
    }

    /// Whether the shared stream's history now reaches back to the catch-up's position;
    /// if so, moves onto it (its first message waits in `pending`).
    ///
    /// A probe attached with replay gets the topic's history only when the producer next
    /// sends; it is waited for at most [`FIRST_MESSAGE_WAIT`] and never kept past this
    /// call (a probe left attached while the trainer does something else would fill its
    /// queue and hold every other trainer back). A producer that sent nothing meanwhile
    /// is looked at again after a longer pause each time, up to a second.
    fn meet(&mut self) -> bool {
        if Instant::now() < self.next_try {
            return false;
        }
        self.next_try = Instant::now() + LOOK_EVERY;
        if !self.within_reach() {
            return false;
        }
        let Ok(mut probe) = self.attach.replaying(Some(Duration::ZERO), &mut None) else {
            return false;
        };
        match probe.recv(Some(FIRST_MESSAGE_WAIT)) {
            Ok(first) if position_of(&first).is_some_and(|p| p <= self.at) => {
                tracing::info!(topic = %self.attach.topic, "caught up at {}", self.at);
                self.pending.push_back(first);
                self.live = Some(Box::new(probe));
                self.feed = None;
                true
            }
            // The history starts after the catch-up (or the stream ended).
            Ok(_) => {
                self.pause = RETRY_AFTER;
                self.next_try = Instant::now() + self.pause;
                false
            }
            Err(_) => {
                self.pause = (self.pause * 2).min(Duration::from_secs(1));
                self.next_try = Instant::now() + self.pause;
                false
            }
        }
    }

    /// Whether the shared stream may be within reach: unless the producer's report (a
    /// lower bound of where the producer is: it is rewritten at most every quarter of a
    /// second) already puts it in a later epoch. (Its window counts messages, of
    /// however many batches each: only an attempt tells whether it reaches back.)
    fn within_reach(&self) -> bool {
        let producer = crate::status::snapshot(&self.attach.namespace)
            .ok()
            .and_then(|topics| {
                topics
                    .into_iter()
                    .find(|t| t.topic == self.attach.topic.as_str())
            })
            .and_then(|t| t.producer);
        let Some(producer) = producer else {
            // No report (yet): only an attempt tells.
            return true;
        };
        producer.epoch <= self.at.epoch
    }
}

impl Inlet<Payload> for CatchUp {
    fn recv(&mut self, timeout: Option<Duration>) -> Result<Inbound<Payload>> {
        if let Some(message) = self.pending.pop_front() {
            return Ok(message);
        }
        if let Some(live) = &mut self.live {
            return live.recv(timeout);
        }
        if self.meet() {
            // The protocol drops what the shared stream repeats.
            return Ok(Inbound::Reconnected);
        }
        let Some(feed) = &mut self.feed else {
            return Ok(Inbound::EndOfStream);
        };
        let message = feed.recv(timeout)?;
        match &message {
            Inbound::Batch { epoch, index, .. } => self.at = Position::new(*epoch, index + 1),
            Inbound::EndOfEpoch { epoch, .. } => self.at = Position::new(epoch + 1, 0),
            _ => {}
        }
        Ok(message.map(Payload::private))
    }
}

/// The catch-up a `sluice serve --flight` server gives a remote subscriber whose position
/// `topic`'s history no longer holds (see `sluice_flight::catch_up`): the plan its
/// producer recorded, computed again in the server's process from that position, on
/// threads at a lower priority, with the same refusals as a local trainer's catch-up.
pub fn remote_catch_up(namespace: Namespace) -> sluice_flight::CatchUpSource {
    Arc::new(move |topic, start, columns, found| {
        // A loader's topic is computed again by a Python trainer only, not here: the
        // client gets the gap (`ResumeGap`).
        if PlanRecord::load(&namespace, topic)?.is_none() {
            return Ok(None);
        }
        plan_feed(&namespace, topic, start, columns, found).map(Some)
    })
}

/// The plan `topic`'s producer recorded, computed again from `start` (see [`replan`]).
fn plan_feed(
    namespace: &Namespace,
    topic: &TopicName,
    start: Position,
    columns: &Columns,
    found: &str,
) -> Result<Box<dyn Inlet<RecordBatch> + Send>> {
    let (plan, runtime) = replan(namespace, topic, start, found)?;
    let feed = CatchUpFeed::start(plan, runtime, start, columns.clone(), topic.clone())?;
    Ok(Box::new(feed))
}

/// How a subscriber's process computes again the batches of a topic that a loader feeds
/// which can make them again ([`LoaderRecord`]): given the record, the position and the
/// columns, the stream's messages from that position to its end (one batch per
/// message; see [`catch_up_channel`]). The Python binding gives every subscriber one
/// that makes the loader in Python.
#[derive(Clone)]
pub struct LoaderCatchUp(pub Arc<MakeFeed>);

/// A catch-up's feed from a loader's record, a position and the columns.
pub type MakeFeed = dyn Fn(&LoaderRecord, Position, &Columns) -> Result<Box<dyn Inlet<RecordBatch> + Send>>
    + Send
    + Sync;

impl std::fmt::Debug for LoaderCatchUp {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.write_str("LoaderCatchUp")
    }
}

/// A catch-up's two ends: the sender, for the code that computes the messages (on a
/// thread of its own), and the feed a catching-up subscriber reads. Two messages ahead.
pub fn catch_up_channel(
    topic: &TopicName,
    columns: Columns,
) -> (CatchUpSender, Box<dyn Inlet<RecordBatch> + Send>) {
    let (tx, messages) = sync_channel(2);
    let stop = Arc::new(AtomicBool::new(false));
    let sender = CatchUpSender {
        tx,
        stop: stop.clone(),
        columns,
    };
    let feed = CatchUpFeed {
        messages,
        stop,
        topic: topic.clone(),
    };
    (sender, Box::new(feed))
}

/// Plans the topic's plan again, as its producer recorded it, and checks that it is the
/// same plan over the same files and that it computes the same rows each time; with the
/// runtime it runs on.
fn replan(
    namespace: &Namespace,
    topic: &TopicName,
    start: Position,
    found: &str,
) -> Result<(Plan, Runtime)> {
    let Some(record) = PlanRecord::load(namespace, topic)? else {
        return Err(SluiceError::Config(format!(
            "{found}, not {start}, the position asked for on topic '{topic}', and its \
             producer runs no plan that this process could compute again, nor a loader \
             published with resumable=True (a loader's batches, or a producer of another \
             Sluice): start the trainer without its saved state, or with join='next_epoch'"
        )));
    };
    let runtime = background_runtime()?;
    let plan = runtime.block_on(async {
        let mut plan = Plan::from_sql(&record.file, &record.sql).await?;
        let options = plan.options_mut();
        options.epochs = record.epochs;
        options.batch_rows = record.batch_rows;
        options.shard.clone_from(&record.shard);
        options.topic.clone_from(&record.topic);
        let listing = DataListing::from(&plan.listing().await?);
        Ok::<_, SluiceError>((plan, listing))
    });
    let refuse = |why: String| {
        SluiceError::Config(format!(
            "cannot catch up on topic '{topic}' from {start} ({found}): {why}"
        ))
    };
    let (plan, listing) = plan.map_err(|e| refuse(format!("its plan does not load here: {e}")))?;
    if plan.engine().is_ballista() {
        return Err(refuse(
            "the plan runs on Ballista, which this process does not run it on; set \
             sluice.engine = 'local' to make its stream resumable"
                .into(),
        ));
    }
    if plan.options().rounds > 1 {
        return Err(refuse(
            "the topic runs rounds (sluice.rounds), each over its own snapshot of the data and \
             feedback, which this process does not rebuild; resume while the producer's \
             history still holds the position, or with join='next_epoch'"
                .into(),
        ));
    }
    if let Some(function) = plan.nondeterministic_function() {
        return Err(refuse(format!(
            "the plan calls {function}(), whose values differ every time it runs; draw them \
             from the seed, the epoch and a row key (random_crop, random_flip, or a hash of the \
             key) to make its stream resumable"
        )));
    }
    if plan_hash(&plan) != record.plan || listing != record.data {
        return Err(refuse(format!(
            "the plan {} plans or lists other files here than in its producer; run the \
             trainer (or, for remote trainers, `sluice serve`) in the producer's working \
             directory ({}), or use absolute paths in the plan",
            record.file,
            record.cwd.display()
        )));
    }
    Ok((plan, runtime))
}

/// How much lower than the rest of the process the catch-up's threads run (a `nice`
/// value): where the cores are busy, the shared stream comes first.
const CATCH_UP_NICENESS: libc::c_int = 10;

/// Lowers the calling thread's scheduling priority by [`CATCH_UP_NICENESS`]. A
/// catch-up serves one trainer; on a machine whose cores the pipeline keeps busy it
/// would otherwise take as much CPU as the pipeline every trainer shares (measured:
/// the others' rate halved on 2 cores, docs/benchmarks.md).
fn lower_priority() {
    // SAFETY: getpriority/setpriority take plain integers and touch no memory of
    // ours; on Linux `PRIO_PROCESS` with `who = 0` names the calling thread alone.
    // `getpriority` may return -1 legitimately: errno is not needed here, since a
    // failed `setpriority` only leaves the priority as it was.
    unsafe {
        let now = libc::getpriority(libc::PRIO_PROCESS, 0);
        libc::setpriority(
            libc::PRIO_PROCESS,
            0,
            now.saturating_add(CATCH_UP_NICENESS).min(19),
        );
    }
}

/// A runtime for the catch-up's plan, its threads at a lower priority.
fn background_runtime() -> Result<Runtime> {
    tokio::runtime::Builder::new_multi_thread()
        .enable_all()
        .thread_name(format!(
            "{}-catch-up",
            sluice_core::panics::RUNTIME_THREAD_PREFIX
        ))
        .thread_stack_size(sluice_core::threads::RUNTIME_THREAD_STACK)
        .on_thread_start(lower_priority)
        .build()
        .map_err(|e| SluiceError::io("cannot start the catch-up's runtime", e))
}

/// A catch-up's messages, computed on a thread of its own (see [`catch_up_channel`]);
/// the thread is told to stop once this is dropped.
struct CatchUpFeed {
    messages: Receiver<Result<Inbound<RecordBatch>>>,
    stop: Arc<AtomicBool>,
    topic: TopicName,
}

impl CatchUpFeed {
    /// Starts computing `plan` from `from`, one batch per message, as its producer's
    /// messages would be.
    fn start(
        plan: Plan,
        runtime: Runtime,
        from: Position,
        columns: Columns,
        topic: TopicName,
    ) -> Result<Box<dyn Inlet<RecordBatch> + Send>> {
        let (sender, feed) = catch_up_channel(&topic, columns);
        std::thread::Builder::new()
            .name("sluice-catch-up".into())
            .stack_size(sluice_core::threads::RUNTIME_THREAD_STACK)
            .spawn(move || {
                lower_priority();
                if let Err(e) = run_plan(&sender, &plan, runtime.handle(), from) {
                    sender.fail(e);
                }
            })
            .map_err(|e| SluiceError::io("cannot start the catch-up thread", e))?;
        Ok(feed)
    }
}

impl Inlet<RecordBatch> for CatchUpFeed {
    fn recv(&mut self, timeout: Option<Duration>) -> Result<Inbound<RecordBatch>> {
        let topic = &self.topic;
        let message = match timeout {
            None => self
                .messages
                .recv()
                .map_err(|_| RecvTimeoutError::Disconnected),
            Some(t) => self.messages.recv_timeout(t),
        };
        match message {
            Ok(message) => message,
            Err(RecvTimeoutError::Timeout) => Err(SluiceError::Timeout {
                what: format!("the next batch of the catch-up on topic '{topic}'"),
                seconds: timeout.unwrap_or_default().as_secs_f64(),
            }),
            Err(RecvTimeoutError::Disconnected) => Err(SluiceError::Internal(format!(
                "the catch-up on topic '{topic}' ended without the end of the stream"
            ))),
        }
    }
}

impl Drop for CatchUpFeed {
    fn drop(&mut self) {
        self.stop.store(true, Ordering::Relaxed);
    }
}

/// The computing end of a catch-up (see [`catch_up_channel`]).
pub struct CatchUpSender {
    tx: SyncSender<Result<Inbound<RecordBatch>>>,
    stop: Arc<AtomicBool>,
    columns: Columns,
}

impl CatchUpSender {
    /// Sends `message` (a batch with the subscriber's columns only), waiting while two
    /// are ahead; `Ok(false)` once nobody takes them (the subscriber moved onto the
    /// shared stream, or left): stop computing then.
    pub fn send(&self, message: Inbound<RecordBatch>) -> Result<bool> {
        let message = message.try_map(|payload| -> Result<RecordBatch> {
            Ok(match self.columns.indices(&payload.schema())? {
                Some(indices) => payload.project(&indices)?,
                None => payload,
            })
        })?;
        Ok(!self.stop.load(Ordering::Relaxed) && self.tx.send(Ok(message)).is_ok())
    }

    /// Fails the catch-up with `error` (the subscriber gets it).
    pub fn fail(&self, error: SluiceError) {
        let _ = self.tx.send(Err(error));
    }
}

/// Computes `plan` from `from` into `sender`, until its end or until nobody takes it.
fn run_plan(sender: &CatchUpSender, plan: &Plan, handle: &Handle, from: Position) -> Result<()> {
    let opts = plan.options().clone();
    let mut source = PlanSource::new(plan, &opts).stamped(&plan_hash(plan));
    for epoch in from.epoch..opts.epochs {
        let skip = if epoch == from.epoch { from.index } else { 0 };
        source.start(handle, epoch, skip)?;
        while let Some(message) = source.next(handle)? {
            let batch = Inbound::Batch {
                epoch,
                index: message.index,
                batch_rows: 0,
                payload: message.rows,
            };
            if !sender.send(batch)? {
                return Ok(());
            }
        }
        let (batches, rows) = source.produced();
        let end = Inbound::EndOfEpoch {
            epoch,
            batches,
            rows,
        };
        if !sender.send(end)? {
            return Ok(());
        }
    }
    sender.send(Inbound::EndOfStream)?;
    Ok(())
}
