//! `sluice.Producer`: runs a plan on a background thread of the calling process.
//!
//! The plan is loaded (and its errors raised) in the constructor; the run starts at once
//! on a thread with its own tokio runtime and never touches Python objects, so it keeps
//! publishing while the interpreter does other work. `wait()` and the end of a `with`
//! block raise the run's error, if any; `close()` stops the run (subscribers then see
//! `ProducerFailed: ... stopped`).

use std::path::PathBuf;
use std::sync::atomic::{AtomicBool, Ordering};
use std::sync::{Arc, Mutex, PoisonError, Weak};
use std::time::{Duration, Instant};

use pyo3::exceptions::PyValueError;
use pyo3::prelude::*;
use pyo3::types::{PyDict, PyTuple};
use sluice::core::TopicName;
use sluice::shm::process::Owner;
use sluice::{Namespace, Producer, ProducerHandle, RunOptions, RunStats, SluiceError};

use crate::errors::to_py;
use crate::subscriber::{parse_count, parse_timeout};

/// Longest wait without a chance to run Python's signal handlers.
const SLICE: Duration = Duration::from_millis(50);
/// How long interpreter shutdown waits for each running producer to stop.
const SHUTDOWN_WAIT: Duration = Duration::from_secs(5);

/// Producers of this process that may still run, for [`_shutdown`].
static LIVE: Mutex<Vec<(Owner, Weak<ProducerHandle>)>> = Mutex::new(Vec::new());

/// What a finished run did.
#[pyclass(frozen, module = "sluice._sluice", name = "RunStats")]
#[derive(Debug, Clone)]
pub struct PyRunStats(RunStats);

impl From<RunStats> for PyRunStats {
    fn from(stats: RunStats) -> Self {
        Self(stats)
    }
}

#[pymethods]
impl PyRunStats {
    /// Epochs completed.
    #[getter]
    fn epochs(&self) -> u64 {
        self.0.epochs
    }
    /// Batches published.
    #[getter]
    fn batches(&self) -> u64 {
        self.0.batches
    }
    /// Rows published.
    #[getter]
    fn rows(&self) -> u64 {
        self.0.rows
    }
    /// Payload bytes written to shared memory.
    #[getter]
    fn bytes(&self) -> u64 {
        self.0.bytes
    }
    /// Seconds from the first batch to the end of the stream.
    #[getter]
    fn elapsed(&self) -> f64 {
        self.0.elapsed.as_secs_f64()
    }
    /// Bytes of shared memory the topic reserved.
    #[getter]
    fn shm_bytes(&self) -> u64 {
        self.0.shm_bytes
    }
    /// Batches a subscriber could have queued: `sluice.window` as 'auto' sized it, or the
    /// lag limit where one is set.
    #[getter]
    fn window(&self) -> usize {
        self.0.window
    }
    /// Seconds of `elapsed` the producer waited for its plan (each epoch's and each next
    /// batch): a large share means the pipeline paced the run.
    #[getter]
    fn waited_for_pipeline(&self) -> f64 {
        self.0.waited_for_pipeline.as_secs_f64()
    }
    /// Seconds of `elapsed` the producer spent on subscribers' full queues: a large share
    /// means the slowest subscriber paced the run.
    #[getter]
    fn waited_for_subscribers(&self) -> f64 {
        self.0.waited_for_subscribers.as_secs_f64()
    }
    /// Messages of batches published (several batches to a message where
    /// `sluice.message_batches` lets them).
    #[getter]
    fn messages(&self) -> u64 {
        self.0.messages
    }
    /// Times idle subscribers were woken, for messages of batches and for each epoch's
    /// end and the stream's: fewer than `messages` where a burst of messages ready at
    /// once shared one.
    #[getter]
    fn wakeups(&self) -> u64 {
        self.0.wakeups
    }
    fn __repr__(&self) -> String {
        format!(
            "sluice.RunStats(epochs={}, batches={}, rows={}, bytes={}, elapsed={:.3}, shm_bytes={}, window={}, waited_for_pipeline={:.3}, waited_for_subscribers={:.3}, messages={}, wakeups={})",
            self.0.epochs,
            self.0.batches,
            self.0.rows,
            self.0.bytes,
            self.0.elapsed.as_secs_f64(),
            self.0.shm_bytes,
            self.0.window,
            self.0.waited_for_pipeline.as_secs_f64(),
            self.0.waited_for_subscribers.as_secs_f64(),
            self.0.messages,
            self.0.wakeups,
        )
    }
}

