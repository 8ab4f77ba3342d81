//! The subscriber: receives a topic's batches, epoch by epoch, in its own batch size.

use std::collections::VecDeque;
use std::ops::Range;
use std::time::Duration;

use std::sync::Arc;

use arrow::array::ArrayData;
use arrow::record_batch::RecordBatch;
use sluice_core::{Position, Rebatcher, Result, Resume, Rows, SluiceError, TopicName, Verdict};
use sluice_shm::{Frame, Namespace, TopicSubscriber};

use crate::device::{DeviceBatch, ImporterCell};
use crate::status::{Reporter, SubscriberReport, unix_now};

/// Where a subscriber that attaches to a running stream starts.
#[derive(Debug, Clone, Copy, Default, PartialEq, Eq)]
pub enum Join {
    /// With the next message: the current epoch is then flagged partial.
    #[default]
    Now,
    /// With the first batch of the next epoch, so every epoch it sees is whole.
    NextEpoch,
    /// With the oldest message the producer still holds (up to `sluice.window` messages
    /// back), then live. The first epoch is flagged partial unless the replay reached
    /// back to its first batch.
    Replay,
}

impl std::str::FromStr for Join {
    type Err = SluiceError;

    fn from_str(s: &str) -> Result<Self> {
        match s {
            "now" => Ok(Self::Now),
            "next_epoch" => Ok(Self::NextEpoch),
            "replay" => Ok(Self::Replay),
            other => Err(SluiceError::Config(format!(
                "unknown join mode '{other}'; use 'now', 'next_epoch' or 'replay'"
            ))),
        }
    }
}

/// What a subscriber does when the producer skipped batches for it because it fell
/// further behind than the topic's lag limit (`sluice.lag_limit_ms`).
#[derive(Debug, Clone, Copy, Default, PartialEq, Eq)]
pub enum OnLag {
    /// Fail with [`SluiceError::Lagged`] and detach.
    #[default]
    Error,
    /// Go on; the epoch is reported incomplete, with the batches missed.
    Skip,
}

impl std::str::FromStr for OnLag {
    type Err = SluiceError;

    fn from_str(s: &str) -> Result<Self> {
        match s {
            "error" => Ok(Self::Error),
            "skip" => Ok(Self::Skip),
            other => Err(SluiceError::Config(format!(
                "unknown on_lag mode '{other}'; use 'error' or 'skip'"
            ))),
        }
    }
}

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
    /// Batches this subscriber received in it (in its own batch size).
    pub received_batches: u64,
    /// Rows this subscriber received in it.
    pub received_rows: u64,
    /// Messages the producer skipped for this subscriber in this epoch (lag limit).
    pub missed: u64,
    /// Whether this subscriber saw the whole epoch (false for an epoch it joined late or
    /// in which it missed batches).
    pub complete: bool,
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

/// Rows as they travel through the subscriber: in shared memory, or in device slots.
#[derive(Debug)]
enum Payload {
    Host(RecordBatch),
    Device(DeviceBatch),
}

impl Rows for Payload {
    fn num_rows(&self) -> usize {
        match self {
            Self::Host(b) => b.num_rows(),
            Self::Device(b) => b.num_rows(),
        }
    }

    fn slice(&self, offset: usize, len: usize) -> Self {
        match self {
            Self::Host(b) => Self::Host(b.slice(offset, len)),
            Self::Device(b) => Self::Device(Rows::slice(b, offset, len)),
        }
    }

    fn concat(parts: Vec<Self>) -> Result<Self> {
        let mut host = Vec::new();
        let mut device = Vec::new();
        for p in parts {
            match p {
                Self::Host(b) => host.push(b),
                Self::Device(b) => device.push(b),
            }
        }
        match (host.is_empty(), device.is_empty()) {
            (false, true) => Ok(Self::Host(<RecordBatch as Rows>::concat(host)?)),
            (true, false) => Ok(Self::Device(<DeviceBatch as Rows>::concat(device)?)),
            _ => Err(SluiceError::Corrupt(
                "one topic sent both host and device batches".into(),
            )),
        }
    }

    fn to_private(&self) -> Result<Option<Self>> {
        Ok(match self {
            Self::Host(b) => b.to_private()?.map(Self::Host),
            Self::Device(b) => b.to_private()?.map(Self::Device),
        })
    }
}

/// A received message, with batches (host or device) already decoded.
#[derive(Debug)]
enum Incoming {
    Batch {
        epoch: u64,
        index: u64,
        payload: Payload,
        /// The shared-memory sample of a host batch.
        shm_range: Option<Range<usize>>,
    },
    Other(Frame),
}

#[derive(Debug, Default)]
struct EpochState {
    epoch: Option<u64>,
    ended: bool,
    producer_batches: u64,
    joined_late: bool,
    missed: u64,
    out_batches: u64,
    out_rows: u64,
}

