//! Where a run starts: the beginning, or the checkpoint a crashed run left.

use std::collections::BTreeMap;
use std::path::PathBuf;

use sluice_core::{Position, Result, SluiceError, TopicName};
use sluice_plan::Plan;
use sluice_shm::Namespace;

use super::RunOptions;
use crate::checkpoint::{Checkpoint, CheckpointWriter, DataListing};
use crate::cursor::PlanRecord;

/// A run's start and the identity its checkpoints carry.
#[derive(Debug)]
pub(crate) struct StartPoint {
    /// Where the run starts.
    pub position: Position,
    path: PathBuf,
    fingerprint: String,
    settings: BTreeMap<String, String>,
    data: DataListing,
}

impl StartPoint {
    /// The start of a run of `plan` on `topic`: with [`RunOptions::resume`], the
    /// checkpoint a crashed run left (refused if another plan or other settings took
    /// it), else the beginning.
    pub(crate) fn resolve(
        plan: &Plan,
        namespace: &Namespace,
        topic: &TopicName,
        options: &RunOptions,
        data: DataListing,
    ) -> Result<Self> {
        let fingerprint = crate::cursor::plan_hash(plan);
        let settings: BTreeMap<_, _> = plan.sequence_settings().into_iter().collect();
        let path = match &options.checkpoint {
            Some(path) => path.clone(),
            // The namespace's state directory: checked to be this user's alone before a
            // checkpoint in it is trusted (or written).
            None => {
                namespace.prepare_state_dir()?;
                Checkpoint::default_path(namespace, topic)
            }
        };
        let position = if options.resume {
            match Checkpoint::load(&path)? {
                Some(c) => {
                    c.check(&path, topic, &fingerprint, &settings, &data)?;
                    within_epochs(&c, &path, plan.options().total_epochs())?;
                    tracing::info!(topic = %topic, "resuming from {}", c.position());
                    c.position()
                }
                None => {
                    tracing::info!(
                        "no checkpoint at {}: starting from the beginning",
                        path.display()
                    );
                    Position::default()
                }
            }
        } else {
            Position::default()
        };
        Ok(Self {
            position,
            path,
            fingerprint,
            settings,
            data,
        })
    }

    /// The hash of the plan's fingerprint.
    pub(crate) fn plan_hash(&self) -> &str {
        &self.fingerprint
    }

    /// The writer of this run's checkpoints; it also leaves the plan's record for
    /// trainers that catch up ([`PlanRecord`]), and removes both when the run ends.
    pub(crate) fn writer(
        self,
        plan: &Plan,
        namespace: &Namespace,
        topic: &TopicName,
    ) -> Result<CheckpointWriter> {
        namespace.prepare_state_dir()?;
        let record = PlanRecord::path(namespace, topic);
        PlanRecord::new(plan, topic, &self.fingerprint, &self.data).write(&record)?;
        let writer =
            CheckpointWriter::new(self.path, topic, self.fingerprint, self.settings, self.data)?;
        Ok(writer.with_record(record))
    }
}

/// A checkpoint past the end of this run (taken by a run of more epochs) would resume to
/// publish nothing and be removed: refused, saying what to set. One just at its end
/// (a crash after the last batch) resumes to end the stream.
fn within_epochs(checkpoint: &Checkpoint, path: &std::path::Path, epochs: u64) -> Result<()> {
    let at = checkpoint.position();
    if at.epoch > epochs || (at.epoch == epochs && at.index > 0) {
        return Err(SluiceError::Config(format!(
            "checkpoint {} is at {at}, past this run's {epochs} epochs: resume with as many \
             epochs as the run it was taken by (--epochs or sluice.epochs), or run without \
             --resume to start over",
            path.display()
        )));
    }
    Ok(())
}

#[cfg(test)]
mod tests {
    use super::*;

    fn at(epoch: u64, batch: u64) -> Checkpoint {
        Checkpoint {
            version: crate::checkpoint::VERSION,
            topic: "t".into(),
            plan: "p".into(),
            settings: BTreeMap::new(),
            data: None,
            epoch,
            batch,
        }
    }

    #[test]
    fn a_checkpoint_past_the_runs_epochs_is_refused_saying_what_to_set() {
        let path = std::path::Path::new("t.checkpoint.json");
        for (epoch, batch) in [(0, 0), (2, 7), (3, 0)] {
            assert!(
                within_epochs(&at(epoch, batch), path, 3).is_ok(),
                "{epoch}:{batch}"
            );
        }
        for (epoch, batch) in [(3, 1), (5, 0), (u64::MAX, u64::MAX)] {
            let err = within_epochs(&at(epoch, batch), path, 3)
                .unwrap_err()
                .to_string();
            assert!(err.contains("past this run's 3 epochs"), "{err}");
            assert!(err.contains("--epochs"), "{err}");
        }
    }
}