/// Runs a plan file and publishes its batches on the plan's topic, from a background
/// thread of this process.
#[pyclass(frozen, module = "sluice._sluice", name = "Producer")]
pub struct PyProducer {
    plan_file: String,
    topic: String,
    epochs: u64,
    /// The run (shared with [`LIVE`], for interpreter shutdown).
    handle: Arc<ProducerHandle>,
    stopped: AtomicBool,
    /// The process that started the run: in a forked child, the run's thread does not
    /// exist (a fork copies only the forking thread), so the child's copy refuses to wait
    /// for it and never joins it (see `sluice::shm::process`).
    owner: Owner,
}

impl PyProducer {
    /// `Ok` in the process that started the run; `TransportError` in a forked child.
    fn here(&self) -> PyResult<()> {
        self.owner.check("producer").map_err(|e| to_py(&e))
    }

    /// Waits for the run to finish, honouring Ctrl-C, up to `timeout`.
    fn wait_inner(&self, py: Python<'_>, timeout: Option<Duration>) -> PyResult<()> {
        self.here()?;
        let start = Instant::now();
        loop {
            let handle = &self.handle;
            if py.detach(|| handle.wait_finished(SLICE)) {
                break;
            }
            py.check_signals()?;
            if timeout.is_some_and(|t| start.elapsed() >= t) {
                return Err(to_py(&SluiceError::Timeout {
                    what: format!("the producer of topic '{}' to finish", self.topic),
                    seconds: start.elapsed().as_secs_f64(),
                }));
            }
        }
        // The thread has published its outcome; it only has to return.
        let handle = &self.handle;
        py.detach(|| handle.join_thread());
        Ok(())
    }

    fn outcome(&self) -> Option<Result<RunStats, PyErr>> {
        self.handle.with_outcome(|outcome| {
            outcome.map(|o| match o {
                Ok(stats) => Ok(stats.clone()),
                Err(e) => Err(to_py(e)),
            })
        })
    }
}

