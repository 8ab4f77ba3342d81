//! The producer: runs a plan and publishes its batches on a topic.

use std::sync::Arc;
use std::sync::atomic::{AtomicBool, Ordering};
use std::time::{Duration, Instant};

use std::collections::VecDeque;
use std::path::PathBuf;

use arrow::record_batch::RecordBatch;
use futures::StreamExt;
use sluice_core::{Position, Result, Shaper, SluiceError, wire};
use sluice_plan::{BatchStream, MessageBatches, Plan, SluiceOptions, Window};
use sluice_shm::{
    Namespace, TopicConfig, TopicPublisher, message_bytes, planned_message_bytes, shm_available,
};
use tokio::runtime::Handle;

use crate::checkpoint::{Checkpoint, CheckpointWriter};
use crate::status::{ProducerReport, Reporter, unix_now};

/// The window under `sluice.window = 'auto'` of a `cuda:N` topic (its chunks are GPU
/// slots too) and of a topic with a lag limit (whose queues hold the limit), and the
/// window of the topic `fail_before_start` creates to carry an error.
const SHORT_WINDOW: usize = 4;
/// About how large a message of several batches grows under `sluice.message_batches =
/// 'auto'`: at 853 KiB per message a subscriber's fixed cost per message had become a
/// small part of its cost per row (docs/benchmarks.md, "Several batches per message").
const MESSAGE_TARGET_BYTES: usize = 1 << 20;
/// The most batches a message carries under 'auto' (tiny batches).
const MAX_MESSAGE_BATCHES: usize = 64;

/// How a run behaves beyond what the plan file says.
#[derive(Debug, Clone)]
pub struct RunOptions {
    /// Subscribers to wait for before the first batch; `None` uses `sluice.min_subscribers`.
    pub min_subscribers: Option<usize>,
    /// Give up waiting for `min_subscribers` after this long.
    pub subscriber_timeout: Option<Duration>,
    /// After the end of the stream, wait up to this long for subscribers to read it all.
    pub linger: Duration,
    /// Set to stop the run early (Ctrl-C); subscribers are told the producer stopped.
    pub stop: Arc<AtomicBool>,
    /// Resume from the checkpoint a crashed run left (from the beginning if there is none).
    pub resume: bool,
    /// Where checkpoints go; `None`: [`Checkpoint::default_path`] of the topic.
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

/// Runs a plan and publishes its output on the plan's topic.
#[derive(Debug)]
pub struct Producer {
    plan: Plan,
    namespace: Namespace,
}

impl Producer {
    /// A producer for `plan` in `namespace`.
    pub fn new(plan: Plan, namespace: Namespace) -> Self {
        Self { plan, namespace }
    }