/// Receives a topic's stream.
#[derive(Debug)]
pub struct Subscriber {
    /// The topic's subscriber port; `None` only while reconnecting.
    inner: Option<TopicSubscriber>,
    topic: TopicName,
    max_held: usize,
    namespace: Namespace,
    reconnect: Option<Duration>,
    /// Where this subscriber is in the producer's stream, to join a restarted producer's
    /// stream onto it.
    resume: Resume,
    timeout: Option<Duration>,
    /// Reports for `sluice status`.
    reporter: Reporter,
    /// Rows and missed messages, all epochs.
    total_rows: u64,
    total_missed: u64,
    join: Join,
    on_lag: OnLag,
    /// A batch received but not yet processed (after a synthesized epoch end).
    deferred: Option<Incoming>,
    waiting_for_boundary: bool,
    rebatcher: Option<Rebatcher<Payload>>,
    /// Sample ranges of producer batches the re-batcher may still be slicing.
    ranges: VecDeque<Range<usize>>,
    ready: VecDeque<Payload>,
    /// Opens the device slots of a GPU topic, on first use.
    importer: Arc<ImporterCell>,
    state: EpochState,
    pending_end: Option<Event>,
}

impl Subscriber {
    /// When the producer published the newest producer batch this subscriber received
    /// (`CLOCK_MONOTONIC` nanoseconds, see [`sluice_shm::monotonic_ns`]): with
    /// `monotonic_ns()` taken when a batch is usable, the publish-to-use latency.
    pub fn last_published_ns(&self) -> Option<u64> {
        self.inner
            .as_ref()
            .and_then(TopicSubscriber::last_published_ns)
    }

    /// Attaches to `topic`, waiting for its producer if it has not started yet.
    pub fn connect(topic: &str, options: SubscribeOptions) -> Result<Self> {
        let namespace = match options.namespace {
            Some(ns) => ns,
            None => Namespace::from_env()?,
        };
        let topic = TopicName::new(topic)?;
        let rebatcher = options.batch_size.map(Rebatcher::new).transpose()?;
        let inner = TopicSubscriber::connect(
            &namespace,
            &topic,
            options.timeout,
            options.join == Join::Replay,
        )?;
        Ok(Self {
            reporter: Reporter::new(&namespace, &topic, "subscriber"),
            total_rows: 0,
            total_missed: 0,
            max_held: inner.max_held(),
            inner: Some(inner),
            topic,
            namespace,
            reconnect: options.reconnect,
            resume: Resume::new(),
            timeout: options.timeout,
            join: options.join,
            on_lag: options.on_lag,
            deferred: None,
            waiting_for_boundary: options.join == Join::NextEpoch,
            rebatcher,
            ranges: VecDeque::new(),
            ready: VecDeque::new(),
            importer: Arc::default(),
            state: EpochState::default(),
            pending_end: None,
        })
    }

