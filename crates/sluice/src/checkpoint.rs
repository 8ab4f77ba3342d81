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

use std::collections::BTreeMap;
use std::path::{Path, PathBuf};
use std::time::{Duration, Instant};

use serde::{Deserialize, Serialize};
use sluice_core::{Position, Result, SluiceError, TopicName};
use sluice_shm::Namespace;

/// How often, at most, a checkpoint is written while batches flow.
pub const CHECKPOINT_INTERVAL: Duration = Duration::from_millis(100);

/// Version 2 added `settings`, and the settings to the plan's fingerprint; version 3
/// the listing of the data (`data`). Version 2 is still read: its data is not checked.
pub(crate) const VERSION: u32 = 3;
const OLDEST_READ: u32 = 2;

/// The files a run read ([`sluice_plan::Listing`]), as a checkpoint keeps them.
#[derive(Debug, Clone, PartialEq, Eq, Serialize, Deserialize)]
pub struct DataListing {
    /// Files.
    pub files: u64,
    /// Their bytes.
    pub bytes: u64,
    /// Digest of every file's path, size, modification time and entity tag.
    pub digest: String,
}

impl From<&sluice_plan::Listing> for DataListing {
    fn from(l: &sluice_plan::Listing) -> Self {
        Self {
            files: l.files,
            bytes: l.bytes,
            digest: l.digest.clone(),
        }
    }
}

/// The text of the state file at `path` (`what` names it in errors); `None` if there is
/// none.
pub(crate) fn read_state(path: &Path, what: &str) -> Result<Option<String>> {
    use std::io::Read;
    use std::os::unix::fs::OpenOptionsExt;
    /// Far above any state file (a checkpoint, a record, a report: a few KiB).
    const MAX: u64 = 1 << 20;
    let cannot = |e| SluiceError::io(format!("cannot read {what} {}", path.display()), e);
    // Never through a link, and never a FIFO or device whose read would block or not end.
    let file = match std::fs::OpenOptions::new()
        .read(true)
        .custom_flags(libc::O_NOFOLLOW | libc::O_NONBLOCK)
        .open(path)
    {
        Ok(file) => file,
        Err(e) if e.kind() == std::io::ErrorKind::NotFound => return Ok(None),
        Err(e) => return Err(cannot(e)),
    };
    let meta = file.metadata().map_err(cannot)?;
    let not_state = |why: &str| {
        SluiceError::Config(format!(
            "{what} {} is not a state file of Sluice's ({why}): remove it",
            path.display()
        ))
    };
    if !meta.is_file() || meta.len() > MAX {
        return Err(not_state(&format!("not a plain file, or over {MAX} bytes")));
    }
    let mut bytes = Vec::new();
    file.take(MAX).read_to_end(&mut bytes).map_err(cannot)?;
    String::from_utf8(bytes)
        .map(Some)
        .map_err(|_| not_state("not text"))
}

/// Writes a state file owner-only and atomically (under `PATH.tmp`, then renamed):
/// readers see the old file or the new one, never half of one.
pub fn write_state(path: &Path, bytes: &[u8]) -> Result<()> {
    refuse_non_file(path)?;
    let mut tmp = path.as_os_str().to_owned();
    tmp.push(".tmp");
    sluice_shm::write_private(Path::new(&tmp), path, bytes)
        .map_err(|e| SluiceError::io(format!("cannot write {}", path.display()), e))
}

/// The file at a run's checkpoint path, if any, must be a checkpoint (a crashed run's):
/// the run writes over it and removes it when it ends, which must never happen to
/// anything else (`--checkpoint notes.txt`, a plan file).
fn only_a_checkpoint_there(path: &Path) -> Result<()> {
    refuse_non_file(path)?;
    let Ok(text) = std::fs::read(path) else {
        return Ok(());
    };
    let parsed = std::str::from_utf8(&text)
        .ok()
        .and_then(|t| serde_json::from_str::<Checkpoint>(t).ok());
    if parsed.is_none() {
        return Err(SluiceError::Config(format!(
            "{} is there and is not a Sluice checkpoint: a run writes its checkpoint over \
             that file and removes it when it ends; name a new file, or remove it",
            path.display()
        )));
    }
    Ok(())
}

