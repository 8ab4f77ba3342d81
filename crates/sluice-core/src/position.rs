//! Positions in a stream, and the rule that makes a restarted producer's stream join
//! seamlessly onto what a subscriber already received.
//!
//! Every producer batch has a position `(epoch, index)`, and the order of rows depends
//! only on the plan, the seed and the epoch; so a producer restarted from a checkpoint
//! republishes exactly the batches it published before from that position on. A
//! subscriber that reconnects remembers the position it has reached and runs the new
//! producer's messages through a [`Resume`] filter:
//!
//! ```text
//!   new producer:   (e, c) (e, c+1) … (e, p) (e, p+1) …     c = checkpoint, p = reached
//!   subscriber:      skip   skip      skip    deliver  …
//!   c > p (the checkpoint is ahead of the subscriber): a gap, reported as an error
//! ```
//!
//! The producer writes a checkpoint only once a batch has reached every live
//! subscriber's queue, so with the default pace (no lag limit) a checkpoint is never
//! ahead of a subscriber that drained its queue: restarts cause duplicates on the wire,
//! which the filter drops, and never gaps.

use std::fmt;

/// Where a stream is: the next producer batch expected is batch `index` of `epoch`.
///
/// Positions order by epoch, then index. `(e, n)` where `n` is the number of batches of
/// epoch `e` means "every batch of epoch `e` is done, its end is not yet seen";
/// the end of epoch `e` moves the position to `(e + 1, 0)`.
#[derive(Debug, Clone, Copy, Default, PartialEq, Eq, PartialOrd, Ord, Hash)]
pub struct Position {
    /// The epoch, from 0.
    pub epoch: u64,
    /// The index of the next batch within the epoch.
    pub index: u64,
}

impl Position {
    /// The position `(epoch, index)`.
    pub const fn new(epoch: u64, index: u64) -> Self {
        Self { epoch, index }
    }

    /// The position after the batch at `self`.
    pub const fn next_batch(self) -> Self {
        Self::new(self.epoch, self.index.saturating_add(1))
    }

    /// The position after the end of this epoch.
    pub const fn next_epoch(self) -> Self {
        Self::new(self.epoch.saturating_add(1), 0)
    }
}

impl fmt::Display for Position {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        write!(f, "epoch {} batch {}", self.epoch, self.index)
    }
}

/// Where a subscriber is, to the row: the next row it needs is row `row` of producer
/// batch `index` of `epoch` (rows counted in the producer's batch, which may hold more
/// than the subscriber's batches). What a trainer's saved state holds: rows before it
/// were consumed, rows from it on were not.
#[derive(Debug, Clone, Copy, Default, PartialEq, Eq, PartialOrd, Ord, Hash)]
pub struct RowPosition {
    /// The epoch, from 0.
    pub epoch: u64,
    /// The producer batch within the epoch.
    pub index: u64,
    /// The row within that batch.
    pub row: u64,
}

impl RowPosition {
    /// Row `row` of batch `index` of `epoch`.
    pub const fn new(epoch: u64, index: u64, row: u64) -> Self {
        Self { epoch, index, row }
    }

    /// The producer batch the position is in.
    pub const fn batch(self) -> Position {
        Position::new(self.epoch, self.index)
    }
}

impl From<Position> for RowPosition {
    fn from(p: Position) -> Self {
        Self::new(p.epoch, p.index, 0)
    }
}

impl fmt::Display for RowPosition {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        write!(
            f,
            "epoch {} batch {} row {}",
            self.epoch, self.index, self.row
        )
    }
}

/// What to do with a message from a (possibly restarted) producer.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum Verdict {
    /// New to this subscriber: deliver it.
    Deliver,
    /// Already delivered before the producer restarted: drop it.
    Duplicate,
    /// The producer resumed after the subscriber's position: the messages in between
    /// are lost to this subscriber.
    Gap {
        /// Where the subscriber was.
        expected: Position,
        /// Where the producer resumed.
        found: Position,
    },
}

/// Tracks the position a subscriber has reached and filters a resumed producer's
/// messages against it. Pure: no I/O, testable on its own.
#[derive(Debug, Clone, Default)]
pub struct Resume {
    /// The next position this subscriber needs; `None` before its first message.
    reached: Option<Position>,
    /// Set after a reconnection until the first message that is not a duplicate.
    resuming: bool,
}

impl Resume {
    /// A filter that has seen nothing yet.
    pub fn new() -> Self {
        Self::default()
    }

    /// A filter for a subscriber that starts at `at` (a trainer's saved position):
    /// messages before it are duplicates, the first one after it a gap.
    pub fn starting_at(at: Position) -> Self {
        Self {
            reached: Some(at),
            resuming: true,
        }
    }

