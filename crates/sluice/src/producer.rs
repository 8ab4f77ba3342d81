//! The producer: runs a plan and publishes its batches on a topic.

use std::sync::Arc;
use std::sync::atomic::{AtomicBool, Ordering};
use std::time::{Duration, Instant};

use futures::StreamExt;
use sluice_core::{Result, Shaper, SluiceError, wire};
use sluice_plan::Plan;
use sluice_shm::{Namespace, TopicConfig, TopicPublisher};
use tokio::runtime::Handle;

/// Smallest shared-memory chunk a topic is planned with.
const MIN_MESSAGE_BYTES: usize = 4096;

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
}

impl Default for RunOptions {
    fn default() -> Self {
        Self {
            min_subscribers: None,
            subscriber_timeout: None,
            linger: Duration::from_secs(10),
            stop: Arc::new(AtomicBool::new(false)),
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
    /// as an error before this returns it.
    pub fn run(
        &self,
        handle: &Handle,
        options: &RunOptions,
        mut on_progress: impl FnMut(&Progress),
    ) -> Result<RunStats> {
        let opts = self.plan.options().clone();
        opts.validate()?;
        let topic = opts.topic_name()?;
        let mut progress = Progress::default();

        // The first batch tells how large messages are, which sizes the shared memory.
        let mut shaper = Shaper::new(opts.batch_rows, 0, opts.shuffle())?;
        let mut stream = handle.block_on(self.plan.execute_epoch(0))?;
        let mut first = Vec::new();
        let mut first_error = None;
        let mut stream_done = false;
        while first.is_empty() {
            match handle.block_on(stream.next()) {
                Some(Ok(batch)) => first = shaper.push(batch)?,
                Some(Err(e)) => {
                    first_error = Some(e);
                    break;
                }
                None => {
                    first.extend(shaper.finish()?);
                    stream_done = true;
                    break;
                }
            }
        }
        let mut first_encoded = Vec::with_capacity(first.len());
        for b in &first {
            first_encoded.push(wire::encode(b)?);
        }
        let largest = first_encoded.iter().map(|e| e.len()).max().unwrap_or(0);
        let config = TopicConfig {
            topic: topic.clone(),
            window: opts.window,
            max_subscribers: opts.max_subscribers,
            max_held: opts.max_held,
            // Later batches may carry longer strings or lists: leave room.
            lag_limit: (opts.lag_limit > 0).then_some(opts.lag_limit),
            max_message_bytes: (largest + largest / 2)
                .max(MIN_MESSAGE_BYTES)
                .next_multiple_of(wire::ALIGNMENT),
        };
        let mut publisher = TopicPublisher::create(&self.namespace, config, options.stop.clone())?;
        let shm_bytes = publisher.config().shm_bytes();
        tracing::info!(topic = %topic, shm_bytes, "publishing");

        let result = (|| -> Result<RunStats> {
            if let Some(e) = first_error.take() {
                return Err(e);
            }
            let min = options.min_subscribers.unwrap_or(opts.min_subscribers);
            publisher.wait_for_subscribers(min, options.subscriber_timeout, &options.stop)?;
            let start = Instant::now();
            let mut pending: std::collections::VecDeque<_> =
                first.into_iter().zip(first_encoded).collect();
            for epoch in 0..opts.epochs {
                progress.epoch = epoch;
                if epoch > 0 {
                    stream = handle.block_on(self.plan.execute_epoch(epoch))?;
                    shaper = Shaper::new(opts.batch_rows, epoch, opts.shuffle())?;
                    stream_done = false;
                }
                let (mut batches, mut rows) = (0u64, 0u64);
                loop {
                    if options.stop.load(Ordering::Relaxed) {
                        return Err(SluiceError::Execution("the producer was stopped".into()));
                    }
                    if let Some((batch, encoded)) = pending.pop_front() {
                        publisher.publish_batch(
                            epoch,
                            batches,
                            batch.num_rows() as u64,
                            &encoded,
                        )?;
                        batches += 1;
                        rows += batch.num_rows() as u64;
                        progress.batches += 1;
                        progress.rows += batch.num_rows() as u64;
                        progress.bytes += encoded.len() as u64;
                        progress.subscribers = publisher.subscribers();
                        on_progress(&progress);
                        continue;
                    }
                    if stream_done {
                        break;
                    }
                    let next = match handle.block_on(stream.next()) {
                        Some(batch) => shaper.push(batch?)?,
                        None => {
                            stream_done = true;
                            shaper.finish()?
                        }
                    };
                    for b in next {
                        let encoded = wire::encode(&b)?;
                        pending.push_back((b, encoded));
                    }
                }
                publisher.publish_end_of_epoch(epoch, batches, rows)?;
            }
            publisher.publish_end_of_stream(opts.epochs)?;
            Ok(RunStats {
                epochs: opts.epochs,
                batches: progress.batches,
                rows: progress.rows,
                bytes: progress.bytes,
                elapsed: start.elapsed(),
                shm_bytes,
            })
        })();
        match result {
            Ok(stats) => {
                publisher.drain(options.linger);
                Ok(stats)
            }
            Err(e) => {
                // Subscribers must see the failure rather than wait for data that never
                // comes. When stopping, subscribers with a full queue are not waited for
                // (they notice the producer is gone instead).
                if let Err(send) = publisher.publish_error(&e.to_string()) {
                    tracing::warn!("could not tell subscribers about the failure: {send}");
                } else {
                    publisher.drain(options.linger.min(Duration::from_secs(2)));
                }
                Err(e)
            }
        }
    }
}

impl Producer {
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
            window: declared.window.max(1),
            max_subscribers: declared.max_subscribers.max(1),
            max_held: declared.max_held.max(1),
            lag_limit: None,
            max_message_bytes: (message.len() + 256)
                .max(MIN_MESSAGE_BYTES)
                .next_multiple_of(wire::ALIGNMENT),
        };
        let mut publisher = TopicPublisher::create(namespace, config, options.stop.clone())?;
        let min = options
            .min_subscribers
            .unwrap_or(declared.min_subscribers)
            .max(1);
        let wait = options.subscriber_timeout.unwrap_or(options.linger);
        // Nobody attached in time: nobody to tell.
        let _ = publisher.wait_for_subscribers(min, Some(wait), &options.stop);
        publisher.publish_error(&message)?;
        publisher.drain(options.linger.min(Duration::from_secs(2)));
        Ok(())
    }
}