    /// The plan.
    pub fn plan(&self) -> &Plan {
        &self.plan
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
        mut on_progress: impl FnMut(&Progress),
    ) -> Result<RunStats> {
        let opts = self.plan.options().clone();
        opts.validate()?;
        let device = crate::gpu::open_device(opts.device()?)?;
        // Only a `cuda:N` topic carries device descriptors; `cuda_host:N` opened its GPU
        // as a check and publishes Arrow IPC like `cpu`.
        let on_device = device.is_some();
        let topic = opts.topic_name()?;
        let fingerprint = format!(
            "{:016x}",
            xxhash_rust::xxh3::xxh3_64(self.plan.fingerprint().as_bytes())
        );
        let settings: std::collections::BTreeMap<_, _> =
            self.plan.sequence_settings().into_iter().collect();
        let checkpoint_path = options
            .checkpoint
            .clone()
            .unwrap_or_else(|| Checkpoint::default_path(&self.namespace, &topic));
        let start_at = if options.resume {
            match Checkpoint::load(&checkpoint_path)? {
                Some(c) => {
                    c.check(&checkpoint_path, &topic, &fingerprint, &settings)?;
                    tracing::info!(topic = %topic, "resuming from {}", c.position());
                    c.position()
                }
                None => {
                    tracing::info!(
                        "no checkpoint at {}: starting from the beginning",
                        checkpoint_path.display()
                    );
                    Position::default()
                }
            }
        } else {
            Position::default()
        };
        let mut progress = Progress {
            epoch: start_at.epoch,
            ..Progress::default()
        };

        // The first batch tells how large messages are, which sizes the shared memory.
        let mut source = EpochSource::new(&self.plan, &opts);
        // Encodes each batch's schema message once for the run, not once per batch.
        let mut encoder = wire::Encoder::new();
        let mut first = None;
        let mut first_error = None;
        if start_at.epoch < opts.epochs {
            let skipped = source.start(handle, start_at.epoch, start_at.index);
            first_error = skipped.err();
            if first_error.is_none() {
                match source.next(handle) {
                    Ok(Some((index, batch, batches))) => {
                        // A device topic carries descriptors, not Arrow IPC.
                        let encoded = match device {
                            None => Some(encoder.encode(&batch)?),
                            Some(_) => None,
                        };
                        first = Some((index, batch, batches, encoded));
                    }
                    Ok(None) => {}
                    Err(e) => first_error = Some(e),
                }
            }
        }
        let sizing = match (&device, &first) {
            (Some(_), Some((_, batch, _, _))) => Some(crate::gpu::DeviceSizing::of(batch)?),
            _ => None,
        };
        // The first message is one batch (a resumed run's first batches are passed over
        // one at a time); from the next on, a message may carry several.
        let (mut max_batches, batch_bytes) = match (&first, device.is_some()) {
            (Some((_, batch, 1, Some(encoded))), false) => {
                message_batches(&opts, encoded.len(), batch.num_rows())?
            }
            _ => (1, 0),
        };
        let window = opts.window()?;
        if (window == Window::Auto || max_batches > 1) && device.is_none() && opts.lag_limit == 0 {
            // A crashed predecessor's segments are not free space for long (the window
            // and the size of messages are planned against what is free).
            self.namespace.reclaim_dead();
        }
        // The topic planned for messages of `batches` batches, with its window.
        let plan_topic = |batches: usize| -> Result<TopicConfig> {
            let max_message_bytes = match (&first, sizing) {
                // Descriptors have a bound: device messages never grow.
                (_, Some(sizing)) => message_bytes(sizing.footprint.descriptor_bytes),
                (Some((_, _, _, Some(encoded))), None) => {
                    planned_message_bytes(encoded.len().max(batch_bytes.saturating_mul(batches)))
                }
                _ => message_bytes(0),
            };
            let mut config = TopicConfig {
                topic: topic.clone(),
                window: SHORT_WINDOW,
                max_subscribers: opts.max_subscribers,
                max_held: opts.max_held,
                lag_limit: (opts.lag_limit > 0).then_some(opts.lag_limit),
                max_message_bytes,
            };
            config.window = match window {
                Window::Batches(n) => n,
                // A `cuda:N` topic's chunks are also GPU slots (sluice.device_memory): its
                // queues stay short.
                Window::Auto if device.is_some() => SHORT_WINDOW,
                // With a lag limit the queues hold the limit and bursts wake at once: the
                // window sizes nothing.
                Window::Auto if config.lag_limit.is_some() => SHORT_WINDOW,
                Window::Auto => config.auto_window_here()?,
            };
            Ok(config)
        };
        let mut config = plan_topic(max_batches)?;
        if max_batches > 1 && opts.message_batches()? == MessageBatches::Auto {
            // Under 'auto', larger messages only where the shared memory has room.
            let single = plan_topic(1)?;
            let free = shm_available()?;
            while max_batches > 1 && !config.fits_beside(&single, free) {
                max_batches /= 2;
                config = plan_topic(max_batches)?;
            }
        }
        source.set_max_batches(max_batches);
        // The header's `batch_rows` of a message of several batches (`message_batches`
        // keeps one batch per message where the size does not fit it).
        let header_batch_rows = u32::try_from(opts.batch_rows).unwrap_or(0);
        // The device ring is allocated before the topic exists: a ring over
        // sluice.device_memory fails here, with nothing to clean up.
        let mut stager = match (device, &first, sizing) {
            (Some(device), Some((_, batch, _, _)), Some(sizing)) => Some(crate::gpu::stager(
                device,
                batch,
                sizing,
                config.chunks(),
                opts.device_memory()?.0,
            )?),
            _ => None,
        };
        let mut publisher = TopicPublisher::create(&self.namespace, config, options.stop.clone())?;
        let shm_bytes = publisher.config().shm_bytes();
        let mut checkpoint = CheckpointWriter::new(checkpoint_path, &topic, fingerprint, settings)?;
        tracing::info!(topic = %topic, shm_bytes, max_batches, "publishing");
        let mut reporter = Reporter::new(&self.namespace, &topic, "producer");
        // Reports for `sluice status`: at most every REPORT_INTERVAL unless forced.
        let mut report = |state: &str,
                          publisher: &TopicPublisher,
                          progress: &Progress,
                          batch: u64,
                          force: bool| {
            if !force && !reporter.due() {
                return;
            }
            reporter.write(progress.rows, |rows_per_s| ProducerReport {
                pid: std::process::id(),
                topic: topic.to_string(),
                state: state.to_string(),
                epoch: progress.epoch,
                epochs: opts.epochs,
                batch,
                seq: publisher.seq(),
                rows: progress.rows,
                rows_per_s,
                subscribers: publisher.subscribers(),
                shm_bytes,
                window: publisher.config().queue_depth(),
                lag_limit: opts.lag_limit,
                updated: unix_now(),
            });
        };

        let result = (|| -> Result<RunStats> {
            let min = options.min_subscribers.unwrap_or(opts.min_subscribers);
            // Subscribers that were waiting for the topic get it from the first batch (or
            // hear why there is none).
            wait_for_interested(&publisher, &opts, &options.stop)?;
            if let Some(e) = first_error.take() {
                // The subscribers this run waits for must hear why no data comes, not
                // time out on a topic that came and went before they attached; the wait
                // is bounded, since a failed run has nothing to wait for otherwise.
                if min > 0 {
                    let wait = options.subscriber_timeout.unwrap_or(options.linger);
                    let _ = publisher.wait_for_subscribers(min, Some(wait), &options.stop);
                }
                return Err(e);
            }
            report("waiting", &publisher, &progress, start_at.index, true);
            publisher.wait_for_subscribers(min, options.subscriber_timeout, &options.stop)?;
            let start = Instant::now();
            // The first batch was read (and a resumed run's first batches passed over)
            // before the topic existed: `elapsed` and the waits count from here.
            let waited_before_start = source.waited;
            let mut messages = 0;
            for epoch in start_at.epoch..opts.epochs {
                progress.epoch = epoch;
                if source.epoch != Some(epoch) {
                    source.start(handle, epoch, 0)?;
                }
                loop {
                    if options.stop.load(Ordering::Relaxed) {
                        return Err(SluiceError::Stopped(format!(
                            "in epoch {epoch}, after {} batches",
                            progress.batches
                        )));
                    }
                    let (index, batch, batches, encoded) = match first.take() {
                        Some(first) => first,
                        None => match source.next(handle)? {
                            Some((index, batch, batches)) => {
                                let encoded = match on_device {
                                    false => Some(encoder.encode(&batch)?),
                                    true => None,
                                };
                                (index, batch, batches, encoded)
                            }
                            None => break,
                        },
                    };
                    let rows = batch.num_rows() as u64;
                    let bytes = match (&encoded, &mut stager) {
                        (Some(encoded), _) => {
                            // Batches already cut from one DataFusion batch follow at
                            // once: subscribers are woken once for them.
                            let more = source.has_ready();
                            let batch_rows = if batches > 1 { header_batch_rows } else { 0 };
                            publisher.publish_batches_in_burst(
                                epoch, index, rows, batch_rows, encoded, more,
                            )?;
                            encoded.len() as u64
                        }
                        (None, Some(stager)) => {
                            let mut bytes = 0;
                            publisher.publish_device_batch(epoch, index, rows, |chunk| {
                                let (descriptor, used) = stager.stage(&batch, chunk)?;
                                bytes = used;
                                Ok(descriptor)
                            })?;
                            bytes
                        }
                        (None, None) => {
                            // The ring is sized from the first batch; a plan whose first
                            // epoch has no rows has nothing to size it with.
                            return Err(SluiceError::Device(
                                "the first epoch of this GPU plan produced no rows, so the \
                                 device ring could not be sized; a later epoch did"
                                    .into(),
                            ));
                        }
                    };
                    // The batches are in every live subscriber's queue: a restart may
                    // begin after them.
                    checkpoint.record(Position::new(epoch, index + batches), false)?;
                    progress.batches += batches;
                    messages += 1;
                    progress.rows += rows;
                    progress.bytes += bytes;
                    progress.subscribers = publisher.subscribers();
                    on_progress(&progress);
                    report("publishing", &publisher, &progress, index + batches, false);
                }
                publisher.publish_end_of_epoch(epoch, source.index, source.rows)?;
                checkpoint.record(Position::new(epoch + 1, 0), true)?;
            }
            publisher.publish_end_of_stream(opts.epochs)?;
            if let Some(stager) = &stager {
                stager.synchronize()?;
            }
            Ok(RunStats {
                epochs: opts.epochs,
                batches: progress.batches,
                rows: progress.rows,
                bytes: progress.bytes,
                elapsed: start.elapsed(),
                shm_bytes,
                window: publisher.config().queue_depth(),
                resumed_from: start_at,
                waited_for_pipeline: source.waited - waited_before_start,
                waited_for_subscribers: publisher.full_queue_wait(),
                messages,
                wakeups: publisher.wakeups(),
            })
        })();
        // Whatever happens next, this run will not be resumed: it ended, or it told its
        // subscribers that it failed. Only a crash leaves a checkpoint behind.
        checkpoint.remove();
        let batch = source.index;
        match result {
            Ok(stats) => {
                report("draining", &publisher, &progress, batch, true);
                publisher.drain(options.linger);
                if stager.is_some() {
                    wait_for_device_holders(&publisher, &options.stop);
                }
                Ok(stats)
            }
            Err(e) => {
                report("failed", &publisher, &progress, batch, true);
                // Subscribers must see the failure rather than wait for data that never
                // comes. When stopping, subscribers with a full queue are not waited for
                // (they notice the producer is gone instead).
                if let Err(send) = publisher.publish_error(&e.to_string()) {
                    tracing::warn!("could not tell subscribers about the failure: {send}");
                } else {
                    publisher.drain(options.linger.min(Duration::from_secs(2)));
                }
                if stager.is_some() {
                    wait_for_device_holders(&publisher, &options.stop);
                }
                Err(e)
            }
        }
    }
}

/// How many consecutive batches a message may carry (`sluice.message_batches`), and
/// about how many bytes a full batch encodes to, from the first batch: under 'auto',
/// about [`MESSAGE_TARGET_BYTES`] of batches, at most [`MAX_MESSAGE_BATCHES`], and one
/// under a lag limit (which counts messages) or on a GPU topic. A batch size that the frame header cannot
/// carry (over `u32::MAX` rows) is one.
fn message_batches(
    opts: &SluiceOptions,
    first_bytes: usize,
    first_rows: usize,
) -> Result<(usize, usize)> {
    // A short first batch (a small epoch's only one) stands for a full one.
    let per_batch = first_bytes
        .saturating_mul(opts.batch_rows)
        .checked_div(first_rows)
        .unwrap_or(first_bytes)
        .max(1);
    if u32::try_from(opts.batch_rows).is_err() {
        return Ok((1, per_batch));
    }
    let most = match opts.message_batches()? {
        MessageBatches::Most(n) => n,
        MessageBatches::Auto if opts.lag_limit > 0 => 1,
        // A `cuda_host:N` topic's batches are copied to the GPU one by one: its messages
        // stay one batch each until batches cut from one pinned sample have run on a
        // device (docs/gpu.md).
        MessageBatches::Auto if opts.device()? != sluice_core::DeviceSpec::Cpu => 1,
        MessageBatches::Auto => auto_message_batches(per_batch),
    };
    Ok((most, per_batch))
}

/// The batches a message carries under `sluice.message_batches = 'auto'` (no lag limit,
/// a host topic) when a batch encodes to `batch_bytes`: about 1 MiB of them, 1 to 64.
pub fn auto_message_batches(batch_bytes: usize) -> usize {
    (MESSAGE_TARGET_BYTES / batch_bytes.max(1)).clamp(1, MAX_MESSAGE_BATCHES)
}

/// One epoch of the plan at a time, shaped into the published messages, with the index
/// of their first batch in the epoch.
struct EpochSource<'a> {
    plan: &'a Plan,
    opts: &'a SluiceOptions,
    epoch: Option<u64>,
    stream: Option<BatchStream>,
    shaper: Option<Shaper>,
    pending: VecDeque<RecordBatch>,
    done: bool,
    /// Batches of the epoch produced so far (published or skipped), in `batch_rows`.
    index: u64,
    /// Consecutive batches one message may carry (see [`message_batches`]).
    max_batches: usize,
    /// Rows of the epoch produced so far (published or skipped).
    rows: u64,
    /// Time spent waiting for the plan (each epoch's stream, and its batches).
    waited: Duration,
}

