//! `sluice.Subscriber`, its epochs, and the Arrow stream over it.
//!
//! # Waiting
//! Every wait (for the topic to appear, for the next batch) runs with the GIL released
//! and in slices of [`SLICE`]: a slice that times out loses nothing, and between slices
//! Python runs its signal handlers, so Ctrl-C raises `KeyboardInterrupt` promptly. The
//! caller's `timeout` bounds the whole wait for one batch.
//!
//! # Threads
//! The Rust subscriber is behind a mutex, taken only while the GIL is released, so a
//! subscriber may be shared between Python threads (each batch goes to one of them).

use std::sync::{Arc, Mutex, MutexGuard, PoisonError};
use std::time::{Duration, Instant};

use arrow::datatypes::{Schema, SchemaRef};
use arrow::error::ArrowError;
use arrow::ffi_stream::FFI_ArrowArrayStream;
use arrow::record_batch::{RecordBatch, RecordBatchReader};
use pyo3::exceptions::{PyTypeError, PyValueError};
use pyo3::prelude::*;
use pyo3::types::{PyBool, PyBytes, PyCapsule, PyList, PyString, PyTuple};
use sluice::core::{RowPosition, TopicName};
use sluice::{
    Columns, Connector, Cursor, EpochSummary, Event, Join, OnLag, OnMaxHeld, SluiceError,
    SubscribeOptions, Subscriber,
};

use crate::batch::{PyBatch, deep_copy};
use crate::device_batch::PyDeviceBatch;
use crate::errors::to_py;
use sluice::shm::process::{Local, Owner};

/// Longest wait without a chance to run Python's signal handlers.
const SLICE: Duration = Duration::from_millis(50);
/// Each attempt to attach creates an iceoryx2 node: poll for the topic less often.
const CONNECT_SLICE: Duration = Duration::from_millis(200);

/// The stream as this Python object sees it: the Rust subscriber plus an event that was
/// looked at and put back.
struct Stream {
    // `Local`: a forked child's copy of the subscription (its ports, its status report,
    // a Flight connection's runtime) and of a batch looked at is never dropped there
    // (see `sluice::shm::process`).
    sub: Local<Option<Subscriber>>,
    peeked: Local<Option<Event>>,
    ended: bool,
    /// `Subscriber::last_published_ns` as of the last event taken.
    last_published_ns: Option<u64>,
    /// The subscriber's cursor after the last event handed to Python (not one looked at
    /// and put back), and before it.
    consumed: Option<RowPosition>,
    before_last: Option<RowPosition>,
    /// The cursor after the event put back.
    peeked_after: Option<RowPosition>,
    /// The closed subscription's cursor (its identity: topic, plan, batch size), kept
    /// for `state_dict()` once `sub` is gone.
    closed_cursor: Option<Cursor>,
    /// Closed before the end of its stream: an Arrow stream reader ends with an error.
    closed_early: bool,
}

impl Stream {
    fn next_within(&mut self, timeout: Option<Duration>) -> Result<Event, SluiceError> {
        if let Some(event) = self.peeked.take() {
            self.before_last = self.consumed.take();
            self.consumed = self.peeked_after.take();
            return Ok(event);
        }
        if self.ended {
            return Ok(Event::End);
        }
        let Some(sub) = self.sub.as_mut() else {
            return Ok(Event::End);
        };
        let event = sub.next_event_within(timeout)?;
        self.before_last = std::mem::replace(&mut self.consumed, sub.consumed());
        self.last_published_ns = sub.last_published_ns().or(self.last_published_ns);
        if matches!(event, Event::End) {
            self.ended = true;
        }
        Ok(event)
    }
}

/// The Arrow C stream interface describes host memory only.
fn device_stream_refused() -> SluiceError {
    SluiceError::Device(
        "a GPU topic (sluice.device = 'cuda:N') cannot be read as an Arrow C stream, which \
         describes host memory: iterate the subscriber for DeviceBatch objects, or run the \
         plan with sluice.device = 'cpu'"
            .into(),
    )
}

/// A received batch as its Python object: a `Batch`, or a `DeviceBatch` on a GPU topic.
fn batch_object(py: Python<'_>, event: Event) -> PyResult<Option<Py<PyAny>>> {
    match event {
        Event::Batch {
            epoch,
            index,
            batch,
            shm_range,
        } => Ok(Some(
            Py::new(py, PyBatch::new(batch, epoch, index, shm_range))?.into_any(),
        )),
        Event::DeviceBatch {
            epoch,
            index,
            batch,
        } => Ok(Some(
            Py::new(py, PyDeviceBatch::new(batch, epoch, index))?.into_any(),
        )),
        _ => Ok(None),
    }
}

fn lock(stream: &Mutex<Stream>) -> MutexGuard<'_, Stream> {
    // A panic while the lock was held cannot leave `Stream` half-updated in a way that
    // matters more than the panic itself, which pyo3 already reported.
    stream.lock().unwrap_or_else(PoisonError::into_inner)
}

/// Seconds from Python: `None` (or infinity) waits forever.
pub fn parse_timeout(what: &str, timeout: Option<f64>) -> PyResult<Option<Duration>> {
    match timeout {
        None => Ok(None),
        Some(t) if t.is_infinite() && t > 0.0 => Ok(None),
        Some(t) if t.is_nan() || t < 0.0 => Err(PyValueError::new_err(format!(
            "{what} must be a number of seconds >= 0 or None, not {t}"
        ))),
        // Longer than a Duration holds (about 584 billion years): as long as it takes.
        Some(t) => Ok(Duration::try_from_secs_f64(t).ok()),
    }
}

