//! Batches and columns as Python objects: Arrow PyCapsule protocol and DLPack.
//!
//! Nothing here copies data. `__arrow_c_array__` and `__arrow_c_device_array__` hand
//! consumers an `ArrowArray` whose private data holds references to the batch's buffers;
//! `__dlpack__` hands them a `DLManagedTensor` whose deleter holds a reference to the
//! column. For a batch received zero-copy those buffers are slices of one shared-memory
//! sample, and the sample is returned to the producer when the last of these references
//! is dropped, whichever object (this batch, a pyarrow array, a numpy array) held it.

use std::ops::Range;
use std::sync::Arc;

use arrow::array::{Array, ArrayRef, StructArray};
use arrow::datatypes::{Field, FieldRef, Schema};
use arrow::ffi::{FFI_ArrowArray, FFI_ArrowSchema};
use arrow::record_batch::RecordBatch;
use pyo3::exceptions::{
    PyIndexError, PyKeyError, PyNotImplementedError, PyTypeError, PyValueError,
};
use pyo3::intern;
use pyo3::prelude::*;
use pyo3::types::{PyCapsule, PyDict, PyTuple};

use crate::c_device::{ArrowDeviceArray, DEVICE_ARRAY_CAPSULE_NAME};
use crate::dlpack;

/// The struct field a record batch is exported as (the C data interface convention).
fn batch_field(batch: &RecordBatch) -> FieldRef {
    Arc::new(
        Field::new_struct("", batch.schema_ref().fields().clone(), false)
            .with_metadata(batch.schema_ref().metadata().clone()),
    )
}

fn batch_array(batch: &RecordBatch) -> ArrayRef {
    Arc::new(StructArray::from(batch.clone()))
}

pub use sluice::core::rebatch::deep_copy;

/// Rejects keyword arguments of the PyCapsule protocol this version does not know,
/// unless they are `None` (as the protocol asks).
fn check_kwargs(kwargs: Option<&Bound<'_, PyDict>>) -> PyResult<()> {
    if let Some(kwargs) = kwargs {
        for (key, value) in kwargs.iter() {
            if !value.is_none() {
                return Err(PyNotImplementedError::new_err(format!(
                    "__arrow_c_device_array__ does not support the keyword {key}"
                )));
            }
        }
    }
    Ok(())
}

/// `(schema, device array)` capsules for `array`, cast to `requested_schema` where the
/// consumer asked and the cast is possible.
fn device_capsules<'py>(
    py: Python<'py>,
    field: FieldRef,
    array: &dyn Array,
    requested_schema: Option<Bound<'py, PyCapsule>>,
) -> PyResult<Bound<'py, PyTuple>> {
    let (data, field) = match requested_schema {
        Some(capsule) => {
            let wanted = pyo3_arrow::PyField::from_arrow_pycapsule(&capsule)?.into_inner();
            if wanted.data_type() != field.data_type()
                && arrow::compute::can_cast_types(field.data_type(), wanted.data_type())
            {
                let cast = arrow::compute::cast(array, wanted.data_type())
                    .map_err(|e| PyTypeError::new_err(e.to_string()))?;
                let field = Arc::new(
                    wanted
                        .as_ref()
                        .clone()
                        .with_metadata(field.metadata().clone()),
                );
                (cast.to_data(), field)
            } else {
                (array.to_data(), field)
            }
        }
        None => (array.to_data(), field),
    };
    let schema = FFI_ArrowSchema::try_from(field.as_ref())
        .map_err(|e| PyTypeError::new_err(e.to_string()))?;
    let device_array = ArrowDeviceArray::cpu(FFI_ArrowArray::new(&data));
    let schema = PyCapsule::new_with_value(py, schema, c"arrow_schema")?;
    let device_array = PyCapsule::new_with_value(py, device_array, DEVICE_ARRAY_CAPSULE_NAME)?;
    PyTuple::new(py, [schema, device_array])
}

fn schema_capsule<'py>(py: Python<'py>, field: &Field) -> PyResult<Bound<'py, PyCapsule>> {
    Ok(pyo3_arrow::ffi::to_schema_pycapsule(py, field)?)
}

/// A record batch received from a topic.
///
/// Implements the Arrow PyCapsule protocol (`pyarrow.record_batch(batch)`,
/// `polars.from_arrow(...)`, …) without copying; `batch["x"]` gives a column with
/// `__dlpack__` for numpy, torch and JAX.
#[pyclass(frozen, module = "sluice._sluice", name = "Batch")]
#[derive(Debug)]
pub struct PyBatch {
    batch: RecordBatch,
    epoch: u64,
    index: u64,
    shm_range: Option<Range<usize>>,
}