impl<'a> EpochSource<'a> {
    fn new(plan: &'a Plan, opts: &'a SluiceOptions) -> Self {
        Self {
            plan,
            opts,
            epoch: None,
            stream: None,
            shaper: None,
            pending: VecDeque::new(),
            done: false,
            index: 0,
            max_batches: 1,
            rows: 0,
            waited: Duration::ZERO,
        }
    }

    /// Lets the messages from now on carry up to `max_batches` consecutive batches.
    fn set_max_batches(&mut self, max_batches: usize) {
        self.max_batches = max_batches.max(1);
        if let Some(shaper) = &mut self.shaper {
            shaper.set_max_batches(self.max_batches);
        }
    }

    /// Starts `epoch`, passing over its first `skip` batches (a resumed run: the order of
    /// rows depends only on the plan, the seed and the epoch, so they are the batches
    /// published before the checkpoint).
    fn start(&mut self, handle: &Handle, epoch: u64, skip: u64) -> Result<()> {
        self.epoch = Some(epoch);
        self.pending.clear();
        self.done = false;
        self.index = 0;
        self.rows = 0;
        let mut shaper = Shaper::new(self.opts.batch_rows, epoch, self.opts.shuffle())?;
        shaper.set_max_batches(self.max_batches);
        self.shaper = Some(shaper);
        let asked = Instant::now();
        let stream = handle.block_on(self.plan.execute_epoch(epoch));
        self.waited += asked.elapsed();
        self.stream = Some(stream?);
        while self.index < skip {
            let Some((index, message, batches)) = self.next(handle)? else {
                return Err(SluiceError::Config(format!(
                    "the checkpoint is at batch {skip} of epoch {epoch}, but the epoch has only {} batches: the data changed since it was taken. Run without --resume to start over",
                    self.index
                )));
            };
            if index + batches > skip {
                // The checkpoint falls inside a message: its batches from there on are
                // the next to publish.
                let done = usize::try_from(skip - index)
                    .unwrap_or(usize::MAX)
                    .saturating_mul(self.opts.batch_rows)
                    .min(message.num_rows());
                let rest = message.slice(done, message.num_rows() - done);
                self.index = skip;
                self.rows -= rest.num_rows() as u64;
                self.pending.push_front(rest);
            }
        }
        Ok(())
    }

