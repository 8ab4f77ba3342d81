//! Where a run starts: the beginning, or the checkpoint a crashed run left.

use std::collections::BTreeMap;
use std::path::PathBuf;

use sluice_core::{Position, Result, TopicName};
use sluice_plan::Plan;
use sluice_shm::Namespace;

use super::RunOptions;
use crate::checkpoint::{Checkpoint, CheckpointWriter, DataListing};

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
        let fingerprint = format!(
            "{:016x}",
            xxhash_rust::xxh3::xxh3_64(plan.fingerprint().as_bytes())
        );
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

    /// The writer of this run's checkpoints.
    pub(crate) fn writer(self, topic: &TopicName) -> Result<CheckpointWriter> {
        CheckpointWriter::new(self.path, topic, self.fingerprint, self.settings, self.data)
    }
}