#[pymethods]
impl PyProducer {
    /// Loads `plan` (a plan file) and starts publishing it on a background thread.
    ///
    /// Keyword arguments override the plan's `SET sluice.*` options: `topic`, `epochs`,
    /// `batch_rows`, `min_subscribers` (subscribers to wait for before the first batch).
    /// `wait_timeout`: give up waiting for them after this many seconds. `linger`: after
    /// the last batch, wait for subscribers to read it all, giving up after this many
    /// seconds in which none takes a message.
    ///
    /// Raises `PlanError` (with file:line:column) for a bad plan.
    #[new]
    #[pyo3(signature = (plan, *, topic=None, epochs=None, batch_rows=None, min_subscribers=None, wait_timeout=None, linger=10.0))]
    #[allow(clippy::too_many_arguments)]
    fn new(
        py: Python<'_>,
        plan: PathBuf,
        topic: Option<String>,
        epochs: Option<&Bound<'_, PyAny>>,
        batch_rows: Option<&Bound<'_, PyAny>>,
        min_subscribers: Option<&Bound<'_, PyAny>>,
        wait_timeout: Option<f64>,
        linger: f64,
    ) -> PyResult<Self> {
        let epochs = parse_count("epochs", epochs, 1)?;
        let batch_rows = parse_count("batch_rows", batch_rows, 1)?;
        let min_subscribers = parse_count("min_subscribers", min_subscribers, 0)?;
        let subscriber_timeout = parse_timeout("wait_timeout", wait_timeout)?;
        let linger = parse_timeout("linger", Some(linger))?.unwrap_or(Duration::MAX);
        if let Some(t) = &topic {
            TopicName::new(t.as_str()).map_err(|e| PyValueError::new_err(e.to_string()))?;
        }

        let runtime = ProducerHandle::runtime("producer").map_err(|e| to_py(&e))?;
        let namespace = Namespace::from_env().map_err(|e| to_py(&e))?;
        // A plan that cannot load tells the subscribers waiting for its topic why.
        let told = RunOptions {
            min_subscribers,
            subscriber_timeout,
            linger,
            ..RunOptions::default()
        };
        // Parsed and planned on a deep stack, not this Python thread's (a deep expression).
        let mut plan = py
            .detach(|| {
                sluice::core::threads::on_deep_stack("sluice-plan", || {
                    Producer::load_for_run(
                        runtime.handle(),
                        &plan,
                        topic.as_deref(),
                        &namespace,
                        &told,
                    )
                })
                .and_then(|loaded| loaded)
            })
            .map_err(|e| to_py(&e))?;
        let options = plan.options_mut();
        if let Some(t) = topic {
            options.topic = t;
        }
        if let Some(e) = epochs {
            options.epochs = e as u64;
        }
        if let Some(b) = batch_rows {
            options.batch_rows = b;
        }
        if let Some(m) = min_subscribers {
            // Also in the options, so that it is validated with them.
            options.min_subscribers = m;
        }
        options.validate().map_err(|e| to_py(&e))?;
        let topic = options.topic.clone();
        let epochs = options.total_epochs();
        let plan_file = plan.file().to_string();

        let run_options = RunOptions {
            min_subscribers,
            subscriber_timeout,
            linger,
            ..RunOptions::default()
        };
        let producer = Producer::new(plan, namespace);
        let handle =
            Arc::new(ProducerHandle::spawn(producer, run_options, runtime).map_err(|e| to_py(&e))?);
        stopped_at_exit(&handle);
        Ok(Self {
            plan_file,
            topic,
            epochs,
            handle,
            stopped: AtomicBool::new(false),
            owner: Owner::this(),
        })
    }

    /// The topic the plan publishes on.
    #[getter]
    fn topic(&self) -> &str {
        &self.topic
    }

    /// The plan file.
    #[getter]
    fn plan_file(&self) -> &str {
        &self.plan_file
    }

    /// Epochs the run publishes.
    #[getter]
    fn epochs(&self) -> u64 {
        self.epochs
    }

    /// Whether the run is still going.
    #[getter]
    fn running(&self) -> bool {
        !self.handle.is_finished()
    }

    /// Where the run is: `epoch`, `batches`, `rows`, `bytes`, `subscribers`.
    #[getter]
    fn progress<'py>(&self, py: Python<'py>) -> PyResult<Bound<'py, PyDict>> {
        progress_dict(py, &self.handle)
    }

    /// Waits for the run to finish and returns its `RunStats`; raises its error
    /// (`ProducerFailed`-worthy failures surface here as `SluiceError` subclasses), or
    /// `Timeout` after `timeout` seconds (the run goes on).
    #[pyo3(signature = (timeout=None))]
    fn wait(&self, py: Python<'_>, timeout: Option<f64>) -> PyResult<PyRunStats> {
        let timeout = parse_timeout("timeout", timeout)?;
        self.wait_inner(py, timeout)?;
        match self.outcome() {
            Some(Ok(stats)) => Ok(PyRunStats(stats)),
            Some(Err(e)) => Err(e),
            None => unreachable!("wait_inner returns once the outcome is set"),
        }
    }

    /// Stops the run if it is still going and waits for the thread to end. Subscribers
    /// are told it stopped (`ProducerFailed`), or, those whose queue was full, find the
    /// producer gone (`ProducerLost`): a stopping producer waits for no one. Raises the run's error only if it failed before `close()`.
    /// Idempotent.
    fn close(&self, py: Python<'_>) -> PyResult<()> {
        self.here()?;
        if !self.handle.is_finished() {
            self.stopped.store(true, Ordering::Relaxed);
            self.handle.stop();
        }
        self.wait_inner(py, None)?;
        match self.outcome() {
            Some(Err(e)) if !self.stopped.load(Ordering::Relaxed) => Err(e),
            _ => Ok(()),
        }
    }

    fn __enter__(slf: Bound<'_, Self>) -> Bound<'_, Self> {
        slf
    }

    /// Without an exception: waits for the run and raises its error (unless `close()`
    /// stopped it inside the block). With one: stops the run and lets the exception
    /// propagate.
    #[pyo3(signature = (*args))]
    fn __exit__(&self, py: Python<'_>, args: &Bound<'_, PyTuple>) -> PyResult<bool> {
        let exception = args.len() > 0 && !args.get_item(0)?.is_none();
        if exception {
            let _ = self.close(py);
        } else if self.stopped.load(Ordering::Relaxed) {
            // Closed inside the block: the stop was asked for, not a failure to report.
            self.close(py)?;
        } else {
            self.wait(py, None)?;
        }
        Ok(false)
    }

    fn __repr__(&self) -> String {
        format!(
            "sluice.Producer(plan={:?}, topic={:?}, epochs={}, running={})",
            self.plan_file,
            self.topic,
            self.epochs,
            if self.running() { "True" } else { "False" }
        )
    }
}