    /// Whether the next batch is ready without running the plan further.
    fn has_ready(&self) -> bool {
        !self.pending.is_empty() || self.shaper.as_ref().is_some_and(Shaper::has_ready)
    }

    /// The next message of the epoch: the index of its first batch, its rows, and how
    /// many batches of `batch_rows` they are; `None` at the epoch's end.
    fn next(&mut self, handle: &Handle) -> Result<Option<(u64, RecordBatch, u64)>> {
        loop {
            if let Some(batch) = self.pending.pop_front() {
                let index = self.index;
                let batches = batch.num_rows().div_ceil(self.opts.batch_rows).max(1) as u64;
                self.index += batches;
                self.rows += batch.num_rows() as u64;
                return Ok(Some((index, batch, batches)));
            }
            if self.done {
                return Ok(None);
            }
            let (Some(stream), Some(shaper)) = (&mut self.stream, &mut self.shaper) else {
                return Err(SluiceError::Internal(
                    "an epoch was read before it started".into(),
                ));
            };
            // Cut one message at a time: the limit on batches per message is set after
            // the first (which sizes the topic), and applies to what is not cut yet.
            if let Some(message) = shaper.next_ready()? {
                self.pending.push_back(message);
                continue;
            }
            let asked = Instant::now();
            let next = handle.block_on(stream.next());
            self.waited += asked.elapsed();
            match next {
                Some(batch) => shaper.add(batch?)?,
                None => {
                    self.done = true;
                    self.pending.extend(shaper.finish()?);
                }
            }
        }
    }
}