    /// The next position this subscriber needs, once it has received anything.
    pub fn reached(&self) -> Option<Position> {
        self.reached
    }

    /// Whether a reconnection is waiting for its first new message.
    pub fn is_resuming(&self) -> bool {
        self.resuming
    }

    /// The producer went away and the subscriber is attaching to its successor: from now
    /// on, messages before the reached position are duplicates.
    pub fn reconnecting(&mut self) {
        self.resuming = self.reached.is_some();
    }

    /// Judges the batch at `at`; records it as reached when it is delivered.
    pub fn batch(&mut self, at: Position) -> Verdict {
        self.judge(at, at.next_batch())
    }

    /// Judges the end of `epoch`, which had `batches` batches.
    pub fn end_of_epoch(&mut self, epoch: u64, batches: u64) -> Verdict {
        self.judge(
            Position::new(epoch, batches),
            Position::new(epoch, batches).next_epoch(),
        )
    }

    fn judge(&mut self, at: Position, after: Position) -> Verdict {
        let Some(reached) = self.reached.filter(|_| self.resuming) else {
            // Not resuming: the transport already guarantees order without gaps (or
            // reports gaps itself, under a lag limit).
            self.reached = Some(after);
            return Verdict::Deliver;
        };
        if at < reached {
            return Verdict::Duplicate;
        }
        self.resuming = false;
        self.reached = Some(after);
        if at == reached {
            Verdict::Deliver
        } else {
            Verdict::Gap {
                expected: reached,
                found: at,
            }
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn without_a_reconnection_everything_is_delivered() {
        let mut r = Resume::new();
        assert_eq!(r.batch(Position::new(0, 5)), Verdict::Deliver);
        assert_eq!(r.batch(Position::new(0, 6)), Verdict::Deliver);
        assert_eq!(r.end_of_epoch(0, 7), Verdict::Deliver);
        assert_eq!(r.reached(), Some(Position::new(1, 0)));
    }

    #[test]
    fn a_resumed_producer_s_repeats_are_dropped_until_the_reached_position() {
        let mut r = Resume::new();
        for i in 0..10 {
            assert_eq!(r.batch(Position::new(2, i)), Verdict::Deliver);
        }
        r.reconnecting();
        assert!(r.is_resuming());
        for i in 4..10 {
            assert_eq!(
                r.batch(Position::new(2, i)),
                Verdict::Duplicate,
                "batch {i}"
            );
        }
        assert_eq!(r.batch(Position::new(2, 10)), Verdict::Deliver);
        assert!(!r.is_resuming());
        assert_eq!(r.batch(Position::new(2, 11)), Verdict::Deliver);
    }

    #[test]
    fn an_epoch_end_already_seen_is_a_duplicate_and_the_next_epoch_is_delivered() {
        let mut r = Resume::new();
        assert_eq!(r.batch(Position::new(0, 0)), Verdict::Deliver);
        assert_eq!(r.end_of_epoch(0, 1), Verdict::Deliver);
        r.reconnecting();
        assert_eq!(r.batch(Position::new(0, 0)), Verdict::Duplicate);
        assert_eq!(r.end_of_epoch(0, 1), Verdict::Duplicate);
        assert_eq!(r.batch(Position::new(1, 0)), Verdict::Deliver);
    }

    #[test]
    fn the_end_of_an_epoch_whose_batches_were_all_seen_is_delivered() {
        let mut r = Resume::new();
        assert_eq!(r.batch(Position::new(0, 0)), Verdict::Deliver);
        assert_eq!(r.batch(Position::new(0, 1)), Verdict::Deliver);
        r.reconnecting();
        assert_eq!(r.batch(Position::new(0, 1)), Verdict::Duplicate);
        assert_eq!(r.end_of_epoch(0, 2), Verdict::Deliver);
    }

    #[test]
    fn a_producer_that_resumes_past_the_subscriber_is_a_gap() {
        let mut r = Resume::new();
        assert_eq!(r.batch(Position::new(1, 3)), Verdict::Deliver);
        r.reconnecting();
        assert_eq!(
            r.batch(Position::new(1, 6)),
            Verdict::Gap {
                expected: Position::new(1, 4),
                found: Position::new(1, 6)
            }
        );
        assert_eq!(
            r.batch(Position::new(1, 7)),
            Verdict::Deliver,
            "one gap is reported once"
        );
    }

    #[test]
    fn a_subscriber_that_had_received_nothing_takes_the_new_stream_as_it_comes() {
        let mut r = Resume::new();
        r.reconnecting();
        assert!(!r.is_resuming());
        assert_eq!(r.batch(Position::new(3, 9)), Verdict::Deliver);
    }
}
