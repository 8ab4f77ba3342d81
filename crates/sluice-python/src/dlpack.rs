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

use std::ffi::{CStr, c_void};
use std::ptr::NonNull;

use arrow::array::{Array, AsArray};
use arrow::buffer::{Buffer, MutableBuffer};
use arrow::datatypes::{DataType, Field};
use pyo3::exceptions::PyBufferError;
use pyo3::ffi;
use pyo3::prelude::*;
use pyo3::types::PyCapsule;

use crate::private_map::{Backing, PrivateMapping};

/// `kDLCPU`.
pub const KDL_CPU: i32 = 1;
/// `kDLCUDA`.
pub const KDL_CUDA: i32 = 2;
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
    /// The private mapping the tensor points into, for values in shared memory; unmapped
    /// before the sample below goes back.
    _private: Option<PrivateMapping>,
    /// Keeps the values in memory (for shared memory: the sample mapped and borrowed;
    /// on a GPU: the device column, which pins the producer's slot).
    _memory: Memory,
}

/// Where a tensor's values are.
enum Memory {
    /// Host memory: `buffer` from byte `start`.
    Host { buffer: Buffer, start: usize },
    /// Device memory of CUDA device `device_id` (this process's numbering) at `ptr`,
    /// valid while `keep` lives; `copied` when it is the consumer's own copy.
    Device {
        ptr: u64,
        device_id: i32,
        copied: bool,
        _keep: Box<dyn Send>,
    },
}

impl std::fmt::Debug for Memory {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        match self {
            Self::Host { start, .. } => write!(f, "Host {{ start: {start} }}"),
            Self::Device { ptr, device_id, .. } => {
                write!(f, "Device {{ ptr: {ptr:#x}, device_id: {device_id} }}")
            }
        }
    }
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
    /// Where the values are (a reference to it keeps them in memory).
    memory: Memory,
    /// Bytes from the first element to the end of the last one.
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

    /// The element type.
    pub fn dtype(&self) -> DLDataType {
        self.dtype
    }

    /// Strides in bytes, or `None` when the tensor is C-contiguous (row-major), as
    /// `__cuda_array_interface__` wants them.
    pub fn byte_strides(&self) -> Option<Vec<i64>> {
        if Some(&self.strides) == row_major_strides(&self.shape).as_ref() {
            return None;
        }
        let width = i64::from(self.dtype.bits / 8);
        Some(self.strides.iter().map(|s| s * width).collect())
    }
}

impl DLDataType {
    /// The type code: 0 signed integer, 1 unsigned integer, 2 float.
    pub fn code(&self) -> u8 {
        self.code
    }