/// Waits, bounded by `sluice.attach_grace_s`, until the subscribers that declared
/// interest in the topic have attached; logs those that did not.
/// The device slots are freed when the stager drops, and legacy CUDA IPC memory does
/// not outlive its exporter's allocation: tensors a trainer still holds would read freed
/// memory. A subscriber keeps its port while it holds a device batch (the batch holds the
/// sample, which holds the port), so wait until every subscriber of another process has
/// detached — dead ones are reclaimed meanwhile — and say so while waiting. Subscribers
/// in this process are not waited for: their views hold the slots themselves (see
/// `TopicPublisher::subscribers_in_other_processes`). A stop (Ctrl-C) ends the wait with
/// a warning naming what it breaks.
fn wait_for_device_holders(publisher: &TopicPublisher, stop: &AtomicBool) {
    const STEP: Duration = Duration::from_secs(10);
    let mut waited = Duration::ZERO;
    loop {
        let n = publisher.subscribers_in_other_processes();
        if n == 0 {
            return;
        }
        if stop.load(Ordering::Relaxed) {
            tracing::warn!(
                "stopping with {n} subscriber(s) attached: GPU batches they still hold become \
                 invalid when the producer frees its device memory"
            );
            return;
        }
        if !waited.is_zero() {
            tracing::info!(
                "waiting for {n} subscriber(s) to release their GPU batches before freeing \
                 device memory ({} s so far; stop the producer to free it anyway)",
                waited.as_secs()
            );
        }
        publisher.drain(STEP);
        waited += STEP;
    }
}

