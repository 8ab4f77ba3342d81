//! The `DeviceBatch` Python type (its methods and columns: `gpu`), and how a host batch
//! becomes one (`Batch.to_device`): apart from `gpu`, so that `Batch` and `DeviceBatch`,
//! which convert into each other, do not import each other's modules.

use std::sync::{Arc, Mutex, PoisonError};

use arrow::record_batch::RecordBatch;
use pyo3::exceptions::{PyTypeError, PyValueError};
use pyo3::prelude::*;
use sluice::cuda::ConsumerStream;
use sluice::{DeviceBatch, HostCopier, SluiceError};

use crate::errors::to_py;

/// One [`HostCopier`] per GPU for the whole process: each keeps its registrations of the
/// segments it copied from, so a segment is registered once, not once per batch.
static HOST_COPIERS: Mutex<Vec<Arc<HostCopier>>> = Mutex::new(Vec::new());

/// The process's copier to GPU `ordinal`.
fn host_copier(ordinal: u32) -> Result<Arc<HostCopier>, SluiceError> {
    let mut copiers = HOST_COPIERS.lock().unwrap_or_else(PoisonError::into_inner);
    if let Some(c) = copiers.iter().find(|c| c.ordinal() == ordinal) {
        return Ok(c.clone());
    }
    let copier = Arc::new(HostCopier::new(ordinal)?);
    copiers.push(copier.clone());
    Ok(copier)
}

/// Hands back the host batches whose copies to a GPU have completed (called as a
/// subscriber receives, so that the last copied batch does not stay held until the next
/// copy).
pub fn collect_host_copies() {
    let copiers = HOST_COPIERS.lock().unwrap_or_else(PoisonError::into_inner);
    for c in copiers.iter() {
        c.collect();
    }
}

/// `Batch.to_device`: copies `batch` to GPU `ordinal` on the DLPack `stream`.
pub fn copy_to_device(
    py: Python<'_>,
    batch: &RecordBatch,
    ordinal: u32,
    stream: Option<i64>,
) -> PyResult<DeviceBatch> {
    // Not DLPack: 0 is what torch reports for its default stream
    // (`torch.cuda.current_stream().cuda_stream`), the legacy default stream.
    let stream = ConsumerStream::from_dlpack(stream.map(|s| if s == 0 { 1 } else { s }))
        .map_err(|e| PyValueError::new_err(SluiceError::from(e).to_string()))?;
    py.detach(|| host_copier(ordinal)?.to_device(batch, stream))
        .map_err(|e| to_py(&e))
}

/// The GPU a `device=` argument names: `None` (0), an ordinal, `"cuda"`, `"cuda:N"`, or
/// an object with `type == "cuda"` and `index` (`torch.device`).
pub fn device_ordinal(device: Option<&Bound<'_, PyAny>>) -> PyResult<u32> {
    let Some(device) = device else {
        return Ok(0);
    };
    if let Ok(n) = device.extract::<u32>() {
        return Ok(n);
    }
    let text = match device.extract::<String>() {
        Ok(text) => text,
        Err(_) => {
            let kind = device
                .getattr("type")
                .and_then(|t| t.extract::<String>())
                .ok();
            let index = device
                .getattr("index")
                .and_then(|i| i.extract::<Option<u32>>())
                .ok()
                .flatten();
            match kind.as_deref() {
                Some("cuda") => return Ok(index.unwrap_or(0)),
                _ => {
                    return Err(PyTypeError::new_err(format!(
                        "device must be a GPU ordinal, 'cuda', 'cuda:N' or a CUDA torch.device, \
                         not {}",
                        device.repr().map(|r| r.to_string()).unwrap_or_default()
                    )));
                }
            }
        }
    };
    match text.strip_prefix("cuda") {
        Some("") => Ok(0),
        Some(rest) => rest
            .strip_prefix(':')
            .and_then(|n| n.parse::<u32>().ok())
            .ok_or_else(|| {
                PyValueError::new_err(format!(
                    "device '{text}' is not 'cuda' or 'cuda:N' with N a GPU ordinal"
                ))
            }),
        None => Err(PyValueError::new_err(format!(
            "device '{text}' is not a GPU: use 'cuda', 'cuda:N' or an ordinal"
        ))),
    }
}

/// Rows of a GPU topic: columns stay in device memory.
#[pyclass(frozen, module = "sluice._sluice", name = "DeviceBatch")]
#[derive(Debug)]
pub struct PyDeviceBatch {
    pub(crate) batch: DeviceBatch,
    pub(crate) epoch: u64,
    pub(crate) index: u64,
}

impl PyDeviceBatch {
    /// Wraps a received device batch.
    pub fn new(batch: DeviceBatch, epoch: u64, index: u64) -> Self {
        Self {
            batch,
            epoch,
            index,
        }
    }
}