/// A state file is written by renaming a new file over it, which would replace what is
/// not a file: a device (`--checkpoint /dev/null`, run as root), a link, a directory's
/// name. Those are refused.
pub fn refuse_non_file(path: &Path) -> Result<()> {
    match std::fs::symlink_metadata(path) {
        Ok(meta) if !meta.file_type().is_file() => Err(SluiceError::Config(format!(
            "{} is not a regular file: Sluice saves its state by renaming a new file over \
             the one named, which would replace it; name a file",
            path.display()
        ))),
        _ => Ok(()),
    }
}

impl DataListing {
    /// What a run of several rounds is taken over: each round checks its own listing
    /// (see `crate::rounds`).
    pub fn of_rounds() -> Self {
        Self {
            files: 0,
            bytes: 0,
            digest: "rounds".into(),
        }
    }
}

/// The saved state of a run.
#[derive(Debug, Clone, PartialEq, Eq, Serialize, Deserialize)]
pub struct Checkpoint {
    /// Format version.
    pub version: u32,
    /// The topic the run published on.
    pub topic: String,
    /// Hash of the plan's fingerprint ([`sluice_plan::Plan::fingerprint`]).
    pub plan: String,
    /// The settings beyond the query that decide the order of batches, as the run that
    /// took it had them ([`sluice_plan::Plan::sequence_settings`]): a resume that differs
    /// is told which to set. (Absent from version 1, which `load` then refuses by its
    /// version.)
    #[serde(default)]
    pub settings: BTreeMap<String, String>,
    /// The files the run read (absent from version 2).
    #[serde(default)]
    pub data: Option<DataListing>,
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
        let Some(text) = read_state(path, "checkpoint")? else {
            return Ok(None);
        };
        Self::parse(&text, path).map(Some)
    }

    /// A checkpoint from the JSON `text` of the file at `path` (named in errors).
    pub fn parse(text: &str, path: &Path) -> Result<Self> {
        let checkpoint: Self = serde_json::from_str(text).map_err(|e| {
            SluiceError::Config(format!(
                "checkpoint {} is unreadable ({e}); remove it to start from the beginning",
                path.display()
            ))
        })?;
        if !(OLDEST_READ..=VERSION).contains(&checkpoint.version) {
            return Err(SluiceError::Config(format!(
                "checkpoint {} has version {}, this Sluice writes version {VERSION}; remove it to start over",
                path.display(),
                checkpoint.version
            )));
        }
        Ok(checkpoint)
    }

    /// Checks that this checkpoint was taken by the same plan, with the same
    /// [`sluice_plan::Plan::sequence_settings`] (`settings`), on the same topic.
    pub fn check(
        &self,
        path: &Path,
        topic: &TopicName,
        plan: &str,
        settings: &BTreeMap<String, String>,
        data: &DataListing,
    ) -> Result<()> {
        if self.topic != topic.as_str() {
            return Err(SluiceError::Config(format!(
                "checkpoint {} was taken on topic '{}', not '{topic}'. Run without --resume to \
                 start over, or pass the plan that took it",
                path.display(),
                self.topic
            )));
        }
        // Settings of one run and not the other count as changed too.
        let changed: Vec<&String> = self
            .settings
            .keys()
            .chain(settings.keys())
            .collect::<std::collections::BTreeSet<_>>()
            .into_iter()
            .filter(|key| self.settings.get(*key) != settings.get(*key))
            .collect();
        if !changed.is_empty() {
            let show = |v: Option<&String>| v.map_or("(none)".to_string(), |v| format!("'{v}'"));
            let what: Vec<String> = changed
                .iter()
                .map(|key| {
                    format!(
                        "{key} was {} and is now {}",
                        show(self.settings.get(*key)),
                        show(settings.get(*key))
                    )
                })
                .collect();
            // The old values, as SET lines (the shard also as `--shard`, which overrides
            // the plan's); an option only one of the two runs knows (their DataFusions
            // differ) or one left unset cannot be set back that way.
            let pins: Option<Vec<String>> = changed
                .iter()
                .map(|key| match self.settings.get(*key) {
                    Some(v) if *key == "sluice.shard" => {
                        Some(format!("`SET sluice.shard = '{v}';` (or `--shard {v}`)"))
                    }
                    Some(v) if settings.contains_key(*key) => Some(format!("`SET {key} = '{v}';`")),
                    _ => None,
                })
                .collect();
            let cores = if changed.iter().any(|key| *key == CORES_KEY) {
                " (target_partitions defaults to this machine's cores)"
            } else {
                ""
            };
            let what_to_do = match pins {
                Some(pins) => format!(
                    "To resume, put {} in the plan{cores}; or run without --resume to start over",
                    pins.join(" ")
                ),
                None => "Run without --resume to start over".to_string(),
            };
            return Err(SluiceError::Config(format!(
                "checkpoint {} was taken with other settings, which order the batches \
                 differently: {}. Resuming would publish different batches at the positions \
                 subscribers already have. {what_to_do}",
                path.display(),
                what.join("; "),
            )));
        }
        if self.plan != plan {
            return Err(SluiceError::Config(format!(
                "checkpoint {} was taken by another plan; resuming it would publish different \
                 batches. Run without --resume to start over, or pass the plan that took it",
                path.display()
            )));
        }
        self.check_data(path, data)
    }

    /// The data must be what the run that took the checkpoint read: files added,
    /// removed or rewritten shift the rows at the positions subscribers already have.
    fn check_data(&self, path: &Path, data: &DataListing) -> Result<()> {
        match &self.data {
            None => {
                tracing::warn!(
                    "checkpoint {} was written by an older Sluice without the data's listing: \
                     resuming as if the files had not changed",
                    path.display()
                );
                Ok(())
            }
            Some(then) if then == data => Ok(()),
            Some(then) => Err(SluiceError::Config(format!(
                "the data changed since checkpoint {} was taken: the plan's tables listed {} \
                 files of {} bytes then (listing {}) and list {} files of {} bytes now (listing \
                 {}); files added, removed or rewritten move rows to other positions, so \
                 resuming would repeat some and skip others. Put the files back as they were \
                 to resume, or run without --resume to start over",
                path.display(),
                then.files,
                then.bytes,
                then.digest,
                data.files,
                data.bytes,
                data.digest
            ))),
        }
    }
}

