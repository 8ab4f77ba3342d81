//! A producer running on a thread of its own, with a tokio runtime of its own: how the
//! `sluice` binary, the Python binding and the benchmarks run one.
//!
//! ```no_run
//! # fn main() -> sluice::Result<()> {
//! use sluice::{Namespace, Plan, Producer, ProducerHandle, RunOptions};
//!
//! let runtime = ProducerHandle::runtime("sluice-producer")?;
//! let plan = runtime.block_on(Plan::load(std::path::Path::new("pipelines/demo.sql")))?;
//! let producer = Producer::new(plan, Namespace::from_env()?);
//! let handle = ProducerHandle::spawn(producer, RunOptions::default(), runtime)?;
//! // ... trainers subscribe meanwhile ...
//! let stats = handle.join()?;
//! println!("{} rows in {:?}", stats.rows, stats.elapsed);
//! # Ok(()) }
//! ```

use std::sync::atomic::{AtomicBool, Ordering};
use std::sync::{Arc, Condvar, Mutex, PoisonError};
use std::thread::JoinHandle;
use std::time::Duration;

use sluice_core::process::Owner;
use sluice_core::{Result, SluiceError};
use tokio::runtime::Runtime;

use super::{Producer, Progress, RunOptions, RunStats};

/// How long a dropped handle's runtime may take to stop its tasks.
const RUNTIME_SHUTDOWN: Duration = Duration::from_secs(5);

/// What the run's thread shares with its handle.
#[derive(Debug, Default)]
struct Shared {
    outcome: Mutex<Option<Result<RunStats>>>,
    finished: Condvar,
    progress: Mutex<Progress>,
}

/// `run`'s outcome, a panic in it becoming an error that says so (a panic is a bug, but
/// must not leave the run without an outcome: `wait_finished` would wait forever, as
/// `sluice run` did once its thread had died).
fn outcome_of(run: impl FnOnce() -> Result<RunStats>) -> Result<RunStats> {
    sluice_core::panics::catch(run).unwrap_or_else(|panic| {
        Err(SluiceError::Internal(format!(
            "the producer thread panicked: {panic}"
        )))
    })
}

/// A producer running on a thread of its own (see the module docs): progress, stop,
/// and its outcome. Dropping the handle stops the run and waits for it to clean up.
///
/// A forked child's copy refuses to wait (the thread is its parent's, and not in the
/// child) and lets go of nothing.
#[derive(Debug)]
pub struct ProducerHandle {
    shared: Arc<Shared>,
    stop: Arc<AtomicBool>,
    thread: Mutex<Option<JoinHandle<()>>>,
    owner: Owner,
}

impl ProducerHandle {
    /// A multi-threaded tokio runtime for a producer's plan, its threads named after
    /// `name` (their panics are reported as errors, see `sluice_core::panics`).
    pub fn runtime(name: &str) -> Result<Runtime> {
        tokio::runtime::Builder::new_multi_thread()
            .enable_all()
            .thread_name(format!(
                "{}-{name}",
                sluice_core::panics::RUNTIME_THREAD_PREFIX
            ))
            .thread_stack_size(sluice_core::threads::RUNTIME_THREAD_STACK)
            .build()
            .map_err(|e| SluiceError::io("cannot start the async runtime", e))
    }

    /// Starts `producer` with `options` on a new thread, its plan executing on
    /// `runtime` (which the thread shuts down when the run ends). `options.stop` is the
    /// handle's stop flag.
    pub fn spawn(producer: Producer, options: RunOptions, runtime: Runtime) -> Result<Self> {
        let shared = Arc::new(Shared::default());
        let stop = options.stop.clone();
        let for_thread = shared.clone();
        let thread = std::thread::Builder::new()
            .name("sluice-producer".into())
            .stack_size(sluice_core::threads::RUNTIME_THREAD_STACK)
            .spawn(move || {
                let shared = for_thread;
                let result = outcome_of(|| {
                    producer.run(runtime.handle(), &options, |p| {
                        *shared
                            .progress
                            .lock()
                            .unwrap_or_else(PoisonError::into_inner) = p.clone();
                    })
                });
                drop(producer);
                runtime.shutdown_timeout(RUNTIME_SHUTDOWN);
                *shared
                    .outcome
                    .lock()
                    .unwrap_or_else(PoisonError::into_inner) = Some(result);
                shared.finished.notify_all();
            })
            .map_err(|e| SluiceError::io("cannot start the producer thread", e))?;
        Ok(Self {
            shared,
            stop,
            thread: Mutex::new(Some(thread)),
            owner: Owner::this(),
        })
    }

