//! The Arrow C Device data interface: host memory, and CUDA memory for GPU topics.
//!
//! Neither arrow-rs nor pyo3-arrow defines `ArrowDeviceArray`, so it is written out here
//! from the specification (`arrow/c/abi.h`):
//!
//! ```c
//! struct ArrowDeviceArray {
//!   struct ArrowArray array;   // 80 bytes
//!   int64_t device_id;
//!   ArrowDeviceType device_type;  // int32_t; ARROW_DEVICE_CPU = 1
//!   void* sync_event;
//!   int64_t reserved[3];
//! };                           // 128 bytes
//! ```

use std::ffi::{CStr, c_void};
use std::mem::{offset_of, size_of};

use arrow::ffi::FFI_ArrowArray;

/// `ARROW_DEVICE_CPU`.
pub const ARROW_DEVICE_CPU: i32 = 1;
/// `ARROW_DEVICE_CUDA`.
pub const ARROW_DEVICE_CUDA: i32 = 2;

/// Name of a PyCapsule holding an `ArrowDeviceArray`.
pub const DEVICE_ARRAY_CAPSULE_NAME: &CStr = c"arrow_device_array";

/// An `ArrowDeviceArray`: an `ArrowArray` and the device its buffers live on.
///
/// Dropping it drops the inner [`FFI_ArrowArray`], which calls the array's `release`
/// callback unless a consumer has already moved the array out (and set `release` to
/// null, as the C data interface requires).
#[repr(C)]
#[derive(Debug)]
pub struct ArrowDeviceArray {
    /// The array; its buffers are on the device below.
    pub array: FFI_ArrowArray,
    /// Device number; 0 for the CPU.
    pub device_id: i64,
    /// `ArrowDeviceType`; [`ARROW_DEVICE_CPU`].
    pub device_type: i32,
    /// An event to wait on before reading the buffers; null on the CPU.
    pub sync_event: *mut c_void,
    /// Reserved by the specification: zero.
    pub reserved: [i64; 3],
}

const _: () = assert!(size_of::<FFI_ArrowArray>() == 80);
const _: () = assert!(size_of::<ArrowDeviceArray>() == 128);
const _: () = assert!(offset_of!(ArrowDeviceArray, device_id) == 80);
const _: () = assert!(offset_of!(ArrowDeviceArray, device_type) == 88);
const _: () = assert!(offset_of!(ArrowDeviceArray, sync_event) == 96);
const _: () = assert!(offset_of!(ArrowDeviceArray, reserved) == 104);

// SAFETY: the only field that is not `Send` is `sync_event`: null for CPU arrays, and for
// CUDA arrays a pointer to a `CUevent` handle boxed in the array's own private data (see
// `ArrowDeviceArray::cuda`), which lives as long as the array and may be waited on from
// any thread of the process. `FFI_ArrowArray` is `Send`, and its
// private data (an `ArrayData` of `Arc`-counted buffers) may be released from any thread.
unsafe impl Send for ArrowDeviceArray {}

impl ArrowDeviceArray {
    /// Wraps an array whose buffers are in host memory.
    pub fn cpu(array: FFI_ArrowArray) -> Self {
        Self {
            array,
            device_id: 0,
            device_type: ARROW_DEVICE_CPU,
            sync_event: std::ptr::null_mut(),
            reserved: [0; 3],
        }
    }

    /// Wraps an array whose buffers are in the memory of CUDA device `device_id`;
    /// `sync_event` points to a `CUevent` that completes when they are ready, and must
    /// stay valid as long as the array (keep it in the array's private data).
    pub fn cuda(array: FFI_ArrowArray, device_id: i64, sync_event: *mut c_void) -> Self {
        Self {
            array,
            device_id,
            device_type: ARROW_DEVICE_CUDA,
            sync_event,
            reserved: [0; 3],
        }
    }
}