/// The setting whose default is the machine's cores.
const CORES_KEY: &str = "datafusion.execution.target_partitions";

/// Writes a run's checkpoints to one file.
#[derive(Debug)]
pub(crate) struct CheckpointWriter {
    path: PathBuf,
    tmp: PathBuf,
    topic: String,
    plan: String,
    settings: BTreeMap<String, String>,
    data: DataListing,
    last: Option<Instant>,
    /// The plan's record for trainers that catch up, removed with the checkpoint.
    record: Option<PathBuf>,
}

impl CheckpointWriter {
    pub(crate) fn new(
        path: PathBuf,
        topic: &TopicName,
        plan: String,
        settings: BTreeMap<String, String>,
        data: DataListing,
    ) -> Result<Self> {
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
        only_a_checkpoint_there(&path)?;
        let mut tmp = path.clone().into_os_string();
        tmp.push(".tmp");
        Ok(Self {
            tmp: tmp.into(),
            path,
            topic: topic.to_string(),
            plan,
            settings,
            data,
            last: None,
            record: None,
        })
    }

    /// Removes `record` too when the run ends.
    pub(crate) fn with_record(mut self, record: PathBuf) -> Self {
        self.record = Some(record);
        self
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
            settings: self.settings.clone(),
            data: Some(self.data.clone()),
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
        sluice_shm::write_private(&self.tmp, &self.path, text.as_bytes()).map_err(io)?;
        self.last = Some(Instant::now());
        Ok(())
    }