    /// Where the run is.
    pub fn progress(&self) -> Progress {
        self.shared
            .progress
            .lock()
            .unwrap_or_else(PoisonError::into_inner)
            .clone()
    }

    /// Asks the run to stop: subscribers are told it stopped (those whose queue is full
    /// find the producer gone instead), and it ends with [`SluiceError::Stopped`].
    pub fn stop(&self) {
        self.stop.store(true, Ordering::Relaxed);
    }

    /// The run's stop flag, for a signal handler.
    pub fn stop_flag(&self) -> Arc<AtomicBool> {
        self.stop.clone()
    }

    /// Whether the run has ended.
    pub fn is_finished(&self) -> bool {
        self.shared
            .outcome
            .lock()
            .unwrap_or_else(PoisonError::into_inner)
            .is_some()
    }

    /// Waits up to `timeout` for the run to end; true once it has.
    pub fn wait_finished(&self, timeout: Duration) -> bool {
        let guard = self
            .shared
            .outcome
            .lock()
            .unwrap_or_else(PoisonError::into_inner);
        let (guard, _) = self
            .shared
            .finished
            .wait_timeout_while(guard, timeout, |o| o.is_none())
            .unwrap_or_else(PoisonError::into_inner);
        guard.is_some()
    }

    /// The run's outcome once it has ended, given to `f` (the error is not `Clone`).
    pub fn with_outcome<T>(&self, f: impl FnOnce(Option<&Result<RunStats>>) -> T) -> T {
        f(self
            .shared
            .outcome
            .lock()
            .unwrap_or_else(PoisonError::into_inner)
            .as_ref())
    }

    /// Waits for the run to end and returns its outcome.
    pub fn join(self) -> Result<RunStats> {
        self.owner.check("producer")?;
        self.join_thread();
        self.shared
            .outcome
            .lock()
            .unwrap_or_else(PoisonError::into_inner)
            .take()
            .unwrap_or_else(|| {
                Err(SluiceError::Internal(
                    "the producer thread ended without an outcome".into(),
                ))
            })
    }

    /// Joins the run's thread once it has ended (it has published its outcome and only
    /// returns); does nothing in a forked child.
    pub fn join_thread(&self) {
        if !self.owner.is_here() {
            return;
        }
        let thread = self
            .thread
            .lock()
            .unwrap_or_else(PoisonError::into_inner)
            .take();
        if let Some(thread) = thread {
            let _ = thread.join();
        }
    }
}

impl Drop for ProducerHandle {
    fn drop(&mut self) {
        let thread = self
            .thread
            .get_mut()
            .unwrap_or_else(PoisonError::into_inner)
            .take();
        if !self.owner.is_here() {
            // A forked child's copy: the thread is its parent's, and not in this process.
            std::mem::forget(thread);
            return;
        }
        if let Some(thread) = thread {
            // Nobody can wait for this run any more: stop it and let it clean up its
            // shared memory. The thread never needs the caller's locks (Python's GIL
            // included), so joining cannot deadlock.
            self.stop();
            let _ = thread.join();
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn a_run_thread_that_panics_still_ends_the_run() {
        let outcome = outcome_of(|| panic!("a bug in the run"));
        assert!(
            matches!(&outcome, Err(SluiceError::Internal(m)) if m.contains("panicked") && m.contains("a bug in the run")),
            "{outcome:?}"
        );
    }

    #[test]
    fn an_outcome_set_by_the_run_is_kept() {
        let outcome = outcome_of(|| Err(SluiceError::Stopped("by hand".into())));
        assert!(matches!(outcome, Err(SluiceError::Stopped(_))));
    }
}
