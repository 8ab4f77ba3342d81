//! The trainers' feedback: per-sample values reported for rows they received, which a
//! round's plan reads as `sluice_feedback`.
//!
//! Each trainer appends Arrow IPC files to `<state>/<topic>.feedback/`, each written
//! under a temporary name and renamed into place, so the producer reads a whole file or
//! none. The directory is in the namespace's owner-only state directory: the trainers of
//! the producer's user write it. The producer reads every file as data (a wrong column
//! type, a key that is not an integer, an unreadable file are skipped with a warning and
//! counted), and lists the files each round read in the round's record, so a restarted
//! producer reads the same.

use std::path::{Path, PathBuf};
use std::sync::Arc;
use std::sync::atomic::{AtomicU64, Ordering};
use std::time::{Duration, Instant, SystemTime};

use arrow::array::{Array, ArrayRef, AsArray, Float64Array, new_null_array};
use arrow::compute::cast;
use arrow::datatypes::{DataType, Int64Type};
use arrow::record_batch::RecordBatch;
use sluice_core::{Result, SluiceError, TopicName};
use sluice_flight::{ClientOptions, FlightTarget};
use sluice_plan::rounds::{feedback_batch, feedback_schema};
use sluice_shm::Namespace;

/// Reports a trainer buffers before writing them out (also written at most a second
/// after the first, on [`FeedbackWriter::flush`] and when the writer drops).
const BUFFERED_ROWS: usize = 65_536;
const BUFFERED_FOR: Duration = Duration::from_secs(1);

/// The feedback directory of `topic`.
pub fn feedback_dir(namespace: &Namespace, topic: &TopicName) -> PathBuf {
    namespace.state_dir().join(format!("{topic}.feedback"))
}

/// Where a trainer's reports go.
#[derive(Debug)]
enum Destination {
    /// A local topic's feedback directory.
    Dir(PathBuf),
    /// The Flight server of a remote topic (`flight://HOST:PORT/TOPIC`), which writes
    /// them into its topic's directory.
    Remote(FlightTarget, Box<ClientOptions>),
}

/// A trainer's reports, written to the topic's feedback directory (or sent to the
/// server of a remote topic).
#[derive(Debug)]
pub struct FeedbackWriter {
    to: Destination,
    trainer: String,
    pending: Vec<RecordBatch>,
    rows: usize,
    since: Option<Instant>,
    files: u64,
    /// Random, so that writers of processes with the same pid (trainers in containers,
    /// each pid 1, sharing the state directory) never name a file alike.
    id: u64,
    /// Whether this writer has left its mark in the feedback directory (a hidden file
    /// named by `id`): a new run of the producer replaces the directory, mark included,
    /// and reports on the rows of a run that ended must not steer the next one.
    marked: bool,
}

static WRITERS: AtomicU64 = AtomicU64::new(0);

impl FeedbackWriter {
    /// A writer of `trainer`'s reports on `topic`, a local topic of `namespace` or
    /// `flight://HOST:PORT/TOPIC` (letters, digits, `_`, `-` and `.` of the trainer's
    /// name are kept; it names the rows in `sluice_feedback.trainer`).
    pub fn open(namespace: &Namespace, topic: &str, trainer: &str) -> Result<Self> {
        let to = match FlightTarget::parse(topic) {
            Some(target) => Destination::Remote(target?, Box::new(ClientOptions::from_env()?)),
            None => {
                namespace.prepare_state_dir()?;
                let dir = feedback_dir(namespace, &TopicName::new(topic)?);
                sluice_shm::private_dir(
                    &dir,
                    "set TMPDIR or XDG_RUNTIME_DIR to a directory of your own",
                )?;
                Destination::Dir(dir)
            }
        };
        let trainer = Self::name_of(trainer);
        if trainer.is_empty() {
            return Err(SluiceError::Config(
                "a trainer's name must hold a letter or digit".into(),
            ));
        }
        Ok(Self {
            to,
            trainer,
            pending: Vec::new(),
            rows: 0,
            since: None,
            files: 0,
            id: {
                use std::hash::{BuildHasher, Hasher};
                std::collections::hash_map::RandomState::new()
                    .build_hasher()
                    .finish()
            },
            marked: false,
        })
    }

