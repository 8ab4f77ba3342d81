//! The producer: runs a plan (or takes the batches a loader feeds it) and publishes its
//! batches on a topic.

use std::sync::atomic::AtomicBool;
use std::sync::{Arc, Mutex, PoisonError};
use std::time::Duration;

use std::borrow::Cow;
use std::path::PathBuf;

use sluice_core::{Position, Result, SluiceError, TopicName, wire};
use sluice_plan::{Plan, SluiceOptions};
use sluice_shm::{Namespace, TopicConfig, TopicPublisher, message_bytes};
use tokio::runtime::Handle;

mod fed;
mod handle;
mod report;
mod run;
mod sizing;
mod source;
mod start;

pub use fed::Feeder;
pub use handle::ProducerHandle;
pub use sizing::auto_message_batches;

use crate::checkpoint::{CheckpointWriter, DataListing};
use crate::rounds::RoundSource;
use crate::status::EpochSize;
use report::ProducerReporter;
use run::{Run, Sink, wait_for_interested};
use sizing::{First, SHORT_WINDOW, TopicPlan};
pub(crate) use source::{Message, PlanSource, Source};
use start::StartPoint;

/// How a run behaves beyond what the plan file says.
#[derive(Debug, Clone)]
pub struct RunOptions {
    /// Subscribers to wait for before the first batch; `None` uses `sluice.min_subscribers`.
    pub min_subscribers: Option<usize>,
    /// Give up waiting for `min_subscribers` after this long.
    pub subscriber_timeout: Option<Duration>,
    /// After the end of the stream, wait for subscribers to read it all, giving up after
    /// this long without a subscriber taking a message (a slow one that reads is waited
    /// for: what is queued for it may go with the producer).
    pub linger: Duration,
    /// Set to stop the run early (Ctrl-C); subscribers are told the producer stopped.
    pub stop: Arc<AtomicBool>,
    /// Resume from the checkpoint a crashed run left (from the beginning if there is none).
    pub resume: bool,
    /// Where checkpoints go; `None`: [`crate::Checkpoint::default_path`] of the topic.
    pub checkpoint: Option<PathBuf>,
}

impl Default for RunOptions {
    fn default() -> Self {
        Self {
            min_subscribers: None,
            subscriber_timeout: None,
            linger: Duration::from_secs(10),
            stop: Arc::new(AtomicBool::new(false)),
            resume: false,
            checkpoint: None,
        }
    }
}

/// Where a run is.
#[derive(Debug, Clone, Default)]
pub struct Progress {
    /// Current epoch.
    pub epoch: u64,
    /// Batches published so far, all epochs.
    pub batches: u64,
    /// Rows published so far, all epochs.
    pub rows: u64,
    /// Payload bytes written to shared memory so far.
    pub bytes: u64,
    /// Subscribers attached now.
    pub subscribers: usize,
}

/// What a finished run did.
#[derive(Debug, Clone, Default)]
pub struct RunStats {
    /// Epochs completed.
    pub epochs: u64,
    /// Batches published.
    pub batches: u64,
    /// Rows published.
    pub rows: u64,
    /// Payload bytes written to shared memory.
    pub bytes: u64,
    /// Wall time from the first batch to the end of the stream.
    pub elapsed: Duration,
    /// Shared memory the topic reserved.
    pub shm_bytes: u64,
    /// Batches a subscriber could have queued: `sluice.window` as 'auto' sized it, or the
    /// lag limit where one is set.
    pub window: usize,
    /// Where the run started: `(0, 0)`, or the checkpoint it resumed from.
    pub resumed_from: Position,
    /// Time the publishing thread spent, within `elapsed`, waiting for the plan: for an
    /// epoch's plan and for each next batch (DataFusion decoding and transforming on its
    /// own threads). Where it is a large share of `elapsed`, the pipeline paces the
    /// subscribers.
    pub waited_for_pipeline: Duration,
    /// Time the publishing thread spent on subscribers' full queues, within `elapsed`:
    /// where it is a large share of it, the slowest subscriber paces the producer.
    pub waited_for_subscribers: Duration,
    /// Messages of batches published (several batches to a message where
    /// `sluice.message_batches` lets them); control messages are not counted.
    pub messages: u64,
    /// Times idle subscribers were woken (each wake-up notifies every subscriber), for
    /// messages of batches and for control messages (each epoch's end, the stream's):
    /// fewer than `messages` where a burst of messages ready at once shares one.
    pub wakeups: u64,
}

/// Runs a plan (or takes the batches fed to it) and publishes its output on the topic.
#[derive(Debug)]
pub struct Producer {
    feed: Feed,
    namespace: Namespace,
}

