//! The subscriber's half of the delivery protocol, as a pure state machine.
//!
//! A transport (shared memory today; any backend that delivers a producer's messages in
//! order and reports gaps) hands the [`Receiver`] what arrived, as [`Inbound`] messages,
//! and the receiver hands the subscriber's user what to see, as [`Outbound`] events:
//!
//! ```text
//! transport ──Inbound──► Receiver::push ─┐            ┌─► Outbound::Batch (own batch size)
//!                                        ├─ state ────┼─► Outbound::EpochEnd(summary)
//!            Receiver::poll ◄────────────┘            └─► Outbound::End
//! ```
//!
//! It holds the contract's rules and nothing else (no I/O, no clock, no threads):
//! * **Join.** `next_epoch` skips messages up to the next epoch's first batch; any join
//!   mid-epoch flags that epoch partial ([`EpochSummary::complete`] false).
//! * **Batch size.** Producer batches are cut to the subscriber's size ([`Rebatcher`]);
//!   the last batch of an epoch may be shorter and is never dropped.
//! * **End of epoch.** After the epoch's last rows; a summary says what the producer
//!   published and what this subscriber got. An epoch whose end was among missed messages
//!   is closed, incomplete, when the next epoch's first batch arrives.
//! * **Lag.** A gap reported by the transport ([`Inbound::Missed`]) is an error
//!   ([`SluiceError::Lagged`]) or, with [`OnLag::Skip`], counted in the epoch's summary.
//! * **Resume.** After [`Receiver::reconnecting`] (or [`Inbound::Reconnected`] from a
//!   transport that reconnects by itself), a restarted producer's messages that
//!   this subscriber already had are dropped and a gap is an error
//!   ([`SluiceError::ResumeGap`]), so a reconnect has no duplicate and no hole.
//! * **End of stream** comes after every queued batch.
//!
//! The payload is generic ([`Rows`]): record batches in shared memory, device batches,
//! or anything a test makes up.

use std::collections::VecDeque;
use std::time::Duration;

use crate::position::{Position, Resume, RowPosition, Verdict};
use crate::rebatch::{Rebatcher, Rows};
use crate::{Result, SluiceError};

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
    /// With the first batch of the epoch running when it attaches: what the topic no
    /// longer holds of it is computed again for this subscriber alone (a plan's topic
    /// only), then it continues on the shared stream, so its first epoch is whole.
    CatchUp,
}

impl std::str::FromStr for Join {
    type Err = SluiceError;

    fn from_str(s: &str) -> Result<Self> {
        match s {
            "now" => Ok(Self::Now),
            "next_epoch" => Ok(Self::NextEpoch),
            "replay" => Ok(Self::Replay),
            "catch_up" => Ok(Self::CatchUp),
            other => Err(SluiceError::Config(format!(
                "unknown join mode '{other}'; use 'now', 'next_epoch', 'replay' or 'catch_up'"
            ))),
        }
    }
}

/// What a subscriber does when the producer skipped batches for it because it fell
/// further behind than the topic's lag limit (`sluice.lag_limit`).
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

/// A producer's message, as the transport delivers it, in order.
#[derive(Debug)]
pub enum Inbound<P> {
    /// A producer batch: batch `index` of `epoch`; or, where `batch_rows` is not zero
    /// and the payload holds more rows, a message of consecutive producer batches from
    /// `index` on, each of `batch_rows` rows but the last.
    Batch {
        /// Epoch, from 0.
        epoch: u64,
        /// Index of the (first) batch within its epoch, in the producer's batches.
        index: u64,
        /// Rows of each producer batch in a message of several; 0: the message is one
        /// batch, whatever its rows.
        batch_rows: u64,
        /// The rows.
        payload: P,
    },
    /// The producer ended `epoch` after `batches` batches of `rows` rows in all.
    EndOfEpoch {
        /// The epoch.
        epoch: u64,
        /// Batches published in it.
        batches: u64,
        /// Rows published in it.
        rows: u64,
    },
    /// No more messages will come.
    EndOfStream,
    /// The transport lost this many messages for this subscriber (lag limit).
    Missed {
        /// Messages missed.
        messages: u64,
    },
    /// The producer was lost and the transport attached to its restarted successor (or
    /// re-attached after its own failure): what follows may repeat what was delivered,
    /// and must continue exactly where this subscriber is.
    Reconnected,
}

impl<P> Inbound<P> {
    /// The same message with its payload converted by `f`, which may fail.
    pub fn try_map<Q, E>(self, f: impl FnOnce(P) -> Result<Q, E>) -> Result<Inbound<Q>, E> {
        Ok(match self {
            Self::Batch {
                epoch,
                index,
                batch_rows,
                payload,
            } => Inbound::Batch {
                epoch,
                index,
                batch_rows,
                payload: f(payload)?,
            },
            Self::EndOfEpoch {
                epoch,
                batches,
                rows,
            } => Inbound::EndOfEpoch {
                epoch,
                batches,
                rows,
            },
            Self::EndOfStream => Inbound::EndOfStream,
            Self::Missed { messages } => Inbound::Missed { messages },
            Self::Reconnected => Inbound::Reconnected,
        })
    }

    /// The same message with its payload converted (a transport's batches into the
    /// subscriber's payload type).
    pub fn map<Q>(self, f: impl FnOnce(P) -> Q) -> Inbound<Q> {
        match self.try_map(|p| Ok::<_, std::convert::Infallible>(f(p))) {
            Ok(mapped) => mapped,
            Err(never) => match never {},
        }
    }
}

/// What the subscriber's user sees.
#[derive(Debug)]
pub enum Outbound<P> {
    /// A batch in the subscriber's batch size: batch `index` of `epoch` as this
    /// subscriber counts them.
    Batch {
        /// Epoch of the batch.
        epoch: u64,
        /// Index of the batch in its epoch, in this subscriber's batches.
        index: u64,
        /// The rows.
        payload: P,
    },
    /// An epoch ended.
    EpochEnd(EpochSummary),
    /// The stream ended.
    End,
}

