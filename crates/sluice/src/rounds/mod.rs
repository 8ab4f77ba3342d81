//! Rounds: a run of several snapshots of growing data, each started by a trigger and
//! planned with the trainers' feedback (see docs/rounds.md).

mod feedback;
mod log;
mod source;

pub use feedback::{FeedbackWriter, feedback_dir};
pub use log::{RoundEntry, RoundLog};
pub(crate) use source::RoundSource;
pub use source::{NEW_ROWS_KEY, ROUND_KEY, TRIGGER_KEY, request_round, round_of};

use std::time::{Duration, SystemTime, UNIX_EPOCH};

/// Microseconds since the Unix epoch, as the round log and `sluice_feedback` keep times.
pub(crate) fn to_us(t: SystemTime) -> i64 {
    t.duration_since(UNIX_EPOCH)
        .map_or(0, |d| i64::try_from(d.as_micros()).unwrap_or(i64::MAX))
}

/// The time `us` microseconds after the Unix epoch (the epoch itself for a negative one).
pub(crate) fn from_us(us: i64) -> SystemTime {
    UNIX_EPOCH + Duration::from_micros(u64::try_from(us).unwrap_or(0))
}