impl PyBatch {
    /// Wraps a received batch.
    pub fn new(
        batch: RecordBatch,
        epoch: u64,
        index: u64,
        shm_range: Option<Range<usize>>,
    ) -> Self {
        Self {
            batch,
            epoch,
            index,
            shm_range,
        }
    }

    fn column_index(&self, key: &Bound<'_, PyAny>) -> PyResult<usize> {
        column_index(self.batch.schema_ref(), key)
    }
}

/// The position of the column `key` (a name, or a position counted from the end when
/// negative) in `schema`, with the errors Python's mappings and sequences raise.
pub fn column_index(schema: &Schema, key: &Bound<'_, PyAny>) -> PyResult<usize> {
    if let Ok(name) = key.extract::<&str>() {
        return schema.index_of(name).map_err(|_| {
            PyKeyError::new_err(format!(
                "no column '{name}'; the columns are {:?}",
                schema
                    .fields()
                    .iter()
                    .map(|f| f.name().as_str())
                    .collect::<Vec<_>>()
            ))
        });
    }
    if let Ok(i) = key.extract::<isize>() {
        let n = schema.fields().len() as isize;
        let j = if i < 0 { i + n } else { i };
        if (0..n).contains(&j) {
            return Ok(j as usize);
        }
        return Err(PyIndexError::new_err(format!(
            "column index {i} out of range for {n} columns"
        )));
    }
    Err(PyTypeError::new_err(format!(
        "columns are selected by name (str) or position (int), not {}",
        key.get_type().name()?
    )))
}

#[pymethods]
impl PyBatch {
    /// Epoch of the batch.
    #[getter]
    fn epoch(&self) -> u64 {
        self.epoch
    }

    /// Position of the batch in its epoch, in this subscriber's batches.
    #[getter]
    fn index(&self) -> u64 {
        self.index
    }

    /// The round of a plan of several rounds the batch belongs to (``None``: one round).
    #[getter]
    fn round(&self) -> Option<u64> {
        sluice::rounds::round_of(&self.batch)
    }

    /// `(start, end)` addresses of the shared-memory sample every buffer of this batch
    /// lies in, or `None` for a batch that was assembled (copied once) from two samples.
    #[getter]
    fn shm_range(&self) -> Option<(usize, usize)> {
        self.shm_range.as_ref().map(|r| (r.start, r.end))
    }

    /// Rows in the batch.
    #[getter]
    fn num_rows(&self) -> usize {
        self.batch.num_rows()
    }

    /// Columns in the batch.
    #[getter]
    fn num_columns(&self) -> usize {
        self.batch.num_columns()
    }

    /// Names of the columns.
    #[getter]
    fn column_names(&self) -> Vec<String> {
        self.batch
            .schema_ref()
            .fields()
            .iter()
            .map(|f| f.name().clone())
            .collect()
    }

    /// Bytes of Arrow buffers the batch references.
    #[getter]
    fn nbytes(&self) -> usize {
        self.batch.get_array_memory_size()
    }

    /// The column `key` (name or position).
    fn column(&self, key: &Bound<'_, PyAny>) -> PyResult<PyColumn> {
        let i = self.column_index(key)?;
        let field = self.batch.schema_ref().fields()[i].clone();
        Ok(PyColumn {
            field,
            array: self.batch.column(i).clone(),
        })
    }

    fn __getitem__(&self, key: &Bound<'_, PyAny>) -> PyResult<PyColumn> {
        self.column(key)
    }

    fn __len__(&self) -> usize {
        self.batch.num_rows()
    }

    fn __contains__(&self, name: &str) -> bool {
        self.batch.schema_ref().index_of(name).is_ok()
    }

