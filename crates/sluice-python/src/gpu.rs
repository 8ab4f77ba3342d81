//! Batches of a GPU topic (`sluice.device = 'cuda:N'`) in Python: `DeviceBatch` and
//! `DeviceColumn`.
//!
//! A column is exported to torch, CuPy and JAX without a copy when the subscriber's
//! batch lies within one producer batch (a view of the producer's device slot), and
//! assembled on the device, in memory of this subscriber, when it spans several:
//! * `__dlpack__(stream=…, max_version=…, dl_device=…, copy=…)` and
//!   `__dlpack_device__()` = `(kDLCUDA, ordinal)`: the consumer's `stream` is made to
//!   wait for the producer's copy (and queues the assembly copies), and the capsule's
//!   deleter hands the slot back only after the work queued on that stream has completed;
//! * `__cuda_array_interface__` (version 3): the data is ready on the subscriber's own
//!   stream, given as `stream` for the consumer to wait on; the interface has no deleter,
//!   so the slot is held for as long as the column object lives.
//!
//! Views of the producer's slot are shared by every subscriber of the topic and flagged
//! read-only (DLPack 1.x, `data[1]` of the array interface); a trainer that writes into
//! its tensors asks for `copy=True`.

use arrow::datatypes::FieldRef;
use pyo3::prelude::*;
use pyo3::types::{PyCapsule, PyDict, PyTuple};
use sluice::cuda::ConsumerStream;
use sluice::{DeviceBatch, DeviceColumn, SluiceError};

use crate::batch::{PyBatch, column_index};
use crate::dlpack::{self, DLDataType, KDL_CUDA};
use crate::errors::to_py;

/// Rows of a GPU topic: columns stay in device memory.
#[pyclass(frozen, module = "sluice._sluice", name = "DeviceBatch")]
#[derive(Debug)]
pub struct PyDeviceBatch {
    batch: DeviceBatch,
    epoch: u64,
    index: u64,
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

    fn column_index(&self, key: &Bound<'_, PyAny>) -> PyResult<usize> {
        column_index(&self.batch.schema(), key)
    }
}

#[pymethods]
impl PyDeviceBatch {
    /// The epoch the batch belongs to.
    #[getter]
    fn epoch(&self) -> u64 {
        self.epoch
    }

    /// The batch's position in its epoch, counted in this subscriber's batches.
    #[getter]
    fn index(&self) -> u64 {
        self.index
    }

    /// Rows in the batch.
    #[getter]
    fn num_rows(&self) -> usize {
        self.batch.num_rows()
    }

    /// Columns in the batch.
    #[getter]
    fn num_columns(&self) -> usize {
        self.batch.schema().fields().len()
    }

    /// The column names, in order.
    #[getter]
    fn column_names(&self) -> Vec<String> {
        self.batch
            .schema()
            .fields()
            .iter()
            .map(|f| f.name().clone())
            .collect()
    }

    /// How many producer batches the rows come from: with more than one, exported
    /// columns are assembled into memory of this subscriber (a device-to-device copy).
    #[getter]
    fn producer_batches(&self) -> usize {
        self.batch.parts().len()
    }

    /// The GPU the batch is on, as `(kDLCUDA, ordinal in this process)`.
    fn __dlpack_device__(&self, py: Python<'_>) -> PyResult<(i32, i32)> {
        let ordinal = py
            .detach(|| self.batch.device_ordinal())
            .map_err(|e| to_py(&e))?;
        Ok((KDL_CUDA, ordinal as i32))
    }

    /// A column by name or position.
    fn column(&self, key: &Bound<'_, PyAny>) -> PyResult<PyDeviceColumn> {
        let index = self.column_index(key)?;
        Ok(PyDeviceColumn {
            batch: self.batch.clone(),
            index,
            field: self.batch.schema().fields()[index].clone(),
            interface: std::sync::OnceLock::new(),
        })
    }

    fn __getitem__(&self, key: &Bound<'_, PyAny>) -> PyResult<PyDeviceColumn> {
        self.column(key)
    }

