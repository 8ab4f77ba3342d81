//! DLPack export of fixed-width columns, written from `dlpack.h` (v1.0).
//!
//! A column of a fixed-width numeric type becomes a 1-D tensor; a fixed-size list of such
//! values (Sluice's tensors) becomes an N-D tensor, one dimension per list level, or the
//! shape of an `arrow.fixed_shape_tensor` column. The tensor points into the column's
//! buffer, which for a zero-copy batch is the shared-memory sample itself; the
//! `DLManagedTensor`'s deleter owns a reference to the Arrow array, so the sample stays
//! mapped until the consumer (numpy, torch, JAX) drops its array.
//!
//! Two capsule kinds are produced, as the Python array API describes:
//! * `"dltensor"` holding a `DLManagedTensor`, for consumers that do not ask for a
//!   version (numpy < 2, older torch);
//! * `"dltensor_versioned"` holding a `DLManagedTensorVersioned` with the read-only flag,
//!   when the consumer passes `max_version >= (1, 0)`: shared memory must not be written.
//!
//! A consumer renames the capsule to `"used_dltensor"` (`"used_dltensor_versioned"`) when
//! it takes ownership and later calls the deleter itself; a capsule that was never
//! consumed calls the deleter from its destructor.

use std::any::Any;
use std::ffi::{CStr, c_void};
use std::ptr::NonNull;

use arrow::array::{Array, AsArray};
use arrow::buffer::MutableBuffer;
use arrow::datatypes::{DataType, Field};
use pyo3::exceptions::PyBufferError;
use pyo3::ffi;
use pyo3::prelude::*;
use pyo3::types::PyCapsule;

/// `kDLCPU`.
pub const KDL_CPU: i32 = 1;
const KDL_INT: u8 = 0;
const KDL_UINT: u8 = 1;
const KDL_FLOAT: u8 = 2;
/// `DLPACK_FLAG_BITMASK_READ_ONLY`.
const FLAG_READ_ONLY: u64 = 1;
/// `DLPACK_FLAG_BITMASK_IS_COPIED`.
const FLAG_IS_COPIED: u64 = 1 << 1;

const LEGACY_NAME: &CStr = c"dltensor";
const VERSIONED_NAME: &CStr = c"dltensor_versioned";

/// `DLDevice`.
#[repr(C)]
#[derive(Debug, Clone, Copy)]
struct DLDevice {
    device_type: i32,
    device_id: i32,
}

/// `DLDataType`.
#[repr(C)]
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub struct DLDataType {
    code: u8,
    bits: u8,
    lanes: u16,
}

/// `DLTensor`.
#[repr(C)]
#[derive(Debug)]
struct DLTensor {
    data: *mut c_void,
    device: DLDevice,
    ndim: i32,
    dtype: DLDataType,
    shape: *mut i64,
    strides: *mut i64,
    byte_offset: u64,
}

/// `DLManagedTensor` (unversioned, "dltensor").
#[repr(C)]
#[derive(Debug)]
struct DLManagedTensor {
    dl_tensor: DLTensor,
    manager_ctx: *mut c_void,
    deleter: Option<unsafe extern "C" fn(*mut DLManagedTensor)>,
}

/// `DLPackVersion`.
#[repr(C)]
#[derive(Debug, Clone, Copy)]
struct DLPackVersion {
    major: u32,
    minor: u32,
}

/// `DLManagedTensorVersioned` ("dltensor_versioned").
#[repr(C)]
#[derive(Debug)]
struct DLManagedTensorVersioned {
    version: DLPackVersion,
    manager_ctx: *mut c_void,
    deleter: Option<unsafe extern "C" fn(*mut DLManagedTensorVersioned)>,
    flags: u64,
    dl_tensor: DLTensor,
}

/// What a tensor's memory and metadata depend on: dropped by the deleter.
struct Owner {
    shape: Vec<i64>,
    strides: Vec<i64>,
    _keep: Box<dyn Any + Send>,
}

/// A `DLManagedTensor` followed by what it points to; `managed` comes first so that a
/// pointer to the struct is a pointer to the `DLManagedTensor`.
#[repr(C)]
struct Legacy {
    managed: DLManagedTensor,
    owner: Owner,
}

/// As [`Legacy`], for the versioned struct.
#[repr(C)]
struct Versioned {
    managed: DLManagedTensorVersioned,
    owner: Owner,
}

/// Where a column's values are and how they are laid out, as DLPack needs it.
#[derive(Debug)]
pub struct TensorView {
    /// The first element.
    data: *const u8,
    /// Bytes from `data` to the end of the last element.
    len: usize,
    dtype: DLDataType,
    shape: Vec<i64>,
    /// In elements, one per dimension.
    strides: Vec<i64>,
}

