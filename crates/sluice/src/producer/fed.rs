//! Batches the caller produces (Python code iterating a data loader) as a producer's
//! source: each batch fed is one message, published as it is, so that subscribers that
//! keep the producer's batches receive exactly the loader's batches.
//!
//! The caller feeds through a [`Feeder`] from its own thread while the run publishes on
//! the producer's; a queue of [`QUEUE`] batches between them lets the loader run ahead a
//! little, and makes it wait when the topic's subscribers set a slower pace.

use std::sync::Arc;
use std::sync::atomic::{AtomicUsize, Ordering};
use std::sync::mpsc::{Receiver, SyncSender, TrySendError, sync_channel};
use std::time::{Duration, Instant};

use arrow::record_batch::RecordBatch;
use sluice_core::{Result, SluiceError, TopicName};
use sluice_plan::SluiceOptions;
use sluice_shm::Namespace;
use tokio::runtime::Handle;

use super::source::{Message, Source};
use crate::cursor::{LoaderRecord, PlanRecord, remove_record};

/// Batches fed ahead of the publishing thread.
const QUEUE: usize = 2;

/// What the caller feeds.
enum Fed {
    Batch(RecordBatch),
    EndOfEpoch,
    Failed(String),
}

/// The caller's end of a fed producer (see [`crate::Producer::fed`]): one epoch's batches,
/// then [`Feeder::end_epoch`], for every epoch of the run. Dropping it before the last
/// epoch ended stops the run ([`SluiceError::Stopped`]; subscribers are told).
#[derive(Debug)]
pub struct Feeder {
    tx: SyncSender<Fed>,
    queued: Arc<AtomicUsize>,
}

impl Feeder {
    /// Feeds the next batch of the current epoch, waiting while the queue to the
    /// publishing thread is full. Fails once the run has ended (its outcome says why).
    pub fn send(&self, batch: RecordBatch) -> Result<()> {
        self.put(Fed::Batch(batch))
    }

    /// Feeds the next batch if the queue has room now; gives it back if not (a caller
    /// that must stay responsive, say to Ctrl-C, waits in slices this way).
    pub fn try_send(&self, batch: RecordBatch) -> Result<Option<RecordBatch>> {
        self.queued.fetch_add(1, Ordering::Relaxed);
        match self.tx.try_send(Fed::Batch(batch)) {
            Ok(()) => Ok(None),
            Err(e) => {
                self.queued.fetch_sub(1, Ordering::Relaxed);
                match e {
                    TrySendError::Full(Fed::Batch(batch)) => Ok(Some(batch)),
                    _ => Err(ended()),
                }
            }
        }
    }

    /// Ends the current epoch.
    pub fn end_epoch(&self) -> Result<()> {
        self.put(Fed::EndOfEpoch)
    }

    /// Fails the run with `message` (the loader raised): every subscriber gets it as
    /// [`SluiceError::ProducerFailed`].
    pub fn fail(&self, message: &str) -> Result<()> {
        self.put(Fed::Failed(message.to_string()))
    }

    fn put(&self, fed: Fed) -> Result<()> {
        // Counted first, so that the publishing thread never sees more taken than put.
        self.queued.fetch_add(1, Ordering::Relaxed);
        let sent = match self.tx.try_send(fed) {
            Err(TrySendError::Full(fed)) => self.tx.send(fed).map_err(|_| ()),
            Err(TrySendError::Disconnected(_)) => Err(()),
            Ok(()) => Ok(()),
        };
        sent.map_err(|()| {
            self.queued.fetch_sub(1, Ordering::Relaxed);
            ended()
        })
    }
}

/// Feeding a run that has ended.
fn ended() -> SluiceError {
    SluiceError::Stopped("the run ended before the loader did; its outcome says why".into())
}

/// The publishing thread's end (see the module docs).
pub(crate) struct FedSource {
    rx: Receiver<Fed>,
    queued: Arc<AtomicUsize>,
    epoch: Option<u64>,
    /// Batches and rows of the epoch so far.
    index: u64,
    rows: u64,
    waited: Duration,
}

/// A source fed batch by batch, and its feeder.
pub(crate) fn channel() -> (Feeder, FedSource) {
    let (tx, rx) = sync_channel(QUEUE);
    let queued = Arc::new(AtomicUsize::new(0));
    let feeder = Feeder {
        tx,
        queued: queued.clone(),
    };
    let source = FedSource {
        rx,
        queued,
        epoch: None,
        index: 0,
        rows: 0,
        waited: Duration::ZERO,
    };
    (feeder, source)
}