    /// The trainer's name as it appears in `sluice_feedback`.
    pub fn trainer(&self) -> &str {
        &self.trainer
    }

    /// Reports `values` (name, one value per key) for the samples `keys` of round
    /// `round`, epoch `epoch`. Written out within a second (or on [`Self::flush`]).
    pub fn report(
        &mut self,
        keys: Vec<i64>,
        (round, epoch): (u64, u64),
        values: Vec<(String, Vec<Option<f64>>)>,
    ) -> Result<()> {
        if keys.is_empty() {
            return Ok(());
        }
        let (names, columns): (Vec<String>, Vec<_>) = values.into_iter().unzip();
        sluice_plan::rounds::feedback_columns(&names.join(","))?;
        let batch = feedback_batch(
            &names,
            keys,
            &self.trainer,
            (round, epoch),
            columns,
            super::to_us(SystemTime::now()),
        )?;
        self.push(batch)
    }

    /// Writes out reports made a second ago or more: a trainer that waits (for the next
    /// batch, the next round) calls it, so that its last reports are not held back. A
    /// failure is logged, and the reports kept for the next flush.
    pub fn flush_if_due(&mut self) {
        if self.since.is_some_and(|s| s.elapsed() >= BUFFERED_FOR)
            && let Err(e) = self.flush()
        {
            tracing::warn!("reports not written yet: {e}");
        }
    }

    /// The name a trainer called `trainer` has in `sluice_feedback.trainer`.
    pub fn name_of(trainer: &str) -> String {
        // A name never starts with a dot: the producer skips dot files (unfinished ones).
        trainer
            .trim_start_matches(|c: char| !c.is_ascii_alphanumeric())
            .chars()
            .filter(|c| c.is_ascii_alphanumeric() || matches!(c, '_' | '-' | '.'))
            .take(64)
            .collect()
    }

    /// Writes out reports already in `sluice_feedback`'s columns (what a remote trainer
    /// sends `sluice serve`), all or none: refused unless each has exactly its fixed
    /// columns and `Float64` values; their trainer is this writer's.
    pub fn append_all(&mut self, batches: Vec<RecordBatch>) -> Result<()> {
        let checked = batches
            .into_iter()
            .map(|b| self.conformed(b))
            .collect::<Result<Vec<_>>>()?;
        self.rows += checked.iter().map(RecordBatch::num_rows).sum::<usize>();
        self.pending.extend(checked);
        self.flush()
    }

    fn conformed(&self, batch: RecordBatch) -> Result<RecordBatch> {
        const FIXED: [&str; 5] = ["key", "trainer", "round", "epoch", "time"];
        let schema = batch.schema();
        let names: Vec<String> = schema
            .fields()
            .iter()
            .map(|f| f.name().clone())
            .filter(|n| !FIXED.contains(&n.as_str()))
            .collect();
        let expected = feedback_schema(&names);
        let same = expected.fields().len() == schema.fields().len()
            && expected.fields().iter().all(|f| {
                schema
                    .field_with_name(f.name())
                    .is_ok_and(|g| g.data_type() == f.data_type())
            });
        if !same
            || batch
                .column_by_name("key")
                .is_some_and(|k| k.null_count() > 0)
        {
            return Err(SluiceError::Config(format!(
                "reports must have the columns {expected} (one Float64 per reported value), \
             not {schema}"
            )));
        }
        sluice_plan::rounds::feedback_columns(&names.join(","))?;
        let columns = expected
            .fields()
            .iter()
            .map(|f| match f.name().as_str() {
                "trainer" => Arc::new(arrow::array::StringArray::from_iter_values(
                    std::iter::repeat_n(self.trainer.as_str(), batch.num_rows()),
                )) as ArrayRef,
                name => batch
                    .column_by_name(name)
                    .cloned()
                    .unwrap_or_else(|| new_null_array(f.data_type(), batch.num_rows())),
            })
            .collect();
        Ok(RecordBatch::try_new(expected, columns)?)
    }

    fn push(&mut self, batch: RecordBatch) -> Result<()> {
        self.rows += batch.num_rows();
        self.pending.push(batch);
        let since = *self.since.get_or_insert_with(Instant::now);
        if self.rows >= BUFFERED_ROWS || since.elapsed() >= BUFFERED_FOR {
            self.flush()?;
        }
        Ok(())
    }