impl TensorView {
    /// The tensor's shape.
    pub fn shape(&self) -> &[i64] {
        &self.shape
    }
}

fn dl_dtype(dt: &DataType) -> Option<DLDataType> {
    let (code, bits) = match dt {
        DataType::Int8 => (KDL_INT, 8),
        DataType::Int16 => (KDL_INT, 16),
        DataType::Int32 => (KDL_INT, 32),
        DataType::Int64 => (KDL_INT, 64),
        DataType::UInt8 => (KDL_UINT, 8),
        DataType::UInt16 => (KDL_UINT, 16),
        DataType::UInt32 => (KDL_UINT, 32),
        DataType::UInt64 => (KDL_UINT, 64),
        DataType::Float16 => (KDL_FLOAT, 16),
        DataType::Float32 => (KDL_FLOAT, 32),
        DataType::Float64 => (KDL_FLOAT, 64),
        _ => return None,
    };
    Some(DLDataType {
        code,
        bits,
        lanes: 1,
    })
}

fn row_major_strides(shape: &[i64]) -> Vec<i64> {
    let mut strides = vec![1i64; shape.len()];
    for k in (0..shape.len().saturating_sub(1)).rev() {
        strides[k] = strides[k + 1] * shape[k + 1];
    }
    strides
}

/// The shape (and permutation) of an `arrow.fixed_shape_tensor` field, if it is one.
fn fixed_shape_tensor(field: &Field) -> Result<Option<(Vec<i64>, Option<Vec<usize>>)>, String> {
    let meta = field.metadata();
    if meta.get("ARROW:extension:name").map(String::as_str) != Some("arrow.fixed_shape_tensor") {
        return Ok(None);
    }
    let text = meta
        .get("ARROW:extension:metadata")
        .map(String::as_str)
        .unwrap_or("{}");
    let json: serde_json::Value = serde_json::from_str(text)
        .map_err(|e| format!("bad arrow.fixed_shape_tensor metadata {text:?}: {e}"))?;
    let ints = |key: &str| -> Result<Option<Vec<i64>>, String> {
        match json.get(key) {
            None | Some(serde_json::Value::Null) => Ok(None),
            Some(serde_json::Value::Array(items)) => items
                .iter()
                .map(|v| {
                    v.as_i64()
                        .filter(|n| *n >= 0)
                        .ok_or_else(|| format!("bad '{key}' in tensor metadata {text:?}"))
                })
                .collect::<Result<Vec<_>, _>>()
                .map(Some),
            Some(_) => Err(format!("bad '{key}' in tensor metadata {text:?}")),
        }
    };
    let shape = ints("shape")?.ok_or_else(|| format!("tensor metadata {text:?} has no shape"))?;
    let permutation = ints("permutation")?.map(|p| p.into_iter().map(|i| i as usize).collect());
    Ok(Some((shape, permutation)))
}