/// Rows of a producer batch not yet handed out: from row `first` of batch `at`, `rows`
/// of them.
#[derive(Debug, Clone, Copy)]
struct Trail {
    at: Position,
    first: u64,
    rows: u64,
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

/// How a [`Receiver`] starts.
#[derive(Debug, Clone)]
pub struct ReceiverOptions {
    /// The topic, for error messages.
    pub topic: String,
    /// Rows per batch for the subscriber; `None` keeps the producer's batches.
    pub batch_size: Option<usize>,
    /// Where to start in a running stream.
    pub join: Join,
    /// What to do after falling behind the producer's lag limit.
    pub on_lag: OnLag,
    /// Producer batches the re-batcher may keep in the transport's memory (the rest of
    /// a long subscriber batch is copied), so the subscriber stays within the messages
    /// it may hold.
    pub max_held: usize,
    /// Start exactly here (a trainer's saved position, [`Receiver::consumed`]): earlier
    /// messages are dropped as duplicates, the rows of the first batch before `row` are
    /// cut off, and a stream that starts after it is a [`SluiceError::ResumeGap`].
    /// Overrides `join`.
    pub start: Option<RowPosition>,
}

/// What waits in a [`Receiver`] to be judged.
#[derive(Debug)]
enum Deferred<P> {
    /// A message, as it came.
    Message(Inbound<P>),
    /// The batches of a message of several from row `offset` on, the first of them
    /// batch `index`: the whole message stays, so that each batch is one slice of it.
    Rest {
        epoch: u64,
        index: u64,
        batch_rows: usize,
        payload: P,
        offset: usize,
    },
}

/// The subscriber's state machine (see the module docs): push what arrived, poll what to
/// show. Pure: it never blocks and does no I/O.
#[derive(Debug)]
pub struct Receiver<P> {
    topic: String,
    on_lag: OnLag,
    max_held: usize,
    waiting_for_boundary: bool,
    resume: Resume,
    rebatcher: Option<Rebatcher<P>>,
    ready: VecDeque<P>,
    pending_end: Option<Outbound<P>>,
    /// Messages taken but not yet judged, in order: a batch of a new epoch that arrived
    /// before the previous epoch's end (which is synthesized first), the rest of a
    /// message of several batches (cut one batch at a time), and whatever was pushed or
    /// reported (a reconnection) before a poll took those.
    deferred: VecDeque<Deferred<P>>,
    state: EpochState,
    /// The producer batches whose rows are queued (not yet handed out), oldest first.
    trail: VecDeque<Trail>,
    /// Rows to cut off the start cursor's batch, where it falls inside one.
    cut_start: Option<RowPosition>,
    /// The position after the rows handed out so far.
    consumed: Option<RowPosition>,
    total_rows: u64,
    total_missed: u64,
    /// Set once the protocol failed or the subscriber left: nothing more is accepted.
    closed: bool,
    /// Set by the end of the stream: [`Outbound::End`] from then on.
    ended: bool,
}

impl<P: Rows> Receiver<P> {
    /// A receiver that has seen nothing yet.
    pub fn new(options: ReceiverOptions) -> Result<Self> {
        let start = options.start;
        Ok(Self {
            topic: options.topic,
            on_lag: options.on_lag,
            max_held: options.max_held,
            waiting_for_boundary: options.join == Join::NextEpoch && start.is_none(),
            resume: start.map_or_else(Resume::new, |at| Resume::starting_at(at.batch())),
            rebatcher: options.batch_size.map(Rebatcher::new).transpose()?,
            ready: VecDeque::new(),
            pending_end: None,
            deferred: VecDeque::new(),
            state: EpochState::default(),
            trail: VecDeque::new(),
            cut_start: start.filter(|at| at.row > 0),
            consumed: start,
            total_rows: 0,
            total_missed: 0,
            closed: false,
            ended: false,
        })
    }

    /// The next event to hand out, if any; `None`: push the next message first.
    pub fn poll(&mut self) -> Result<Option<Outbound<P>>> {
        loop {
            if let Some(batch) = self.ready.pop_front() {
                return Ok(Some(self.emit(batch)));
            }
            if let Some(end) = self.pending_end.take() {
                if let Outbound::EpochEnd(summary) = &end {
                    self.consumed = Some(RowPosition::new(summary.epoch.saturating_add(1), 0, 0));
                    self.trail.clear();
                }
                return Ok(Some(end));
            }
            match self.deferred.pop_front() {
                Some(deferred) => self.push_now(deferred)?,
                None if self.ended => return Ok(Some(Outbound::End)),
                None => return Ok(None),
            }
        }
    }

    /// Takes the next message of the transport. Call [`Self::poll`] until it returns
    /// `None` before each push.
    ///
    /// Errors: [`SluiceError::Lagged`] (a gap with [`OnLag::Error`]),
    /// [`SluiceError::ResumeGap`] (a restarted producer's stream does not continue this
    /// one), [`SluiceError::Corrupt`] (a message after the end of the stream, a batch
    /// that cannot be cut); after an error the receiver accepts nothing more.
    pub fn push(&mut self, message: Inbound<P>) -> Result<()> {
        if !self.deferred.is_empty() && !self.closed {
            // Pushed before `poll` took what was taken before: it waits its turn.
            self.deferred.push_back(Deferred::Message(message));
            return Ok(());
        }
        self.push_now(Deferred::Message(message))
    }

    fn push_now(&mut self, deferred: Deferred<P>) -> Result<()> {
        if self.ended {
            return Err(SluiceError::Corrupt(format!(
                "a message on topic '{}' after the end of its stream",
                self.topic
            )));
        }
        if self.closed {
            return Err(SluiceError::Config(format!(
                "the subscription to topic '{}' was closed or failed; subscribe again",
                self.topic
            )));
        }
        let result = match deferred {
            Deferred::Message(message) => self.take(message),
            Deferred::Rest {
                epoch,
                index,
                batch_rows,
                payload,
                offset,
            } => self.cut(epoch, index, batch_rows, payload, offset),
        };
        if result.is_err() {
            self.closed = true;
        }
        result
    }

    fn take(&mut self, message: Inbound<P>) -> Result<()> {
        match message {
            Inbound::Missed { messages } => match self.on_lag {
                OnLag::Error => Err(SluiceError::Lagged {
                    topic: self.topic.clone(),
                    missed: messages,
                }),
                OnLag::Skip => {
                    // A count from a remote server: saturating, as it may be anything.
                    self.state.missed = self.state.missed.saturating_add(messages);
                    self.total_missed = self.total_missed.saturating_add(messages);
                    Ok(())
                }
            },
            Inbound::Batch {
                epoch,
                index,
                batch_rows,
                payload,
            } => self.message(epoch, index, batch_rows, payload),
            Inbound::EndOfEpoch {
                epoch,
                batches,
                rows,
            } => self.end_of_epoch(epoch, batches, rows),
            Inbound::Reconnected => self.reconnect_now(),
            Inbound::EndOfStream => {
                if let Some(rebatcher) = &mut self.rebatcher {
                    self.ready.extend(rebatcher.finish()?);
                }
                self.ended = true;
                Ok(())
            }
        }
    }

    /// A message: one producer batch, or several, which are judged one at a time as if
    /// they had come one by one (positions, duplicates and gaps count batches, not
    /// messages). The rest of a message waits in `deferred`, cut lazily, so a message
    /// costs no more memory however many batches it claims.
    fn message(&mut self, epoch: u64, index: u64, batch_rows: u64, payload: P) -> Result<()> {
        let rows = payload.num_rows();
        let Some(cut) = usize::try_from(batch_rows)
            .ok()
            .filter(|&cut| cut > 0 && cut < rows)
        else {
            return self.batch(epoch, index, payload);
        };
        self.cut(epoch, index, cut, payload, 0)
    }

