//! Producer checkpoints: where a run is, so that a restarted producer resumes there.
//!
//! A checkpoint at position `(epoch, batch)` says that every batch before it reached
//! the queue of every live subscriber. It is written at most every
//! [`CHECKPOINT_INTERVAL`] and at every epoch end, atomically (a temporary file renamed
//! over the old one), so a crash leaves either the old or the new one, never half of
//! one. A checkpoint older than the crash only means the resumed producer republishes a
//! few batches that subscribers then drop as duplicates
//! ([`sluice_core::position::Resume`]). A run that ends, fails or is stopped removes its
//! checkpoint: only a crash leaves one behind.

use std::path::{Path, PathBuf};
use std::time::{Duration, Instant};

use serde::{Deserialize, Serialize};
use sluice_core::{Position, Result, SluiceError, TopicName};
use sluice_shm::Namespace;

/// How often, at most, a checkpoint is written while batches flow.
pub const CHECKPOINT_INTERVAL: Duration = Duration::from_millis(100);

const VERSION: u32 = 1;

/// The saved state of a run.
#[derive(Debug, Clone, PartialEq, Eq, Serialize, Deserialize)]
pub struct Checkpoint {
    /// Format version.
    pub version: u32,
    /// The topic the run published on.
    pub topic: String,
    /// Hash of the plan's fingerprint ([`sluice_plan::Plan::fingerprint`]).
    pub plan: String,
    /// The next epoch to publish.
    pub epoch: u64,
    /// The next batch of that epoch to publish.
    pub batch: u64,
}

impl Checkpoint {
    /// The position to resume from.
    pub fn position(&self) -> Position {
        Position::new(self.epoch, self.batch)
    }

    /// The default checkpoint file of `topic` in `namespace`.
    pub fn default_path(namespace: &Namespace, topic: &TopicName) -> PathBuf {
        namespace
            .state_dir()
            .join(format!("{topic}.checkpoint.json"))
    }

    /// Reads the checkpoint at `path`; `None` if there is none.
    pub fn load(path: &Path) -> Result<Option<Self>> {
        let text = match std::fs::read_to_string(path) {
            Ok(text) => text,
            Err(e) if e.kind() == std::io::ErrorKind::NotFound => return Ok(None),
            Err(e) => {
                return Err(SluiceError::io(
                    format!("cannot read checkpoint {}", path.display()),
                    e,
                ));
            }
        };
        let checkpoint: Self = serde_json::from_str(&text).map_err(|e| {
            SluiceError::Config(format!(
                "checkpoint {} is unreadable ({e}); remove it to start from the beginning",
                path.display()
            ))
        })?;
        if checkpoint.version != VERSION {
            return Err(SluiceError::Config(format!(
                "checkpoint {} has version {}, this Sluice writes version {VERSION}; remove it to start over",
                path.display(),
                checkpoint.version
            )));
        }
        Ok(Some(checkpoint))
    }

    /// Checks that this checkpoint was taken by the same plan on the same topic.
    pub fn check(&self, path: &Path, topic: &TopicName, plan: &str) -> Result<()> {
        if self.topic != topic.as_str() || self.plan != plan {
            return Err(SluiceError::Config(format!(
                "checkpoint {} was taken by another plan or topic ('{}'); resuming it would publish \
                 different batches. Run without --resume to start over, or pass the plan that took it",
                path.display(),
                self.topic
            )));
        }
        Ok(())
    }
}

/// Writes a run's checkpoints to one file.
#[derive(Debug)]
pub(crate) struct CheckpointWriter {
    path: PathBuf,
    tmp: PathBuf,
    topic: String,
    plan: String,
    last: Option<Instant>,
}

impl CheckpointWriter {
    pub(crate) fn new(path: PathBuf, topic: &TopicName, plan: String) -> Result<Self> {
        if let Some(dir) = path.parent().filter(|d| !d.as_os_str().is_empty()) {
            use std::os::unix::fs::DirBuilderExt;
            // Owner-only, like everything else of a namespace.
            std::fs::DirBuilder::new()
                .recursive(true)
                .mode(0o700)
                .create(dir)
                .map_err(|e| {
                    SluiceError::io(
                        format!("cannot create checkpoint directory {}", dir.display()),
                        e,
                    )
                })?;
        }
        let mut tmp = path.clone().into_os_string();
        tmp.push(".tmp");
        Ok(Self {
            tmp: tmp.into(),
            path,
            topic: topic.to_string(),
            plan,
            last: None,
        })
    }

    /// Records `at` if the last write is older than [`CHECKPOINT_INTERVAL`] (or `force`).
    pub(crate) fn record(&mut self, at: Position, force: bool) -> Result<()> {
        if !force && self.last.is_some_and(|t| t.elapsed() < CHECKPOINT_INTERVAL) {
            return Ok(());
        }
        let checkpoint = Checkpoint {
            version: VERSION,
            topic: self.topic.clone(),
            plan: self.plan.clone(),
            epoch: at.epoch,
            batch: at.index,
        };
        let text = serde_json::to_string(&checkpoint)
            .map_err(|e| SluiceError::Internal(format!("cannot encode a checkpoint: {e}")))?;
        let io = |e| {
            SluiceError::io(
                format!("cannot write checkpoint {}", self.path.display()),
                e,
            )
        };
        std::fs::write(&self.tmp, text).map_err(io)?;
        std::fs::rename(&self.tmp, &self.path).map_err(io)?;
        self.last = Some(Instant::now());
        Ok(())
    }

    /// The run is over (finished, failed or stopped): nothing to resume.
    pub(crate) fn remove(&self) {
        let _ = std::fs::remove_file(&self.tmp);
        if let Err(e) = std::fs::remove_file(&self.path)
            && e.kind() != std::io::ErrorKind::NotFound
        {
            tracing::warn!("cannot remove checkpoint {}: {e}", self.path.display());
        }
    }
}
