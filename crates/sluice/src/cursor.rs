//! A trainer's position in a topic's stream ([`Cursor`]), saved with its model so that a
//! restarted trainer resumes exactly where it stopped; and what a producer leaves for
//! such a trainer to compute again what the topic no longer holds ([`PlanRecord`],
//! [`LoaderRecord`]).
//!
//! See docs/protocol.md, "Resuming a trainer".

use std::path::{Path, PathBuf};

use arrow::datatypes::Schema;
use serde::{Deserialize, Serialize};
use sluice_core::{Result, RowPosition, SluiceError, TopicName};
use sluice_plan::Plan;
use sluice_shm::Namespace;

use crate::checkpoint::DataListing;

/// Schema metadata of a plan's batches: the hash of the plan's fingerprint, so that a
/// cursor taken on one plan's stream is not used on another's.
pub const PLAN_KEY: &str = "sluice.plan";
/// Schema metadata of a plan's batches: its shuffle seed, where it shuffles.
pub const SEED_KEY: &str = "sluice.shuffle_seed";

const VERSION: u32 = 1;

/// The hash of `plan`'s fingerprint ([`Plan::fingerprint`]) that checkpoints, cursors and
/// batches carry.
pub fn plan_hash(plan: &Plan) -> String {
    format!(
        "{:016x}",
        xxhash_rust::xxh3::xxh3_64(plan.fingerprint().as_bytes())
    )
}

/// Where a trainer is in a topic's stream: every row before it was handed to the
/// trainer, none from it on. Serializable (JSON), to be saved with a model checkpoint.
#[derive(Debug, Clone, PartialEq, Eq, Serialize, Deserialize)]
pub struct Cursor {
    /// Format version.
    pub version: u32,
    /// The topic.
    pub topic: String,
    /// Hash of the fingerprint of the plan that published the stream; `None` for a
    /// topic fed by a loader, or before the trainer received a batch.
    pub plan: Option<String>,
    /// The epoch.
    pub epoch: u64,
    /// The producer batch within the epoch.
    pub batch: u64,
    /// The row within that producer batch.
    pub row: u64,
    /// The trainer's batch size (`None`: the producer's batches), for the record.
    pub batch_size: Option<u64>,
    /// The plan's shuffle seed, where it shuffles, for the record (the plan's hash covers
    /// it).
    pub shuffle_seed: Option<u64>,
}

impl Cursor {
    /// A cursor at `at` on `topic`.
    pub fn new(topic: &str, at: RowPosition) -> Self {
        Self {
            version: VERSION,
            topic: topic.to_string(),
            plan: None,
            epoch: at.epoch,
            batch: at.index,
            row: at.row,
            batch_size: None,
            shuffle_seed: None,
        }
    }

    /// The position.
    pub fn position(&self) -> RowPosition {
        RowPosition::new(self.epoch, self.batch, self.row)
    }

    /// The cursor as JSON.
    pub fn to_json(&self) -> String {
        // A struct of strings and numbers always encodes.
        serde_json::to_string(self).unwrap_or_default()
    }

    /// A cursor from its JSON, as [`Cursor::to_json`] wrote it.
    pub fn from_json(text: &str) -> Result<Self> {
        let cursor: Self = serde_json::from_str(text).map_err(|e| {
            SluiceError::Config(format!(
                "not a Sluice cursor ({e}); pass what a subscriber's state_dict() or \
                 Subscriber::cursor returned"
            ))
        })?;
        if cursor.version != VERSION {
            return Err(SluiceError::Config(format!(
                "cursor version {} is not this Sluice's ({VERSION}); start the trainer without it",
                cursor.version
            )));
        }
        Ok(cursor)
    }

    /// Takes the stream's identity from a batch's schema (see [`PLAN_KEY`]).
    pub(crate) fn identify(&mut self, schema: &Schema) {
        let meta = schema.metadata();
        self.plan = meta.get(PLAN_KEY).cloned();
        self.shuffle_seed = meta.get(SEED_KEY).and_then(|s| s.parse().ok());
    }

    /// Checks that a batch of the stream (its `schema`) comes from the plan this cursor
    /// was taken on.
    pub(crate) fn check_stream(&self, schema: &Schema) -> Result<()> {
        let Some(plan) = &self.plan else {
            return Ok(());
        };
        match schema.metadata().get(PLAN_KEY) {
            Some(found) if found == plan => Ok(()),
            found => Err(SluiceError::Config(format!(
                "the cursor was taken on topic '{}' when plan {plan} published it; the topic's \
                 producer now runs {}, whose rows are at other positions. Start the trainer \
                 without its saved state (join='next_epoch'), or run the plan it was taken on",
                self.topic,
                found.map_or("a loader's batches", String::as_str)
            ))),
        }
    }
}

/// What a producer running a plan leaves in its namespace's state directory for as long
/// as it runs (a crashed run's stays, for its `--resume`): enough for a trainer to plan
/// the same query again and compute what the topic no longer holds.
#[derive(Debug, Clone, Serialize, Deserialize)]
pub struct PlanRecord {
    /// Format version.
    pub version: u32,
    /// The topic.
    pub topic: String,
    /// Hash of the plan's fingerprint, as the producer runs it.
    pub plan: String,
    /// The plan file's name, for messages.
    pub file: String,
    /// The plan's text.
    pub sql: String,
    /// The producer's working directory (relative paths in the plan are relative to it).
    pub cwd: PathBuf,
    /// Options the producer's command line set over the plan's.
    pub epochs: u64,
    /// Rows per producer batch.
    pub batch_rows: usize,
    /// `sluice.shard`.
    pub shard: String,
    /// The files the run reads.
    pub data: DataListing,
}