/// `columns=`: `None`, or a list or tuple of column names, at least one. A lone string
/// is refused (it would otherwise be taken as one column per character), and so are sets
/// and dicts, whose order is not the caller's.
fn parse_columns(value: Option<&Bound<'_, PyAny>>) -> PyResult<Option<Vec<String>>> {
    let Some(value) = value.filter(|v| !v.is_none()) else {
        return Ok(None);
    };
    let type_name = |v: &Bound<'_, PyAny>| {
        v.get_type()
            .name()
            .map(|n| n.to_string())
            .unwrap_or_default()
    };
    if value.is_instance_of::<PyString>() || value.is_instance_of::<PyBytes>() {
        return Err(PyTypeError::new_err(format!(
            "columns must be a list of column names, not one {}: columns=[{}]",
            type_name(value),
            value.repr().map(|r| r.to_string()).unwrap_or_default()
        )));
    }
    if !(value.is_instance_of::<PyList>() || value.is_instance_of::<PyTuple>()) {
        return Err(PyTypeError::new_err(format!(
            "columns must be a list or tuple of column names or None, not {}",
            type_name(value)
        )));
    }
    let names = value
        .try_iter()?
        .map(|item| {
            let item = item?;
            item.extract::<String>().map_err(|_| {
                PyTypeError::new_err(format!(
                    "columns must hold column names (str), not {}",
                    type_name(&item)
                ))
            })
        })
        .collect::<PyResult<Vec<_>>>()?;
    if names.is_empty() {
        return Err(PyValueError::new_err(
            "columns names no column: name at least one, or pass None for all of them",
        ));
    }
    Ok(Some(names))
}

/// A count from Python: `None`, or an int (not a bool) of at least `min`.
pub fn parse_count(
    name: &str,
    value: Option<&Bound<'_, PyAny>>,
    min: i64,
) -> PyResult<Option<usize>> {
    let Some(value) = value else {
        return Ok(None);
    };
    if value.is_none() {
        return Ok(None);
    }
    let type_error = || {
        PyTypeError::new_err(format!(
            "{name} must be an int or None, not {}",
            value
                .get_type()
                .name()
                .map(|n| n.to_string())
                .unwrap_or_default()
        ))
    };
    if value.is_instance_of::<PyBool>() {
        return Err(type_error());
    }
    let n: i64 = value.extract().map_err(|_| type_error())?;
    if n < min {
        return Err(PyValueError::new_err(format!(
            "{name} must be at least {min}, not {n}"
        )));
    }
    usize::try_from(n)
        .map(Some)
        .map_err(|_| PyValueError::new_err(format!("{name} is too large: {n}")))
}

/// A mode given as a string (`join`, `on_lag`, `on_max_held`), parsed as the CLI parses
/// it; a wrong one is a `ValueError` that lists the right ones.
fn parse_mode<T: std::str::FromStr<Err = SluiceError>>(mode: &str) -> PyResult<T> {
    mode.parse().map_err(|e: SluiceError| match e {
        SluiceError::Config(message) => PyValueError::new_err(message),
        other => PyValueError::new_err(other.to_string()),
    })
}

/// How one epoch ended, as this subscriber saw it.
#[pyclass(frozen, module = "sluice._sluice", name = "EpochSummary")]
#[derive(Debug, Clone)]
pub struct PyEpochSummary(EpochSummary);

#[pymethods]
impl PyEpochSummary {
    /// The epoch.
    #[getter]
    fn epoch(&self) -> u64 {
        self.0.epoch
    }
    /// Whether this subscriber received the whole epoch (false when it joined late).
    #[getter]
    fn complete(&self) -> bool {
        self.0.complete
    }
    /// Rows this subscriber received in the epoch.
    #[getter(rows)]
    fn received_rows(&self) -> u64 {
        self.0.received_rows
    }
    /// Batches this subscriber received in the epoch (in its own batch size).
    #[getter(batches)]
    fn received_batches(&self) -> u64 {
        self.0.received_batches
    }
    /// Messages the producer skipped for this subscriber in the epoch because it fell
    /// behind the lag limit (with `on_lag="skip"`).
    #[getter]
    fn missed(&self) -> u64 {
        self.0.missed
    }
    /// Rows the producer published in the epoch.
    #[getter]
    fn producer_rows(&self) -> u64 {
        self.0.rows
    }
    /// Batches the producer published in the epoch.
    #[getter]
    fn producer_batches(&self) -> u64 {
        self.0.batches
    }
    fn __repr__(&self) -> String {
        format!(
            "sluice.EpochSummary(epoch={}, rows={}, batches={}, complete={}, producer_rows={}, missed={})",
            self.0.epoch,
            self.0.received_rows,
            self.0.received_batches,
            if self.0.complete { "True" } else { "False" },
            self.0.rows,
            self.0.missed
        )
    }
}