    /// Judges batch `index` of a message of several, the `batch_rows` rows of `payload`
    /// from `offset` on (fewer if they are its last); what follows waits in `deferred`,
    /// the whole message and where to go on, so that each batch is one slice of it.
    fn cut(
        &mut self,
        epoch: u64,
        index: u64,
        batch_rows: usize,
        payload: P,
        offset: usize,
    ) -> Result<()> {
        let rows = payload.num_rows();
        let len = batch_rows.min(rows.saturating_sub(offset));
        let batch = payload.slice(offset, len);
        let rest = match offset + len < rows {
            false => None,
            true => Some(Deferred::Rest {
                epoch,
                index: index.checked_add(1).ok_or_else(|| {
                    SluiceError::Corrupt(format!(
                        "a message on topic '{}' claims batches past index {index}",
                        self.topic
                    ))
                })?,
                batch_rows,
                payload,
                offset: offset + len,
            }),
        };
        // `deferred` holds what came after this message (pushed before a poll), and, if
        // this batch opens a new epoch, the batch itself in front: the rest goes right
        // after the batch.
        let after = self.deferred.len();
        self.batch(epoch, index, batch)?;
        if let Some(rest) = rest {
            let at = self.deferred.len() - after;
            self.deferred.insert(at, rest);
        }
        Ok(())
    }

    fn batch(&mut self, epoch: u64, index: u64, payload: P) -> Result<()> {
        if index == u64::MAX {
            return Err(SluiceError::Corrupt(format!(
                "a batch on topic '{}' at index {index}, past any epoch's end",
                self.topic
            )));
        }
        if self.waiting_for_boundary {
            if index != 0 {
                return Ok(());
            }
            self.waiting_for_boundary = false;
        }
        let verdict = self.resume.batch(Position::new(epoch, index));
        if !self.admit(verdict)? {
            return Ok(());
        }
        if let Some(current) = self.state.epoch
            && current != epoch
            && !self.state.ended
        {
            // The end of the current epoch was among the messages missed: close it
            // (incomplete) before the next epoch starts.
            if let Some(rebatcher) = &mut self.rebatcher {
                self.ready.extend(rebatcher.finish()?);
            }
            let queued_rows: u64 = self.ready.iter().map(|b| b.num_rows() as u64).sum();
            self.pending_end = Some(Outbound::EpochEnd(EpochSummary {
                epoch: current,
                batches: 0,
                rows: 0,
                received_batches: self.state.out_batches + self.ready.len() as u64,
                received_rows: self.state.out_rows + queued_rows,
                missed: self.state.missed.max(1),
                complete: false,
            }));
            self.state.ended = true;
            // Taken again by `poll` once the end is out (judging it again is harmless:
            // the resume filter delivers a position it just delivered).
            self.deferred.push_front(Deferred::Message(Inbound::Batch {
                epoch,
                index,
                batch_rows: 0,
                payload,
            }));
            return Ok(());
        }
        let (payload, first) = self.cut_at_start(Position::new(epoch, index), payload);
        if self.state.epoch != Some(epoch) || self.state.ended {
            let missed = if self.state.ended {
                0
            } else {
                self.state.missed
            };
            self.state = EpochState {
                epoch: Some(epoch),
                joined_late: index != 0 || first != 0,
                missed,
                ..EpochState::default()
            };
        }
        self.trail.push_back(Trail {
            at: Position::new(epoch, index),
            first,
            rows: payload.num_rows() as u64,
        });
        self.state.producer_batches += 1;
        let keep = self.keep_inputs();
        match &mut self.rebatcher {
            None => self.ready.push_back(payload),
            Some(rebatcher) => {
                self.ready.extend(rebatcher.push(payload)?);
                // A batch spanning many producer batches would pin that many messages;
                // copy the older ones so the subscriber stays within the messages it may
                // hold (the batches handed out hold some).
                rebatcher.release_inputs(keep)?;
            }
        }
        Ok(())
    }

    /// The batch at `at` without the rows before the start cursor, if the cursor falls
    /// inside it; and the row it now starts at.
    fn cut_at_start(&mut self, at: Position, payload: P) -> (P, u64) {
        let Some(start) = self.cut_start.filter(|s| s.batch() == at) else {
            return (payload, 0);
        };
        self.cut_start = None;
        let rows = payload.num_rows();
        let skip = usize::try_from(start.row).unwrap_or(usize::MAX).min(rows);
        (payload.slice(skip, rows - skip), skip as u64)
    }

    /// `rows` more rows were handed out: moves [`Self::consumed`] past them.
    fn advance(&mut self, mut rows: u64) {
        while let Some(front) = self.trail.front_mut() {
            if rows == 0 && front.rows > 0 {
                self.consumed = Some(RowPosition::new(
                    front.at.epoch,
                    front.at.index,
                    front.first,
                ));
                return;
            }
            let take = rows.min(front.rows);
            front.rows -= take;
            front.first += take;
            rows -= take;
            if front.rows == 0 {
                let next = front.at.next_batch();
                self.consumed = Some(RowPosition::new(next.epoch, next.index, 0));
                self.trail.pop_front();
            }
        }
    }

