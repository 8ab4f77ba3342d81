//! Batches of a GPU topic (`sluice.device = 'cuda:N'`) in Python: `DeviceBatch`'s methods
//! and `DeviceColumn` (the `DeviceBatch` type and `Batch.to_device`: `device_batch`).
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
//!   so the slot is held for as long as the column object lives;
//! * `__arrow_c_device_array__`: `ARROW_DEVICE_CUDA`, with `sync_event` pointing to an
//!   event recorded on the subscriber's stream once the data is ready; the array's
//!   release hands the slot back.
//!
//! Views of the producer's slot are shared by every subscriber of the topic and flagged
//! read-only (DLPack 1.x, `data[1]` of the array interface); a trainer that writes into
//! its tensors asks for `copy=True`.

use std::ffi::c_void;
use std::ptr::NonNull;
use std::sync::Arc;

use arrow::array::ArrayData;
use arrow::buffer::Buffer;
use arrow::datatypes::{DataType, Field, FieldRef};
use arrow::error::ArrowError;
use arrow::ffi::{FFI_ArrowArray, FFI_ArrowSchema};
use pyo3::exceptions::PyTypeError;
use pyo3::prelude::*;
use pyo3::types::{PyCapsule, PyDict, PyTuple};
use sluice::cuda::ConsumerStream;
use sluice::{DeviceBatch, DeviceColumn, SluiceError};

use crate::batch::{PyBatch, column_index};
use crate::c_device::{ArrowDeviceArray, DEVICE_ARRAY_CAPSULE_NAME};
use crate::device_batch::PyDeviceBatch;
use crate::dlpack::{self, DLDataType, KDL_CUDA};
use crate::errors::to_py;

impl PyDeviceBatch {
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

    /// Exports the schema, with its metadata (Arrow PyCapsule protocol): what
    /// `pyarrow.schema(batch)` reads, as of a host batch.
    fn __arrow_c_schema__<'py>(&self, py: Python<'py>) -> PyResult<Bound<'py, PyCapsule>> {
        let schema = self.batch.schema();
        let field = Field::new_struct("", schema.fields().clone(), false)
            .with_metadata(schema.metadata().clone());
        Ok(pyo3_arrow::ffi::to_schema_pycapsule(py, &field)?)
    }

    /// Exports the batch through the Arrow C Device interface as a struct array of its
    /// columns on `ARROW_DEVICE_CUDA`, with `sync_event` recorded on the subscriber's
    /// stream once every column is ready. Every column must be a tensor column (see
    /// `DeviceColumn.__dlpack__`); a requested schema is not applied.
    #[pyo3(signature = (requested_schema=None, **kwargs))]
    fn __arrow_c_device_array__<'py>(
        &self,
        py: Python<'py>,
        requested_schema: Option<Bound<'py, PyCapsule>>,
        kwargs: Option<&Bound<'py, PyDict>>,
    ) -> PyResult<Bound<'py, PyTuple>> {
        let _ = (requested_schema, kwargs);
        let schema = self.batch.schema();
        let columns = py
            .detach(|| {
                let own = self.batch.own_stream()?;
                (0..schema.fields().len())
                    .map(|i| self.batch.column(i, own, false))
                    .collect::<sluice::Result<Vec<_>>>()
            })
            .map_err(|e| dlpack::buffer_error(e.to_string()))?;
        let ordinal = i64::from(columns.first().map_or(0, |c| c.device_ordinal()));
        let extents = columns.iter().map(extent).collect::<PyResult<Vec<_>>>()?;
        let owner = DeviceArrayOwner::new(columns)?;
        let sync_event = owner.sync_event();
        let rows = self.batch.num_rows();
        let children = schema
            .fields()
            .iter()
            .zip(extents)
            .map(|(field, (ptr, len))| device_array_data(field, rows, ptr, len, owner.clone()))
            .collect::<Result<Vec<_>, _>>()
            .map_err(|e| dlpack::buffer_error(e.to_string()))?;
        let field = Field::new_struct("", schema.fields().clone(), false)
            .with_metadata(schema.metadata().clone());
        let data = ArrayData::builder(field.data_type().clone())
            .len(rows)
            .child_data(children)
            .build()
            .map_err(|e| dlpack::buffer_error(e.to_string()))?;
        let ffi_schema =
            FFI_ArrowSchema::try_from(&field).map_err(|e| PyTypeError::new_err(e.to_string()))?;
        let array = ArrowDeviceArray::cuda(FFI_ArrowArray::new(&data), ordinal, sync_event);
        let ffi_schema = PyCapsule::new_with_value(py, ffi_schema, c"arrow_schema")?;
        let array = PyCapsule::new_with_value(py, array, DEVICE_ARRAY_CAPSULE_NAME)?;
        PyTuple::new(py, [ffi_schema.into_any(), array.into_any()])
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
        dlpack::to_capsule(py, view, versioned, None)
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

    /// Exports the column through the Arrow C Device interface: `ARROW_DEVICE_CUDA`,
    /// buffers in GPU memory, and `sync_event` pointing to a `CUevent` recorded on the
    /// subscriber's stream after the data is ready (consumers wait on it before use). The
    /// array's release callback frees the event and hands the slot back. Tensor columns
    /// only (as `__dlpack__`); a requested schema is not applied (no casts on the device).
    #[pyo3(signature = (requested_schema=None, **kwargs))]
    fn __arrow_c_device_array__<'py>(
        &self,
        py: Python<'py>,
        requested_schema: Option<Bound<'py, PyCapsule>>,
        kwargs: Option<&Bound<'py, PyDict>>,
    ) -> PyResult<Bound<'py, PyTuple>> {
        let _ = (requested_schema, kwargs);
        let own = py
            .detach(|| self.batch.own_stream())
            .map_err(|e| to_py(&e))?;
        let column = self.export(py, own, false)?;
        let ordinal = i64::from(column.device_ordinal());
        let (ptr, len) = extent(&column)?;
        let owner = DeviceArrayOwner::new(vec![column])?;
        let sync_event = owner.sync_event();
        let data = device_array_data(&self.field, self.batch.num_rows(), ptr, len, owner)
            .map_err(|e| dlpack::buffer_error(e.to_string()))?;
        let schema = FFI_ArrowSchema::try_from(self.field.as_ref())
            .map_err(|e| PyTypeError::new_err(e.to_string()))?;
        let array = ArrowDeviceArray::cuda(FFI_ArrowArray::new(&data), ordinal, sync_event);
        let schema = PyCapsule::new_with_value(py, schema, c"arrow_schema")?;
        let array = PyCapsule::new_with_value(py, array, DEVICE_ARRAY_CAPSULE_NAME)?;
        PyTuple::new(py, [schema.into_any(), array.into_any()])
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

