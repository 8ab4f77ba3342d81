//! A run: the topic's epochs published, the end of the stream, and the drain.

use std::sync::atomic::{AtomicBool, Ordering};
use std::time::{Duration, Instant};

use sluice_core::{Outlet, Position, Result, SluiceError};
use sluice_cuda::DeviceStager;
use sluice_plan::SluiceOptions;
use sluice_shm::TopicPublisher;
use tokio::runtime::Handle;

use super::report::ProducerReporter;
use super::sizing::First;
use super::source::{Message, Source};
use super::{Progress, RunOptions, RunStats};
use crate::checkpoint::CheckpointWriter;
use crate::gpu::outlet::DeviceOutlet;

/// Where a run's messages go: Arrow IPC in shared memory, or the device ring.
pub(crate) enum Sink {
    /// A host topic (`cpu`, `cuda_host:N`): the topic's [`Outlet`], each message encoded
    /// once.
    Host,
    /// A `cuda:N` topic: the ring, `None` where the first epoch had no batch to size it.
    Device(Option<Box<DeviceStager>>),
}

impl Sink {
    /// Publishes `message` of `epoch` through the topic's outlet; `more`: another message
    /// is ready at once (a burst, see [`sluice_core::Burst`]). Returns the payload bytes
    /// written (to shared memory or to the device).
    fn publish(
        &mut self,
        publisher: &mut TopicPublisher,
        epoch: u64,
        message: &Message,
        header_batch_rows: u32,
        more: bool,
    ) -> Result<u64> {
        let batch_rows = match message.batches {
            1 => 0,
            _ => header_batch_rows as usize,
        };
        let (index, rows) = (message.index, &message.rows);
        match self {
            Sink::Host => {
                let before = publisher.payload_bytes();
                publisher.message(epoch, index, batch_rows, rows, more)?;
                Ok(publisher.payload_bytes() - before)
            }
            Sink::Device(Some(stager)) => {
                let mut outlet = DeviceOutlet::new(publisher, stager);
                outlet.message(epoch, index, batch_rows, rows, more)?;
                Ok(outlet.staged)
            }
            // The ring is sized from the first batch; a plan whose first epoch has no
            // rows has nothing to size it with.
            Sink::Device(None) => Err(SluiceError::Device(
                "the first epoch of this GPU plan produced no rows, so the device ring could \
                 not be sized; a later epoch did"
                    .into(),
            )),
        }
    }

    /// Whether the run allocated device memory that other processes may map.
    fn holds_device_memory(&self) -> bool {
        matches!(self, Sink::Device(Some(_)))
    }
}

/// A run in progress: its topic, where its messages come from and go, its checkpoints and
/// reports.
pub(crate) struct Run<S> {
    pub publisher: TopicPublisher,
    pub sink: Sink,
    pub source: S,
    /// `None`: a run that cannot resume (a producer fed by a loader).
    pub checkpoint: Option<CheckpointWriter>,
    pub reporter: ProducerReporter,
    pub progress: Progress,
    pub header_batch_rows: u32,
    /// Messages of batches published.
    pub messages: u64,
}

impl<S: Source> Run<S> {
    /// Waits for the subscribers it must, then publishes every epoch from `start` and
    /// the end of the stream. `first` is the first message, read to size the topic (or
    /// why it could not be read, which the subscribers waiting for the topic are told).
    pub(crate) fn publish(
        &mut self,
        handle: &Handle,
        options: &RunOptions,
        opts: &SluiceOptions,
        start: Position,
        first: Result<Option<First>>,
        on_progress: &mut impl FnMut(&Progress),
    ) -> Result<RunStats> {
        let min = options.min_subscribers.unwrap_or(opts.min_subscribers);
        // Subscribers that were waiting for the topic get it from the first batch (or
        // hear why there is none).
        wait_for_interested(&self.publisher, opts, &options.stop)?;
        let mut first = match first {
            Ok(first) => first.filter(|f| !f.sizing_only),
            Err(e) => {
                // The subscribers this run waits for must hear why no data comes, not
                // time out on a topic that came and went before they attached; the wait
                // is bounded, since a failed run has nothing to wait for otherwise.
                if min > 0 {
                    let wait = options.subscriber_timeout.unwrap_or(options.linger);
                    let _ = self
                        .publisher
                        .wait_for_subscribers(min, Some(wait), &options.stop);
                }
                return Err(e);
            }
        };
        self.reporter.report(
            "waiting",
            &self.publisher,
            &self.progress,
            start.index,
            true,
        );
        self.publisher
            .wait_for_subscribers(min, options.subscriber_timeout, &options.stop)?;
        let started = Instant::now();
        // The first batch was read (and a resumed run's first batches passed over)
        // before the topic existed: `elapsed` and the waits count from here.
        let waited_before_start = self.source.waited();
        for epoch in start.epoch..opts.total_epochs() {
            self.publish_epoch(handle, epoch, &mut first, &options.stop, on_progress)?;
        }
        self.publisher.publish_end_of_stream(opts.total_epochs())?;
        if let Sink::Device(Some(stager)) = &self.sink {
            stager.synchronize()?;
        }
        Ok(RunStats {
            epochs: opts.total_epochs(),
            batches: self.progress.batches,
            rows: self.progress.rows,
            bytes: self.progress.bytes,
            elapsed: started.elapsed(),
            shm_bytes: self.publisher.config().shm_bytes(),
            window: self.publisher.config().queue_depth(),
            resumed_from: start,
            waited_for_pipeline: self.source.waited() - waited_before_start,
            waited_for_subscribers: self.publisher.full_queue_wait(),
            messages: self.messages,
            wakeups: self.publisher.wakeups(),
        })
    }