fn wait_for_interested(
    publisher: &TopicPublisher,
    opts: &sluice_plan::SluiceOptions,
    stop: &std::sync::atomic::AtomicBool,
) -> Result<()> {
    // Validated with the options, except for a plan that failed to load: a bad value
    // then falls back to the default rather than panicking.
    let grace = Duration::try_from_secs_f64(opts.attach_grace_s)
        .unwrap_or(Duration::from_secs(10))
        .min(Duration::from_secs(86_400));
    let late = publisher.wait_for_interested(grace, stop)?;
    if late > 0 {
        tracing::warn!(
            topic = %publisher.config().topic,
            "{late} waiting subscriber(s) did not attach within sluice.attach_grace_s = {} s; \
             starting without them (they join late)",
            opts.attach_grace_s
        );
    }
    Ok(())
}

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
            Ok(plan) => return Ok(plan),
            Err(e) => e,
        };
        // An unreadable plan file names no topic: nobody to tell.
        let Ok(sql) = std::fs::read_to_string(path) else {
            return Err(error);
        };
        let mut declared = handle.block_on(Plan::declared_options(&sql));
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
            max_subscribers: declared.max_subscribers.max(1),
            max_held: declared.max_held.max(1),
            lag_limit: None,
            max_message_bytes: message_bytes(message.len() + 256),
        };
        let mut publisher = TopicPublisher::create(namespace, config, options.stop.clone())?;
        // Those waiting for the topic attach within the grace period; those the run was
        // told to wait for, within the subscriber timeout (else the linger). Nobody
        // attached in time: nobody to tell.
        let _ = wait_for_interested(&publisher, declared, &options.stop);
        let min = options.min_subscribers.unwrap_or(declared.min_subscribers);
        if min > 0 {
            let wait = options.subscriber_timeout.unwrap_or(options.linger);
            let _ = publisher.wait_for_subscribers(min, Some(wait), &options.stop);
        }
        publisher.publish_error(&message)?;
        publisher.drain(options.linger.min(Duration::from_secs(2)));
        Ok(())
    }
}

