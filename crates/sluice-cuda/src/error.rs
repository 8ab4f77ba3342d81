//! Errors of the GPU path.

use cudarc::driver::sys::CUresult;

/// Result alias of this crate.
pub type Result<T, E = CudaError> = std::result::Result<T, E>;

/// The message of [`CudaError::NoDriver`]; tests and the CLI look for its start.
pub const NO_DRIVER: &str = "no CUDA driver found (libcuda.so not loadable) — this plan needs an NVIDIA GPU; use sluice.device = 'cpu'";

/// Everything the GPU path can fail with.
#[derive(Debug, thiserror::Error)]
#[non_exhaustive]
pub enum CudaError {
    /// `libcuda.so` cannot be loaded: no NVIDIA driver on this machine.
    #[error("{NO_DRIVER}")]
    NoDriver,
    /// The requested ordinal is not a GPU of this machine.
    #[error("no CUDA device {ordinal}: this machine has {count} device(s)")]
    NoSuchDevice {
        /// What was asked for.
        ordinal: u32,
        /// What exists.
        count: u32,
    },
    /// A CUDA driver call failed.
    #[error("CUDA call {call} failed: {code:?}")]
    Driver {
        /// The driver function.
        call: &'static str,
        /// Its result.
        code: CUresult,
    },
    /// A batch does not fit the device slots sized when the topic was created.
    #[error(
        "a batch needs {needed} bytes on the device but a slot holds {slot_bytes}; lower sluice.batch_rows"
    )]
    SlotTooSmall {
        /// Bytes the batch needs.
        needed: u64,
        /// Bytes a slot holds.
        slot_bytes: u64,
    },
    /// Every device slot is bound to a shared-memory chunk that is still in use.
    #[error(
        "all {0} device slots are in use by subscribers (this is a bug in Sluice: there is one slot per shared-memory chunk)"
    )]
    SlotsExhausted(usize),
    /// A device descriptor read from shared memory is malformed.
    #[error("corrupt device descriptor: {0}")]
    Corrupt(String),
    /// The batch has a type the device layout does not carry.
    #[error("unsupported column for the GPU path: {0}")]
    Unsupported(String),
    /// An Arrow operation failed.
    #[error("arrow: {0}")]
    Arrow(#[from] arrow::error::ArrowError),
}

impl From<CudaError> for sluice_core::SluiceError {
    fn from(e: CudaError) -> Self {
        match e {
            CudaError::Corrupt(m) => Self::Corrupt(format!("device descriptor: {m}")),
            CudaError::Arrow(a) => Self::Arrow(a),
            other => Self::Device(other.to_string()),
        }
    }
}

/// Turns a driver result into a [`Result`], naming the call.
pub(crate) fn check(call: &'static str, code: CUresult) -> Result<()> {
    if code == CUresult::CUDA_SUCCESS {
        Ok(())
    } else {
        Err(CudaError::Driver { call, code })
    }
}
