//! `sluice._sluice.Feeder`: a producer whose batches Python code feeds (what
//! `sluice.publish` drives with any data loader; see `python/sluice/loader.py`).
//!
//! The run starts at once on a thread with its own runtime, as a plan's does; each batch
//! fed (anything exporting `__arrow_c_array__` as a record batch, built by the loader
//! module from the loader's structure) crosses to it without a copy and is written once
//! into shared memory there. Feeding releases the GIL while the queue is full.

use std::sync::{Arc, Mutex, PoisonError};
use std::time::Duration;

use arrow::record_batch::RecordBatch;
use pyo3::exceptions::PyValueError;
use pyo3::prelude::*;
use pyo3_arrow::PyRecordBatch;
use sluice::core::{DeviceSpec, TopicName};
use sluice::shm::process::Owner;
use sluice::status::EpochSize;
use sluice::{Feeder, Namespace, Producer, ProducerHandle, RunOptions, SluiceError, SluiceOptions};

use crate::errors::to_py;
use crate::producer::PyRunStats;
use crate::subscriber::{parse_count, parse_timeout};

/// Longest wait without a chance to run Python's signal handlers.
const SLICE: Duration = Duration::from_millis(50);

/// Feeds `batch` if the queue has room within `wait`; gives it back if not.
fn send_within(
    feeder: &Feeder,
    batch: RecordBatch,
    wait: Duration,
) -> sluice::Result<Option<RecordBatch>> {
    let start = std::time::Instant::now();
    let mut batch = batch;
    loop {
        batch = match feeder.try_send(batch)? {
            None => return Ok(None),
            Some(batch) => batch,
        };
        if start.elapsed() >= wait {
            return Ok(Some(batch));
        }
        std::thread::sleep(Duration::from_millis(2));
    }
}

/// A producer fed batch by batch from Python.
#[pyclass(module = "sluice._sluice", name = "Feeder")]
pub struct PyFeeder {
    topic: String,
    /// `None` once the feeding ended (finished, failed or stopped). Locked only to take
    /// or clone it, never across a wait: a thread that waits to feed lets go of the GIL,
    /// and must not hold a lock that a thread holding the GIL (one closing the run) wants.
    feeder: Mutex<Option<Arc<Feeder>>>,
    handle: Arc<ProducerHandle>,
    owner: Owner,
}

impl PyFeeder {
    fn feeder<T>(&self, f: impl FnOnce(&Feeder) -> sluice::Result<T>) -> PyResult<T> {
        self.owner.check("producer").map_err(|e| to_py(&e))?;
        let feeder = self
            .feeder
            .lock()
            .unwrap_or_else(PoisonError::into_inner)
            .clone();
        let Some(feeder) = feeder else {
            return Err(to_py(&SluiceError::Stopped(format!(
                "the producer of topic '{}' was closed",
                self.topic
            ))));
        };
        f(&feeder).map_err(|e| to_py(&e))
    }

    /// `e`, or where it says the run ended first, the run's own error.
    fn run_error(&self, py: Python<'_>, e: SluiceError) -> PyErr {
        let handle = &self.handle;
        if matches!(e, SluiceError::Stopped(_))
            && py.detach(|| handle.wait_finished(Duration::from_secs(1)))
            && let Some(run) = handle.with_outcome(|o| match o {
                Some(Err(run)) => Some(to_py(run)),
                _ => None,
            })
        {
            return run;
        }
        to_py(&e)
    }

    /// Ends the feeding and waits for the run's outcome (in the process that started it:
    /// a forked child has no run thread to wait for).
    fn join(&self, py: Python<'_>) -> PyResult<PyRunStats> {
        self.owner.check("producer").map_err(|e| to_py(&e))?;
        drop(
            self.feeder
                .lock()
                .unwrap_or_else(PoisonError::into_inner)
                .take(),
        );
        loop {
            let handle = &self.handle;
            if py.detach(|| handle.wait_finished(SLICE)) {
                break;
            }
            py.check_signals()?;
        }
        let handle = &self.handle;
        py.detach(|| handle.join_thread());
        let outcome = self.handle.with_outcome(|o| {
            o.map(|r| match r {
                Ok(stats) => Ok(stats.clone()),
                Err(e) => Err(to_py(e)),
            })
        });
        match outcome {
            Some(Ok(stats)) => Ok(PyRunStats::from(stats)),
            Some(Err(e)) => Err(e),
            None => Err(to_py(&SluiceError::Internal(
                "the run left no outcome".into(),
            ))),
        }
    }
}