    /// Exports the schema (Arrow PyCapsule protocol).
    fn __arrow_c_schema__<'py>(&self, py: Python<'py>) -> PyResult<Bound<'py, PyCapsule>> {
        schema_capsule(py, &batch_field(&self.batch))
    }

    /// Exports the batch as a struct array (Arrow PyCapsule protocol), without copying.
    #[pyo3(signature = (requested_schema=None))]
    fn __arrow_c_array__<'py>(
        &self,
        py: Python<'py>,
        requested_schema: Option<Bound<'py, PyCapsule>>,
    ) -> PyResult<Bound<'py, PyTuple>> {
        let array = batch_array(&self.batch);
        Ok(pyo3_arrow::ffi::to_array_pycapsules(
            py,
            batch_field(&self.batch),
            array.as_ref(),
            requested_schema,
        )?)
    }

    /// Exports the batch through the Arrow C Device interface (device: CPU), without
    /// copying.
    #[pyo3(signature = (requested_schema=None, **kwargs))]
    fn __arrow_c_device_array__<'py>(
        &self,
        py: Python<'py>,
        requested_schema: Option<Bound<'py, PyCapsule>>,
        kwargs: Option<&Bound<'py, PyDict>>,
    ) -> PyResult<Bound<'py, PyTuple>> {
        check_kwargs(kwargs)?;
        let array = batch_array(&self.batch);
        device_capsules(
            py,
            batch_field(&self.batch),
            array.as_ref(),
            requested_schema,
        )
    }

    /// A deep copy in process memory, which holds no shared memory: for batches kept
    /// longer than the subscriber may hold samples (`sluice.max_held`).
    fn copy(&self) -> PyResult<Self> {
        let batch = deep_copy(&self.batch).map_err(|e| PyValueError::new_err(e.to_string()))?;
        Ok(Self::new(batch, self.epoch, self.index, None))
    }

    /// Copies the batch to a GPU of this process (the ``cuda_host`` mode; works for any
    /// batch): one asynchronous host-to-device copy per Arrow buffer, straight from the
    /// shared memory, registered as pinned memory in 8 MiB blocks on first use. The copies
    /// are queued on ``stream`` (DLPack's convention: ``None``/1 the legacy default
    /// stream, 2 the per-thread default, -1 copy and wait here, or a stream handle such
    /// as ``torch.cuda.current_stream().cuda_stream``, where 0 is the legacy default);
    /// the shared memory is handed back once they complete. ``device`` is an ordinal, ``"cuda"``, ``"cuda:N"`` or a
    /// ``torch.device`` (default 0). The result is this process's own memory, so writes
    /// to its tensors are private.
    #[pyo3(signature = (device=None, stream=None))]
    fn to_device(
        &self,
        py: Python<'_>,
        device: Option<&Bound<'_, PyAny>>,
        stream: Option<i64>,
    ) -> PyResult<crate::device_batch::PyDeviceBatch> {
        let ordinal = crate::device_batch::device_ordinal(device)?;
        let batch = crate::device_batch::copy_to_device(py, &self.batch, ordinal, stream)?;
        Ok(crate::device_batch::PyDeviceBatch::new(
            batch, self.epoch, self.index,
        ))
    }

    /// The batch as a `pyarrow.RecordBatch` (zero-copy; needs pyarrow).
    fn to_pyarrow<'py>(slf: &Bound<'py, Self>) -> PyResult<Bound<'py, PyAny>> {
        let py = slf.py();
        py.import(intern!(py, "pyarrow"))?
            .getattr(intern!(py, "record_batch"))?
            .call1((slf,))
    }

    fn __repr__(&self) -> String {
        format!(
            "sluice.Batch(epoch={}, index={}, rows={}, columns={:?}, zero_copy={})",
            self.epoch,
            self.index,
            self.batch.num_rows(),
            self.column_names(),
            if self.shm_range.is_some() {
                "True"
            } else {
                "False"
            }
        )
    }
}

/// One column of a [`PyBatch`]: Arrow PyCapsule protocol and DLPack.
#[pyclass(frozen, module = "sluice._sluice", name = "Column")]
#[derive(Debug)]
pub struct PyColumn {
    field: FieldRef,
    array: ArrayRef,
}

#[pymethods]
impl PyColumn {
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

    /// Null values in the column.
    #[getter]
    fn null_count(&self) -> usize {
        self.array.null_count()
    }

    /// The shape `numpy.from_dlpack(column)` gives, or `None` when the column cannot be
    /// exported through DLPack.
    #[getter]
    fn shape(&self) -> Option<Vec<i64>> {
        dlpack::describe(self.field.name(), &self.field, self.array.as_ref())
            .ok()
            .map(|v| v.shape().to_vec())
    }

    fn __len__(&self) -> usize {
        self.array.len()
    }