    /// Writes the reports buffered so far as one file (one per set of value columns).
    /// Those a failure left unwritten stay buffered for the next flush.
    pub fn flush(&mut self) -> Result<()> {
        while let Some(first) = self.pending.first() {
            let schema = first.schema();
            let (group, rest): (Vec<RecordBatch>, Vec<RecordBatch>) =
                std::mem::take(&mut self.pending)
                    .into_iter()
                    .partition(|b| b.schema() == schema);
            self.pending = rest;
            let written = match &self.to {
                Destination::Dir(dir) => self.write(&dir.clone(), &group),
                Destination::Remote(target, options) => {
                    sluice_flight::put_feedback(target, options, &self.trainer, group.clone())
                }
            };
            if let Err(e) = written {
                self.pending.extend(group);
                return Err(e);
            }
        }
        self.rows = 0;
        self.since = None;
        Ok(())
    }

    fn write(&mut self, dir: &Path, batches: &[RecordBatch]) -> Result<()> {
        let n = WRITERS.fetch_add(1, Ordering::Relaxed);
        self.files += 1;
        let name = format!(
            "{}-{}-{:016x}-{n}-{}.arrow",
            self.trainer,
            std::process::id(),
            self.id,
            self.files
        );
        let mut bytes = Vec::new();
        {
            let mut writer =
                arrow::ipc::writer::FileWriter::try_new(&mut bytes, &batches[0].schema())?;
            for batch in batches {
                writer.write(batch)?;
            }
            writer.finish()?;
        }
        // A new run of the producer removes the directory with the last run's reports.
        sluice_shm::private_dir(
            dir,
            "set TMPDIR or XDG_RUNTIME_DIR to a directory of your own",
        )?;
        // (An inode number does not tell one directory from the next: it is reused.)
        let mark = dir.join(format!(".writer-{:016x}", self.id));
        if self.marked && !mark.exists() {
            tracing::warn!(
                trainer = %self.trainer,
                "reports on a run that has ended are dropped: a new run of the producer started"
            );
            return Ok(());
        }
        if !self.marked {
            sluice_shm::write_private(
                &dir.join(format!(".writer-{:016x}.tmp", self.id)),
                &mark,
                b"",
            )
            .map_err(|e| SluiceError::io(format!("cannot write {}", mark.display()), e))?;
            self.marked = true;
        }
        let to = dir.join(&name);
        let tmp = dir.join(format!(".{name}.tmp"));
        sluice_shm::write_private(&tmp, &to, &bytes)
            .map_err(|e| SluiceError::io(format!("cannot write feedback {}", to.display()), e))
    }
}

impl Drop for FeedbackWriter {
    fn drop(&mut self) {
        if let Err(e) = self.flush() {
            tracing::warn!("reports not written: {e}");
        }
    }
}

/// The feedback files in `dir` now, by name (closed files only).
pub(crate) fn feedback_files(dir: &Path) -> Vec<String> {
    let Ok(entries) = std::fs::read_dir(dir) else {
        return Vec::new();
    };
    let mut names: Vec<String> = entries
        .filter_map(|e| e.ok()?.file_name().into_string().ok())
        .filter(|n| n.ends_with(".arrow") && !n.starts_with('.'))
        .collect();
    names.sort();
    names
}

/// The reports in `files` of `dir`, in `sluice_feedback`'s columns (`columns` the value
/// columns the plan reads), and how many batches were skipped as malformed. A file that
/// is gone (a topic's feedback removed by hand) is skipped too.
pub(crate) fn read_feedback(
    dir: &Path,
    files: &[String],
    columns: &[String],
) -> (Vec<RecordBatch>, u64) {
    let schema = feedback_schema(columns);
    let mut out = Vec::new();
    let mut skipped = 0u64;
    for name in files {
        let path = dir.join(name);
        let reader = std::fs::File::open(&path)
            .map_err(|e| e.to_string())
            .and_then(|f| {
                arrow::ipc::reader::FileReader::try_new(std::io::BufReader::new(f), None)
                    .map_err(|e| e.to_string())
            });
        let reader = match reader {
            Ok(reader) => reader,
            Err(e) => {
                tracing::warn!("feedback file {} skipped: {e}", path.display());
                skipped += 1;
                continue;
            }
        };
        for batch in reader {
            match batch
                .map_err(|e| e.to_string())
                .and_then(|b| conform(&b, columns).map_err(|e| e.to_string()))
                .and_then(|c| RecordBatch::try_new(schema.clone(), c).map_err(|e| e.to_string()))
            {
                Ok(batch) => out.push(batch),
                Err(e) => {
                    tracing::warn!("feedback in {} skipped: {e}", path.display());
                    skipped += 1;
                }
            }
        }
    }
    (out, skipped)
}