    /// The topic.
    pub fn topic(&self) -> &str {
        self.topic.as_str()
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

    /// The next event, waiting up to `timeout` (`None`: as long as it takes). A timeout
    /// loses nothing: call again to keep waiting.
    pub fn next_event_within(&mut self, timeout: Option<Duration>) -> Result<Event> {
        if self.reporter.due() {
            self.report();
        }
        loop {
            if let Some(batch) = self.ready.pop_front() {
                return Ok(self.emit(batch));
            }
            if let Some(end) = self.pending_end.take() {
                return Ok(end);
            }
            let incoming = match self.deferred.take() {
                Some(incoming) => incoming,
                None => match self.port()?.recv(timeout) {
                    Err(SluiceError::ProducerLost(_)) if self.reconnect.is_some() => {
                        self.reconnect_to_successor()?;
                        continue;
                    }
                    received => self.decode(received?)?,
                },
            };
            match incoming {
                Incoming::Other(Frame::Missed { messages }) => match self.on_lag {
                    OnLag::Error => {
                        self.close();
                        return Err(SluiceError::Lagged {
                            topic: self.topic().to_string(),
                            missed: messages,
                        });
                    }
                    OnLag::Skip => {
                        self.state.missed += messages;
                        self.total_missed += messages;
                    }
                },
                Incoming::Batch {
                    epoch,
                    index,
                    payload,
                    shm_range,
                } => {
                    if self.waiting_for_boundary {
                        if index != 0 {
                            continue;
                        }
                        self.waiting_for_boundary = false;
                    }
                    let verdict = self.resume.batch(Position::new(epoch, index));
                    if tracing::enabled!(tracing::Level::TRACE)
                        && let Payload::Host(batch) = &payload
                    {
                        let mut sum = sluice_core::Checksum::default();
                        let _ = sum.update(batch);
                        tracing::trace!(epoch, index, rows = batch.num_rows(), sum = %sum.hex(), ?verdict, "producer batch");
                    }
                    if !self.admit(verdict)? {
                        continue;
                    }
                    if let Some(current) = self.state.epoch
                        && current != epoch
                        && !self.state.ended
                    {
                        // The end of the current epoch was among the messages missed:
                        // close it (incomplete) before the next epoch starts.
                        if let Some(rebatcher) = &mut self.rebatcher {
                            self.ready.extend(rebatcher.finish()?);
                        }
                        let queued_rows: u64 = self.ready.iter().map(|b| b.num_rows() as u64).sum();
                        self.pending_end = Some(Event::EpochEnd(EpochSummary {
                            epoch: current,
                            batches: 0,
                            rows: 0,
                            received_batches: self.state.out_batches + self.ready.len() as u64,
                            received_rows: self.state.out_rows + queued_rows,
                            missed: self.state.missed.max(1),
                            complete: false,
                        }));
                        self.state.ended = true;
                        self.deferred = Some(Incoming::Batch {
                            epoch,
                            index,
                            payload,
                            shm_range,
                        });
                        continue;
                    }
                    if self.state.epoch != Some(epoch) || self.state.ended {
                        let missed = if self.state.ended {
                            0
                        } else {
                            self.state.missed
                        };
                        self.state = EpochState {
                            epoch: Some(epoch),
                            joined_late: index != 0,
                            missed,
                            ..EpochState::default()
                        };
                    }
                    self.state.producer_batches += 1;
                    match &mut self.rebatcher {
                        None => {
                            self.ranges.clear();
                            self.ranges.extend(shm_range);
                            self.ready.push_back(payload);
                        }
                        Some(rebatcher) => {
                            self.ranges.extend(shm_range);
                            self.ready.extend(rebatcher.push(payload)?);
                            // A batch spanning many producer batches would pin that many
                            // samples; copy the older ones so the subscriber stays within
                            // the samples it may hold (the batches handed out hold some).
                            let keep = (self.max_held / 2).max(1);
                            rebatcher.release_inputs(keep)?;
                            while self.ranges.len() > keep + 1 {
                                self.ranges.pop_front();
                            }
                        }
                    }
                }
                Incoming::Other(Frame::EndOfEpoch {
                    epoch,
                    batches,
                    rows,
                }) => {
                    if self.waiting_for_boundary {
                        self.waiting_for_boundary = false;
                        continue;
                    }
                    let verdict = self.resume.end_of_epoch(epoch, batches);
                    if !self.admit(verdict)? {
                        continue;
                    }
                    if let Some(rebatcher) = &mut self.rebatcher {
                        self.ready.extend(rebatcher.finish()?);
                    }
                    let seen = self.state.epoch == Some(epoch) && !self.state.ended;
                    let missed = self.state.missed;
                    let (producer_batches, joined_late) = if seen {
                        (self.state.producer_batches, self.state.joined_late)
                    } else {
                        (0, batches > 0)
                    };
                    // Counts are provisional until the batches still queued are emitted.
                    let queued_rows: u64 = self.ready.iter().map(|b| b.num_rows() as u64).sum();
                    let (out_batches, out_rows) = if seen {
                        (
                            self.state.out_batches + self.ready.len() as u64,
                            self.state.out_rows + queued_rows,
                        )
                    } else {
                        (self.ready.len() as u64, queued_rows)
                    };
                    self.pending_end = Some(Event::EpochEnd(EpochSummary {
                        epoch,
                        batches,
                        rows,
                        received_batches: out_batches,
                        received_rows: out_rows,
                        missed,
                        // Messages arrive in order and gaps are reported (the transport
                        // checks sequence numbers), so an epoch was seen whole exactly
                        // when the subscriber saw its first batch and every row.
                        complete: !joined_late
                            && missed == 0
                            && producer_batches == batches
                            && out_rows == rows,
                    }));
                    // Batches still queued belong to the ending epoch.
                    self.state.epoch = Some(epoch);
                    self.state.ended = true;
                    self.state.missed = 0;
                }
                Incoming::Other(Frame::EndOfStream) => {
                    if let Some(rebatcher) = &mut self.rebatcher {
                        self.ready.extend(rebatcher.finish()?);
                    }
                    if self.ready.is_empty() {
                        return Ok(Event::End);
                    }
                    // Deliver what is queued first; End comes on a later call.
                    self.pending_end = Some(Event::End);
                }
                Incoming::Other(Frame::Batch { .. } | Frame::DeviceBatch { .. }) => {
                    return Err(SluiceError::Internal(
                        "a batch frame was not decoded".into(),
                    ));
                }
            }
        }
    }

    /// Batches, host or device, into [`Incoming::Batch`]; other frames as they are.
    fn decode(&self, frame: Frame) -> Result<Incoming> {
        Ok(match frame {
            Frame::Batch {
                epoch,
                index,
                batch,
                shm_range,
            } => Incoming::Batch {
                epoch,
                index,
                payload: Payload::Host(batch),
                shm_range: Some(shm_range),
            },
            Frame::DeviceBatch {
                epoch,
                index,
                rows,
                payload,
            } => Incoming::Batch {
                epoch,
                index,
                payload: Payload::Device(DeviceBatch::from_sample(
                    payload,
                    rows,
                    self.importer.clone(),
                )?),
                shm_range: None,
            },
            other => Incoming::Other(other),
        })
    }

    /// Whether a message passes the resume filter: duplicates from a restarted producer
    /// are dropped, a gap is an error.
    fn admit(&mut self, verdict: Verdict) -> Result<bool> {
        match verdict {
            Verdict::Deliver => Ok(true),
            Verdict::Duplicate => Ok(false),
            Verdict::Gap { expected, found } => {
                self.close();
                Err(SluiceError::ResumeGap {
                    topic: self.topic().to_string(),
                    expected,
                    found,
                })
            }
        }
    }

    /// The producer is gone: let go of its topic (a restarted producer can only create it
    /// once every subscriber has), then wait for a successor and join its stream where
    /// this subscriber left off.
    fn reconnect_to_successor(&mut self) -> Result<()> {
        let wait = self.reconnect.unwrap_or_default();
        let topic = self.topic.clone();
        tracing::info!(topic = %topic, "producer lost; waiting up to {wait:?} for a restarted one");
        // Rows the re-batcher still slices out of the old topic's samples are copied, so
        // no sample of the old topic is held.
        if let Some(rebatcher) = &mut self.rebatcher {
            rebatcher.release_inputs(0)?;
        }
        self.ranges.clear();
        // Declared before letting go of the old topic: the successor can create the topic
        // only once every subscriber has let go, and must then find this one waiting.
        let _interest = sluice_shm::Interest::declare(&self.namespace, &topic)?;
        // Every port and service handle of the old topic goes before waiting.
        self.inner = None;
        // Replay: the successor may have published a few messages before this
        // subscriber attached; the resume filter drops the ones already seen.
        let successor = TopicSubscriber::connect(&self.namespace, &topic, Some(wait), true)
            .map_err(|e| match e {
                SluiceError::Timeout { .. } => SluiceError::ProducerLost(topic.to_string()),
                other => other,
            })?;
        self.max_held = successor.max_held();
        self.inner = Some(successor);
        self.resume.reconnecting();
        Ok(())
    }

    fn report(&mut self) {
        let (seq, held) = self
            .inner
            .as_ref()
            .map_or((0, 0), |i| (i.next_seq(), i.held()));
        let topic = self.topic.to_string();
        let (epoch, rows, missed) = (
            self.state.epoch.unwrap_or(0),
            self.total_rows,
            self.total_missed,
        );
        self.reporter.write(rows, |rows_per_s| SubscriberReport {
            pid: std::process::id(),
            topic,
            epoch,
            seq,
            rows,
            rows_per_s,
            held,
            missed,
            updated: unix_now(),
        });
    }

    fn emit(&mut self, payload: Payload) -> Event {
        self.total_rows += payload.num_rows() as u64;
        let epoch = self.state.epoch.unwrap_or(0);
        let index = self.state.out_batches;
        self.state.out_batches += 1;
        self.state.out_rows += payload.num_rows() as u64;
        if self.ready.is_empty()
            && let Some(Event::EpochEnd(_)) = &self.pending_end
        {
            // The epoch's last batch is out: the next epoch starts from zero.
            self.state = EpochState::default();
        }
        match payload {
            Payload::Host(batch) => {
                let shm_range = self.ranges.iter().find(|r| lies_within(&batch, r)).cloned();
                Event::Batch {
                    epoch,
                    index,
                    batch,
                    shm_range,
                }
            }
            Payload::Device(batch) => Event::DeviceBatch {
                epoch,
                index,
                batch,
            },
        }
    }

    /// Leaves the topic now; the producer stops waiting for this subscriber. Batches
    /// already received stay valid.
    pub fn close(&mut self) {
        if let Some(inner) = &mut self.inner {
            inner.detach();
        }
    }

    fn port(&mut self) -> Result<&mut TopicSubscriber> {
        // Only a failed reconnection leaves no port: the producer is lost for good.
        let topic = &self.topic;
        self.inner
            .as_mut()
            .ok_or_else(|| SluiceError::ProducerLost(topic.to_string()))
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