/// A subscription to a topic: iterate it for batches, or use [`epochs`](Self::epochs).
#[pyclass(frozen, module = "sluice._sluice", name = "Subscriber")]
pub struct PySubscriber {
    topic: String,
    batch_size: Option<usize>,
    /// The columns received, by name; `None`: all.
    columns: Option<Vec<String>>,
    join: &'static str,
    on_lag: &'static str,
    timeout: Option<Duration>,
    stream: Arc<Mutex<Stream>>,
    last_epoch: Mutex<Option<EpochSummary>>,
    /// The round of the last batch taken (plans of several rounds), and the reports
    /// written so far.
    round: Mutex<Option<u64>>,
    // `Local`: a forked child (a DataLoader worker) never writes or sends its parent's
    // buffered reports.
    feedback: Mutex<Local<Option<sluice::FeedbackWriter>>>,
    /// The process that subscribed: a forked child's copy refuses to be used (before it
    /// takes the stream's lock, which a thread of the parent may have held at the fork)
    /// and lets go of nothing of its parent's (see `sluice::shm::process`).
    owner: Owner,
}

impl PySubscriber {
    /// `Ok` in the process that subscribed; `TransportError` in a forked child.
    fn here(&self) -> PyResult<()> {
        self.owner.check("subscriber").map_err(|e| to_py(&e))
    }

    /// The next event, waiting (GIL released, Ctrl-C honoured) up to the timeout.
    fn next_event(&self, py: Python<'_>) -> PyResult<Event> {
        self.here()?;
        // Host batches copied to a GPU whose copies completed go back to the producer
        // now, before this subscriber's held samples are counted.
        crate::device_batch::collect_host_copies();
        let start = Instant::now();
        // A timeout past what an Instant holds: as long as it takes.
        let deadline = self.timeout.and_then(|t| start.checked_add(t));
        loop {
            // Reports wait at most a second while the trainer waits (for a batch, for the
            // next round, whose trigger may need them).
            self.flush_due_reports(py);
            let slice = deadline.map_or(SLICE, |d| {
                d.saturating_duration_since(Instant::now()).min(SLICE)
            });
            let stream = &self.stream;
            let result = py.detach(|| lock(stream).next_within(Some(slice)));
            match result {
                Ok(event) => {
                    // A signal that came meanwhile (Ctrl-C) is raised with the event put
                    // back: CPython raises it as soon as this returns, and the event
                    // would be lost, though the cursor counts it as handed out. Put back
                    // before the handlers run: one that saves `state_dict()` or closes
                    // the subscription sees the event as not handed out.
                    self.put_back(py, event);
                    py.check_signals()?;
                    let event = py
                        .detach(|| lock(stream).next_within(Some(Duration::ZERO)))
                        .map_err(|e| to_py(&e))?;
                    if let Event::Batch { batch, .. } = &event
                        && let Some(round) = sluice::rounds::round_of(batch)
                    {
                        *self.round.lock().unwrap_or_else(PoisonError::into_inner) = Some(round);
                    }
                    return Ok(event);
                }
                Err(SluiceError::Timeout { .. }) => {}
                Err(e) => {
                    py.check_signals()?;
                    return Err(to_py(&e));
                }
            }
            py.check_signals()?;
            if deadline.is_some_and(|d| Instant::now() >= d) {
                let note = py.detach(|| lock(stream).sub.as_ref().and_then(|s| s.held_back_by()));
                let what = match note {
                    Some(note) => format!("the next batch on topic '{}' ({note})", self.topic),
                    None => format!("the next batch on topic '{}'", self.topic),
                };
                return Err(to_py(&SluiceError::Timeout {
                    what,
                    seconds: start.elapsed().as_secs_f64(),
                }));
            }
        }
    }

    /// Puts an event back at the front of the stream.
    fn put_back(&self, py: Python<'_>, event: Event) {
        let stream = &self.stream;
        py.detach(|| {
            let mut stream = lock(stream);
            *stream.peeked = Some(event);
            let before = stream.before_last.take();
            stream.peeked_after = std::mem::replace(&mut stream.consumed, before);
        });
    }

    /// Writes out reports made a second ago or more, before waiting for the next batch:
    /// a trainer's last reports of a round are not held back while it waits for the
    /// next round (whose trigger may need them).
    ///
    /// The writer's lock is taken without the GIL, never held while taking it: another
    /// thread that holds it (flushing, without the GIL) must be able to finish.
    fn flush_due_reports(&self, py: Python<'_>) {
        let feedback = &self.feedback;
        py.detach(|| {
            let mut feedback = feedback.lock().unwrap_or_else(PoisonError::into_inner);
            if let Some(writer) = feedback.as_mut() {
                writer.flush_if_due();
            }
        });
    }

    fn set_last_epoch(&self, summary: &EpochSummary) {
        *self
            .last_epoch
            .lock()
            .unwrap_or_else(PoisonError::into_inner) = Some(summary.clone());
    }
}