/// `batch`'s columns as `sluice_feedback` has them: the fixed ones checked, the value
/// columns the plan reads cast to `Float64` (null where the trainer did not report them).
fn conform(batch: &RecordBatch, columns: &[String]) -> Result<Vec<ArrayRef>> {
    let rows = batch.num_rows();
    let column = |name: &str| {
        batch
            .column_by_name(name)
            .cloned()
            .ok_or_else(|| SluiceError::Corrupt(format!("feedback without a '{name}' column")))
    };
    let key = cast(&column("key")?, &DataType::Int64)?;
    if key.null_count() > 0 || key.as_primitive::<Int64Type>().len() != rows {
        return Err(SluiceError::Corrupt(
            "feedback keys must be integers".into(),
        ));
    }
    let mut out = vec![
        key,
        cast(&column("trainer")?, &DataType::Utf8)?,
        cast(&column("round")?, &DataType::UInt64)?,
        cast(&column("epoch")?, &DataType::UInt64)?,
    ];
    for name in columns {
        out.push(match batch.column_by_name(name) {
            Some(values) => finite(&cast(values, &DataType::Float64)?),
            None => Arc::new(Float64Array::new_null(rows)) as ArrayRef,
        });
    }
    let time = DataType::Timestamp(arrow::datatypes::TimeUnit::Microsecond, Some("UTC".into()));
    out.push(match batch.column_by_name("time") {
        Some(t) => cast(t, &time)?,
        None => new_null_array(&time, rows),
    });
    if out[1..4]
        .iter()
        .chain(out.last())
        .any(|c| c.null_count() > 0)
    {
        return Err(SluiceError::Corrupt(
            "feedback with a null trainer, round, epoch or time".into(),
        ));
    }
    Ok(out)
}

/// `values` with every NaN and infinity made null. A diverged trainer reports NaN or
/// infinite losses, and SQL orders NaN above every number: one such report would make
/// `max(loss)` NaN, put its keys first in `ORDER BY loss DESC` and move the median, in
/// every round after, since reports are kept.
fn finite(values: &ArrayRef) -> ArrayRef {
    let floats = values.as_primitive::<arrow::datatypes::Float64Type>();
    if floats.iter().flatten().all(f64::is_finite) {
        return values.clone();
    }
    let kept: Float64Array = floats.iter().map(|v| v.filter(|x| x.is_finite())).collect();
    tracing::debug!(
        dropped = kept.null_count() - floats.null_count(),
        "non-finite reported values read as null"
    );
    Arc::new(kept)
}

#[cfg(test)]
mod tests {
    use super::*;

    /// A writer that wrote during one run of the producer writes nothing once a new run
    /// replaced the feedback directory: its reports are on rows of a run that ended. A
    /// writer that first writes in the new run writes there.
    #[test]
    fn reports_on_a_run_that_ended_do_not_reach_the_next() {
        let ns = Namespace::new(&format!("fbrun{}", std::process::id())).unwrap();
        let dir = feedback_dir(&ns, &TopicName::new("t").unwrap());
        let _ = std::fs::remove_dir_all(&dir);
        let loss = |v: f64| vec![("loss".to_string(), vec![Some(v)])];
        let mut old = FeedbackWriter::open(&ns, "t", "old").unwrap();
        old.report(vec![1], (0, 0), loss(1.0)).unwrap();
        old.flush().unwrap();
        assert_eq!(feedback_files(&dir).len(), 1);
        std::fs::remove_dir_all(&dir).unwrap(); // what a new run does
        old.report(vec![2], (0, 1), loss(2.0)).unwrap();
        old.flush().unwrap();
        let mut new = FeedbackWriter::open(&ns, "t", "new").unwrap();
        new.report(vec![3], (0, 0), loss(3.0)).unwrap();
        new.flush().unwrap();
        let files = feedback_files(&dir);
        assert_eq!(files.len(), 1, "{files:?}");
        assert!(files[0].starts_with("new-"), "{files:?}");
        let _ = std::fs::remove_dir_all(ns.state_dir());
    }

