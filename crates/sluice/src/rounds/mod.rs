//! Rounds: a run of several snapshots of growing data, each started by a trigger and
//! planned with the trainers' feedback (see docs/rounds.md).

mod feedback;
mod log;
mod source;

pub use feedback::{FeedbackWriter, feedback_dir};
pub use log::{RoundEntry, RoundLog};
pub(crate) use source::RoundSource;
pub use source::{NEW_ROWS_KEY, ROUND_KEY, TRIGGER_KEY, request_round};