    fn __len__(&self) -> usize {
        self.batch.num_rows()
    }

    fn __contains__(&self, name: &str) -> bool {
        self.batch.schema().index_of(name).is_ok()
    }

    /// The rows copied to host memory, as a :class:`Batch` (checks, debugging).
    fn to_host(&self, py: Python<'_>) -> PyResult<PyBatch> {
        let batch = py.detach(|| self.batch.to_host()).map_err(|e| to_py(&e))?;
        Ok(PyBatch::new(batch, self.epoch, self.index, None))
    }

    fn __repr__(&self) -> String {
        format!(
            "sluice.DeviceBatch(epoch={}, index={}, rows={}, columns={:?}, producer_batches={})",
            self.epoch,
            self.index,
            self.batch.num_rows(),
            self.column_names(),
            self.batch.parts().len()
        )
    }
}

/// One column of a :class:`DeviceBatch`.
#[pyclass(frozen, module = "sluice._sluice", name = "DeviceColumn")]
#[derive(Debug)]
pub struct PyDeviceColumn {
    batch: DeviceBatch,
    index: usize,
    field: FieldRef,
    /// The column as `__cuda_array_interface__` exports it, made on first use and held
    /// as long as this object (the interface has no deleter).
    interface: std::sync::OnceLock<DeviceColumn>,
}

impl PyDeviceColumn {
    fn export(&self, py: Python<'_>, stream: ConsumerStream, copy: bool) -> PyResult<DeviceColumn> {
        py.detach(|| self.batch.column(self.index, stream, copy))
            .map_err(|e| dlpack::buffer_error(e.to_string()))
    }

    /// The tensor view of `column`'s memory, kept valid by `keep`.
    fn view(&self, column: &DeviceColumn, keep: Box<dyn Send>) -> PyResult<dlpack::TensorView> {
        let (ptr, ordinal, copied) = (
            column.device_ptr(),
            column.device_ordinal() as i32,
            column.is_copy(),
        );
        self.view_at(ptr, ordinal, copied, keep)
    }

    fn view_at(
        &self,
        ptr: u64,
        ordinal: i32,
        copied: bool,
        keep: Box<dyn Send>,
    ) -> PyResult<dlpack::TensorView> {
        dlpack::describe_device(
            self.field.name(),
            &self.field,
            self.batch.num_rows(),
            ptr,
            ordinal,
            copied,
            keep,
        )
        .map_err(dlpack::buffer_error)
    }
}

#[pymethods]
impl PyDeviceColumn {
    /// The column's name.
    #[getter]
    fn name(&self) -> String {
        self.field.name().clone()
    }