    /// NaN and infinite values are read as nulls (not reported), finite ones as they are.
    #[test]
    fn non_finite_values_are_read_as_not_reported() {
        let cols = vec!["loss".to_string()];
        let values = vec![
            Some(0.5),
            Some(f64::NAN),
            Some(f64::INFINITY),
            Some(-f64::NAN),
            Some(f64::NEG_INFINITY),
            None,
        ];
        let batch = feedback_batch(&cols, (0..6).collect(), "t", (0, 0), vec![values], 1).unwrap();
        let out = conform(&batch, &cols).unwrap();
        let loss = out[4].as_primitive::<arrow::datatypes::Float64Type>();
        let read: Vec<Option<f64>> = loss.iter().collect();
        assert_eq!(read, vec![Some(0.5), None, None, None, None, None]);
    }

    #[test]
    fn reports_round_trip_and_bad_files_are_skipped() {
        let ns = Namespace::new(&format!("fb{}", std::process::id())).unwrap();
        let dir = feedback_dir(&ns, &TopicName::new("t").unwrap());
        let _ = std::fs::remove_dir_all(&dir);
        let mut w = FeedbackWriter::open(&ns, "t", "trainer/a").unwrap();
        assert_eq!(w.trainer(), "trainera");
        assert_eq!(
            FeedbackWriter::open(&ns, "t", "..x").unwrap().trainer(),
            "x"
        );
        w.report(
            vec![1, 2, 3],
            (0, 1),
            vec![("loss".into(), vec![Some(0.5), None, Some(2.0)])],
        )
        .unwrap();
        w.report(vec![4], (0, 1), vec![("acc".into(), vec![Some(1.0)])])
            .unwrap();
        drop(w);
        std::fs::write(dir.join("garbage.arrow"), b"not arrow").unwrap();
        let files = feedback_files(&dir);
        assert_eq!(files.len(), 3, "{files:?}");
        let cols = vec!["loss".to_string(), "grad".to_string()];
        let (batches, skipped) = read_feedback(&dir, &files, &cols);
        assert_eq!(skipped, 1);
        let rows: usize = batches.iter().map(RecordBatch::num_rows).sum();
        assert_eq!(rows, 4);
        assert!(batches.iter().all(|b| b.schema() == feedback_schema(&cols)));
        assert!(FeedbackWriter::open(&ns, "t", "//").is_err());
        // What a remote trainer sends: its columns checked, its trainer the writer's.
        let mut w = FeedbackWriter::open(&ns, "t", "remote").unwrap();
        let cols = vec!["loss".to_string()];
        let good =
            feedback_batch(&cols, vec![9], "forged", (1, 2), vec![vec![Some(1.0)]], 5).unwrap();
        w.append_all(vec![good.clone()]).unwrap();
        let mut fields: Vec<arrow::datatypes::Field> = good
            .schema()
            .fields()
            .iter()
            .map(|f| f.as_ref().clone())
            .collect();
        fields[4] = arrow::datatypes::Field::new("loss", DataType::Int64, true);
        let mut columns = good.columns().to_vec();
        columns[4] = Arc::new(arrow::array::Int64Array::from(vec![1]));
        let int_loss =
            RecordBatch::try_new(Arc::new(arrow::datatypes::Schema::new(fields)), columns).unwrap();
        assert!(
            w.append_all(vec![good.clone(), int_loss]).is_err(),
            "values are Float64, and a refused request writes nothing"
        );
        let no_time = good.project(&[0, 1, 2, 3, 4]).unwrap();
        assert!(
            w.append_all(vec![no_time]).is_err(),
            "the time column is required"
        );
        w.flush().unwrap();
        let (batches, _) = read_feedback(&dir, &feedback_files(&dir), &cols);
        assert_eq!(batches.iter().map(RecordBatch::num_rows).sum::<usize>(), 5);
        assert!(batches.iter().any(|b| {
            b.column_by_name("trainer")
                .unwrap()
                .as_string::<i32>()
                .value(0)
                == "remote"
        }));
        let _ = std::fs::remove_dir_all(ns.state_dir());
    }
}
