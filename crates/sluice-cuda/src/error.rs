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
    /// The ring of device slots would take more than `sluice.device_memory`.
    #[error(
        "the device ring needs {slots} slots of {} ({} in all) but sluice.device_memory is {}: raise sluice.device_memory, or lower sluice.batch_rows (smaller slots) or sluice.max_subscribers, sluice.max_held or sluice.window (fewer slots)",
        gib(*slot_bytes), gib((*slots as u64).saturating_mul(*slot_bytes)), gib(*budget)
    )]
    OverBudget {
        /// Slots the topic needs: one per shared-memory chunk.
        slots: usize,
        /// Bytes of each slot.
        slot_bytes: u64,
        /// `sluice.device_memory`.
        budget: u64,
    },
    /// The producer's GPU is not visible to this process.
    #[error(
        "the producer's GPU {uuid} is not visible to this process, which {}: add it to CUDA_VISIBLE_DEVICES (or subscribe on the CPU path)",
        visible_list(visible)
    )]
    DeviceNotVisible {
        /// The producer's GPU.
        uuid: crate::identity::DeviceUuid,
        /// The GPUs this process sees, in ordinal order.
        visible: Vec<crate::identity::DeviceUuid>,
    },
    /// A `stream` argument that is not a CUDA stream.
    #[error("{0}")]
    BadStream(String),
    /// A device descriptor read from shared memory is malformed.
    #[error("corrupt device descriptor: {0}")]
    Corrupt(String),
    /// The batch has a type the device layout does not carry.
    #[error("unsupported column for the GPU path: {0}")]
    Unsupported(String),
    /// nvJPEG cannot be loaded.
    #[error(
        "nvJPEG not found: {tried}. Install CUDA's libnvjpeg (the CUDA toolkit, or the wheel `nvidia-nvjpeg-cu12` for CUDA 12, `nvidia-nvjpeg` for CUDA 13) or set SLUICE_NVJPEG to the library's path"
    )]
    NoNvjpeg {
        /// Each library tried and why it failed to load.
        tried: String,
    },
    /// An nvJPEG call failed.
    #[error("nvJPEG call {call} failed: {status}")]
    Nvjpeg {
        /// The nvJPEG function.
        call: &'static str,
        /// What it returned.
        status: crate::nvjpeg::NvjpegStatus,
    },
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

fn gib(bytes: u64) -> String {
    format!("{:.1} GiB", bytes as f64 / (1u64 << 30) as f64)
}

fn visible_list(visible: &[crate::identity::DeviceUuid]) -> String {
    if visible.is_empty() {
        return "sees no GPU".into();
    }
    let names: Vec<String> = visible
        .iter()
        .enumerate()
        .map(|(i, u)| format!("cuda:{i} = {u}"))
        .collect();
    format!("sees {}", names.join(", "))
}

/// Turns a driver result into a [`Result`], naming the call.
pub(crate) fn check(call: &'static str, code: CUresult) -> Result<()> {
    if code == CUresult::CUDA_SUCCESS {
        Ok(())
    } else {
        Err(CudaError::Driver { call, code })
    }
}
