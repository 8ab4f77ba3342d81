//! Python exceptions for [`sluice::SluiceError`].
//!
//! Every Rust error becomes an instance of one of the classes below, carrying the Rust
//! message unchanged:
//!
//! ```text
//! SluiceError (Exception)
//! ├── PlanError          Plan, Config: the plan file or a setting is wrong (file:line:col)
//! ├── ProducerLost       the producer exited or was killed without ending the stream
//! ├── ProducerFailed     the producer failed and told its subscribers why
//! ├── Lagged             the subscriber fell behind the producer's lag limit, or stalled
//! │                      its Flight server longer than its --max-stall (detached)
//! ├── Timeout            waiting took longer than the caller allowed
//! ├── TransportError     Transport, TopicBusy, ShmTooSmall, Forked*: shared memory or iceoryx2
//! └── CorruptMessage     a message in shared memory failed validation
//! ```
//! Everything else (execution, Arrow, I/O, internal errors) is a plain `SluiceError`.

use pyo3::PyErr;
use pyo3::create_exception;
use pyo3::exceptions::PyException;
use sluice::SluiceError as RustError;

create_exception!(
    sluice,
    SluiceError,
    PyException,
    "Base class of every error Sluice raises; the message is the Rust runtime's."
);
create_exception!(
    sluice,
    PlanError,
    SluiceError,
    "The plan file or a configuration value is wrong; plan errors name file:line:column."
);
create_exception!(
    sluice,
    ProducerLost,
    SluiceError,
    "The producer exited or was killed without ending the stream."
);
create_exception!(
    sluice,
    ProducerFailed,
    SluiceError,
    "The producer failed (for example, its query failed part-way) and told its subscribers why."
);
create_exception!(
    sluice,
    Lagged,
    SluiceError,
    "This subscriber fell further behind than the producer's sluice.lag_limit and was detached; subscribe with on_lag='skip' to continue past gaps."
);
create_exception!(
    sluice,
    Timeout,
    SluiceError,
    "Waiting (for a producer, a batch or a run) took longer than the caller allowed."
);
create_exception!(
    sluice,
    TransportError,
    SluiceError,
    "The shared-memory transport failed: a busy topic, too little /dev/shm, an iceoryx2 error."
);
create_exception!(
    sluice,
    CorruptMessage,
    SluiceError,
    "A message read from shared memory failed validation; nothing was trusted."
);

/// The Python exception for `err`, with the Rust message.
pub fn to_py(err: &RustError) -> PyErr {
    let message = err.to_string();
    match err {
        RustError::Plan { .. } | RustError::Config(_) => PlanError::new_err(message),
        RustError::ProducerLost(_) | RustError::ResumeGap { .. } => ProducerLost::new_err(message),
        RustError::ProducerFailed(_) => ProducerFailed::new_err(message),
        RustError::Lagged { .. } | RustError::Stalled { .. } => Lagged::new_err(message),
        RustError::Timeout { .. } => Timeout::new_err(message),
        RustError::Transport(_)
        | RustError::SharedMemory { .. }
        | RustError::TopicBusy(_)
        | RustError::ShmTooSmall { .. }
        | RustError::Forked { .. }
        | RustError::ForkedIdentity { .. } => TransportError::new_err(message),
        RustError::Corrupt(_) => CorruptMessage::new_err(message),
        _ => SluiceError::new_err(message),
    }
}