/// Where a producer's batches come from.
enum Feed {
    Plan(Box<Plan>),
    /// Batches fed through a [`Feeder`]; the run takes the source.
    Fed {
        options: Box<SluiceOptions>,
        source: Mutex<Option<fed::FedSource>>,
        /// `package.module:function` that makes the loader again, for trainers that
        /// catch up ([`crate::cursor::LoaderRecord`]).
        factory: Option<String>,
        /// What the loader says an epoch holds, reported until one ends.
        epoch_size: EpochSize,
    },
}

impl std::fmt::Debug for Feed {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        match self {
            Feed::Plan(plan) => f.debug_tuple("Plan").field(plan).finish(),
            Feed::Fed { options, .. } => f
                .debug_struct("Fed")
                .field("topic", &options.topic)
                .finish(),
        }
    }
}

impl Producer {
    /// A producer for `plan` in `namespace`.
    pub fn new(plan: Plan, namespace: Namespace) -> Self {
        Self {
            feed: Feed::Plan(Box::new(plan)),
            namespace,
        }
    }

    /// A producer of the batches fed through the returned [`Feeder`], each published as
    /// one message (subscribers that keep the producer's batches receive exactly those),
    /// with `options`' topic, epochs and topic settings (`sluice.window`,
    /// `max_subscribers`, `min_subscribers`, `lag_limit`, `max_held`, `device`); the
    /// settings of a plan's query (`batch_rows`, shuffling, sharding) do not apply. It
    /// cannot resume from a checkpoint.
    pub fn fed(mut options: SluiceOptions, namespace: Namespace) -> (Self, Feeder) {
        // One batch per message: the topic is sized for that, not for messages of many.
        options.message_batches = "1".into();
        let (feeder, source) = fed::channel();
        let feed = Feed::Fed {
            options: Box::new(options),
            source: Mutex::new(Some(source)),
            factory: None,
            epoch_size: EpochSize::default(),
        };
        (Self { feed, namespace }, feeder)
    }

    /// Says that the fed batches come from a loader that `factory`
    /// (`package.module:function`) makes again, which yields the same batches for an
    /// epoch in any process: the run leaves a [`crate::cursor::LoaderRecord`] while it
    /// runs, and a Python trainer whose cursor the topic no longer holds makes the
    /// loader in its own process to catch up. No effect on a plan's producer.
    pub fn remade_by(mut self, factory: &str) -> Self {
        if let Feed::Fed { factory: f, .. } = &mut self.feed {
            *f = Some(factory.to_string());
        }
        self
    }

    /// Says how large an epoch of the fed loader is (its `len()`, the rows its sampler
    /// yields), which the producer reports for trainers' `len()` until its first epoch
    /// ends and its own count replaces it ([`crate::status::ProducerReport::epoch_size`]).
    /// No effect on a plan's producer, which reports its epochs' size once one ended.
    pub fn epoch_size(mut self, size: EpochSize) -> Self {
        if let Feed::Fed { epoch_size, .. } = &mut self.feed {
            *epoch_size = size;
        }
        self
    }

    /// The plan, for a producer that runs one.
    pub fn plan(&self) -> Option<&Plan> {
        match &self.feed {
            Feed::Plan(plan) => Some(plan.as_ref()),
            Feed::Fed { .. } => None,
        }
    }

    /// Runs every epoch of the plan and publishes it. Blocks the calling thread; the
    /// plan executes on the runtime behind `handle`.
    ///
    /// Any failure, including a query that fails part-way, is published to subscribers
    /// as an error before this returns it. While it runs, the producer keeps a
    /// checkpoint (see [`crate::checkpoint`]); with [`RunOptions::resume`] it starts
    /// from the checkpoint a crashed run left.
    pub fn run(
        &self,
        handle: &Handle,
        options: &RunOptions,
        on_progress: impl FnMut(&Progress),
    ) -> Result<RunStats> {
        let opened = std::cell::Cell::new(false);
        let result = self.run_feed(handle, options, on_progress, &opened);
        // Failed before its topic existed (a listing, the device, the topic's size): the
        // subscribers waiting for it are told why. Not those of a run resumed: they wait
        // to reconnect to the crashed run's successor, which a refused resume (a plan
        // changed since the checkpoint) is not yet.
        if let Err(e) = &result
            && !opened.get()
            && !options.resume
        {
            let declared = match &self.feed {
                Feed::Plan(plan) => plan.options(),
                Feed::Fed { options, .. } => options,
            };
            self.tell_before_start(declared, options, e);
        }
        result
    }