    /// The Arrow type, as text.
    #[getter]
    fn r#type(&self) -> String {
        self.field.data_type().to_string()
    }

    /// The tensor's shape, or `None` when the column cannot be a tensor (see
    /// `DevicePart.tensor_bytes`: fixed-width numbers and fixed-size lists of them, no
    /// nulls).
    #[getter]
    fn shape(&self) -> Option<Vec<i64>> {
        let fits = self
            .batch
            .parts()
            .iter()
            .all(|p| p.tensor_bytes(self.index).is_ok());
        if !fits {
            return None;
        }
        dlpack::describe_device(
            self.field.name(),
            &self.field,
            self.batch.num_rows(),
            0,
            0,
            false,
            Box::new(()),
        )
        .ok()
        .map(|v| v.shape().to_vec())
    }

    fn __len__(&self) -> usize {
        self.batch.num_rows()
    }

    /// `(kDLCUDA, ordinal)`: the GPU, numbered as this process sees it.
    fn __dlpack_device__(&self, py: Python<'_>) -> PyResult<(i32, i32)> {
        let ordinal = py
            .detach(|| self.batch.device_ordinal())
            .map_err(|e| to_py(&e))?;
        Ok((KDL_CUDA, ordinal as i32))
    }

    /// Exports the column as a DLPack tensor on the GPU. `stream` is the consumer's
    /// stream (`None`/1 legacy default, 2 per-thread default, -1 none, or a handle): it
    /// waits for the producer's copy, and the slot goes back only after the work queued
    /// on it before the tensor was dropped. `copy=True` gives the consumer its own,
    /// writable copy; `copy=False` refuses batches that span producer batches (they need
    /// one). `dl_device` other than this GPU is refused: use `DeviceBatch.to_host()`.
    #[pyo3(signature = (*, stream=None, max_version=None, dl_device=None, copy=None))]
    fn __dlpack__<'py>(
        &self,
        py: Python<'py>,
        stream: Option<i64>,
        max_version: Option<(u32, u32)>,
        dl_device: Option<(i32, i32)>,
        copy: Option<bool>,
    ) -> PyResult<Bound<'py, PyCapsule>> {
        let here = self.__dlpack_device__(py)?;
        if let Some(device) = dl_device
            && device != here
        {
            return Err(dlpack::buffer_error(format!(
                "column '{}' is on device {here:?}; it cannot be exported to {device:?} \
                 (DeviceBatch.to_host() copies a batch to host memory)",
                self.field.name()
            )));
        }
        let stream = ConsumerStream::from_dlpack(stream)
            .map_err(|e| dlpack::buffer_error(SluiceError::from(e).to_string()))?;
        if copy == Some(false) && self.batch.parts().len() > 1 {
            return Err(dlpack::buffer_error(format!(
                "column '{}': this batch spans {} producer batches and can only be exported \
                 as a copy; subscribe with a batch_size that divides the producer's \
                 sluice.batch_rows, or allow a copy",
                self.field.name(),
                self.batch.parts().len()
            )));
        }
        let column = self.export(py, stream, copy == Some(true))?;
        // The capsule owns the column: its drop (the consumer's deleter) retires the slot
        // after the consumer's stream has passed it.
        let (ptr, ordinal, copied) = (
            column.device_ptr(),
            column.device_ordinal() as i32,
            column.is_copy(),
        );
        let view = self.view_at(ptr, ordinal, copied, Box::new(column))?;
        let versioned = max_version.is_some_and(|(major, _)| major >= 1);
        dlpack::to_capsule(py, view, versioned, false)
    }

    /// The CUDA Array Interface (version 3). The data is ready on `stream`, the
    /// subscriber's own stream: consumers (CuPy, Numba) make theirs wait on it. The
    /// memory is held as long as this column object.
    #[getter]
    fn __cuda_array_interface__<'py>(&self, py: Python<'py>) -> PyResult<Bound<'py, PyDict>> {
        let column = match self.interface.get() {
            Some(column) => column,
            None => {
                let own = py
                    .detach(|| self.batch.own_stream())
                    .map_err(|e| to_py(&e))?;
                let column = self.export(py, own, false)?;
                // Another thread may have won the race; either column is valid.
                let _ = self.interface.set(column);
                self.interface
                    .get()
                    .ok_or_else(|| to_py(&SluiceError::Internal("lost a device column".into())))?
            }
        };
        let view = self.view(column, Box::new(()))?;
        let d = PyDict::new(py);
        d.set_item("version", 3)?;
        d.set_item("shape", PyTuple::new(py, view.shape())?)?;
        d.set_item("typestr", typestr(view.dtype()))?;
        d.set_item("data", (column.device_ptr(), !column.is_copy()))?;
        d.set_item(
            "strides",
            view.byte_strides()
                .map(|s| PyTuple::new(py, s))
                .transpose()?,
        )?;
        d.set_item("stream", column.stream_handle())?;
        Ok(d)
    }

    fn __repr__(&self) -> String {
        format!(
            "sluice.DeviceColumn(name={:?}, type={}, len={})",
            self.field.name(),
            self.field.data_type(),
            self.batch.num_rows(),
        )
    }
}

/// The array interface's `typestr` (little-endian) of a DLPack type.
fn typestr(dtype: DLDataType) -> String {
    let kind = match dtype.code() {
        0 => 'i',
        1 => 'u',
        _ => 'f',
    };
    format!("<{kind}{}", dtype.bits() / 8)
}
