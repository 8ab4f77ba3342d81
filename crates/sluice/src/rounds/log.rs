//! The record of a run's rounds (`<state>/<topic>.rounds.json`): for each round what
//! started it, its listing cutoff and digest, and the feedback files it read, so that a
//! producer resumed in the middle of a round plans exactly that round again.

use std::path::{Path, PathBuf};

use serde::{Deserialize, Serialize};
use sluice_core::{Result, SluiceError, TopicName};
use sluice_plan::rounds::RoundRow;
use sluice_shm::Namespace;

const VERSION: u32 = 1;

/// One round as it started.
#[derive(Debug, Clone, PartialEq, Eq, Serialize, Deserialize)]
pub struct RoundEntry {
    /// Its number, from 0.
    pub round: u64,
    /// What started it.
    pub trigger: String,
    /// When, in microseconds since the Unix epoch.
    pub started_us: i64,
    /// Rows in the plan's tables then, and more than at the previous round.
    pub rows: u64,
    /// See `rows`.
    pub new_rows: u64,
    /// Files modified after this (microseconds since the Unix epoch) were left out.
    pub cutoff_us: i64,
    /// The digest of the files it listed (`sluice explain`'s listing).
    pub listing: String,
    /// The files it listed (paths in their stores).
    pub files: Vec<String>,
    /// The feedback files written since the round before (it read these and theirs).
    pub feedback: Vec<String>,
}

impl RoundEntry {
    /// Its row in `sluice_round`.
    pub fn row(&self) -> RoundRow {
        RoundRow {
            round: self.round,
            trigger: self.trigger.clone(),
            started_us: self.started_us,
            rows: self.rows,
            new_rows: self.new_rows,
        }
    }
}

/// The rounds of a run so far.
#[derive(Debug, Clone, Default, PartialEq, Eq, Serialize, Deserialize)]
pub struct RoundLog {
    version: u32,
    topic: String,
    /// The hash of the plan the rounds ran (a resumed run must run the same).
    plan: String,
    /// The rounds, in order.
    pub rounds: Vec<RoundEntry>,
}

impl RoundLog {
    /// A new log of `topic`'s run of the plan hashed `plan`.
    pub fn new(topic: &TopicName, plan: &str) -> Self {
        Self {
            version: VERSION,
            topic: topic.to_string(),
            plan: plan.to_string(),
            rounds: Vec::new(),
        }
    }

    /// Where the log of `topic` is.
    pub fn path(namespace: &Namespace, topic: &TopicName) -> PathBuf {
        namespace.state_dir().join(format!("{topic}.rounds.json"))
    }

    /// The log at `path` of `topic`'s run of `plan`, if there is one.
    pub fn load(path: &Path, topic: &TopicName, plan: &str) -> Result<Option<Self>> {
        let Some(text) = crate::checkpoint::read_state(path, "round log")? else {
            return Ok(None);
        };
        let log: Self = serde_json::from_str(&text).map_err(|e| {
            SluiceError::Corrupt(format!("round log {} is unreadable: {e}", path.display()))
        })?;
        if log.version != VERSION || log.topic != topic.as_str() || log.plan != plan {
            return Err(SluiceError::Config(format!(
                "the round log {} is of another plan or topic than this run's: start without \
                 --resume (a new run), or resume with the plan that wrote it",
                path.display()
            )));
        }
        Ok(Some(log))
    }

    /// Writes the log (owner-only, atomically).
    pub fn write(&self, path: &Path) -> Result<()> {
        let text = serde_json::to_string_pretty(self)
            .map_err(|e| SluiceError::Internal(format!("cannot encode a round log: {e}")))?;
        crate::checkpoint::write_state(path, text.as_bytes())
    }

    /// Round `round`, if it started.
    pub fn get(&self, round: u64) -> Option<&RoundEntry> {
        self.rounds.iter().find(|r| r.round == round)
    }

    /// The feedback files of the rounds before `round`.
    pub fn feedback_before(&self, round: u64) -> Vec<String> {
        self.rounds
            .iter()
            .filter(|r| r.round < round)
            .flat_map(|r| r.feedback.iter().cloned())
            .collect()
    }

    /// The rows of `sluice_round` up to `round`.
    pub fn rows(&self, round: u64) -> Vec<RoundRow> {
        self.rounds
            .iter()
            .filter(|r| r.round <= round)
            .map(RoundEntry::row)
            .collect()
    }
}
