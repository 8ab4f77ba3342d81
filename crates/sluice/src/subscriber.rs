//! The subscriber: receives a topic's batches, epoch by epoch.

use std::time::Duration;

use arrow::record_batch::RecordBatch;
use sluice_core::{Result, TopicName};
use sluice_shm::{Frame, Namespace, TopicSubscriber};

/// How to attach to a topic.
#[derive(Debug, Clone, Default)]
pub struct SubscribeOptions {
    /// Give up waiting (for the topic to appear, or for the next batch) after this long.
    pub timeout: Option<Duration>,
    /// The namespace; `None` uses [`Namespace::from_env`].
    pub namespace: Option<Namespace>,
}

/// The end of an epoch as one subscriber saw it.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct EpochSummary {
    /// The epoch.
    pub epoch: u64,
    /// Batches the producer published in it.
    pub batches: u64,
    /// Rows the producer published in it.
    pub rows: u64,
    /// Batches this subscriber received in it.
    pub received_batches: u64,
    /// Rows this subscriber received in it.
    pub received_rows: u64,
    /// Whether this subscriber saw the whole epoch (false for an epoch it joined late).
    pub complete: bool,
}

/// What a subscriber receives.
#[derive(Debug)]
pub enum Event {
    /// A batch, zero-copy in shared memory.
    Batch {
        /// Epoch of the batch.
        epoch: u64,
        /// Index of the batch in its epoch.
        index: u64,
        /// The rows.
        batch: RecordBatch,
        /// Addresses of the shared memory the batch's buffers lie in.
        shm_range: std::ops::Range<usize>,
    },
    /// An epoch ended.
    EpochEnd(EpochSummary),
    /// The stream ended.
    End,
}

/// Receives a topic's stream.
#[derive(Debug)]
pub struct Subscriber {
    inner: TopicSubscriber,
    timeout: Option<Duration>,
    epoch: Option<u64>,
    received_batches: u64,
    received_rows: u64,
}

impl Subscriber {
    /// Attaches to `topic`, waiting for its producer if it has not started yet.
    pub fn connect(topic: &str, options: SubscribeOptions) -> Result<Self> {
        let namespace = match options.namespace {
            Some(ns) => ns,
            None => Namespace::from_env()?,
        };
        let topic = TopicName::new(topic)?;
        let inner = TopicSubscriber::connect(&namespace, &topic, options.timeout)?;
        Ok(Self {
            inner,
            timeout: options.timeout,
            epoch: None,
            received_batches: 0,
            received_rows: 0,
        })
    }

    /// The next event. Errors: the producer failed or vanished, a timeout, a corrupt message.
    pub fn next_event(&mut self) -> Result<Event> {
        match self.inner.recv(self.timeout)? {
            Frame::Batch {
                epoch,
                index,
                batch,
                shm_range,
            } => {
                if self.epoch != Some(epoch) {
                    self.epoch = Some(epoch);
                    self.received_batches = 0;
                    self.received_rows = 0;
                }
                self.received_batches += 1;
                self.received_rows += batch.num_rows() as u64;
                Ok(Event::Batch {
                    epoch,
                    index,
                    batch,
                    shm_range,
                })
            }
            Frame::EndOfEpoch {
                epoch,
                batches,
                rows,
            } => {
                let (received_batches, received_rows) = if self.epoch == Some(epoch) {
                    (self.received_batches, self.received_rows)
                } else {
                    (0, 0)
                };
                self.epoch = None;
                self.received_batches = 0;
                self.received_rows = 0;
                // Messages arrive in order without gaps (the transport checks sequence
                // numbers), so an epoch was seen whole exactly when the counts match; a
                // subscriber that joined mid-epoch has fewer.
                Ok(Event::EpochEnd(EpochSummary {
                    epoch,
                    batches,
                    rows,
                    received_batches,
                    received_rows,
                    complete: received_batches == batches && received_rows == rows,
                }))
            }
            Frame::EndOfStream => Ok(Event::End),
        }
    }

    /// Leaves the topic now; the producer stops waiting for this subscriber.
    pub fn close(&mut self) {
        self.inner.detach();
    }
}