    fn end_of_epoch(&mut self, epoch: u64, batches: u64, rows: u64) -> Result<()> {
        if epoch == u64::MAX {
            return Err(SluiceError::Corrupt(format!(
                "the end of epoch {epoch} on topic '{}', after which no epoch can follow",
                self.topic
            )));
        }
        if self.waiting_for_boundary {
            self.waiting_for_boundary = false;
            return Ok(());
        }
        let verdict = self.resume.end_of_epoch(epoch, batches);
        if !self.admit(verdict)? {
            return Ok(());
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
        self.pending_end = Some(Outbound::EpochEnd(EpochSummary {
            epoch,
            batches,
            rows,
            received_batches: out_batches,
            received_rows: out_rows,
            missed,
            // Messages arrive in order and gaps are reported (the transport checks
            // sequence numbers), so an epoch was seen whole exactly when the subscriber
            // saw its first batch and every row.
            complete: !joined_late
                && missed == 0
                && producer_batches == batches
                && out_rows == rows,
        }));
        // Batches still queued belong to the ending epoch.
        self.state.epoch = Some(epoch);
        self.state.ended = true;
        self.state.missed = 0;
        Ok(())
    }

    /// Whether a message passes the resume filter: duplicates from a restarted producer
    /// are dropped, a gap is an error.
    fn admit(&self, verdict: Verdict) -> Result<bool> {
        match verdict {
            Verdict::Deliver => Ok(true),
            Verdict::Duplicate => Ok(false),
            Verdict::Gap { expected, found } => Err(SluiceError::ResumeGap {
                topic: self.topic.clone(),
                expected,
                found,
            }),
        }
    }

    fn emit(&mut self, payload: P) -> Outbound<P> {
        let rows = payload.num_rows() as u64;
        self.advance(rows);
        self.total_rows += rows;
        let epoch = self.state.epoch.unwrap_or(0);
        let index = self.state.out_batches;
        self.state.out_batches += 1;
        self.state.out_rows += rows;
        if self.ready.is_empty()
            && let Some(Outbound::EpochEnd(_)) = &self.pending_end
        {
            // The epoch's last batch is out: the next epoch starts from zero.
            self.state = EpochState::default();
        }
        Outbound::Batch {
            epoch,
            index,
            payload,
        }
    }

    fn keep_inputs(&self) -> usize {
        (self.max_held / 2).max(1)
    }

    /// Producer batches the re-batcher may still slice rows out of (a transport keeps
    /// that many of its latest messages' memory attributed to them).
    pub fn inputs_kept(&self) -> usize {
        self.keep_inputs() + 1
    }

    /// The producer was lost and a restarted one will continue the stream: rows still
    /// held in the old producer's memory are copied (`Rows::to_private`), so the old
    /// messages can go, and the successor's messages are filtered so that this
    /// subscriber sees no duplicate and no gap.
    pub fn reconnecting(&mut self) -> Result<()> {
        let copied = self.copy_held();
        if copied.is_err() {
            self.closed = true;
            return copied;
        }
        if self.deferred.is_empty() {
            self.resume.reconnecting();
        } else {
            // Batches of the old producer's last message are still to be judged (a push
            // before the poll that would have taken them): they go first, then the
            // successor's stream is filtered.
            self.deferred
                .push_back(Deferred::Message(Inbound::Reconnected));
        }
        Ok(())
    }

    /// Copies every row this receiver still holds in a transport's memory, wherever it
    /// waits: in the re-batcher, ready to hand out, or in a message not yet cut.
    fn copy_held(&mut self) -> Result<()> {
        if let Some(rebatcher) = &mut self.rebatcher {
            rebatcher.release_inputs(0)?;
        }
        for deferred in &mut self.deferred {
            if let Deferred::Rest {
                payload, offset, ..
            } = deferred
            {
                // Only the rows still to come are copied.
                *payload = payload.slice(*offset, payload.num_rows() - *offset);
                *offset = 0;
            }
        }
        let deferred = self
            .deferred
            .iter_mut()
            .filter_map(|deferred| match deferred {
                Deferred::Message(Inbound::Batch { payload, .. })
                | Deferred::Rest { payload, .. } => Some(payload),
                Deferred::Message(_) => None,
            });
        for payload in self.ready.iter_mut().chain(deferred) {
            if let Some(private) = payload.to_private()? {
                *payload = private;
            }
        }
        Ok(())
    }

    fn reconnect_now(&mut self) -> Result<()> {
        if let Some(rebatcher) = &mut self.rebatcher {
            rebatcher.release_inputs(0)?;
        }
        self.resume.reconnecting();
        Ok(())
    }

    /// The messages the subscriber may hold changed (a successor topic's setting).
    pub fn set_max_held(&mut self, max_held: usize) {
        self.max_held = max_held;
    }

    /// Leaves the stream: nothing more is accepted (an error that ends the subscription,
    /// or the user closed it).
    pub fn close(&mut self) {
        self.closed = true;
    }

    /// Whether the stream has ended (every later [`Self::poll`] gives [`Outbound::End`]
    /// once the queued batches are out).
    pub fn is_ended(&self) -> bool {
        self.ended
    }

    /// Whether the receiver accepts no more messages: it failed, or was closed.
    pub fn is_closed(&self) -> bool {
        self.closed
    }

    /// The epoch the subscriber is in (0 before the first batch).
    pub fn epoch(&self) -> u64 {
        self.state.epoch.unwrap_or(0)
    }

    /// The position right after the rows handed out so far (or the start cursor, before
    /// any): a trainer that saves it and starts again from it
    /// ([`ReceiverOptions::start`]) gets exactly the rows it had not been handed.
    /// `None` before anything was handed out, without a start.
    pub fn consumed(&self) -> Option<RowPosition> {
        self.consumed
    }

    /// The next producer batch this subscriber needs, once it has received anything (or
    /// was given a start).
    pub fn next_needed(&self) -> Option<Position> {
        self.resume.reached()
    }

    /// Rows handed out, all epochs.
    pub fn total_rows(&self) -> u64 {
        self.total_rows
    }

    /// Messages missed (lag limit), all epochs.
    pub fn total_missed(&self) -> u64 {
        self.total_missed
    }
}

/// The subscriber's end of a transport: a producer's messages, in order, with gaps
/// reported as [`Inbound::Missed`]. Shared memory (`sluice-shm`), Arrow Flight and
/// [`memory`] implement it; [`Subscription`] puts the protocol on top.
pub trait Inlet<P> {
    /// The next message, waiting up to `timeout` (`None`: as long as it takes). Errors:
    /// [`SluiceError::Timeout`] when none came (nothing is lost: call again), the
    /// producer's failure or loss.
    fn recv(&mut self, timeout: Option<Duration>) -> Result<Inbound<P>>;
}

impl<P, I: Inlet<P> + ?Sized> Inlet<P> for Box<I> {
    fn recv(&mut self, timeout: Option<Duration>) -> Result<Inbound<P>> {
        (**self).recv(timeout)
    }
}

/// The producer's end of a transport: publishes to every subscriber, in order, waiting
/// for room when a subscriber's queue is full (the slowest sets the pace).
pub trait Outlet<P> {
    /// Batch `index` of `epoch`.
    fn batch(&mut self, epoch: u64, index: u64, payload: &P) -> Result<()>;
    /// Consecutive batches of `batch_rows` rows of `epoch` from batch `index` on (the
    /// last may be shorter; `batch_rows` 0, or at least the payload's rows, is one
    /// batch, and a payload of no rows is one empty batch), as one message where the
    /// transport carries messages of several batches (subscribers cut it, see
    /// [`Inbound::Batch`]); one by one where it does not. `more`: another message is
    /// ready to follow at once, so the transport may wake its subscribers once for the
    /// burst ([`crate::Burst`]) instead of once per message.
    fn message(
        &mut self,
        epoch: u64,
        index: u64,
        batch_rows: usize,
        payload: &P,
        more: bool,
    ) -> Result<()>
    where
        P: Rows,
    {
        let _ = more;
        let rows = payload.num_rows();
        // One batch, even of no rows: positions count batches.
        if batch_rows == 0 || batch_rows >= rows {
            return self.batch(epoch, index, payload);
        }
        let step = batch_rows;
        for (k, offset) in (0..rows).step_by(step).enumerate() {
            let len = step.min(rows - offset);
            self.batch(epoch, index + k as u64, &payload.slice(offset, len))?;
        }
        Ok(())
    }
    /// The end of `epoch`, after `batches` batches of `rows` rows in all.
    fn end_of_epoch(&mut self, epoch: u64, batches: u64, rows: u64) -> Result<()>;
    /// The end of the stream, after `epochs` epochs.
    fn end_of_stream(&mut self, epochs: u64) -> Result<()>;
}

/// A subscription over any transport: the delivery protocol ([`Receiver`]) fed by an
/// [`Inlet`].
#[derive(Debug)]
pub struct Subscription<P, I> {
    receiver: Receiver<P>,
    inlet: I,
}

impl<P: Rows, I: Inlet<P>> Subscription<P, I> {
    /// The protocol over `inlet`.
    pub fn new(options: ReceiverOptions, inlet: I) -> Result<Self> {
        Ok(Self {
            receiver: Receiver::new(options)?,
            inlet,
        })
    }

    /// The next event, waiting up to `timeout` for each message.
    pub fn next(&mut self, timeout: Option<Duration>) -> Result<Outbound<P>> {
        loop {
            if let Some(out) = self.receiver.poll()? {
                return Ok(out);
            }
            let message = self.inlet.recv(timeout)?;
            self.receiver.push(message)?;
        }
    }

    /// The protocol's state.
    pub fn receiver(&self) -> &Receiver<P> {
        &self.receiver
    }

    /// The protocol's state, to close it.
    pub fn receiver_mut(&mut self) -> &mut Receiver<P> {
        &mut self.receiver
    }