    /// Bits per element.
    pub fn bits(&self) -> u8 {
        self.bits
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

/// The product of `dims` (1 for none), or `None` if it overflows: dimensions come from
/// the data (a Parquet file's tensor metadata), which may claim anything.
fn product(dims: &[i64]) -> Option<i64> {
    dims.iter().try_fold(1i64, |acc, &d| acc.checked_mul(d))
}

fn row_major_strides(shape: &[i64]) -> Option<Vec<i64>> {
    let mut strides = vec![1i64; shape.len()];
    for k in (0..shape.len().saturating_sub(1)).rev() {
        strides[k] = strides[k + 1].checked_mul(shape[k + 1])?;
    }
    Some(strides)
}

/// Whether every element a tensor of `shape` and `strides` (in elements) addresses lies
/// within `elements` elements: the last check before a consumer gets the pointer.
fn within(shape: &[i64], strides: &[i64], elements: i64) -> bool {
    if shape.contains(&0) {
        return true;
    }
    let last = shape.iter().zip(strides).try_fold(0i64, |acc, (&d, &s)| {
        if d < 0 || s < 0 {
            return None;
        }
        acc.checked_add((d - 1).checked_mul(s)?)
    });
    last.is_some_and(|last| last < elements)
}

fn too_large(name: &str, shape: &[i64]) -> String {
    format!(
        "column '{name}': a tensor of shape {shape:?} does not fit in memory (its size overflows)"
    )
}

/// The shape of each tensor of an `arrow.fixed_shape_tensor` column, and its permutation.
type TensorShape = (Vec<i64>, Option<Vec<usize>>);

/// The shape (and permutation) of an `arrow.fixed_shape_tensor` field, if it is one.
fn fixed_shape_tensor(field: &Field) -> Result<Option<TensorShape>, String> {
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

/// The shape and strides (in elements) of column `name`'s tensor: `storage` (rows, then
/// one dimension per fixed-size-list level), or for an `arrow.fixed_shape_tensor` column
/// the rows and the extension's (possibly permuted) shape.
fn tensor_layout(
    name: &str,
    field: &Field,
    storage: Vec<i64>,
) -> Result<(Vec<i64>, Vec<i64>), String> {
    let mut shape = storage;
    let mut strides = row_major_strides(&shape).ok_or_else(|| too_large(name, &shape))?;
    if let Some((tensor_shape, permutation)) = fixed_shape_tensor(field)? {
        let inner = product(&tensor_shape).ok_or_else(|| too_large(name, &tensor_shape))?;
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
        let physical_strides =
            row_major_strides(&physical).ok_or_else(|| too_large(name, &physical))?;
        let mut logical_strides = vec![0i64; n];
        for (j, &p) in permutation.iter().enumerate() {
            logical_strides[p] = physical_strides[j];
        }
        shape = std::iter::once(shape[0]).chain(tensor_shape).collect();
        strides = std::iter::once(inner).chain(logical_strides).collect();
    }
    Ok((shape, strides))
}

/// Describes the device values of column `name` (`rows` rows at `ptr` on CUDA device
/// `device_id`, laid out as the CPU path lays them out) as a tensor kept valid by `keep`.
pub fn describe_device(
    name: &str,
    field: &Field,
    rows: usize,
    ptr: u64,
    device_id: i32,
    copied: bool,
    keep: Box<dyn Send>,
) -> Result<TensorView, String> {
    let mut shape = vec![rows as i64];
    let mut data_type = field.data_type();
    let dtype = loop {
        match data_type {
            DataType::FixedSizeList(child, size) => {
                shape.push(i64::from(*size));
                data_type = child.data_type();
            }
            dt => {
                break dl_dtype(dt).ok_or_else(|| {
                    format!(
                        "column '{name}' has type {}; only fixed-width numbers and fixed-size \
                         lists of them can be exported through DLPack",
                        field.data_type()
                    )
                })?;
            }
        }
    };
    let width = usize::from(dtype.bits / 8);
    let elements = product(&shape).ok_or_else(|| too_large(name, &shape))?;
    let len = usize::try_from(elements)
        .ok()
        .and_then(|n| n.checked_mul(width))
        .ok_or_else(|| too_large(name, &shape))?;
    let (shape, strides) = tensor_layout(name, field, shape)?;
    if !within(&shape, &strides, elements) {
        return Err(too_large(name, &shape));
    }
    Ok(TensorView {
        memory: Memory::Device {
            ptr,
            device_id,
            copied,
            _keep: keep,
        },
        len,
        dtype,
        shape,
        strides,
    })
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
    let elements = product(&shape).ok_or_else(|| too_large(name, &shape))?;
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
    let span = data.offset().checked_mul(width).and_then(|start| {
        let len = current.len().checked_mul(width)?;
        Some((start, len, start.checked_add(len)?))
    });
    let Some((start, len, _)) = span.filter(|&(_, _, end)| end <= buffer.len()) else {
        return Err(format!(
            "column '{name}': its value buffer is shorter than its length"
        ));
    };

    let (shape, strides) = tensor_layout(name, field, shape)?;
    if !within(&shape, &strides, elements) {
        return Err(too_large(name, &shape));
    }
    Ok(TensorView {
        memory: Memory::Host {
            buffer: buffer.clone(),
            start,
        },
        len,
        dtype,
        shape,
        strides,
    })
}

impl TensorView {
    /// The values, for a view of host memory (`None` on a device).
    fn host_bytes(&self) -> Option<&[u8]> {
        match &self.memory {
            // `describe` checked the range against the buffer.
            Memory::Host { buffer, start } => Some(&buffer.as_slice()[*start..*start + self.len]),
            Memory::Device { .. } => None,
        }
    }

    /// The same host tensor in fresh (64-byte aligned) process memory.
    fn copied(&self, bytes: &[u8]) -> Self {
        let mut copy = MutableBuffer::from_len_zeroed(self.len);
        copy.as_slice_mut().copy_from_slice(bytes);
        Self {
            memory: Memory::Host {
                buffer: copy.into(),
                start: 0,
            },
            len: self.len,
            dtype: self.dtype,
            shape: self.shape.clone(),
            strides: self.strides.clone(),
        }
    }

    /// Moves the metadata and the memory into an [`Owner`] and describes them as a
    /// `DLTensor`, which stays valid for as long as the owner lives (wherever it moves:
    /// the shape, strides and values are on the heap, in shared memory or on a device).
    fn into_owner(self) -> (Owner, DLTensor) {
        // DLPack has no const pointers; consumers are told the memory is read-only where
        // the protocol version can say so.
        let (data, device) = match &self.memory {
            Memory::Host { buffer, start } => (
                buffer.as_slice()[*start..].as_ptr().cast_mut().cast(),
                DLDevice {
                    device_type: KDL_CPU,
                    device_id: 0,
                },
            ),
            Memory::Device { ptr, device_id, .. } => (
                *ptr as *mut c_void,
                DLDevice {
                    device_type: KDL_CUDA,
                    device_id: *device_id,
                },
            ),
        };
        let mut owner = Owner {
            shape: self.shape,
            strides: self.strides,
            _private: None,
            _memory: self.memory,
        };
        let tensor = DLTensor {
            data,
            device,
            ndim: owner.shape.len() as i32,
            dtype: self.dtype,
            shape: owner.shape.as_mut_ptr(),
            strides: owner.strides.as_mut_ptr(),
            byte_offset: 0,
        };
        (owner, tensor)
    }
}

/// Frees a `Legacy` tensor.
///
/// # Safety
/// `managed` must be null or the `DLManagedTensor` at the start of a `Legacy` leaked by
/// [`to_capsule`], not freed before (DLPack calls each deleter once).
unsafe extern "C" fn delete_legacy(managed: *mut DLManagedTensor) {
    if !managed.is_null() {
        // SAFETY: the caller passes the start of a leaked `Box<Legacy>`, once.
        drop(unsafe { Box::from_raw(managed.cast::<Legacy>()) });
    }
}

/// Frees a `Versioned` tensor.
///
/// # Safety
/// As for [`delete_legacy`], for a `Versioned`.
unsafe extern "C" fn delete_versioned(managed: *mut DLManagedTensorVersioned) {
    if !managed.is_null() {
        // SAFETY: the caller passes the start of a leaked `Box<Versioned>`, once.
        drop(unsafe { Box::from_raw(managed.cast::<Versioned>()) });
    }
}

/// Destructor of a "dltensor" capsule: frees the tensor unless a consumer took it.
///
/// # Safety
/// Called by Python with a capsule made by [`to_capsule`], while it is destroyed.
unsafe extern "C" fn legacy_capsule_destructor(capsule: *mut ffi::PyObject) {
    // SAFETY: `capsule` is a live capsule. `PyCapsule_IsValid` sets no exception; it is
    // false once a consumer renamed the capsule to "used_dltensor" (then the consumer
    // calls the deleter). Otherwise the pointer is our unconsumed `Legacy`.
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

/// Destructor of a "dltensor_versioned" capsule.
///
/// # Safety
/// As for [`legacy_capsule_destructor`].
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

/// Wraps `view` in a DLPack capsule whose deleter keeps `view`'s buffer alive until the
/// consumer is done with the tensor. `copy` is the consumer's: `Some(true)` copies the
/// values first; `Some(false)` is a `BufferError` where they would have to be copied
/// (DLPack's rule); `None` copies where needed. `versioned` selects
/// `DLManagedTensorVersioned` (flagged read-only unless copied).
pub fn to_capsule<'py>(
    py: Python<'py>,
    view: TensorView,
    versioned: bool,
    copy: Option<bool>,
) -> PyResult<Bound<'py, PyCapsule>> {
    let no_copy = copy == Some(false);
    let copy = copy == Some(true);
    // Consumers that ignore the read-only flag (torch) write through the pointer: values
    // in shared memory are handed out in a private copy-on-write mapping, so such a write
    // changes this tensor only (see `private_map`), or copied where that cannot be made.
    // Values in this process's memory (a batch assembled from two producer batches, one
    // received beyond `max_held`, a remote topic's) are copied: other views (pyarrow,
    // numpy, later exports) share that memory, and there is no copy-on-write for it.
    let (view, flags, private) = match (&view.memory, view.host_bytes()) {
        // Device views are asked for already copied or not (`describe_device`): there
        // is no copy-on-write for device memory, so a shared view is flagged read-only
        // and the docs tell writers to pass `copy=True`.
        (Memory::Device { copied: true, .. }, _) => (view, FLAG_IS_COPIED, None),
        (Memory::Device { .. }, _) => (view, FLAG_READ_ONLY, None),
        (Memory::Host { .. }, Some(bytes)) if copy => (view.copied(bytes), FLAG_IS_COPIED, None),
        (Memory::Host { .. }, Some(bytes)) => match PrivateMapping::of(bytes) {
            Backing::Private(mapping, data) => (view, FLAG_READ_ONLY, Some((mapping, data))),
            Backing::NotShared | Backing::Unavailable if no_copy => {
                return Err(buffer_error(
                    "this column cannot be exported without a copy (it is in this \
                     process's memory, shared with its other views): pass copy=None or \
                     copy=True"
                        .into(),
                ));
            }
            Backing::NotShared | Backing::Unavailable => (view.copied(bytes), FLAG_IS_COPIED, None),
        },
        (Memory::Host { .. }, None) => {
            return Err(buffer_error("internal: a host view without bytes".into()));
        }
    };
    let (mut owner, mut dl_tensor) = view.into_owner();
    if let Some((mapping, data)) = private {
        dl_tensor.data = data.cast();
        owner._private = Some(mapping);
    }
    if versioned {
        let leaked = NonNull::from(Box::leak(Box::new(Versioned {
            managed: DLManagedTensorVersioned {
                version: DLPackVersion { major: 1, minor: 0 },
                manager_ctx: std::ptr::null_mut(),
                deleter: Some(delete_versioned),
                flags,
                dl_tensor,
            },
            owner,
        })));
        // SAFETY: `leaked` points to a live `Versioned` that nothing else references yet.
        unsafe { (*leaked.as_ptr()).managed.manager_ctx = leaked.as_ptr().cast() };
        // SAFETY: the pointer is the `DLManagedTensorVersioned` at the start of the leaked
        // `Versioned`, valid until its deleter runs: from the destructor while the capsule
        // is unconsumed, else from the consumer. The destructor may run on any thread;
        // everything it frees is `Send`.
        let capsule = unsafe {
            PyCapsule::new_with_pointer_and_destructor(
                py,
                leaked.cast(),
                VERSIONED_NAME,
                Some(versioned_capsule_destructor),
            )
        };
        if capsule.is_err() {
            // SAFETY: no capsule took the tensor, so it is still ours to free, once.
            unsafe { delete_versioned(leaked.as_ptr().cast()) };
        }
        capsule
    } else {
        let leaked = NonNull::from(Box::leak(Box::new(Legacy {
            managed: DLManagedTensor {
                dl_tensor,
                manager_ctx: std::ptr::null_mut(),
                deleter: Some(delete_legacy),
            },
            owner,
        })));
        // SAFETY: `leaked` points to a live `Legacy` that nothing else references yet.
        unsafe { (*leaked.as_ptr()).managed.manager_ctx = leaked.as_ptr().cast() };
        // SAFETY: as above, for the `DLManagedTensor` at the start of the leaked `Legacy`.
        let capsule = unsafe {
            PyCapsule::new_with_pointer_and_destructor(
                py,
                leaked.cast(),
                LEGACY_NAME,
                Some(legacy_capsule_destructor),
            )
        };
        if capsule.is_err() {
            // SAFETY: no capsule took the tensor, so it is still ours to free, once.
            unsafe { delete_legacy(leaked.as_ptr().cast()) };
        }
        capsule
    }
}

/// The error DLPack consumers expect when a producer cannot export.
pub fn buffer_error(message: String) -> PyErr {
    PyBufferError::new_err(message)
}