    /// [`Producer::run`]'s run of the plan or the fed batches; `opened` is set once the
    /// topic exists (a failure after that is published on it).
    fn run_feed(
        &self,
        handle: &Handle,
        options: &RunOptions,
        on_progress: impl FnMut(&Progress),
        opened: &std::cell::Cell<bool>,
    ) -> Result<RunStats> {
        match &self.feed {
            Feed::Plan(plan) => {
                let opts = plan.options().clone();
                opts.validate()?;
                let topic = opts.topic_name()?;
                // The files as listed now: what a checkpoint of this run is taken over. A
                // run of rounds lists files anew each round, and checks each round's
                // listing against its record instead.
                let data = match opts.rounds {
                    1 => DataListing::from(&handle.block_on(plan.listing())?),
                    _ => DataListing::of_rounds(),
                };
                let start = StartPoint::resolve(plan, &self.namespace, &topic, options, data)?;
                fed::forget_loader(&self.namespace, &topic)?;
                let position = start.position;
                if opts.rounds == 1 {
                    let source = PlanSource::new(plan, &opts)
                        .stamped(start.plan_hash())
                        .prefetching_until(opts.total_epochs().saturating_sub(1));
                    let checkpoint = start.writer(plan, &self.namespace, &topic)?;
                    let run = (source, position, Some(checkpoint));
                    return self.publish(handle, options, &opts, run, on_progress, opened);
                }
                let source = RoundSource::new(
                    plan,
                    &opts,
                    start.plan_hash(),
                    &self.namespace,
                    &topic,
                    options.resume,
                    options.stop.clone(),
                )?;
                let checkpoint = start.writer(plan, &self.namespace, &topic)?;
                let run = (source, position, Some(checkpoint));
                self.publish(handle, options, &opts, run, on_progress, opened)
            }
            Feed::Fed {
                options: opts,
                source,
                factory,
                ..
            } => {
                if options.resume {
                    return Err(SluiceError::Config(
                        "a producer fed by a loader cannot resume from a checkpoint: start it \
                         again from the beginning"
                            .into(),
                    ));
                }
                opts.validate()?;
                let source = source
                    .lock()
                    .unwrap_or_else(PoisonError::into_inner)
                    .take()
                    .ok_or_else(|| SluiceError::Config("a fed producer runs once".into()))?;
                // A loader that cannot be made again removes the record a crashed run
                // of a loader that could may have left: its function is not this one.
                let _record = match factory {
                    Some(factory) => fed::LoaderRecordKept::leave(&self.namespace, opts, factory)?,
                    None => {
                        fed::forget(&self.namespace, &opts.topic_name()?)?;
                        None
                    }
                };
                let run = (source, Position::default(), None);
                self.publish(handle, options, opts, run, on_progress, opened)
            }
        }
    }

    /// Publishes `source`'s epochs from `position` (see [`Producer::run`]), keeping
    /// checkpoints where the run can resume.
    fn publish<S: Source>(
        &self,
        handle: &Handle,
        options: &RunOptions,
        opts: &SluiceOptions,
        (mut source, position, checkpoint): (S, Position, Option<CheckpointWriter>),
        mut on_progress: impl FnMut(&Progress),
        topic_exists: &std::cell::Cell<bool>,
    ) -> Result<RunStats> {
        let opened = self.open(handle, options, opts, &mut source, position)?;
        topic_exists.set(true);
        let Opened {
            topic,
            opts,
            first,
            sink,
            publisher,
            header_batch_rows,
        } = opened;
        let opts = &*opts;
        let shm_bytes = publisher.config().shm_bytes();
        let mut run = Run {
            checkpoint,
            reporter: ProducerReporter::new(
                &self.namespace,
                &topic,
                opts.total_epochs(),
                opts.lag_limit,
                shm_bytes,
                self.loader_epoch_size(),
                (opts.rounds > 1).then(|| opts.trigger.clone()),
            ),
            publisher,
            sink,
            source,
            progress: Progress {
                epoch: position.epoch,
                ..Progress::default()
            },
            header_batch_rows,
            messages: 0,
        };
        let result = run.publish(handle, options, opts, position, first, &mut on_progress);
        run.finish(result, options)
    }