#[cfg(test)]
mod tests {
    use arrow::array::AsArray;
    use arrow::datatypes::Int64Type;

    use super::*;

    async fn plan(sql: &str) -> Plan {
        Plan::from_sql("t.sql", sql).await.unwrap()
    }

    /// The first values of each message an epoch's source gives from `skip` on, and its
    /// `(index, batches)`.
    fn messages(sql: &str, max_batches: usize, skip: u64) -> Vec<(u64, u64, usize, i64)> {
        let rt = tokio::runtime::Runtime::new().unwrap();
        let plan = rt.block_on(plan(sql));
        let opts = plan.options().clone();
        let mut source = EpochSource::new(&plan, &opts);
        source.set_max_batches(max_batches);
        source.start(rt.handle(), 0, skip).unwrap();
        let mut out = Vec::new();
        while let Some((index, batch, batches)) = source.next(rt.handle()).unwrap() {
            let first = batch.column(0).as_primitive::<Int64Type>().value(0);
            out.push((index, batches, batch.num_rows(), first));
        }
        assert_eq!(source.index, 10);
        assert_eq!(source.rows, 95);
        out
    }

    const SQL: &str = "SET sluice.batch_rows = 10;\n\
                       SELECT value AS v FROM generate_series(1, 95)";

    #[test]
    fn an_epoch_goes_out_in_messages_of_whole_batches() {
        assert_eq!(
            messages(SQL, 4, 0),
            // The short last batch goes alone: a message is whole batches but the last.
            [(0, 4, 40, 1), (4, 4, 40, 41), (8, 1, 10, 81), (9, 1, 5, 91)]
        );
        let alone = messages(SQL, 1, 0);
        assert_eq!(alone.len(), 10);
        assert!(
            alone
                .iter()
                .enumerate()
                .all(|(i, m)| m.0 == i as u64 && m.1 == 1)
        );
    }

    /// A checkpoint inside a message: the source resumes at its batch, not the message's.
    #[test]
    fn a_resumed_epoch_starts_at_its_checkpoint_inside_a_message() {
        assert_eq!(
            messages(SQL, 4, 3),
            [
                (3, 1, 10, 31),
                (4, 4, 40, 41),
                (8, 1, 10, 81),
                (9, 1, 5, 91)
            ]
        );
        assert_eq!(messages(SQL, 4, 9), [(9, 1, 5, 91)]);
    }

    #[test]
    fn auto_sends_about_a_mebibyte_per_message_and_one_batch_on_a_gpu_or_under_a_lag_limit() {
        let mut opts = SluiceOptions::default();
        assert_eq!(
            message_batches(&opts, 100 << 10, 1024).unwrap(),
            (10, 100 << 10)
        );
        // A short first batch stands for a full one.
        assert_eq!(
            message_batches(&opts, 50 << 10, 512).unwrap(),
            (10, 100 << 10)
        );
        assert_eq!(message_batches(&opts, 8 << 20, 1024).unwrap().0, 1);
        assert_eq!(message_batches(&opts, 100, 1024).unwrap().0, 64);
        opts.device = "cuda_host:0".into();
        assert_eq!(message_batches(&opts, 100 << 10, 1024).unwrap().0, 1);
        opts.device = "cpu".into();
        opts.lag_limit = 8;
        assert_eq!(message_batches(&opts, 100 << 10, 1024).unwrap().0, 1);
        opts.message_batches = "3".into();
        assert_eq!(message_batches(&opts, 100 << 10, 1024).unwrap().0, 3);
    }
}
