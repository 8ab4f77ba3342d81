//! Python bindings of Sluice: the `sluice._sluice` extension module behind the `sluice`
//! Python package.
//!
//! # Architecture
//!
//! ```text
//!  producer process                          trainer process (this module)
//!  ───────────────                           ─────────────────────────────
//!  sluice.Producer ─► sluice::Producer ─► topic ─► sluice::Subscriber ─► Subscriber / Epoch
//!   (background thread,                 (iceoryx2     (Mutex, waits with     │
//!    own tokio runtime)                  shm)          the GIL released)      ▼
//!                                                                           Batch ──► pyarrow, polars
//!                                                          __arrow_c_array__ / __arrow_c_device_array__
//!                                                                           Column ─► numpy, torch, JAX
//!                                                                   __dlpack__ (read-only, zero-copy)
//! ```
//!
//! Batches decoded in place from shared memory are handed to Python without copying:
//! every export (Arrow C data, Arrow C device, DLPack) holds a reference to the Arrow
//! buffers, which hold the iceoryx2 sample, so the sample goes back to the producer only
//! when the last Python view of it is gone.
//!
//! # Modules
//! * `errors`: Python exception classes for `sluice::SluiceError`.
//! * `subscriber`: `Subscriber`, `Epoch`, waiting with Ctrl-C, the Arrow stream export.
//! * `batch`: `Batch` and `Column`, the PyCapsule protocol and DLPack.
//! * `device`: the Arrow C Device struct (`ArrowDeviceArray`).
//! * `dlpack`: DLPack structs and capsules (host and CUDA memory).
//! * `gpu`: `DeviceBatch` and `DeviceColumn`, batches of GPU topics (DLPack on CUDA,
//!   `__cuda_array_interface__`).
//! * `producer`: `Producer`, a run on a background thread.
#![warn(missing_docs)]

mod batch;
mod c_device;
mod catch_up;
mod device_batch;
mod dlpack;
mod errors;
mod feedback;
mod feeder;
mod gpu;
mod private_map;
mod producer;
mod subscriber;

use pyo3::prelude::*;

/// The `sluice._sluice` extension module.
#[pymodule]
fn _sluice(m: &Bound<'_, PyModule>) -> PyResult<()> {
    let py = m.py();
    // Panics Sluice catches (a reader on a corrupt file) are reported once, as errors.
    sluice::core::panics::install_quiet_hook();
    // Sluice's warnings (a segment that cannot be pinned, a stop that leaves held GPU
    // batches invalid, a subscriber left behind) reach the trainer's stderr as the CLI's
    // do; `SLUICE_LOG` sets the filter (default `warn`).
    sluice::logging::log_to_stderr("warn");
    m.add("__version__", env!("CARGO_PKG_VERSION"))?;
    // Benchmarks refuse to report figures of an unoptimised build (the test wheel).
    m.add("_optimized", !cfg!(debug_assertions))?;
    m.add_function(wrap_pyfunction!(feedback::request_round, m)?)?;
    m.add_class::<subscriber::PySubscriber>()?;
    m.add_class::<subscriber::PyEpochs>()?;
    m.add_class::<subscriber::PyEpoch>()?;
    m.add_class::<subscriber::PyEpochSummary>()?;
    m.add_class::<batch::PyBatch>()?;
    m.add_class::<batch::PyColumn>()?;
    m.add_class::<device_batch::PyDeviceBatch>()?;
    m.add_class::<gpu::PyDeviceColumn>()?;
    m.add_class::<producer::PyProducer>()?;
    m.add_class::<producer::PyRunStats>()?;
    m.add_class::<feeder::PyFeeder>()?;
    m.add_class::<catch_up::PyCatchUpSink>()?;
    m.add_function(wrap_pyfunction!(subscriber::subscribe, m)?)?;
    m.add_function(wrap_pyfunction!(producer::_shutdown, m)?)?;
    m.add_function(wrap_pyfunction!(producer::epoch_size, m)?)?;
    m.add("SluiceError", py.get_type::<errors::SluiceError>())?;
    m.add("PlanError", py.get_type::<errors::PlanError>())?;
    m.add("ProducerLost", py.get_type::<errors::ProducerLost>())?;
    m.add("ProducerFailed", py.get_type::<errors::ProducerFailed>())?;
    m.add("Lagged", py.get_type::<errors::Lagged>())?;
    m.add("Timeout", py.get_type::<errors::Timeout>())?;
    m.add("TransportError", py.get_type::<errors::TransportError>())?;
    m.add("CorruptMessage", py.get_type::<errors::CorruptMessage>())?;
    Ok(())
}