    /// The transport.
    pub fn inlet(&self) -> &I {
        &self.inlet
    }

    /// The transport, to act on it (leave the topic).
    pub fn inlet_mut(&mut self) -> &mut I {
        &mut self.inlet
    }
}

/// An in-memory transport: bounded channels, one per subscriber, for tests of the
/// protocol and of code built on it, with no shared memory or network.
pub mod memory {
    use std::sync::mpsc::{Receiver as Rx, RecvTimeoutError, SyncSender, sync_channel};
    use std::time::Duration;

    use super::{Inbound, Inlet, Outlet};
    use crate::{Result, SluiceError};

    /// The producer's end: sends every message to each subscriber's queue of `window`.
    #[derive(Debug)]
    pub struct MemoryOutlet<P> {
        queues: Vec<SyncSender<Inbound<P>>>,
    }

    /// A subscriber's end.
    #[derive(Debug)]
    pub struct MemoryInlet<P> {
        queue: Rx<Inbound<P>>,
        topic: String,
    }

    /// A topic with `subscribers` subscribers, each with a queue of `window` messages.
    pub fn topic<P: Clone>(
        topic: &str,
        window: usize,
        subscribers: usize,
    ) -> (MemoryOutlet<P>, Vec<MemoryInlet<P>>) {
        let (queues, inlets) = (0..subscribers)
            .map(|_| {
                let (tx, rx) = sync_channel(window.max(1));
                (
                    tx,
                    MemoryInlet {
                        queue: rx,
                        topic: topic.to_string(),
                    },
                )
            })
            .unzip();
        (MemoryOutlet { queues }, inlets)
    }

    impl<P: Clone> MemoryOutlet<P> {
        fn send(&mut self, message: impl Fn() -> Inbound<P>) -> Result<()> {
            // A subscriber that went away no longer counts, as on every transport.
            self.queues.retain(|q| q.send(message()).is_ok());
            Ok(())
        }
    }

    impl<P: Clone> Outlet<P> for MemoryOutlet<P> {
        fn batch(&mut self, epoch: u64, index: u64, payload: &P) -> Result<()> {
            self.send(|| Inbound::Batch {
                epoch,
                index,
                batch_rows: 0,
                payload: payload.clone(),
            })
        }

        fn message(
            &mut self,
            epoch: u64,
            index: u64,
            batch_rows: usize,
            payload: &P,
            _more: bool,
        ) -> Result<()> {
            self.send(|| Inbound::Batch {
                epoch,
                index,
                batch_rows: batch_rows as u64,
                payload: payload.clone(),
            })
        }

        fn end_of_epoch(&mut self, epoch: u64, batches: u64, rows: u64) -> Result<()> {
            self.send(|| Inbound::EndOfEpoch {
                epoch,
                batches,
                rows,
            })
        }

        fn end_of_stream(&mut self, _epochs: u64) -> Result<()> {
            self.send(|| Inbound::EndOfStream)
        }
    }