/// Describes column `name` as a tensor, or says why it cannot be one.
pub fn describe(name: &str, field: &Field, array: &dyn Array) -> Result<TensorView, String> {
    let mut shape = vec![array.len() as i64];
    let mut current = array;
    let dtype = loop {
        if current.null_count() > 0 {
            return Err(format!(
                "column '{name}' has {} null value(s) and DLPack has no validity mask; \
                 fill the nulls in the plan (e.g. COALESCE(col, 0)) or convert through pyarrow \
                 (pyarrow.array(batch['{name}']).fill_null(0))",
                current.null_count()
            ));
        }
        match current.data_type() {
            DataType::FixedSizeList(_, size) => {
                shape.push(i64::from(*size));
                current = current.as_fixed_size_list().values().as_ref();
            }
            DataType::Boolean => {
                return Err(format!(
                    "column '{name}' is boolean, which Arrow stores as bits; DLPack needs one byte \
                     per value: cast it in the plan (CAST(col AS TINYINT)) or use pyarrow"
                ));
            }
            dt => match dl_dtype(dt) {
                Some(t) => break t,
                None => {
                    return Err(format!(
                        "column '{name}' has type {}; only fixed-width numbers (int, uint, float) \
                         and fixed-size lists of them can be exported through DLPack; use the \
                         Arrow interface for it (pyarrow.array(batch['{name}']))",
                        array.data_type()
                    ));
                }
            },
        }
    };
    let elements: i64 = shape.iter().product();
    if elements != current.len() as i64 {
        return Err(format!(
            "column '{name}': {} values do not fill a tensor of shape {shape:?}",
            current.len()
        ));
    }
    let width = usize::from(dtype.bits / 8);
    let data = current.to_data();
    let buffer = data
        .buffers()
        .first()
        .ok_or_else(|| format!("column '{name}' has no value buffer"))?;
    let start = data.offset() * width;
    let len = current.len() * width;
    let bytes = buffer
        .as_slice()
        .get(start..start + len)
        .ok_or_else(|| format!("column '{name}': its value buffer is shorter than its length"))?;

    let mut strides = row_major_strides(&shape);
    if let Some((tensor_shape, permutation)) = fixed_shape_tensor(field)? {
        let inner: i64 = tensor_shape.iter().product();
        if shape.len() != 2 || inner != shape[1] {
            return Err(format!(
                "column '{name}': tensor shape {tensor_shape:?} does not match its storage {}",
                field.data_type()
            ));
        }
        let n = tensor_shape.len();
        let permutation = permutation.unwrap_or_else(|| (0..n).collect());
        let mut seen = vec![false; n];
        for &p in &permutation {
            if p >= n || std::mem::replace(&mut seen[p], true) {
                return Err(format!(
                    "column '{name}': bad tensor permutation {permutation:?}"
                ));
            }
        }
        // The storage holds each tensor in the permuted (physical) order: logical
        // dimension permutation[j] lies at physical position j.
        let physical: Vec<i64> = permutation.iter().map(|&p| tensor_shape[p]).collect();
        let physical_strides = row_major_strides(&physical);
        let mut logical_strides = vec![0i64; n];
        for (j, &p) in permutation.iter().enumerate() {
            logical_strides[p] = physical_strides[j];
        }
        shape = std::iter::once(shape[0]).chain(tensor_shape).collect();
        strides = std::iter::once(inner).chain(logical_strides).collect();
    }
    Ok(TensorView {
        data: bytes.as_ptr(),
        len,
        dtype,
        shape,
        strides,
    })
}

/// Copies the tensor into fresh (64-byte aligned) memory; the copy keeps the layout.
fn copy_of(view: &TensorView) -> (TensorView, MutableBuffer) {
    let mut buffer = MutableBuffer::from_len_zeroed(view.len);
    // SAFETY: `describe` took `data` and `len` from a slice of an Arrow buffer that the
    // caller keeps alive (it holds the array) for the duration of this call.
    let source = unsafe { std::slice::from_raw_parts(view.data, view.len) };
    buffer.as_slice_mut().copy_from_slice(source);
    let copied = TensorView {
        data: buffer.as_ptr(),
        len: view.len,
        dtype: view.dtype,
        shape: view.shape.clone(),
        strides: view.strides.clone(),
    };
    (copied, buffer)
}

fn dl_tensor(view: &TensorView) -> DLTensor {
    DLTensor {
        data: view.data.cast_mut().cast(),
        device: DLDevice {
            device_type: KDL_CPU,
            device_id: 0,
        },
        ndim: view.shape.len() as i32,
        dtype: view.dtype,
        // Set once the owner has its final address.
        shape: std::ptr::null_mut(),
        strides: std::ptr::null_mut(),
        byte_offset: 0,
    }
}

unsafe extern "C" fn delete_legacy(managed: *mut DLManagedTensor) {
    if !managed.is_null() {
        // SAFETY: every `DLManagedTensor` with this deleter is the first field of a
        // `Legacy` leaked from a `Box` in `to_capsule`; DLPack calls the deleter once.
        drop(unsafe { Box::from_raw(managed.cast::<Legacy>()) });
    }
}

unsafe extern "C" fn delete_versioned(managed: *mut DLManagedTensorVersioned) {
    if !managed.is_null() {
        // SAFETY: as in `delete_legacy`, for `Versioned`.
        drop(unsafe { Box::from_raw(managed.cast::<Versioned>()) });
    }
}

unsafe extern "C" fn legacy_capsule_destructor(capsule: *mut ffi::PyObject) {
    // SAFETY: Python calls this with the capsule being destroyed. `PyCapsule_IsValid`
    // sets no exception; it fails once a consumer renamed the capsule to "used_dltensor",
    // and then the consumer owns the tensor. Otherwise the pointer is our `Legacy`.
    unsafe {
        if ffi::PyCapsule_IsValid(capsule, LEGACY_NAME.as_ptr()) == 1 {
            let managed =
                ffi::PyCapsule_GetPointer(capsule, LEGACY_NAME.as_ptr()).cast::<DLManagedTensor>();
            if let Some(deleter) = (*managed).deleter {
                deleter(managed);
            }
        }
    }
}

