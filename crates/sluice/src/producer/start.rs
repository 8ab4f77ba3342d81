//! Where a run starts: the beginning, or the checkpoint a crashed run left.

use std::collections::BTreeMap;
use std::path::PathBuf;

use sluice_core::{Position, Result, TopicName};
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