/// What a CUDA device array's buffers own: the columns (their slots stay pinned until the
/// consumer releases the array) and the event `sync_event` points to.
struct DeviceArrayOwner {
    /// The `CUevent` handle `ArrowDeviceArray::sync_event` points at.
    sync_event: Box<*mut c_void>,
    _event: sluice::cuda::Event,
    _columns: Vec<DeviceColumn>,
}

impl DeviceArrayOwner {
    /// Holds `columns` (exported on one stream) and an event recorded on that stream
    /// after the last of them: it completes when all are ready.
    fn new(columns: Vec<DeviceColumn>) -> PyResult<Arc<Self>> {
        let last = columns
            .last()
            .ok_or_else(|| to_py(&SluiceError::Internal("no column to export".into())))?;
        let event = last.ready_event().map_err(|e| to_py(&e))?;
        Ok(Arc::new(Self {
            sync_event: Box::new(event.as_raw().cast()),
            _event: event,
            _columns: columns,
        }))
    }

    /// The `sync_event` pointer: valid while the owner lives.
    fn sync_event(&self) -> *mut c_void {
        std::ptr::from_ref(self.sync_event.as_ref())
            .cast_mut()
            .cast()
    }
}

/// The device address and byte length of an exported column.
fn extent(column: &DeviceColumn) -> PyResult<(u64, usize)> {
    let len = usize::try_from(column.len_bytes())
        .map_err(|_| to_py(&SluiceError::Corrupt("a column larger than memory".into())))?;
    Ok((column.device_ptr(), len))
}

// SAFETY: the boxed handle is only read by consumers through `sync_event` while the array
// lives; the event and the column are `Send + Sync` (driver handles bound to their
// context on every use).
unsafe impl Send for DeviceArrayOwner {}
// SAFETY: as above; nothing mutates the owner after it is made.
unsafe impl Sync for DeviceArrayOwner {}
impl std::panic::RefUnwindSafe for DeviceArrayOwner {}

/// The Arrow layout of a tensor column whose `len` bytes of values are at device address
/// `ptr`: a primitive array, or fixed-size lists of one, with no validity buffers (tensor
/// columns have no nulls), all levels sharing the one values buffer.
fn device_array_data(
    field: &Field,
    rows: usize,
    ptr: u64,
    len: usize,
    owner: Arc<DeviceArrayOwner>,
) -> Result<ArrayData, ArrowError> {
    let mut levels = vec![field.data_type().clone()];
    while let Some(DataType::FixedSizeList(child, _)) = levels.last() {
        let inner = child.data_type().clone();
        levels.push(inner);
    }
    let values = levels.len() - 1;
    let elements = levels[..values].iter().fold(rows, |n, t| match t {
        DataType::FixedSizeList(_, size) => n * (*size as usize),
        _ => n,
    });
    let ptr = NonNull::new(ptr as *mut u8)
        .ok_or_else(|| ArrowError::InvalidArgumentError("a null device pointer".into()))?;
    // SAFETY: `ptr..ptr + len` is device memory that `owner` keeps allocated (the column
    // pins the producer's slot or owns the assembled copy) for as long as the buffer and
    // every FFI array made from it live. It is never dereferenced on the host: the buffer
    // only carries the address to the consumer through the C Device interface, which
    // says the memory is on `ARROW_DEVICE_CUDA`; building the array data below checks
    // lengths and alignment, never values, for these types.
    let buffer = unsafe { Buffer::from_custom_allocation(ptr, len, owner) };
    let mut data = ArrayData::builder(levels[values].clone())
        .len(elements)
        .add_buffer(buffer)
        .build()?;
    let mut n = elements;
    for t in levels[..values].iter().rev() {
        if let DataType::FixedSizeList(_, size) = t {
            n /= (*size as usize).max(1);
        }
        data = ArrayData::builder(t.clone())
            .len(n)
            .add_child_data(data)
            .build()?;
    }
    Ok(data)
}