#[pymethods]
impl PySubscriber {
    /// Attaches to `topic`, waiting for its producer if it has not started yet.
    ///
    /// `batch_size`: rows per batch for this subscriber (default: the producer's).
    /// `join`: `"now"`, `"next_epoch"` or `"replay"`. `timeout`: seconds to wait for the
    /// producer and then for each batch (default: forever). `on_lag`: `"error"` (raise
    /// `Lagged`) or `"skip"` (go on past batches missed under the producer's
    /// `sluice.lag_limit`). `reconnect`: seconds to wait for a restarted producer
    /// (`sluice run --resume`) after the producer is lost, continuing without duplicates
    /// or gaps (default: raise `ProducerLost`). `columns`: the names of the columns to
    /// receive, in that order (default: all); the others are never decoded.
    /// `on_max_held`: once the subscriber holds `sluice.max_held` batches, `"copy"` (the
    /// default) receives further batches as private copies, with one warning; `"error"`
    /// raises `TransportError` instead. `state`: what `state_dict()` returned in an
    /// earlier run of the trainer: start exactly after the rows it had consumed.
    #[new]
    #[pyo3(signature = (topic, batch_size=None, join="now", timeout=None, on_lag="error", reconnect=None, columns=None, on_max_held="copy", state=None, mask=None))]
    #[allow(clippy::too_many_arguments)]
    fn new(
        py: Python<'_>,
        topic: &str,
        batch_size: Option<&Bound<'_, PyAny>>,
        join: &str,
        timeout: Option<f64>,
        on_lag: &str,
        reconnect: Option<f64>,
        columns: Option<&Bound<'_, PyAny>>,
        on_max_held: &str,
        state: Option<&Bound<'_, PyAny>>,
        mask: Option<String>,
    ) -> PyResult<Self> {
        // A local topic name, or flight://HOST:PORT/TOPIC: a bad one is a ValueError.
        match sluice::flight::FlightTarget::parse(topic) {
            Some(target) => drop(target.map_err(|e| PyValueError::new_err(e.to_string()))?),
            None => drop(TopicName::new(topic).map_err(|e| PyValueError::new_err(e.to_string()))?),
        }
        let batch_size = parse_count("batch_size", batch_size, 1)?;
        let columns = parse_columns(columns)?;
        let join_mode: Join = parse_mode(join)?;
        let on_lag_mode: OnLag = parse_mode(on_lag)?;
        let on_max_held: OnMaxHeld = parse_mode(on_max_held)?;
        let timeout = parse_timeout("timeout", timeout)?;
        let cursor = parse_state(py, state)?;
        // Unlike a timeout, `None` means "do not reconnect" and infinity "wait forever".
        let reconnect = match reconnect {
            Some(t) if t.is_infinite() && t > 0.0 => Some(Duration::MAX),
            other => parse_timeout("reconnect", other)?,
        };
        // Options this module does not set keep their defaults.
        #[allow(clippy::needless_update)]
        let options = SubscribeOptions {
            timeout,
            namespace: None,
            batch_size,
            join: join_mode,
            on_lag: on_lag_mode,
            reconnect,
            columns: columns.as_ref().map_or(Columns::All, Columns::named),
            on_max_held,
            cursor,
            mask,
            loader_catch_up: Some(crate::catch_up::loader_catch_up()),
            ..SubscribeOptions::default()
        };
        // Waits in slices, so that Ctrl-C is answered between two; the connector keeps
        // the subscriber's declared interest for the whole wait.
        let mut connector = py
            .detach(|| Connector::new(topic, options))
            .map_err(|e| to_py(&e))?;
        let sub = loop {
            match py.detach(|| connector.attach(Some(CONNECT_SLICE))) {
                Ok(sub) => break sub,
                Err(SluiceError::Timeout { .. }) if !connector.timed_out() => {}
                Err(SluiceError::Timeout { .. }) => {
                    return Err(to_py(&SluiceError::Timeout {
                        what: format!("a producer to create topic '{topic}'"),
                        seconds: connector.waited().as_secs_f64(),
                    }));
                }
                Err(e) => {
                    py.check_signals()?;
                    return Err(to_py(&e));
                }
            }
            py.check_signals()?;
        };

        Ok(Self {
            topic: topic.to_string(),
            batch_size,
            columns,
            join: match join_mode {
                Join::Now => "now",
                Join::NextEpoch => "next_epoch",
                Join::Replay => "replay",
                Join::CatchUp => "catch_up",
            },
            on_lag: match on_lag_mode {
                OnLag::Error => "error",
                OnLag::Skip => "skip",
            },
            timeout,
            stream: Arc::new(Mutex::new(Stream {
                sub: Local::new(Some(sub)),
                peeked: Local::new(None),
                ended: false,
                last_published_ns: None,
                consumed: None,
                before_last: None,
                peeked_after: None,
                closed_cursor: None,
                closed_early: false,
            })),
            last_epoch: Mutex::new(None),
            round: Mutex::new(None),
            feedback: Mutex::new(Local::new(None)),
            owner: Owner::this(),
        })
    }