unsafe extern "C" fn versioned_capsule_destructor(capsule: *mut ffi::PyObject) {
    // SAFETY: as in `legacy_capsule_destructor`, for "dltensor_versioned".
    unsafe {
        if ffi::PyCapsule_IsValid(capsule, VERSIONED_NAME.as_ptr()) == 1 {
            let managed = ffi::PyCapsule_GetPointer(capsule, VERSIONED_NAME.as_ptr())
                .cast::<DLManagedTensorVersioned>();
            if let Some(deleter) = (*managed).deleter {
                deleter(managed);
            }
        }
    }
}

/// Wraps `view` in a DLPack capsule. `keep` must own the memory `view` points to; it is
/// dropped when the consumer is done with the tensor. With `copy`, the values are copied
/// first. `versioned` selects `DLManagedTensorVersioned` (read-only unless copied).
pub fn to_capsule<'py>(
    py: Python<'py>,
    view: TensorView,
    keep: Box<dyn Any + Send>,
    versioned: bool,
    copy: bool,
) -> PyResult<Bound<'py, PyCapsule>> {
    let (view, keep, flags): (TensorView, Box<dyn Any + Send>, u64) = if copy {
        let (copied, buffer) = copy_of(&view);
        drop(keep);
        (
            copied,
            Box::new(arrow::buffer::Buffer::from(buffer)),
            FLAG_IS_COPIED,
        )
    } else {
        (view, keep, FLAG_READ_ONLY)
    };
    let tensor = dl_tensor(&view);
    let owner = Owner {
        shape: view.shape,
        strides: view.strides,
        _keep: keep,
    };
    if versioned {
        let mut boxed = Box::new(Versioned {
            managed: DLManagedTensorVersioned {
                version: DLPackVersion { major: 1, minor: 0 },
                manager_ctx: std::ptr::null_mut(),
                deleter: Some(delete_versioned),
                flags,
                dl_tensor: tensor,
            },
            owner,
        });
        boxed.managed.dl_tensor.shape = boxed.owner.shape.as_mut_ptr();
        boxed.managed.dl_tensor.strides = boxed.owner.strides.as_mut_ptr();
        let raw = Box::into_raw(boxed);
        // SAFETY: `raw` comes from `Box::into_raw` just above and is valid.
        unsafe { (*raw).managed.manager_ctx = raw.cast() };
        let ptr = NonNull::new(raw.cast::<c_void>()).expect("Box pointers are not null");
        // SAFETY: `ptr` points to a live `DLManagedTensorVersioned` (first field of
        // `Versioned`) that stays valid until its deleter runs, which the destructor does
        // only while the capsule is unconsumed; the destructor may run on any thread, and
        // the owner is `Send`.
        let capsule = unsafe {
            PyCapsule::new_with_pointer_and_destructor(
                py,
                ptr,
                VERSIONED_NAME,
                Some(versioned_capsule_destructor),
            )
        };
        if capsule.is_err() {
            // SAFETY: no capsule took the tensor, so it is still ours to free, once.
            unsafe { delete_versioned(raw.cast()) };
        }
        capsule
    } else {
        let mut boxed = Box::new(Legacy {
            managed: DLManagedTensor {
                dl_tensor: tensor,
                manager_ctx: std::ptr::null_mut(),
                deleter: Some(delete_legacy),
            },
            owner,
        });
        boxed.managed.dl_tensor.shape = boxed.owner.shape.as_mut_ptr();
        boxed.managed.dl_tensor.strides = boxed.owner.strides.as_mut_ptr();
        let raw = Box::into_raw(boxed);
        // SAFETY: `raw` comes from `Box::into_raw` just above and is valid.
        unsafe { (*raw).managed.manager_ctx = raw.cast() };
        let ptr = NonNull::new(raw.cast::<c_void>()).expect("Box pointers are not null");
        // SAFETY: as above, for the unversioned `DLManagedTensor` at the start of `Legacy`.
        let capsule = unsafe {
            PyCapsule::new_with_pointer_and_destructor(
                py,
                ptr,
                LEGACY_NAME,
                Some(legacy_capsule_destructor),
            )
        };
        if capsule.is_err() {
            // SAFETY: no capsule took the tensor, so it is still ours to free, once.
            unsafe { delete_legacy(raw.cast()) };
        }
        capsule
    }
}

/// The error DLPack consumers expect when a producer cannot export.
pub fn buffer_error(message: String) -> PyErr {
    PyBufferError::new_err(message)
}