/// The size of an epoch of `topic` as its running producer in this namespace reports it
/// (`(batches, rows)`, either `None` where unknown), or `None` without a producer.
#[pyfunction]
pub fn epoch_size(py: Python<'_>, topic: &str) -> PyResult<Option<(Option<u64>, Option<u64>)>> {
    let topic = TopicName::new(topic).map_err(|e| PyValueError::new_err(e.to_string()))?;
    let namespace = Namespace::from_env().map_err(|e| to_py(&e))?;
    // Files are read: other threads (a DataLoader's pin-memory thread) go on meanwhile.
    let report = py
        .detach(|| sluice::status::producer_report(&namespace, &topic))
        .map_err(|e| to_py(&e))?;
    match report {
        // A run that failed reports so while it tells its subscribers why: no size.
        Some(r) if r.state == "failed" => Err(to_py(&SluiceError::ProducerFailed(
            r.error.unwrap_or_else(|| {
                format!(
                    "the producer of topic '{topic}' (process {}) failed; its subscribers \
                     are told why",
                    r.pid
                )
            }),
        ))),
        report => Ok(report.map(|r| (r.epoch_size.batches, r.epoch_size.rows))),
    }
}

/// Stops every producer of this process that is still running and waits (up to a few
/// seconds each) for it to remove its shared memory. Registered with `atexit`.
#[pyfunction]
pub fn _shutdown(py: Python<'_>) {
    // A forked child's copies of its parent's producers have no thread to wait for.
    let live: Vec<Arc<ProducerHandle>> = LIVE
        .lock()
        .unwrap_or_else(PoisonError::into_inner)
        .drain(..)
        .filter(|(owner, _)| owner.is_here())
        .filter_map(|(_, w)| w.upgrade())
        .collect();
    for handle in &live {
        handle.stop();
    }
    py.detach(|| {
        for handle in &live {
            handle.wait_finished(SHUTDOWN_WAIT);
        }
    });
}

/// Has `handle`'s run stopped by [`_shutdown`] at interpreter exit if it still runs then,
/// so that it removes its shared memory.
pub(crate) fn stopped_at_exit(handle: &Arc<ProducerHandle>) {
    let mut live = LIVE.lock().unwrap_or_else(PoisonError::into_inner);
    live.retain(|(_, w)| w.strong_count() > 0);
    live.push((Owner::this(), Arc::downgrade(handle)));
}

/// A run's progress so far, as the `progress` dict of a producer or a feeder.
pub(crate) fn progress_dict<'py>(
    py: Python<'py>,
    handle: &ProducerHandle,
) -> PyResult<Bound<'py, PyDict>> {
    let p = handle.progress();
    let d = PyDict::new(py);
    d.set_item("epoch", p.epoch)?;
    d.set_item("batches", p.batches)?;
    d.set_item("rows", p.rows)?;
    d.set_item("bytes", p.bytes)?;
    d.set_item("subscribers", p.subscribers)?;
    Ok(d)
}