    /// When the producer published the newest of its batches this subscriber received:
    /// ``CLOCK_MONOTONIC`` nanoseconds, the clock of ``time.monotonic_ns()`` in every
    /// process of the machine (publish-to-use latency); ``None`` before the first batch.
    /// Where this trainer is, as a dict to save with its model (``torch.save``): every
    /// row of the batches this subscriber handed out came before it, none after. Pass it
    /// as ``state=`` to start again exactly there (see docs/python.md, "Resuming a
    /// trainer"). ``{}`` before the first batch.
    fn state_dict<'py>(&self, py: Python<'py>) -> PyResult<Bound<'py, PyAny>> {
        self.here()?;
        let stream = &self.stream;
        let json = py.detach(|| {
            let stream = lock(stream);
            let at = stream.consumed?;
            let cursor = match (stream.sub.as_ref(), &stream.closed_cursor) {
                (Some(sub), _) => sub.cursor_at(at),
                (None, Some(closed)) => Cursor {
                    epoch: at.epoch,
                    batch: at.index,
                    row: at.row,
                    ..closed.clone()
                },
                (None, None) => return None,
            };
            Some(cursor.to_json())
        });
        match json {
            Some(json) => py.import("json")?.call_method1("loads", (json,)),
            None => Ok(pyo3::types::PyDict::new(py).into_any()),
        }
    }

    /// Reports per-sample values for samples this trainer received, e.g.
    /// ``sub.report(batch["id"], loss=losses)``: one value per key for each name. A plan
    /// of several rounds reads them as ``sluice_feedback`` from its next round on
    /// (see docs/rounds.md). Written out within a second, on ``flush_reports()`` and on
    /// ``close()``; ``trainer`` names this trainer in ``sluice_feedback.trainer``.
    #[pyo3(signature = (keys, trainer=None, **values))]
    fn report(
        &self,
        py: Python<'_>,
        keys: &Bound<'_, PyAny>,
        trainer: Option<&str>,
        values: Option<&Bound<'_, pyo3::types::PyDict>>,
    ) -> PyResult<()> {
        self.here()?;
        let keys = crate::feedback::keys(keys)?;
        let values = crate::feedback::values(keys.len(), values)?;
        let round = self
            .round
            .lock()
            .unwrap_or_else(PoisonError::into_inner)
            .unwrap_or(0);
        let epoch = lock(&self.stream).consumed.map_or(0, |c| c.epoch);
        let (feedback, topic) = (&self.feedback, self.topic.as_str());
        // The writer's lock without the GIL (see `flush_due_reports`).
        py.detach(|| {
            let mut feedback = feedback.lock().unwrap_or_else(PoisonError::into_inner);
            let writer = match feedback.as_mut() {
                Some(writer) => {
                    crate::feedback::same_trainer(writer, trainer)?;
                    writer
                }
                None => feedback.insert(crate::feedback::writer(topic, trainer)?),
            };
            writer
                .report(keys, (round, epoch), values)
                .map_err(|e| to_py(&e))
        })
    }

    /// Writes the reports made so far now (else within a second, and on ``close()``).
    fn flush_reports(&self, py: Python<'_>) -> PyResult<()> {
        self.here()?;
        let feedback = &self.feedback;
        py.detach(|| {
            let mut feedback = feedback.lock().unwrap_or_else(PoisonError::into_inner);
            match feedback.as_mut() {
                Some(writer) => writer.flush().map_err(|e| to_py(&e)),
                None => Ok(()),
            }
        })
    }

    /// The round of the last batch taken (``None``: a plan of one round, or no batch yet).
    #[getter]
    fn round(&self) -> Option<u64> {
        *self.round.lock().unwrap_or_else(PoisonError::into_inner)
    }

    #[getter]
    fn last_published_ns(&self) -> Option<u64> {
        // Not in a forked child, before the lock (see `owner`).
        self.here().ok()?;
        lock(&self.stream).last_published_ns
    }

    /// The topic.
    #[getter]
    fn topic(&self) -> &str {
        &self.topic
    }

    /// Rows per batch for this subscriber, or `None` for the producer's batches.
    #[getter]
    fn batch_size(&self) -> Option<usize> {
        self.batch_size
    }

    /// The names of the columns received, or `None` for all of them.
    #[getter]
    fn columns(&self) -> Option<Vec<String>> {
        self.columns.clone()
    }

    /// How this subscriber joined: `"now"` or `"next_epoch"`.
    #[getter]
    fn join(&self) -> &'static str {
        self.join
    }

    /// What happens after falling behind the lag limit: `"error"` or `"skip"`.
    #[getter]
    fn on_lag(&self) -> &'static str {
        self.on_lag
    }

    /// Seconds to wait for each batch, or `None`.
    #[getter]
    fn timeout(&self) -> Option<f64> {
        self.timeout.map(|t| t.as_secs_f64())
    }

    /// Whether [`close`](Self::close) was called.
    #[getter]
    fn closed(&self, py: Python<'_>) -> bool {
        // A forked child's copy cannot be used: closed to it (and not looked at, before
        // the lock, see `owner`).
        if self.here().is_err() {
            return true;
        }
        let stream = &self.stream;
        py.detach(|| lock(stream).sub.is_none())
    }

    /// Summary of the last epoch that ended, or `None`.
    #[getter]
    fn last_epoch(&self) -> Option<PyEpochSummary> {
        self.last_epoch
            .lock()
            .unwrap_or_else(PoisonError::into_inner)
            .clone()
            .map(PyEpochSummary)
    }

    fn __iter__(slf: Bound<'_, Self>) -> Bound<'_, Self> {
        slf
    }

    /// The next batch, in any epoch; `StopIteration` at the end of the stream.
    fn __next__(&self, py: Python<'_>) -> PyResult<Option<Py<PyAny>>> {
        loop {
            match self.next_event(py)? {
                event @ (Event::Batch { .. } | Event::DeviceBatch { .. }) => {
                    return batch_object(py, event);
                }
                Event::EpochEnd(summary) => self.set_last_epoch(&summary),
                Event::End => return Ok(None),
            }
        }
    }

    /// The stream, epoch by epoch: `for epoch in sub.epochs(): for batch in epoch: ...`.
    ///
    /// Moving to the next epoch skips what is left of the current one.
    fn epochs(slf: Bound<'_, Self>) -> PyEpochs {
        PyEpochs {
            sub: slf.unbind(),
            current: Mutex::new(None),
        }
    }

    /// Leaves the topic; the producer stops waiting for this subscriber. Batches already
    /// received stay valid. Idempotent.
    fn close(&self, py: Python<'_>) {
        // A forked child's copy: the subscription is its parent's to close, and what the
        // child drops of it stays its parent's.
        if self.here().is_err() {
            return;
        }
        // Dropping the writer writes its reports out (its lock without the GIL, see
        // `flush_due_reports`).
        let feedback = &self.feedback;
        py.detach(|| {
            let writer = feedback
                .lock()
                .unwrap_or_else(PoisonError::into_inner)
                .take();
            drop(writer);
        });
        let stream = &self.stream;
        let sub = py.detach(|| {
            let mut stream = lock(stream);
            *stream.peeked = None;
            stream.closed_early |= !stream.ended;
            stream.ended = true;
            let at = stream.consumed.unwrap_or_default();
            stream.closed_cursor = stream.sub.as_ref().map(|s| s.cursor_at(at));
            stream.sub.take()
        });
        if let Some(mut sub) = sub {
            py.detach(move || {
                sub.close();
                drop(sub);
            });
        }
    }

    fn __enter__(slf: Bound<'_, Self>) -> Bound<'_, Self> {
        slf
    }

    #[pyo3(signature = (*_args))]
    fn __exit__(&self, py: Python<'_>, _args: &Bound<'_, pyo3::types::PyTuple>) -> bool {
        self.close(py);
        false
    }

    /// Exports the rest of the stream (all epochs) as an Arrow C stream, for
    /// `pyarrow.RecordBatchReader.from_stream(sub)`, `polars.DataFrame(sub)` and other
    /// Arrow consumers. Waits for the first batch to learn the schema.
    ///
    /// Stream consumers usually keep every batch (`read_all`), more than a subscriber may
    /// hold in shared memory (`sluice.max_held`), so the stream copies each batch out of
    /// shared memory once; iterate the subscriber itself for zero-copy batches. Ctrl-C
    /// ends a wait of the stream with an error (and `KeyboardInterrupt` once its consumer
    /// returns); the subscriber's `timeout` bounds each wait.
    #[pyo3(signature = (requested_schema=None))]
    fn __arrow_c_stream__<'py>(
        &self,
        py: Python<'py>,
        requested_schema: Option<Bound<'py, PyCapsule>>,
    ) -> PyResult<Bound<'py, PyCapsule>> {
        // The schema is fixed by the plan; a requested schema is not applied.
        let _ = requested_schema;
        let schema = loop {
            match self.next_event(py)? {
                event @ Event::Batch { .. } => {
                    let schema = match &event {
                        Event::Batch { batch, .. } => batch.schema(),
                        _ => unreachable!("matched a batch just above"),
                    };
                    self.put_back(py, event);
                    break schema;
                }
                Event::DeviceBatch { .. } => return Err(to_py(&device_stream_refused())),
                Event::EpochEnd(summary) => self.set_last_epoch(&summary),
                Event::End => break Arc::new(Schema::empty()),
            }
        };
        let reader = StreamReader {
            signals_seen: Instant::now(),
            owner: self.owner,
            stream: self.stream.clone(),
            schema,
            timeout: self.timeout,
        };
        let ffi = FFI_ArrowArrayStream::new(Box::new(reader));
        PyCapsule::new_with_value(py, ffi, c"arrow_array_stream")
    }

    fn __repr__(&self, py: Python<'_>) -> String {
        format!(
            "sluice.Subscriber(topic={:?}, batch_size={:?}, join={:?}, closed={})",
            self.topic,
            self.batch_size,
            self.join,
            if self.closed(py) { "True" } else { "False" }
        )
    }
}