    /// Exports the field (Arrow PyCapsule protocol).
    fn __arrow_c_schema__<'py>(&self, py: Python<'py>) -> PyResult<Bound<'py, PyCapsule>> {
        schema_capsule(py, &self.field)
    }

    /// Exports the column (Arrow PyCapsule protocol), without copying.
    #[pyo3(signature = (requested_schema=None))]
    fn __arrow_c_array__<'py>(
        &self,
        py: Python<'py>,
        requested_schema: Option<Bound<'py, PyCapsule>>,
    ) -> PyResult<Bound<'py, PyTuple>> {
        Ok(pyo3_arrow::ffi::to_array_pycapsules(
            py,
            self.field.clone(),
            self.array.as_ref(),
            requested_schema,
        )?)
    }

    /// Exports the column through the Arrow C Device interface (device: CPU).
    #[pyo3(signature = (requested_schema=None, **kwargs))]
    fn __arrow_c_device_array__<'py>(
        &self,
        py: Python<'py>,
        requested_schema: Option<Bound<'py, PyCapsule>>,
        kwargs: Option<&Bound<'py, PyDict>>,
    ) -> PyResult<Bound<'py, PyTuple>> {
        check_kwargs(kwargs)?;
        device_capsules(
            py,
            self.field.clone(),
            self.array.as_ref(),
            requested_schema,
        )
    }

    /// Exports the column as a DLPack tensor without copying (unless `copy=True`):
    /// 1-D for numbers, N-D for fixed-size lists. Raises `BufferError` for columns with
    /// nulls and for types DLPack cannot describe. With `max_version >= (1, 0)` the
    /// tensor is flagged read-only: it is shared memory.
    #[pyo3(signature = (*, stream=None, max_version=None, dl_device=None, copy=None))]
    fn __dlpack__<'py>(
        &self,
        py: Python<'py>,
        stream: Option<Bound<'py, PyAny>>,
        max_version: Option<(u32, u32)>,
        dl_device: Option<(i32, i32)>,
        copy: Option<bool>,
    ) -> PyResult<Bound<'py, PyCapsule>> {
        // Host memory needs no synchronisation: any stream is accepted and ignored.
        let _ = stream;
        if let Some(device) = dl_device
            && device != (dlpack::KDL_CPU, 0)
        {
            return Err(dlpack::buffer_error(format!(
                "column '{}' is in host memory (device (1, 0)); it cannot be exported to device {device:?}",
                self.field.name()
            )));
        }
        let view = dlpack::describe(self.field.name(), &self.field, self.array.as_ref())
            .map_err(dlpack::buffer_error)?;
        let versioned = max_version.is_some_and(|(major, _)| major >= 1);
        dlpack::to_capsule(py, view, versioned, copy)
    }

    /// `(kDLCPU, 0)`: the column is in host memory.
    fn __dlpack_device__(&self) -> (i32, i32) {
        (dlpack::KDL_CPU, 0)
    }

    /// The column as a numpy array, zero-copy and read-only (`numpy.from_dlpack`).
    fn to_numpy<'py>(slf: &Bound<'py, Self>) -> PyResult<Bound<'py, PyAny>> {
        let py = slf.py();
        py.import(intern!(py, "numpy"))?
            .getattr(intern!(py, "from_dlpack"))?
            .call1((slf,))
    }

    /// numpy's array protocol: `np.asarray(column)` is the zero-copy, read-only view of
    /// `numpy.from_dlpack`; `np.array(column)` (`copy=True`) a writable copy.
    #[pyo3(signature = (dtype=None, copy=None))]
    fn __array__<'py>(
        slf: &Bound<'py, Self>,
        dtype: Option<Bound<'py, PyAny>>,
        copy: Option<bool>,
    ) -> PyResult<Bound<'py, PyAny>> {
        let py = slf.py();
        let mut array = py
            .import(intern!(py, "numpy"))?
            .getattr(intern!(py, "from_dlpack"))?
            .call1((slf,))?;
        if let Some(dtype) = dtype {
            array = array.call_method1(intern!(py, "astype"), (dtype,))?;
        } else if copy == Some(true) {
            array = array.call_method0(intern!(py, "copy"))?;
        }
        Ok(array)
    }

    /// The column as a `pyarrow.Array` (zero-copy; needs pyarrow).
    fn to_pyarrow<'py>(slf: &Bound<'py, Self>) -> PyResult<Bound<'py, PyAny>> {
        let py = slf.py();
        py.import(intern!(py, "pyarrow"))?
            .getattr(intern!(py, "array"))?
            .call1((slf,))
    }

    fn __repr__(&self) -> String {
        format!(
            "sluice.Column(name={:?}, type={}, len={})",
            self.field.name(),
            self.field.data_type(),
            self.array.len(),
        )
    }
}