    /// The run is over (finished, failed or stopped): nothing to resume.
    pub(crate) fn remove(&self) {
        let _ = std::fs::remove_file(&self.tmp);
        if let Some(record) = &self.record {
            let _ = std::fs::remove_file(record);
        }
        if let Err(e) = std::fs::remove_file(&self.path)
            && e.kind() != std::io::ErrorKind::NotFound
        {
            tracing::warn!("cannot remove checkpoint {}: {e}", self.path.display());
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    fn settings(pairs: &[(&str, &str)]) -> BTreeMap<String, String> {
        pairs
            .iter()
            .map(|(k, v)| (k.to_string(), v.to_string()))
            .collect()
    }

    fn checkpoint() -> Checkpoint {
        Checkpoint {
            version: VERSION,
            topic: "t".into(),
            plan: "abc".into(),
            settings: settings(&[
                ("datafusion.execution.batch_size", "8192"),
                ("datafusion.execution.target_partitions", "2"),
            ]),
            data: Some(data(3, 300, "d1")),
            epoch: 1,
            batch: 7,
        }
    }

    fn data(files: u64, bytes: u64, digest: &str) -> DataListing {
        DataListing {
            files,
            bytes,
            digest: digest.into(),
        }
    }

    #[test]
    fn a_resume_with_other_settings_is_told_what_to_set() {
        let c = checkpoint();
        let d = data(3, 300, "d1");
        let path = Path::new("/x/t.checkpoint.json");
        let topic = TopicName::new("t").unwrap();
        c.check(path, &topic, "abc", &c.settings, &d).unwrap();

        let now = settings(&[
            ("datafusion.execution.batch_size", "8192"),
            ("datafusion.execution.target_partitions", "16"),
            ("datafusion.execution.new_option", "x"),
        ]);
        let Err(SluiceError::Config(m)) = c.check(path, &topic, "abd", &now, &d) else {
            panic!("resumed with other settings");
        };
        assert!(
            m.contains("datafusion.execution.target_partitions was '2' and is now '16'")
                && m.contains("datafusion.execution.new_option was (none) and is now 'x'")
                && !m.contains("batch_size")
                && m.contains("Run without --resume"),
            "{m}"
        );
        // An option this run has and the checkpoint's did not cannot be pinned back.
        assert!(!m.contains("SET "), "{m}");

        let now = settings(&[
            ("datafusion.execution.batch_size", "8192"),
            ("datafusion.execution.target_partitions", "16"),
        ]);
        let Err(SluiceError::Config(m)) = c.check(path, &topic, "abd", &now, &d) else {
            panic!("resumed with other settings");
        };
        assert!(
            m.contains("To resume, put `SET datafusion.execution.target_partitions = '2';` in the plan (target_partitions defaults"),
            "{m}"
        );

        // The shard, which `--shard` may also have set, without a word on cores.
        let mut sharded = c.clone();
        sharded.settings.insert("sluice.shard".into(), "0/4".into());
        let mut now = sharded.settings.clone();
        now.insert("sluice.shard".into(), "1/4".into());
        let Err(SluiceError::Config(m)) = sharded.check(path, &topic, "abd", &now, &d) else {
            panic!("resumed with another shard");
        };
        assert!(
            m.contains("sluice.shard was '0/4' and is now '1/4'")
                && m.contains("`SET sluice.shard = '0/4';` (or `--shard 0/4`) in the plan;")
                && !m.contains("cores"),
            "{m}"
        );

        let Err(SluiceError::Config(m)) = c.check(path, &topic, "abd", &c.settings, &d) else {
            panic!("resumed with another plan");
        };
        assert!(m.contains("another plan"), "{m}");
        let other = TopicName::new("u").unwrap();
        let Err(SluiceError::Config(m)) = c.check(path, &other, "abc", &c.settings, &d) else {
            panic!("resumed on another topic");
        };
        assert!(m.contains("taken on topic 't', not 'u'"), "{m}");
    }

    /// Files added, removed or rewritten since the checkpoint: refused with both
    /// listings and what to do (finding 7 of issue 50); a version-2 checkpoint, which has
    /// no listing, resumes.
    #[test]
    fn a_resume_over_changed_data_is_refused() {
        let c = checkpoint();
        let path = Path::new("/x/t.checkpoint.json");
        let topic = TopicName::new("t").unwrap();
        let Err(SluiceError::Config(m)) =
            c.check(path, &topic, "abc", &c.settings, &data(4, 400, "d2"))
        else {
            panic!("resumed over other data");
        };
        assert!(
            m.contains("the data changed")
                && m.contains("3 files of 300 bytes then (listing d1)")
                && m.contains("4 files of 400 bytes now (listing d2)")
                && m.contains("run without --resume"),
            "{m}"
        );
        // Same counts, another digest (a file rewritten in place).
        assert!(
            c.check(path, &topic, "abc", &c.settings, &data(3, 300, "d3"))
                .is_err()
        );
        let older = Checkpoint {
            version: 2,
            data: None,
            ..c.clone()
        };
        older
            .check(path, &topic, "abc", &c.settings, &data(4, 400, "d2"))
            .unwrap();
    }

    #[test]
    fn a_checkpoint_of_an_older_version_is_refused_with_what_to_do() {
        let path = std::env::temp_dir().join(format!(
            "sluice-checkpoint-test-{}.checkpoint.json",
            std::process::id()
        ));
        std::fs::write(
            &path,
            r#"{"version":1,"topic":"t","plan":"abc","epoch":0,"batch":3}"#,
        )
        .unwrap();
        let Err(SluiceError::Config(m)) = Checkpoint::load(&path) else {
            panic!("an old checkpoint loaded");
        };
        assert!(m.contains("version 1") && m.contains("remove it"), "{m}");
        let c = checkpoint();
        std::fs::write(&path, serde_json::to_string(&c).unwrap()).unwrap();
        let loaded = Checkpoint::load(&path);
        assert_eq!(loaded.unwrap(), Some(c));
        std::fs::write(
            &path,
            r#"{"version":2,"topic":"t","plan":"abc","settings":{},"epoch":0,"batch":3}"#,
        )
        .unwrap();
        let loaded = Checkpoint::load(&path);
        let _ = std::fs::remove_file(&path);
        assert_eq!(loaded.unwrap().and_then(|c| c.data), None);
    }

    /// A state file is never renamed over what is not a file (a device, a directory, a
    /// link): refused, and what was there stays.
    #[test]
    fn state_is_never_written_over_what_is_not_a_file() {
        let dir = tempfile::tempdir().unwrap();
        let sub = dir.path().join("a-directory");
        std::fs::create_dir(&sub).unwrap();
        let target = dir.path().join("target");
        std::fs::write(&target, "kept").unwrap();
        let link = dir.path().join("a-link");
        std::os::unix::fs::symlink(&target, &link).unwrap();
        for path in [&sub, &link] {
            let err = write_state(path, b"{}").unwrap_err().to_string();
            assert!(err.contains("is not a regular file"), "{err}");
        }
        assert!(sub.is_dir() && std::fs::symlink_metadata(&link).unwrap().is_symlink());
        assert_eq!(std::fs::read_to_string(&target).unwrap(), "kept");
        let file = dir.path().join("state.json");
        write_state(&file, b"{}").unwrap();
        write_state(&file, b"[]").unwrap();
        assert_eq!(std::fs::read_to_string(&file).unwrap(), "[]");
    }
}