    /// Opens what the run writes to: the device, if the plan names one, and the topic,
    /// sized from the first message (read here; an error reading it is kept for the
    /// subscribers to hear once the topic exists).
    fn open<'o, S: Source>(
        &self,
        handle: &Handle,
        options: &RunOptions,
        opts: &'o SluiceOptions,
        source: &mut S,
        position: Position,
    ) -> Result<Opened<'o>> {
        let device = crate::gpu::open_device(opts.device()?)?;
        let topic = opts.topic_name()?;
        let mut encoder = wire::Encoder::new();
        let first = read_first(
            source,
            handle,
            opts,
            position,
            device.is_some(),
            &mut encoder,
        );
        // Batches as fed are as large as they come: the first stands for the others,
        // whatever `batch_rows` says.
        let opts = match &first {
            Ok(Some(first)) if source.batches_as_fed() => {
                let mut fed = opts.clone();
                fed.batch_rows = first.message.rows.num_rows().max(1);
                Cow::Owned(fed)
            }
            _ => Cow::Borrowed(opts),
        };
        let sizing_batch = first.as_ref().ok().and_then(Option::as_ref);
        let plan = TopicPlan::new(
            &self.namespace,
            &topic,
            &opts,
            sizing_batch,
            device.is_some(),
        )?;
        source.set_max_batches(plan.max_batches);
        // The device ring is allocated before the topic exists: a ring over
        // sluice.device_memory fails here, with nothing to clean up.
        let sink = match (device, sizing_batch, plan.device) {
            (None, _, _) => Sink::Host,
            (Some(device), Some(first), Some(sizing)) => {
                Sink::Device(Some(Box::new(crate::gpu::stager(
                    device,
                    &first.message.rows,
                    sizing,
                    plan.config.chunks(),
                    opts.device_memory()?.0,
                )?)))
            }
            (Some(_), _, _) => Sink::Device(None),
        };
        let publisher = TopicPublisher::create(&self.namespace, plan.config, options.stop.clone())?;
        let shm_bytes = publisher.config().shm_bytes();
        tracing::info!(topic = %topic, shm_bytes, max_batches = plan.max_batches, "publishing");
        Ok(Opened {
            topic,
            opts,
            first,
            sink,
            publisher,
            header_batch_rows: plan.header_batch_rows,
        })
    }

    /// A run that failed before its topic existed (no GPU, a topic larger than the
    /// shared memory): the subscribers waiting for the topic are told why, as those of a
    /// plan that failed to load are, unless another producer has the topic.
    fn tell_before_start(&self, opts: &SluiceOptions, options: &RunOptions, error: &SluiceError) {
        if matches!(error, SluiceError::TopicBusy(_)) {
            return;
        }
        match Self::fail_before_start(&self.namespace, opts, options, error) {
            // Another producer serves the topic (this run was refused for it): its
            // subscribers are its own.
            Ok(()) | Err(SluiceError::TopicBusy(_)) => {}
            // The same cause (a full /dev/shm) stopped the telling too: said once is enough.
            Err(e) if std::mem::discriminant(&e) == std::mem::discriminant(error) => {
                tracing::debug!("could not tell subscribers about the failure: {e}")
            }
            Err(e) => tracing::warn!("could not tell subscribers about the failure: {e}"),
        }
    }

    /// What the fed loader says of its epochs' size (nothing, for a plan).
    fn loader_epoch_size(&self) -> EpochSize {
        match &self.feed {
            Feed::Fed { epoch_size, .. } => *epoch_size,
            Feed::Plan(_) => EpochSize::default(),
        }
    }
}

/// What a run writes to, opened (see `Producer::open`).
struct Opened<'o> {
    topic: TopicName,
    /// The run's options; a fed run's `batch_rows` is its first batch's.
    opts: Cow<'o, SluiceOptions>,
    /// The first message, or why it could not be read.
    first: Result<Option<First>>,
    sink: Sink,
    publisher: TopicPublisher,
    header_batch_rows: u32,
}

/// The first message of a run from `start` (`None`: no epoch left, or the first is
/// empty), encoded on a host topic; an error is kept for the subscribers to hear once
/// the topic exists.
fn read_first(
    source: &mut impl Source,
    handle: &Handle,
    opts: &SluiceOptions,
    start: Position,
    on_device: bool,
    encoder: &mut wire::Encoder,
) -> Result<Option<First>> {
    if start.epoch >= opts.total_epochs() {
        return Ok(None);
    }
    let sizing = source.sizing_message(handle, start)?;
    let sizing_only = sizing.is_some();
    let message = match sizing {
        Some(message) => message,
        None => {
            source.start(handle, start.epoch, start.index)?;
            let Some(message) = source.next(handle)? else {
                return Ok(None);
            };
            message
        }
    };
    // A device topic carries descriptors, not Arrow IPC.
    let encoded = match on_device {
        false => Some(encoder.encode(&message.rows)?),
        true => None,
    };
    Ok(Some(First {
        message,
        encoded,
        sizing_only,
    }))
}