#[pymethods]
impl PyFeeder {
    #[new]
    #[pyo3(signature = (topic, *, epochs=None, window=None, max_subscribers=None, min_subscribers=None, max_held=None, lag_limit=None, wait_timeout=None, linger=10.0, factory=None, epoch_batches=None, epoch_rows=None, device=None))]
    #[allow(clippy::too_many_arguments)]
    fn new(
        topic: String,
        epochs: Option<&Bound<'_, PyAny>>,
        window: Option<&Bound<'_, PyAny>>,
        max_subscribers: Option<&Bound<'_, PyAny>>,
        min_subscribers: Option<&Bound<'_, PyAny>>,
        max_held: Option<&Bound<'_, PyAny>>,
        lag_limit: Option<&Bound<'_, PyAny>>,
        wait_timeout: Option<f64>,
        linger: f64,
        factory: Option<String>,
        epoch_batches: Option<u64>,
        epoch_rows: Option<u64>,
        device: Option<String>,
    ) -> PyResult<Self> {
        TopicName::new(topic.as_str()).map_err(|e| PyValueError::new_err(e.to_string()))?;
        let mut options = SluiceOptions::default();
        options.topic = topic.clone();
        if let Some(n) = parse_count("epochs", epochs, 1)? {
            options.epochs = n as u64;
        }
        if let Some(n) = parse_count("window", window, 1)? {
            options.window = n.to_string();
        }
        if let Some(n) = parse_count("max_subscribers", max_subscribers, 1)? {
            options.max_subscribers = n;
        }
        let min_subscribers = parse_count("min_subscribers", min_subscribers, 0)?;
        if let Some(n) = min_subscribers {
            options.min_subscribers = n;
        }
        if let Some(n) = parse_count("max_held", max_held, 1)? {
            options.max_held = n;
        }
        if let Some(n) = parse_count("lag_limit", lag_limit, 0)? {
            options.lag_limit = n;
        }
        if let Some(device) = device {
            // Checked here, as a plan's setting is: a bad name is the caller's ValueError.
            device
                .parse::<DeviceSpec>()
                .map_err(|e| PyValueError::new_err(e.to_string()))?;
            options.device = device;
        }
        options.validate().map_err(|e| to_py(&e))?;
        let run_options = RunOptions {
            min_subscribers,
            subscriber_timeout: parse_timeout("wait_timeout", wait_timeout)?,
            linger: parse_timeout("linger", Some(linger))?.unwrap_or(Duration::MAX),
            ..RunOptions::default()
        };
        let namespace = Namespace::from_env().map_err(|e| to_py(&e))?;
        let (producer, feeder) = Producer::fed(options, namespace);
        let producer = match &factory {
            Some(factory) => producer.remade_by(factory),
            None => producer,
        }
        .epoch_size(EpochSize {
            batches: epoch_batches,
            rows: epoch_rows,
        });
        let runtime = ProducerHandle::runtime("feeder").map_err(|e| to_py(&e))?;
        let handle =
            Arc::new(ProducerHandle::spawn(producer, run_options, runtime).map_err(|e| to_py(&e))?);
        crate::producer::stopped_at_exit(&handle);
        Ok(Self {
            topic,
            feeder: Mutex::new(Some(Arc::new(feeder))),
            handle,
            owner: Owner::this(),
        })
    }

    #[getter]
    fn topic(&self) -> &str {
        &self.topic
    }

    /// ``epoch``, ``batches``, ``rows``, ``bytes``, ``subscribers`` so far.
    #[getter]
    fn progress<'py>(&self, py: Python<'py>) -> PyResult<Bound<'py, pyo3::types::PyDict>> {
        crate::producer::progress_dict(py, &self.handle)
    }

    /// Feeds the next batch of the epoch (an object exporting ``__arrow_c_array__`` as a
    /// record batch, such as a ``pyarrow.RecordBatch``); waits, without the GIL, while the
    /// run is two batches behind.
    fn send(&self, py: Python<'_>, batch: PyRecordBatch) -> PyResult<()> {
        let mut batch = batch.into_inner();
        loop {
            // Waits in slices, so that Ctrl-C reaches the loop that feeds.
            let left = self.feeder(|f| Ok(py.detach(|| send_within(f, batch, SLICE))))?;
            batch = match left.map_err(|e| self.run_error(py, e))? {
                None => return Ok(()),
                Some(batch) => batch,
            };
            py.check_signals()?;
        }
    }

    /// Ends the current epoch.
    fn end_epoch(&self, py: Python<'_>) -> PyResult<()> {
        let sent = self.feeder(|f| Ok(py.detach(|| f.end_epoch())))?;
        sent.map_err(|e| self.run_error(py, e))
    }

    /// Fails the run with ``message`` (subscribers get ``ProducerFailed``) and waits for
    /// it to tell them.
    fn fail(&self, py: Python<'_>, message: &str) -> PyResult<()> {
        let _ = self.feeder(|f| Ok(py.detach(|| f.fail(message))))?;
        match self.join(py) {
            Ok(_) => Ok(()),
            // The failure it was told of.
            Err(_) => Ok(()),
        }
    }

    /// After the last epoch: waits for the run to end (the end of the stream published,
    /// the subscribers drained) and returns what it did.
    fn finish(&self, py: Python<'_>) -> PyResult<PyRunStats> {
        self.join(py)
    }

    /// Stops the run where it is (subscribers are told it stopped) and waits for it; in a
    /// forked child, `TransportError` (the run is its parent's).
    fn close(&self, py: Python<'_>) -> PyResult<()> {
        self.owner.check("producer").map_err(|e| to_py(&e))?;
        self.handle.stop();
        let _ = self.join(py);
        Ok(())
    }
}