/// A record-batch reader over a subscriber's stream, for the Arrow C stream interface.
struct StreamReader {
    stream: Arc<Mutex<Stream>>,
    schema: SchemaRef,
    timeout: Option<Duration>,
    /// When signals were last looked at: also while batches keep coming.
    signals_seen: Instant,
    /// The subscriber's process (see `PySubscriber::owner`).
    owner: Owner,
}

impl Iterator for StreamReader {
    type Item = Result<RecordBatch, ArrowError>;

    fn next(&mut self) -> Option<Self::Item> {
        if let Err(forked) = self.owner.check("subscriber") {
            return Some(Err(ArrowError::ExternalError(Box::new(forked))));
        }
        let start = Instant::now();
        if self.signals_seen.elapsed() >= SLICE {
            self.signals_seen = start;
            if let Some(interrupted) = interrupted() {
                return Some(Err(interrupted));
            }
        }
        loop {
            // The lock is held a slice at a time: `close()` and `closed` from another
            // thread do not wait for the next batch.
            let (event, closed) = {
                let mut stream = lock(&self.stream);
                let event = stream.next_within(Some(SLICE));
                // An end that is not the stream's: the subscription was closed (by
                // another thread) part-way.
                let closed = matches!(event, Ok(Event::End)) && stream.closed_early;
                (event, closed)
            };
            match event {
                Ok(Event::End) if closed => {
                    return Some(Err(ArrowError::ExternalError(
                        "the subscription was closed before its stream ended: what was read \
                         is not all of it"
                            .into(),
                    )));
                }
                Ok(Event::Batch { batch, .. }) => return Some(self.conforming(&batch)),
                Ok(Event::DeviceBatch { .. }) => {
                    return Some(Err(ArrowError::ExternalError(Box::new(
                        device_stream_refused(),
                    ))));
                }
                Ok(Event::EpochEnd(_)) => {}
                Ok(Event::End) => return None,
                Err(SluiceError::Timeout { .. }) => {
                    if let Some(interrupted) = interrupted() {
                        return Some(Err(interrupted));
                    }
                    if self.timeout.is_some_and(|t| start.elapsed() >= t) {
                        let e = SluiceError::Timeout {
                            what: "the next batch".into(),
                            seconds: start.elapsed().as_secs_f64(),
                        };
                        return Some(Err(ArrowError::ExternalError(Box::new(e))));
                    }
                }
                Err(e) => return Some(Err(ArrowError::ExternalError(Box::new(e)))),
            }
        }
    }
}