    /// Publishes `epoch` (from the first message left, if any) and its end.
    fn publish_epoch(
        &mut self,
        handle: &Handle,
        epoch: u64,
        first: &mut Option<First>,
        stop: &AtomicBool,
        on_progress: &mut impl FnMut(&Progress),
    ) -> Result<()> {
        self.progress.epoch = epoch;
        if self.source.epoch() != Some(epoch) {
            self.source.start(handle, epoch, 0)?;
        }
        loop {
            if stop.load(Ordering::Relaxed) {
                return Err(SluiceError::Stopped(format!(
                    "in epoch {epoch}, after {} batches",
                    self.progress.batches
                )));
            }
            let message = match first.take() {
                // Its encoding sized the topic; the topic's outlet encodes it again.
                Some(First { message, .. }) => message,
                None => match self.source.next(handle)? {
                    Some(message) => message,
                    None => break,
                },
            };
            let more = self.source.has_ready();
            let bytes = self.sink.publish(
                &mut self.publisher,
                epoch,
                &message,
                self.header_batch_rows,
                more,
            )?;
            let next = message.index + message.batches;
            // The batches are in every live subscriber's queue: a restart may begin
            // after them.
            if let Some(checkpoint) = &mut self.checkpoint {
                checkpoint.record(Position::new(epoch, next), false)?;
            }
            self.progress.batches += message.batches;
            self.progress.rows += message.rows.num_rows() as u64;
            self.progress.bytes += bytes;
            self.progress.subscribers = self.publisher.subscribers();
            self.messages += 1;
            on_progress(&self.progress);
            self.reporter
                .report("publishing", &self.publisher, &self.progress, next, false);
        }
        let (batches, rows) = self.source.produced();
        self.publisher.publish_end_of_epoch(epoch, batches, rows)?;
        // At once: a trainer's `len()` at the next epoch's start reads the epoch counted,
        // while the next report may wait for a subscriber's full queue.
        self.reporter.epoch_ended(batches, rows);
        self.reporter
            .report("publishing", &self.publisher, &self.progress, batches, true);
        match &mut self.checkpoint {
            Some(checkpoint) => checkpoint.record(Position::new(epoch + 1, 0), true),
            None => Ok(()),
        }
    }

    /// Ends the run: drains (a finished run) or tells the subscribers why it failed,
    /// and keeps a device topic's memory while other processes hold its batches.
    pub(crate) fn finish(
        mut self,
        result: Result<RunStats>,
        options: &RunOptions,
    ) -> Result<RunStats> {
        let batch = self.source.produced().0;
        let state = if result.is_ok() { "draining" } else { "failed" };
        if let Err(e) = &result {
            self.reporter.failed(e.to_string());
        }
        self.reporter
            .report(state, &self.publisher, &self.progress, batch, true);
        match &result {
            Ok(_) => self.publisher.drain(options.linger),
            // Subscribers must see the failure rather than wait for data that never
            // comes. When stopping, subscribers with a full queue are not waited for
            // (they notice the producer is gone instead).
            Err(e) => match self.publisher.publish_error(&e.to_string()) {
                Err(send) => tracing::warn!("could not tell subscribers about the failure: {send}"),
                Ok(()) => self
                    .publisher
                    .drain(options.linger.min(Duration::from_secs(2))),
            },
        }
        if self.sink.holds_device_memory() {
            wait_for_device_holders(&self.publisher, &options.stop);
        }
        // Drained: this run will not be resumed (it ended, or told its subscribers that
        // it failed). Not before: while it drains, a trainer restarted from its cursor
        // catches up from the plan record, and a crash must leave the checkpoint for
        // `--resume`, as any crash does.
        if let Some(checkpoint) = &self.checkpoint {
            checkpoint.remove();
        }
        result
    }
}

/// Waits until no subscriber of another process holds the device topic's slots.
///
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

/// Waits, bounded by `sluice.attach_grace_s`, until the subscribers that declared
/// interest in the topic have attached; logs those that did not.
pub(crate) fn wait_for_interested(
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