/// The most subscribers a topic that carries only a failure takes, whatever the plan
/// says (one sized by the plan may be what failed): small, so that it fits where the
/// plan's topic did not. Subscribers beyond it are refused when they attach.
const ERROR_TOPIC_MAX_SUBSCRIBERS: usize = 64;

impl Producer {
    /// Loads the plan at `path` for a run on `topic` (else the plan's own). A plan that
    /// cannot be loaded (a syntax error, a bad option, a file DataFusion cannot read, a
    /// missing bucket) fails its run before the first batch: the subscribers waiting for
    /// its topic are told why (see [`Producer::fail_before_start`]) before the error is
    /// returned, instead of waiting for a topic that never comes. Must not be called
    /// from inside the runtime behind `handle`.
    pub fn load_for_run(
        handle: &Handle,
        path: &std::path::Path,
        topic: Option<&str>,
        namespace: &Namespace,
        options: &RunOptions,
    ) -> Result<Plan> {
        let error = match handle.block_on(Plan::load(path)) {
            // A command asking the impossible: said at once, with no topic to tell (its
            // subscribers could not all attach to one).
            Ok(plan) => {
                return check_min_subscribers(&plan, options.min_subscribers).map(|()| plan);
            }
            Err(e) => e,
        };
        // An unreadable plan file names no topic: nobody to tell.
        let Ok(sql) = std::fs::read_to_string(path) else {
            return Err(error);
        };
        let mut declared = match (handle.block_on(Plan::declared_options(&sql)), topic) {
            (Some(declared), _) => declared,
            (None, Some(_)) => SluiceOptions::default(),
            // A file not made of SQL tokens names no topic, not even the default one.
            (None, None) => return Err(error),
        };
        if let Some(t) = topic {
            declared.topic = t.to_string();
        }
        if let Err(e) = Self::fail_before_start(namespace, &declared, options, &error) {
            tracing::warn!("could not tell subscribers about the failure: {e}");
        }
        Err(error)
    }

    /// Tells the subscribers of a producer whose plan failed to load (say, a missing
    /// bucket or refused credentials) why no data will come, instead of leaving them
    /// waiting for a topic that never appears.
    ///
    /// `declared` are the options the plan file sets (see `Plan::declared_options`). The
    /// topic is created without data; the error is published once `min_subscribers`
    /// (from `options`, else the plan) are attached or `subscriber_timeout` (else
    /// `linger`) has passed, then the producer lingers briefly while they read it.
    pub fn fail_before_start(
        namespace: &Namespace,
        declared: &sluice_plan::SluiceOptions,
        options: &RunOptions,
        error: &SluiceError,
    ) -> Result<()> {
        let topic = declared.topic_name()?;
        let message = error.to_string();
        let config = TopicConfig {
            topic,
            // Nothing but the error goes out: the shortest queue will do.
            window: SHORT_WINDOW,
            max_subscribers: declared
                .max_subscribers
                .clamp(1, ERROR_TOPIC_MAX_SUBSCRIBERS),
            // Nobody holds the one message, the error.
            max_held: 1,
            lag_limit: None,
            max_message_bytes: message_bytes(message.len() + 256),
        };
        let mut publisher = TopicPublisher::create(namespace, config, options.stop.clone())?;
        // Those waiting for the topic attach within the grace period; those the run was
        // told to wait for, within the subscriber timeout (else the linger). Nobody
        // attached in time: nobody to tell.
        let _ = wait_for_interested(&publisher, declared, &options.stop);
        let min = options
            .min_subscribers
            .unwrap_or(declared.min_subscribers)
            .min(ERROR_TOPIC_MAX_SUBSCRIBERS);
        if min > 0 {
            let wait = options.subscriber_timeout.unwrap_or(options.linger);
            let _ = publisher.wait_for_subscribers(min, Some(wait), &options.stop);
        }
        publisher.publish_error(&message)?;
        publisher.drain(options.linger.min(Duration::from_secs(2)));
        Ok(())
    }
}

/// `Ok` unless a run of `plan` is told to wait for more subscribers (`min`) than its
/// topic has places for, which it would do until its wait timeout.
pub fn check_min_subscribers(plan: &Plan, min: Option<usize>) -> Result<()> {
    let places = plan.options().max_subscribers;
    match min {
        Some(min) if min > places => Err(SluiceError::Config(format!(
            "the run waits for min_subscribers = {min} subscribers but its topic has \
             places for sluice.max_subscribers = {places}: raise sluice.max_subscribers in \
             the plan, or wait for fewer"
        ))),
        _ => Ok(()),
    }
}