impl Source for FedSource {
    fn start(&mut self, _handle: &Handle, epoch: u64, skip: u64) -> Result<()> {
        if skip > 0 {
            return Err(SluiceError::Config(
                "a producer fed by a loader cannot resume inside an epoch".into(),
            ));
        }
        self.epoch = Some(epoch);
        self.index = 0;
        self.rows = 0;
        Ok(())
    }

    fn next(&mut self, _handle: &Handle) -> Result<Option<Message>> {
        let asked = Instant::now();
        let fed = self.rx.recv();
        self.waited += asked.elapsed();
        if fed.is_ok() {
            self.queued.fetch_sub(1, Ordering::Relaxed);
        }
        match fed {
            Ok(Fed::Batch(rows)) => {
                let index = self.index;
                self.index += 1;
                self.rows += rows.num_rows() as u64;
                Ok(Some(Message {
                    index,
                    rows,
                    batches: 1,
                }))
            }
            Ok(Fed::EndOfEpoch) => Ok(None),
            Ok(Fed::Failed(message)) => Err(SluiceError::Execution(message)),
            Err(_) => Err(SluiceError::Stopped(format!(
                "the loader stopped in epoch {}, after {} batches",
                self.epoch.unwrap_or(0),
                self.index
            ))),
        }
    }

    fn has_ready(&self) -> bool {
        self.queued.load(Ordering::Relaxed) > 0
    }

    /// Each batch fed is a message of its own: subscribers keep the loader's batches.
    fn set_max_batches(&mut self, _max_batches: usize) {}

    fn epoch(&self) -> Option<u64> {
        self.epoch
    }

    fn produced(&self) -> (u64, u64) {
        (self.index, self.rows)
    }

    fn waited(&self) -> Duration {
        self.waited
    }

    fn batches_as_fed(&self) -> bool {
        true
    }
}

/// A run's [`LoaderRecord`], removed when the run ends (a crash leaves it: the next run
/// of the topic replaces or removes it).
pub(crate) struct LoaderRecordKept(std::path::PathBuf);

impl LoaderRecordKept {
    /// Leaves the record of a loader `factory` makes, run as `options` say, in place of
    /// the records of the topic's earlier runs; `None` (nothing touched) while another
    /// process produces the topic, which this run then fails to take.
    pub(crate) fn leave(
        namespace: &Namespace,
        options: &SluiceOptions,
        factory: &str,
    ) -> Result<Option<Self>> {
        let topic = options.topic_name()?;
        if !forget(namespace, &topic)? {
            return Ok(None);
        }
        let path = LoaderRecord::path(namespace, &topic);
        LoaderRecord::new(&topic, factory, options.epochs).write(&path)?;
        Ok(Some(Self(path)))
    }
}

/// Removes the loader's record a crashed run of `topic` left (a plan's run: trainers
/// would make that loader again instead of computing the plan), unless another process
/// produces the topic now.
pub(crate) fn forget_loader(namespace: &Namespace, topic: &TopicName) -> Result<()> {
    forget_records(namespace, topic, &[LoaderRecord::path(namespace, topic)]).map(drop)
}

/// Removes the records a crashed run of `topic` left for trainers that catch up (a
/// plan's, a loader's: their rows are not this run's), unless another process produces
/// the topic now (`false`: nothing touched).
pub(crate) fn forget(namespace: &Namespace, topic: &TopicName) -> Result<bool> {
    let records = [
        LoaderRecord::path(namespace, topic),
        PlanRecord::path(namespace, topic),
    ];
    forget_records(namespace, topic, &records)
}

/// Removes `records` of `topic` unless another process produces it (`false`).
fn forget_records(
    namespace: &Namespace,
    topic: &TopicName,
    records: &[std::path::PathBuf],
) -> Result<bool> {
    if crate::status::other_live_producer(namespace, topic).is_some() {
        return Ok(false);
    }
    namespace.prepare_state_dir()?;
    records.iter().try_for_each(|path| remove_record(path))?;
    Ok(true)
}

impl Drop for LoaderRecordKept {
    fn drop(&mut self) {
        let _ = std::fs::remove_file(&self.0);
    }
}