impl StreamReader {
    /// `batch`, copied out of shared memory, if it has the stream's schema: a C stream's
    /// consumer reads every batch as the schema it was given first (a batch of other
    /// columns would be read as garbage, or crash it).
    fn conforming(&self, batch: &RecordBatch) -> Result<RecordBatch, ArrowError> {
        // Names and types: nullability and field metadata do not change how a consumer
        // reads the arrays. Compared in place: this runs for every batch of the stream.
        let (now, first) = (batch.schema(), &self.schema);
        let same = Arc::ptr_eq(&now, first)
            || (now.fields().len() == first.fields().len()
                && now
                    .fields()
                    .iter()
                    .zip(first.fields())
                    .all(|(a, b)| a.name() == b.name() && a.data_type() == b.data_type()));
        if !same {
            return Err(ArrowError::SchemaError(format!(
                "the topic's batches changed their columns, from {} to {}: read them one by one (iterate the subscription) rather than as one stream",
                self.schema,
                batch.schema()
            )));
        }
        deep_copy(batch)
    }
}

/// The error of a wait that a signal interrupted (Ctrl-C), with the signal raised again
/// for Python once the consumer of the stream returns; `None` without one.
fn interrupted() -> Option<ArrowError> {
    let raised = Python::attach(|py| {
        py.check_signals().err().map(|e| {
            (
                e.to_string(),
                e.is_instance_of::<pyo3::exceptions::PyKeyboardInterrupt>(py),
            )
        })
    })?;
    let (message, keyboard) = raised;
    if keyboard {
        // SAFETY: PyErr_SetInterrupt only marks SIGINT as pending for the interpreter;
        // it may be called from any thread, with or without the GIL.
        unsafe { pyo3::ffi::PyErr_SetInterrupt() };
    }
    Some(ArrowError::ExternalError(
        format!("the wait for the next batch was interrupted: {message}").into(),
    ))
}

impl RecordBatchReader for StreamReader {
    fn schema(&self) -> SchemaRef {
        self.schema.clone()
    }
}

/// Iterator over the epochs of a subscriber.
#[pyclass(frozen, module = "sluice._sluice", name = "Epochs")]
pub struct PyEpochs {
    sub: Py<PySubscriber>,
    current: Mutex<Option<Py<PyEpoch>>>,
}

#[pymethods]
impl PyEpochs {
    fn __iter__(slf: Bound<'_, Self>) -> Bound<'_, Self> {
        slf
    }

    /// The next epoch; `StopIteration` at the end of the stream.
    fn __next__(&self, py: Python<'_>) -> PyResult<Option<Py<PyEpoch>>> {
        let previous = self
            .current
            .lock()
            .unwrap_or_else(PoisonError::into_inner)
            .take();
        if let Some(previous) = previous {
            // Skip what the caller left of the previous epoch.
            let previous = previous.bind(py).get();
            while previous.next_batch(py)?.is_some() {}
        }
        let sub = self.sub.bind(py).get();
        let epoch = match sub.next_event(py)? {
            event @ (Event::Batch { .. } | Event::DeviceBatch { .. }) => {
                let number = match &event {
                    Event::Batch { epoch, .. } | Event::DeviceBatch { epoch, .. } => *epoch,
                    _ => unreachable!("matched a batch just above"),
                };
                sub.put_back(py, event);
                PyEpoch::open(self.sub.clone_ref(py), number)
            }
            Event::EpochEnd(summary) => {
                // An epoch in which this subscriber received nothing.
                sub.set_last_epoch(&summary);
                let epoch = PyEpoch::open(self.sub.clone_ref(py), summary.epoch);
                *epoch.summary.lock().unwrap_or_else(PoisonError::into_inner) = Some(summary);
                epoch
            }
            Event::End => {
                sub.put_back(py, Event::End);
                return Ok(None);
            }
        };
        let epoch = Py::new(py, epoch)?;
        *self.current.lock().unwrap_or_else(PoisonError::into_inner) = Some(epoch.clone_ref(py));
        Ok(Some(epoch))
    }
}

/// One epoch of a subscription: iterate it for its batches. Once it is exhausted,
/// `complete`, `rows` and `batches` say what this subscriber received.
#[pyclass(frozen, module = "sluice._sluice", name = "Epoch")]
pub struct PyEpoch {
    sub: Py<PySubscriber>,
    epoch: u64,
    summary: Mutex<Option<EpochSummary>>,
    done: Mutex<bool>,
}

impl PyEpoch {
    fn open(sub: Py<PySubscriber>, epoch: u64) -> Self {
        Self {
            sub,
            epoch,
            summary: Mutex::new(None),
            done: Mutex::new(false),
        }
    }