impl PlanRecord {
    /// The record of `plan` run on `topic` with `hash` over `data`.
    pub(crate) fn new(plan: &Plan, topic: &TopicName, hash: &str, data: &DataListing) -> Self {
        let options = plan.options();
        Self {
            version: VERSION,
            topic: topic.to_string(),
            plan: hash.to_string(),
            file: plan.file().to_string(),
            sql: plan.sql().to_string(),
            cwd: std::env::current_dir().unwrap_or_default(),
            epochs: options.epochs,
            batch_rows: options.batch_rows,
            shard: options.shard.clone(),
            data: data.clone(),
        }
    }

    /// Where the record of `topic` is.
    pub fn path(namespace: &Namespace, topic: &TopicName) -> PathBuf {
        namespace.state_dir().join(format!("{topic}.plan.json"))
    }

    /// Writes the record (owner-only, atomically).
    pub(crate) fn write(&self, path: &Path) -> Result<()> {
        let text = serde_json::to_string(self)
            .map_err(|e| SluiceError::Internal(format!("cannot encode a plan record: {e}")))?;
        crate::checkpoint::write_state(path, text.as_bytes())
    }

    /// The record of `topic`, if its producer left one.
    pub fn load(namespace: &Namespace, topic: &TopicName) -> Result<Option<Self>> {
        let record: Option<Self> = load_record(namespace, &Self::path(namespace, topic))?;
        check_record(record, topic, |r| (r.version, r.topic.as_str()))
    }
}

/// What a producer fed by a loader that can compute an epoch again
/// (`sluice.publish(make_loader, …, resumable=True)`) leaves in its namespace's state
/// directory while it runs: the function that makes the loader, for a trainer's process
/// to make it again and compute what the topic no longer holds.
#[derive(Debug, Clone, Serialize, Deserialize)]
pub struct LoaderRecord {
    /// Format version.
    pub version: u32,
    /// The topic.
    pub topic: String,
    /// `package.module:function`, which makes the loader.
    pub factory: String,
    /// The producer's working directory (where the module may be found).
    pub cwd: PathBuf,
    /// Epochs of the run.
    pub epochs: u64,
}

impl LoaderRecord {
    /// The record of a loader made by `factory` and run for `epochs` on `topic`.
    pub fn new(topic: &TopicName, factory: &str, epochs: u64) -> Self {
        Self {
            version: VERSION,
            topic: topic.to_string(),
            factory: factory.to_string(),
            cwd: std::env::current_dir().unwrap_or_default(),
            epochs,
        }
    }

    /// Where the record of `topic` is.
    pub fn path(namespace: &Namespace, topic: &TopicName) -> PathBuf {
        namespace.state_dir().join(format!("{topic}.loader.json"))
    }

    /// Writes the record (owner-only, atomically).
    pub(crate) fn write(&self, path: &Path) -> Result<()> {
        let text = serde_json::to_string(self)
            .map_err(|e| SluiceError::Internal(format!("cannot encode a loader record: {e}")))?;
        crate::checkpoint::write_state(path, text.as_bytes())
    }

    /// The record of `topic`, if its producer left one.
    pub fn load(namespace: &Namespace, topic: &TopicName) -> Result<Option<Self>> {
        let record: Option<Self> = load_record(namespace, &Self::path(namespace, topic))?;
        check_record(record, topic, |r| (r.version, r.topic.as_str()))
    }
}

/// The record at `path` in `namespace`'s state directory (checked to be this user's
/// only), if there is one.
fn load_record<T: serde::de::DeserializeOwned>(
    namespace: &Namespace,
    path: &Path,
) -> Result<Option<T>> {
    namespace.prepare_state_dir()?;
    let Some(text) = crate::checkpoint::read_state(path, "record")? else {
        return Ok(None);
    };
    serde_json::from_str(&text)
        .map(Some)
        .map_err(|e| SluiceError::Corrupt(format!("record {} is unreadable: {e}", path.display())))
}

/// `record`, if it is this Sluice's record of `topic` (its version and topic, as
/// `identity` tells them).
fn check_record<T>(
    record: Option<T>,
    topic: &TopicName,
    identity: impl Fn(&T) -> (u32, &str),
) -> Result<Option<T>> {
    match record {
        Some(r) if identity(&r) != (VERSION, topic.as_str()) => Err(SluiceError::Corrupt(format!(
            "the state directory's record of topic '{topic}' is not this Sluice's"
        ))),
        other => Ok(other),
    }
}

/// Removes the record at `path` that an earlier run left, if there is one.
pub(crate) fn remove_record(path: &Path) -> Result<()> {
    match std::fs::remove_file(path) {
        Ok(()) => Ok(()),
        Err(e) if e.kind() == std::io::ErrorKind::NotFound => Ok(()),
        // A read-only file system refuses before it looks: nothing there, nothing stale.
        Err(_) if std::fs::symlink_metadata(path).is_err() => Ok(()),
        Err(e) => Err(SluiceError::io(
            format!("cannot remove the stale record {}", path.display()),
            e,
        )),
    }
}