    impl<P> Inlet<P> for MemoryInlet<P> {
        fn recv(&mut self, timeout: Option<Duration>) -> Result<Inbound<P>> {
            let lost = || SluiceError::ProducerLost(self.topic.clone());
            match timeout {
                None => self.queue.recv().map_err(|_| lost()),
                Some(t) => self.queue.recv_timeout(t).map_err(|e| match e {
                    RecvTimeoutError::Timeout => SluiceError::Timeout {
                        what: format!("the next message on topic '{}'", self.topic),
                        seconds: t.as_secs_f64(),
                    },
                    RecvTimeoutError::Disconnected => lost(),
                }),
            }
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use proptest::prelude::*;

    /// Rows as their ids: enough to check order, loss and duplication.
    #[derive(Debug, Clone, PartialEq, Eq)]
    struct Ids(Vec<u64>);

    impl Rows for Ids {
        fn num_rows(&self) -> usize {
            self.0.len()
        }
        fn slice(&self, offset: usize, len: usize) -> Self {
            Self(self.0[offset..offset + len].to_vec())
        }
        fn concat(parts: Vec<Self>) -> Result<Self> {
            Ok(Self(parts.into_iter().flat_map(|p| p.0).collect()))
        }
        fn to_private(&self) -> Result<Option<Self>> {
            Ok(Some(self.clone()))
        }
    }

    fn receiver(batch_size: Option<usize>, join: Join, on_lag: OnLag) -> Receiver<Ids> {
        Receiver::new(ReceiverOptions {
            topic: "t".into(),
            batch_size,
            join,
            on_lag,
            max_held: 4,
            start: None,
        })
        .unwrap()
    }

    /// A producer's stream: `epochs[e]` holds the sizes of epoch e's batches; row ids
    /// are `epoch * 1_000_000 + row`.
    fn stream(epochs: &[Vec<usize>]) -> Vec<Inbound<Ids>> {
        let mut out = Vec::new();
        for (e, sizes) in epochs.iter().enumerate() {
            let mut row = 0u64;
            for (i, &n) in sizes.iter().enumerate() {
                let ids = (row..row + n as u64).map(|r| e as u64 * 1_000_000 + r);
                out.push(Inbound::Batch {
                    epoch: e as u64,
                    index: i as u64,
                    batch_rows: 0,
                    payload: Ids(ids.collect()),
                });
                row += n as u64;
            }
            out.push(Inbound::EndOfEpoch {
                epoch: e as u64,
                batches: sizes.len() as u64,
                rows: row,
            });
        }
        out.push(Inbound::EndOfStream);
        out
    }

    /// Everything the receiver hands out for `messages`, polling before each push.
    fn run(r: &mut Receiver<Ids>, messages: Vec<Inbound<Ids>>) -> Result<Vec<Outbound<Ids>>> {
        let mut out = Vec::new();
        for m in messages {
            while let Some(o) = r.poll()? {
                out.push(o);
            }
            r.push(m)?;
        }
        while let Some(o) = r.poll()? {
            let end = matches!(o, Outbound::End);
            out.push(o);
            if end {
                break;
            }
        }
        Ok(out)
    }

    /// Per epoch: its rows in the order handed out, the batch sizes, and the summary.
    type Seen = Vec<(Vec<u64>, Vec<usize>, EpochSummary)>;

    fn by_epoch(out: &[Outbound<Ids>]) -> (Seen, bool) {
        let mut seen = Vec::new();
        let (mut rows, mut sizes) = (Vec::new(), Vec::new());
        let mut ended = false;
        for o in out {
            match o {
                Outbound::Batch { payload, .. } => {
                    assert!(!ended, "a batch after the end");
                    sizes.push(payload.0.len());
                    rows.extend(&payload.0);
                }
                Outbound::EpochEnd(s) => seen.push((
                    std::mem::take(&mut rows),
                    std::mem::take(&mut sizes),
                    s.clone(),
                )),
                Outbound::End => ended = true,
            }
        }
        assert!(rows.is_empty(), "rows after the last end of epoch");
        (seen, ended)
    }

    fn sizes() -> impl Strategy<Value = Vec<Vec<usize>>> {
        prop::collection::vec(prop::collection::vec(1usize..20, 0..8), 1..4)
    }

    /// Epochs of `(batch_rows, rows)`: their batches, as [`stream`] takes them.
    fn cut(epochs: &[(usize, usize)]) -> Vec<Vec<usize>> {
        epochs
            .iter()
            .map(|&(b, rows)| {
                let mut sizes = vec![b; rows / b];
                if rows % b > 0 {
                    sizes.push(rows % b);
                }
                sizes
            })
            .collect()
    }

    /// The stream of [`cut`]`(epochs)`, with consecutive batches of each epoch sent
    /// together as messages of `groups[k]` batches (cycling; at least one).
    fn packed(epochs: &[(usize, usize)], groups: &[usize]) -> Vec<Inbound<Ids>> {
        let mut group = groups.iter().cycle().map(|&g| g.max(1));
        let mut out = Vec::new();
        for (e, (&(b, rows), sizes)) in epochs.iter().zip(cut(epochs)).enumerate() {
            let mut index = 0;
            while index < sizes.len() {
                let n = group.next().unwrap_or(1).min(sizes.len() - index);
                let first = (index * b) as u64;
                let len: usize = sizes[index..index + n].iter().sum();
                out.push(Inbound::Batch {
                    epoch: e as u64,
                    index: index as u64,
                    batch_rows: b as u64,
                    payload: Ids((first..first + len as u64)
                        .map(|r| e as u64 * 1_000_000 + r)
                        .collect()),
                });
                index += n;
            }
            out.push(Inbound::EndOfEpoch {
                epoch: e as u64,
                batches: sizes.len() as u64,
                rows: rows as u64,
            });
        }
        out.push(Inbound::EndOfStream);
        out
    }

    fn epochs_of_batches() -> impl Strategy<Value = Vec<(usize, usize)>> {
        prop::collection::vec((1usize..8, 0usize..60), 1..4)
    }

    proptest! {
        /// Every row of every epoch exactly once, in order, in the subscriber's batch
        /// size (only an epoch's last batch may be shorter), each epoch complete, then
        /// the end — whatever the producer's and the subscriber's batch sizes.
        #[test]
        fn every_row_once_in_any_batch_size(epochs in sizes(), size in prop::option::of(1usize..30)) {
            let mut r = receiver(size, Join::Now, OnLag::Error);
            let out = run(&mut r, stream(&epochs)).unwrap();
            let (seen, ended) = by_epoch(&out);
            prop_assert!(ended);
            prop_assert_eq!(seen.len(), epochs.len());
            for (e, ((rows, got, summary), produced)) in seen.iter().zip(&epochs).enumerate() {
                let total: usize = produced.iter().sum();
                let want: Vec<u64> = (0..total as u64).map(|r| e as u64 * 1_000_000 + r).collect();
                prop_assert_eq!(rows, &want);
                match size {
                    Some(n) => {
                        if let Some((last, full)) = got.split_last() {
                            prop_assert!(full.iter().all(|&s| s == n) && *last <= n && *last > 0);
                        }
                    }
                    None => prop_assert_eq!(got, produced),
                }
                prop_assert!(summary.complete, "{:?}", summary);
                prop_assert_eq!(summary.received_rows, total as u64);
                prop_assert_eq!(summary.received_batches, got.len() as u64);
            }
            // The end stays the end.
            prop_assert!(matches!(r.poll().unwrap(), Some(Outbound::End)));
        }

        /// A subscriber whose producer died after `cut` messages reconnects to a
        /// successor that replays the stream from its start: it sees exactly what an
        /// uninterrupted subscriber sees.
        #[test]
        fn a_reconnection_to_a_replaying_successor_has_no_duplicate_and_no_gap(
            epochs in sizes(), size in prop::option::of(1usize..30), cut in 0usize..40
        ) {
            let all = stream(&epochs);
            let cut = cut.min(all.len() - 1);
            let mut whole = receiver(size, Join::Now, OnLag::Error);
            let want = by_epoch(&run(&mut whole, stream(&epochs)).unwrap());
            let mut r = receiver(size, Join::Now, OnLag::Error);
            let mut out = Vec::new();
            for m in stream(&epochs).into_iter().take(cut) {
                while let Some(o) = r.poll().unwrap() {
                    out.push(o);
                }
                r.push(m).unwrap();
            }
            // What a transport that reconnects by itself says before the successor's
            // stream.
            let mut again = vec![Inbound::Reconnected];
            again.extend(stream(&epochs));
            out.extend(run(&mut r, again).unwrap());
            let got = by_epoch(&out);
            prop_assert_eq!(got.0.iter().map(|s| &s.0).collect::<Vec<_>>(), want.0.iter().map(|s| &s.0).collect::<Vec<_>>());
            prop_assert!(got.1);
        }

        /// Messages of several batches are the batches they hold, sent one by one:
        /// the subscriber sees the same batches, epochs and summaries, in any batch
        /// size.
        #[test]
        fn a_message_of_several_batches_is_its_batches_one_by_one(
            epochs in epochs_of_batches(),
            groups in prop::collection::vec(1usize..6, 1..5),
            size in prop::option::of(1usize..30),
        ) {
            let mut one_by_one = receiver(size, Join::Now, OnLag::Error);
            let want = by_epoch(&run(&mut one_by_one, stream(&cut(&epochs))).unwrap());
            let mut r = receiver(size, Join::Now, OnLag::Error);
            let got = by_epoch(&run(&mut r, packed(&epochs, &groups)).unwrap());
            prop_assert_eq!(got, want);
        }

        /// A subscriber reconnects to a successor whose messages group the batches
        /// otherwise: it takes exactly the batches it lacks, even from the middle of
        /// one of the successor's messages.
        #[test]
        fn a_successor_that_groups_batches_otherwise_continues_exactly(
            epochs in epochs_of_batches(),
            before in prop::collection::vec(1usize..6, 1..5),
            after in prop::collection::vec(1usize..6, 1..5),
            size in prop::option::of(1usize..30),
            stop in 0usize..40,
        ) {
            let mut whole = receiver(size, Join::Now, OnLag::Error);
            let want = by_epoch(&run(&mut whole, stream(&cut(&epochs))).unwrap());
            let first = packed(&epochs, &before);
            let stop = stop.min(first.len() - 1);
            let mut r = receiver(size, Join::Now, OnLag::Error);
            let mut out = Vec::new();
            for m in first.into_iter().take(stop) {
                while let Some(o) = r.poll().unwrap() {
                    out.push(o);
                }
                r.push(m).unwrap();
            }
            // A transport reports the loss once the subscriber asks for more.
            while let Some(o) = r.poll().unwrap() {
                out.push(o);
            }
            let mut again = vec![Inbound::Reconnected];
            again.extend(packed(&epochs, &after));
            out.extend(run(&mut r, again).unwrap());
            let got = by_epoch(&out);
            prop_assert_eq!(got.0.iter().map(|s| &s.0).collect::<Vec<_>>(), want.0.iter().map(|s| &s.0).collect::<Vec<_>>());
            prop_assert!(got.1);
        }

        /// Whatever arrives — epochs out of order, gaps, ends twice — the receiver never
        /// panics, and counts exactly the rows it hands out.
        #[test]
        fn arbitrary_messages_never_panic(
            messages in prop::collection::vec((0u8..6, 0u64..3, 0u64..6, 0usize..12), 0..60),
            size in prop::option::of(1usize..10),
            skip in any::<bool>(),
            join in 0u8..3,
        ) {
            let join = [Join::Now, Join::NextEpoch, Join::Replay][join as usize];
            let on_lag = if skip { OnLag::Skip } else { OnLag::Error };
            let mut r = receiver(size, join, on_lag);
            let mut handed = 0u64;
            for (kind, epoch, index, n) in messages {
                let m = match kind {
                    0 => Inbound::Batch { epoch, index, batch_rows: 0, payload: Ids((0..n as u64).collect()) },
                    1 => Inbound::Batch { epoch, index, batch_rows: (n % 4) as u64, payload: Ids((0..n as u64).collect()) },
                    2 => Inbound::EndOfEpoch { epoch, batches: index, rows: n as u64 },
                    3 => Inbound::Missed { messages: index + 1 },
                    4 => Inbound::EndOfStream,
                    _ => Inbound::Reconnected,
                };
                if kind == 4 && index == 0 {
                    r.reconnecting().unwrap();
                }
                loop {
                    match r.poll() {
                        Ok(Some(Outbound::Batch { payload, .. })) => handed += payload.0.len() as u64,
                        Ok(Some(Outbound::End)) | Ok(None) | Err(_) => break,
                        Ok(Some(_)) => {}
                    }
                }
                if r.push(m).is_err() {
                    break;
                }
            }
            while let Ok(Some(o)) = r.poll() {
                match o {
                    Outbound::Batch { payload, .. } => handed += payload.0.len() as u64,
                    Outbound::End => break,
                    Outbound::EpochEnd(_) => {}
                }
            }
            prop_assert_eq!(r.total_rows(), handed);
        }
    }

    #[test]
    fn joining_mid_epoch_flags_that_epoch_partial_and_the_next_complete() {
        let all = stream(&[vec![5, 5, 5], vec![4, 4]]);
        let mut r = receiver(Some(3), Join::Now, OnLag::Error);
        let (seen, ended) = by_epoch(&run(&mut r, all.into_iter().skip(1).collect()).unwrap());
        assert!(ended);
        assert_eq!(seen[0].0, (5..15).collect::<Vec<u64>>());
        assert!(!seen[0].2.complete && seen[0].2.received_rows == 10 && seen[0].2.rows == 15);
        assert!(seen[1].2.complete && seen[1].2.received_rows == 8);
    }

    #[test]
    fn next_epoch_waits_for_the_next_epochs_first_batch() {
        let all = stream(&[vec![5, 5, 5], vec![4, 4]]);
        let mut r = receiver(None, Join::NextEpoch, OnLag::Error);
        let (seen, _) = by_epoch(&run(&mut r, all.into_iter().skip(1).collect()).unwrap());
        assert_eq!(seen.len(), 1);
        assert_eq!(seen[0].2.epoch, 1);
        assert!(seen[0].2.complete);
    }

    #[test]
    fn a_gap_is_an_error_by_default_and_nothing_more_is_accepted() {
        let mut r = receiver(None, Join::Now, OnLag::Error);
        let err = r.push(Inbound::Missed { messages: 3 }).unwrap_err();
        assert!(
            matches!(err, SluiceError::Lagged { missed: 3, .. }),
            "{err}"
        );
        assert!(r.is_closed());
        assert!(r.push(Inbound::EndOfStream).is_err());
    }

    #[test]
    fn a_skipped_gap_and_a_lost_end_of_epoch_close_the_epoch_incomplete() {
        let mut all = stream(&[vec![5, 5, 5], vec![4]]);
        // Batch 2 and the end of epoch 0 were lost: two messages.
        all.drain(2..4);
        all.insert(2, Inbound::Missed { messages: 2 });
        let mut r = receiver(Some(4), Join::Now, OnLag::Skip);
        let (seen, ended) = by_epoch(&run(&mut r, all).unwrap());
        assert!(ended);
        assert_eq!(seen[0].0, (0..10).collect::<Vec<u64>>());
        assert!(!seen[0].2.complete && seen[0].2.missed == 2);
        assert!(seen[1].2.complete && seen[1].0 == (1_000_000..1_000_004).collect::<Vec<u64>>());
        assert_eq!(r.total_missed(), 2);
    }

    #[test]
    fn a_successor_that_resumes_past_the_subscriber_is_a_resume_gap() {
        let mut r = receiver(None, Join::Now, OnLag::Error);
        let mut all = stream(&[vec![5, 5, 5, 5]]);
        run_until(&mut r, all.drain(..2));
        r.reconnecting().unwrap();
        let err = r.push(all.remove(1)).unwrap_err();
        assert!(matches!(err, SluiceError::ResumeGap { .. }), "{err}");
    }

    #[test]
    fn a_message_pushed_before_the_last_was_polled_waits_its_turn() {
        let mut r = receiver(None, Join::Now, OnLag::Error);
        for m in packed(&[(2, 6)], &[3]) {
            r.push(m).unwrap();
        }
        let mut out = Vec::new();
        while let Some(o) = r.poll().unwrap() {
            let end = matches!(o, Outbound::End);
            out.push(o);
            if end {
                break;
            }
        }
        let (seen, ended) = by_epoch(&out);
        assert!(ended);
        assert_eq!(seen[0].0, (0..6).collect::<Vec<u64>>());
        assert_eq!(seen[0].1, [2, 2, 2]);
        assert!(seen[0].2.complete, "{:?}", seen[0].2);
    }

    #[test]
    fn positions_past_the_last_are_corrupt_not_a_panic() {
        for message in [
            Inbound::Batch {
                epoch: 0,
                index: u64::MAX,
                batch_rows: 0,
                payload: Ids(vec![1]),
            },
            Inbound::EndOfEpoch {
                epoch: u64::MAX,
                batches: 1,
                rows: 1,
            },
        ] {
            let mut r = receiver(None, Join::Now, OnLag::Error);
            r.push(Inbound::Batch {
                epoch: 0,
                index: 0,
                batch_rows: 0,
                payload: Ids(vec![0]),
            })
            .unwrap();
            while r.poll().unwrap().is_some() {}
            r.reconnecting().unwrap();
            let err = r.push(message).unwrap_err();
            assert!(matches!(err, SluiceError::Corrupt(_)), "{err}");
        }
    }

    /// A transport that reports a reconnection while batches of the old producer's last
    /// message wait: they go first, then the successor's stream, filtered.
    #[test]
    fn a_reconnection_waits_for_the_rest_of_the_last_message() {
        let mut r = receiver(None, Join::Now, OnLag::Error);
        let all = packed(&[(2, 8)], &[4]);
        r.push(all.into_iter().next().unwrap()).unwrap();
        let mut out = vec![r.poll().unwrap().unwrap()];
        r.reconnecting().unwrap();
        out.extend(run(&mut r, packed(&[(2, 8)], &[1])).unwrap());
        let (seen, ended) = by_epoch(&out);
        assert!(ended);
        assert_eq!(seen[0].0, (0..8).collect::<Vec<u64>>());
        assert!(seen[0].2.complete, "{:?}", seen[0].2);
    }

    /// Rows that know whether they were copied out of the transport's memory.
    #[derive(Debug, Clone)]
    struct Held {
        rows: usize,
        private: bool,
    }

    impl Rows for Held {
        fn num_rows(&self) -> usize {
            self.rows
        }
        fn slice(&self, _offset: usize, len: usize) -> Self {
            Self { rows: len, ..*self }
        }
        fn concat(parts: Vec<Self>) -> Result<Self> {
            Ok(Self {
                rows: parts.iter().map(|p| p.rows).sum(),
                private: true,
            })
        }
        fn to_private(&self) -> Result<Option<Self>> {
            Ok(Some(Self {
                private: true,
                ..*self
            }))
        }
    }

    /// A reconnection copies out every row still held in the old producer's memory at
    /// once, wherever it waits (the old topic must be let go before the successor can
    /// create it), even while batches of its last message wait to be judged.
    #[test]
    fn a_reconnection_copies_out_what_waits_anywhere() {
        let mut r = Receiver::new(ReceiverOptions {
            topic: "t".into(),
            batch_size: Some(3),
            join: Join::Now,
            on_lag: OnLag::Error,
            max_held: 4,
            start: None,
        })
        .unwrap();
        let message = |index| Inbound::Batch {
            epoch: 0,
            index,
            batch_rows: 2,
            payload: Held {
                rows: 8,
                private: false,
            },
        };
        // Two messages pushed without polling: the second waits whole in `deferred`.
        r.push(message(0)).unwrap();
        r.push(message(4)).unwrap();
        assert!(matches!(r.poll().unwrap(), Some(Outbound::Batch { .. })));
        r.reconnecting().unwrap();
        for deferred in &r.deferred {
            if let Deferred::Message(Inbound::Batch { payload, .. })
            | Deferred::Rest { payload, .. } = deferred
            {
                assert!(payload.private, "{deferred:?}");
            }
        }
        assert!(r.ready.iter().all(|p| p.private));
        let rebatcher = r.rebatcher.as_ref().unwrap();
        assert!(rebatcher.pending_rows() > 0 && rebatcher.pending_inputs() == 0);
        assert!(matches!(
            r.deferred.back(),
            Some(Deferred::Message(Inbound::Reconnected))
        ));
        // Everything still comes out, in 3-row batches (one row left for the epoch's end).
        let mut rows = 3;
        while let Some(out) = r.poll().unwrap() {
            if let Outbound::Batch { payload, .. } = out {
                assert_eq!(payload.rows, 3);
                rows += payload.rows;
            }
        }
        assert_eq!(rows + r.rebatcher.as_ref().unwrap().pending_rows(), 16);
    }

    /// An outlet of a transport without messages of several batches (a device topic's),
    /// recording what it sends.
    #[derive(Default)]
    struct OneByOne(Vec<(u64, Ids)>);

    impl Outlet<Ids> for OneByOne {
        fn batch(&mut self, _epoch: u64, index: u64, payload: &Ids) -> Result<()> {
            self.0.push((index, payload.clone()));
            Ok(())
        }
        fn end_of_epoch(&mut self, _epoch: u64, _batches: u64, _rows: u64) -> Result<()> {
            Ok(())
        }
        fn end_of_stream(&mut self, _epochs: u64) -> Result<()> {
            Ok(())
        }
    }

    #[test]
    fn a_message_goes_batch_by_batch_where_a_transport_carries_one_and_an_empty_one_still_goes() {
        let mut out = OneByOne::default();
        out.message(0, 4, 3, &Ids((0..8).collect()), true).unwrap();
        out.message(0, 7, 0, &Ids(vec![]), false).unwrap();
        out.message(0, 8, 5, &Ids(vec![8, 9]), false).unwrap();
        let expected = [
            (4, vec![0, 1, 2]),
            (5, vec![3, 4, 5]),
            (6, vec![6, 7]),
            (7, vec![]),
            (8, vec![8, 9]),
        ];
        let got: Vec<_> = out.0.into_iter().map(|(i, ids)| (i, ids.0)).collect();
        assert_eq!(got, expected.to_vec());
    }

    #[test]
    fn a_message_claiming_more_batches_than_there_are_positions_is_corrupt() {
        let mut r = receiver(None, Join::Now, OnLag::Error);
        r.push(Inbound::Batch {
            epoch: 0,
            index: u64::MAX,
            batch_rows: 1,
            payload: Ids(vec![1, 2]),
        })
        .unwrap_err();
        assert!(r.is_closed());
    }

    fn run_until(r: &mut Receiver<Ids>, messages: impl Iterator<Item = Inbound<Ids>>) {
        for m in messages {
            while r.poll().unwrap().is_some() {}
            r.push(m).unwrap();
        }
        while r.poll().unwrap().is_some() {}
    }

    /// Every row handed out, in order, and the consumed position after each event.
    fn rows_and_positions(
        mut r: Receiver<Ids>,
        messages: Vec<Inbound<Ids>>,
    ) -> (Vec<u64>, Vec<(usize, Option<RowPosition>)>) {
        let (mut rows, mut positions) = (Vec::new(), Vec::new());
        let mut take = |r: &mut Receiver<Ids>| {
            while let Some(o) = r.poll().unwrap() {
                if let Outbound::Batch { payload, .. } = &o {
                    rows.extend(&payload.0);
                }
                positions.push((rows.len(), r.consumed()));
                if matches!(o, Outbound::End) {
                    break;
                }
            }
        };
        for m in messages {
            take(&mut r);
            r.push(m).unwrap();
        }
        take(&mut r);
        (rows, positions)
    }

    proptest! {
        /// A trainer that saves its position after any event and starts again from it
        /// gets exactly the rows it had not been handed, whatever its batch size, from a
        /// stream that replays everything from the start.
        #[test]
        fn a_subscriber_started_at_its_consumed_position_gets_exactly_the_rest(
            epochs in sizes(),
            size in prop::option::of(1usize..7),
            at in 0usize..200,
        ) {
            let (all, positions) = rows_and_positions(receiver(size, Join::Now, OnLag::Error), stream(&epochs));
            let (done, position) = positions[at % positions.len()];
            let Some(start) = position else {
                prop_assert_eq!(done, 0);
                return Ok(());
            };
            let r = Receiver::new(ReceiverOptions {
                topic: "t".into(),
                batch_size: size,
                join: Join::NextEpoch,
                on_lag: OnLag::Error,
                max_held: 4,
                start: Some(start),
            })
            .unwrap();
            let (rest, _) = rows_and_positions(r, stream(&epochs));
            prop_assert_eq!(&rest[..], &all[done..]);
        }
    }

    #[test]
    fn a_stream_that_starts_after_the_start_position_is_a_gap() {
        let mut r = Receiver::new(ReceiverOptions {
            topic: "t".into(),
            batch_size: None,
            join: Join::Now,
            on_lag: OnLag::Error,
            max_held: 4,
            start: Some(RowPosition::new(0, 2, 1)),
        })
        .unwrap();
        let err = r.push(Inbound::Batch {
            epoch: 0,
            index: 3,
            batch_rows: 0,
            payload: Ids(vec![7]),
        });
        assert!(matches!(err, Err(SluiceError::ResumeGap { .. })), "{err:?}");
    }
}