    fn summary_now(&self) -> Option<EpochSummary> {
        self.summary
            .lock()
            .unwrap_or_else(PoisonError::into_inner)
            .clone()
    }

    fn is_done(&self) -> bool {
        *self.done.lock().unwrap_or_else(PoisonError::into_inner) || self.summary_now().is_some()
    }

    fn next_batch(&self, py: Python<'_>) -> PyResult<Option<Py<PyAny>>> {
        if self.is_done() {
            return Ok(None);
        }
        let sub = self.sub.bind(py).get();
        let event = sub.next_event(py)?;
        match event {
            event @ (Event::Batch { epoch, .. } | Event::DeviceBatch { epoch, .. })
                if epoch == self.epoch =>
            {
                batch_object(py, event)
            }
            Event::EpochEnd(summary) if summary.epoch == self.epoch => {
                sub.set_last_epoch(&summary);
                *self.summary.lock().unwrap_or_else(PoisonError::into_inner) = Some(summary);
                Ok(None)
            }
            other => {
                // The stream moved on (it ended, or the subscriber was read elsewhere).
                sub.put_back(py, other);
                *self.done.lock().unwrap_or_else(PoisonError::into_inner) = true;
                Ok(None)
            }
        }
    }
}

#[pymethods]
impl PyEpoch {
    /// The epoch number.
    #[getter]
    fn epoch(&self) -> u64 {
        self.epoch
    }

    /// Whether the epoch has been read to its end.
    #[getter]
    fn done(&self) -> bool {
        self.is_done()
    }

    /// The epoch's summary once it is exhausted, else `None`.
    #[getter]
    fn summary(&self) -> Option<PyEpochSummary> {
        self.summary_now().map(PyEpochSummary)
    }

    /// Whether this subscriber received the whole epoch; `None` until it is exhausted.
    /// False for the epoch a subscriber joined part-way through.
    #[getter]
    fn complete(&self) -> Option<bool> {
        self.summary_now().map(|s| s.complete)
    }

    /// Rows this subscriber received in the epoch; `None` until it is exhausted.
    #[getter]
    fn rows(&self) -> Option<u64> {
        self.summary_now().map(|s| s.received_rows)
    }

    /// Batches this subscriber received in the epoch; `None` until it is exhausted.
    #[getter]
    fn batches(&self) -> Option<u64> {
        self.summary_now().map(|s| s.received_batches)
    }

    fn __iter__(slf: Bound<'_, Self>) -> Bound<'_, Self> {
        slf
    }

    fn __next__(&self, py: Python<'_>) -> PyResult<Option<Py<PyAny>>> {
        self.next_batch(py)
    }

    fn __repr__(&self) -> String {
        match self.summary_now() {
            Some(s) => format!(
                "sluice.Epoch(epoch={}, rows={}, batches={}, complete={})",
                self.epoch,
                s.received_rows,
                s.received_batches,
                if s.complete { "True" } else { "False" }
            ),
            None => format!("sluice.Epoch(epoch={}, in progress)", self.epoch),
        }
    }
}

/// `sluice.subscribe(...)`: the same as `sluice.Subscriber(...)`.
#[pyfunction]
#[pyo3(signature = (topic, batch_size=None, join="now", timeout=None, on_lag="error", reconnect=None, columns=None, on_max_held="copy", state=None, mask=None))]
#[allow(clippy::too_many_arguments)]
pub fn subscribe(
    py: Python<'_>,
    topic: &str,
    batch_size: Option<&Bound<'_, PyAny>>,
    join: &str,
    timeout: Option<f64>,
    on_lag: &str,
    reconnect: Option<f64>,
    columns: Option<&Bound<'_, PyAny>>,
    on_max_held: &str,
    state: Option<&Bound<'_, PyAny>>,
    mask: Option<String>,
) -> PyResult<PySubscriber> {
    PySubscriber::new(
        py,
        topic,
        batch_size,
        join,
        timeout,
        on_lag,
        reconnect,
        columns,
        on_max_held,
        state,
        mask,
    )
}

/// A trainer's saved state (`state_dict()`), as a dict (or its JSON): `None` and `{}`
/// start without one; anything else that is not a cursor is a `ValueError`.
fn parse_state(py: Python<'_>, state: Option<&Bound<'_, PyAny>>) -> PyResult<Option<Cursor>> {
    let Some(state) = state.filter(|s| !s.is_none()) else {
        return Ok(None);
    };
    let json: String = match state.cast::<PyString>() {
        Ok(text) => text.to_str()?.to_string(),
        Err(_) if state.len().ok() == Some(0) => return Ok(None),
        Err(_) => py
            .import("json")?
            .call_method1("dumps", (state,))
            .and_then(|j| j.extract())
            .map_err(|e| {
                PyValueError::new_err(format!("state must be what state_dict() returned: {e}"))
            })?,
    };
    Cursor::from_json(&json)
        .map(Some)
        .map_err(|e| PyValueError::new_err(e.to_string()))
}
