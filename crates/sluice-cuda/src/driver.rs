//! Thin, owning wrappers over the CUDA driver calls Sluice uses.
//!
//! cudarc is built with `dynamic-loading`: `libcuda.so` is opened the first time a driver
//! function is called, and cudarc panics when it cannot be. [`Device::open`] therefore
//! checks [`driver_present`] first and returns [`CudaError::NoDriver`]; every other
//! wrapper here is only reachable through a [`Device`], so no driver call is ever made on
//! a machine without a driver.
//!
//! Allocations use `cuMemAlloc` (not cudarc's stream-ordered `cuMemAllocAsync`, whose
//! pools the legacy IPC API cannot export), and are made once per slot.

use std::ffi::c_void;
use std::ptr;

use cudarc::driver::sys;

use crate::descriptor::HANDLE_BYTES;
use crate::error::{CudaError, Result, check};

/// Whether `libcuda.so` can be loaded on this machine.
pub fn driver_present() -> bool {
    // SAFETY: `is_culib_present` only tries to dlopen the driver's library names and
    // drops what it opened; it calls no driver function.
    unsafe { sys::is_culib_present() }
}

/// A CUDA device with its primary context current on the calling thread.
#[derive(Debug)]
pub struct Device {
    ordinal: u32,
    device: sys::CUdevice,
    context: sys::CUcontext,
    name: String,
}

impl Device {
    /// Opens GPU `ordinal`, or says clearly that there is no driver or no such GPU.
    pub fn open(ordinal: u32) -> Result<Self> {
        if !driver_present() {
            return Err(CudaError::NoDriver);
        }
        // SAFETY: the driver library is loadable (checked above), so cudarc's lazy loader
        // finds it; cuInit has no other precondition.
        check("cuInit", unsafe { sys::cuInit(0) })?;
        let mut count = 0;
        // SAFETY: `count` is a valid out-pointer; the driver is initialized.
        check("cuDeviceGetCount", unsafe {
            sys::cuDeviceGetCount(&mut count)
        })?;
        if i64::from(ordinal) >= i64::from(count) {
            return Err(CudaError::NoSuchDevice {
                ordinal,
                count: count.max(0) as u32,
            });
        }
        let mut device = 0;
        // SAFETY: valid out-pointer; `ordinal` < device count (checked above).
        check("cuDeviceGet", unsafe {
            sys::cuDeviceGet(&mut device, ordinal as i32)
        })?;
        let mut context = ptr::null_mut();
        // SAFETY: valid out-pointer and device handle; the retain is balanced by the
        // release in `Drop`.
        check("cuDevicePrimaryCtxRetain", unsafe {
            sys::cuDevicePrimaryCtxRetain(&mut context, device)
        })?;
        let mut raw = [0 as std::ffi::c_char; 256];
        // SAFETY: `raw` has the length passed; the driver writes a NUL-terminated name.
        let named = unsafe { sys::cuDeviceGetName(raw.as_mut_ptr(), raw.len() as i32, device) };
        let name = if named == sys::CUresult::CUDA_SUCCESS {
            let bytes: Vec<u8> = raw
                .iter()
                .take_while(|&&c| c != 0)
                .map(|&c| c as u8)
                .collect();
            String::from_utf8_lossy(&bytes).into_owned()
        } else {
            format!("CUDA device {ordinal}")
        };
        let d = Self {
            ordinal,
            device,
            context,
            name,
        };
        d.bind()?;
        Ok(d)
    }

    /// Makes the device's primary context current on the calling thread. Call it on any
    /// thread that uses the device's objects.
    pub fn bind(&self) -> Result<()> {
        // SAFETY: `context` is the retained primary context, alive while `self` is.
        check("cuCtxSetCurrent", unsafe {
            sys::cuCtxSetCurrent(self.context)
        })
    }

    /// The device ordinal.
    pub fn ordinal(&self) -> u32 {
        self.ordinal
    }

    /// The device's name, e.g. "NVIDIA H100 80GB HBM3".
    pub fn name(&self) -> &str {
        &self.name
    }

    /// A non-blocking stream.
    pub fn stream(&self) -> Result<Stream> {
        let mut s = ptr::null_mut();
        // SAFETY: valid out-pointer; the context is current (bound in `open`).
        check("cuStreamCreate", unsafe {
            sys::cuStreamCreate(&mut s, sys::CUstream_flags::CU_STREAM_NON_BLOCKING as u32)
        })?;
        Ok(Stream(s))
    }

    /// An event that other processes can open: interprocess events must not record timing.
    pub fn ipc_event(&self) -> Result<Event> {
        let flags = sys::CUevent_flags::CU_EVENT_INTERPROCESS as u32
            | sys::CUevent_flags::CU_EVENT_DISABLE_TIMING as u32;
        let mut e = ptr::null_mut();
        // SAFETY: valid out-pointer; the context is current.
        check("cuEventCreate", unsafe {
            sys::cuEventCreate(&mut e, flags)
        })?;
        Ok(Event(e))
    }

    /// A process-local event without timing.
    pub fn event(&self) -> Result<Event> {
        let mut e = ptr::null_mut();
        // SAFETY: valid out-pointer; the context is current.
        check("cuEventCreate", unsafe {
            sys::cuEventCreate(&mut e, sys::CUevent_flags::CU_EVENT_DISABLE_TIMING as u32)
        })?;
        Ok(Event(e))
    }

    /// `bytes` of device memory from `cuMemAlloc`, exportable with CUDA IPC.
    pub fn alloc(&self, bytes: usize) -> Result<DeviceMemory> {
        let mut p = 0;
        // SAFETY: valid out-pointer; the context is current.
        check("cuMemAlloc", unsafe {
            sys::cuMemAlloc_v2(&mut p, bytes.max(1))
        })?;
        Ok(DeviceMemory { ptr: p, bytes })
    }

    /// `bytes` of pinned (page-locked) host memory, usable by async copies.
    pub fn pinned(&self, bytes: usize) -> Result<PinnedHost> {
        let mut p = ptr::null_mut();
        // SAFETY: valid out-pointer; the context is current.
        check("cuMemHostAlloc", unsafe {
            sys::cuMemHostAlloc(&mut p, bytes.max(1), sys::CU_MEMHOSTALLOC_PORTABLE)
        })?;
        Ok(PinnedHost {
            ptr: p.cast(),
            bytes,
        })
    }

    /// Maps another process's allocation from its IPC handle (once per slot: cache it).
    pub fn open_ipc_memory(&self, handle: &[u8; HANDLE_BYTES], bytes: usize) -> Result<IpcMapping> {
        let h = sys::CUipcMemHandle {
            reserved: handle.map(|b| b as std::ffi::c_char),
        };
        let mut p = 0;
        // SAFETY: valid out-pointer; the handle is plain bytes the driver validates.
        check("cuIpcOpenMemHandle", unsafe {
            sys::cuIpcOpenMemHandle_v2(
                &mut p,
                h,
                sys::CUipcMem_flags::CU_IPC_MEM_LAZY_ENABLE_PEER_ACCESS as u32,
            )
        })?;
        Ok(IpcMapping { ptr: p, bytes })
    }

    /// Opens another process's interprocess event from its IPC handle.
    pub fn open_ipc_event(&self, handle: &[u8; HANDLE_BYTES]) -> Result<Event> {
        let h = sys::CUipcEventHandle {
            reserved: handle.map(|b| b as std::ffi::c_char),
        };
        let mut e = ptr::null_mut();
        // SAFETY: valid out-pointer; the handle is plain bytes the driver validates.
        check("cuIpcOpenEventHandle", unsafe {
            sys::cuIpcOpenEventHandle(&mut e, h)
        })?;
        Ok(Event(e))
    }
}

impl Drop for Device {
    fn drop(&mut self) {
        // SAFETY: balances the retain in `open`. Objects made from this device hold no
        // reference to it; callers drop them first (fields are declared after `Device`
        // nowhere in this crate, see `DeviceStager`).
        unsafe { sys::cuDevicePrimaryCtxRelease_v2(self.device) };
    }
}

fn handle_bytes(reserved: [std::ffi::c_char; HANDLE_BYTES]) -> [u8; HANDLE_BYTES] {
    reserved.map(|c| c as u8)
}

/// A CUDA stream.
#[derive(Debug)]
pub struct Stream(sys::CUstream);

impl Stream {
    /// Makes later work on this stream wait for `event` (recorded in this or another
    /// process), without blocking the host.
    pub fn wait(&self, event: &Event) -> Result<()> {
        // SAFETY: both handles are alive for the call.
        check("cuStreamWaitEvent", unsafe {
            sys::cuStreamWaitEvent(self.0, event.0, 0)
        })
    }

    /// Blocks the host until the stream's work is done.
    pub fn synchronize(&self) -> Result<()> {
        // SAFETY: the stream is alive.
        check("cuStreamSynchronize", unsafe {
            sys::cuStreamSynchronize(self.0)
        })
    }

    /// The raw handle, for consumers such as `__cuda_array_interface__`'s `stream`.
    pub fn as_raw(&self) -> usize {
        self.0 as usize
    }

    /// Queues a copy of `len` bytes from `src` to `dst + offset`.
    ///
    /// # Safety
    /// `src` must stay alive and unmodified until the copy is done (wait on an event
    /// recorded after it); `dst` must stay alive until then too.
    pub unsafe fn copy_htod(
        &self,
        dst: &DeviceMemory,
        offset: usize,
        src: &PinnedHost,
        len: usize,
    ) -> Result<()> {
        if offset.checked_add(len).is_none_or(|e| e > dst.bytes) || len > src.bytes {
            return Err(CudaError::SlotTooSmall {
                needed: (offset + len) as u64,
                slot_bytes: dst.bytes as u64,
            });
        }
        // SAFETY: both ranges are inside their allocations (checked above); the caller
        // keeps them alive and `src` unmodified until the copy completes.
        check("cuMemcpyHtoDAsync", unsafe {
            sys::cuMemcpyHtoDAsync_v2(
                dst.ptr + offset as u64,
                src.ptr as *const c_void,
                len,
                self.0,
            )
        })
    }
}

impl Drop for Stream {
    fn drop(&mut self) {
        // SAFETY: the stream was created by `Device::stream` and is destroyed once; the
        // driver finishes queued work first.
        unsafe { sys::cuStreamDestroy_v2(self.0) };
    }
}

/// A CUDA event (local, interprocess, or opened from another process).
#[derive(Debug)]
pub struct Event(sys::CUevent);

impl Event {
    /// Records the event on `stream`: it completes when the work queued so far does.
    pub fn record(&self, stream: &Stream) -> Result<()> {
        // SAFETY: both handles are alive.
        check("cuEventRecord", unsafe {
            sys::cuEventRecord(self.0, stream.0)
        })
    }

    /// Blocks the host until the event completes.
    pub fn synchronize(&self) -> Result<()> {
        // SAFETY: the event is alive.
        check("cuEventSynchronize", unsafe {
            sys::cuEventSynchronize(self.0)
        })
    }

    /// The IPC handle of an interprocess event.
    pub fn ipc_handle(&self) -> Result<[u8; HANDLE_BYTES]> {
        let mut h = sys::CUipcEventHandle {
            reserved: [0; HANDLE_BYTES],
        };
        // SAFETY: valid out-pointer; the driver rejects events not created interprocess.
        check("cuIpcGetEventHandle", unsafe {
            sys::cuIpcGetEventHandle(&mut h, self.0)
        })?;
        Ok(handle_bytes(h.reserved))
    }

    /// The raw `CUevent`, for `ArrowDeviceArray::sync_event` (a pointer to it).
    pub fn as_raw(&self) -> sys::CUevent {
        self.0
    }
}

impl Drop for Event {
    fn drop(&mut self) {
        // SAFETY: created or opened by this crate, destroyed once.
        unsafe { sys::cuEventDestroy_v2(self.0) };
    }
}

/// Device memory from `cuMemAlloc`.
#[derive(Debug)]
pub struct DeviceMemory {
    ptr: sys::CUdeviceptr,
    bytes: usize,
}

impl DeviceMemory {
    /// The IPC handle other processes open with [`Device::open_ipc_memory`].
    pub fn ipc_handle(&self) -> Result<[u8; HANDLE_BYTES]> {
        let mut h = sys::CUipcMemHandle {
            reserved: [0; HANDLE_BYTES],
        };
        // SAFETY: valid out-pointer; `ptr` is the base of a cuMemAlloc allocation.
        check("cuIpcGetMemHandle", unsafe {
            sys::cuIpcGetMemHandle(&mut h, self.ptr)
        })?;
        Ok(handle_bytes(h.reserved))
    }

    /// The device address.
    pub fn device_ptr(&self) -> u64 {
        self.ptr
    }

    /// Size in bytes.
    pub fn len(&self) -> usize {
        self.bytes
    }

    /// Whether the allocation is empty.
    pub fn is_empty(&self) -> bool {
        self.bytes == 0
    }
}

impl Drop for DeviceMemory {
    fn drop(&mut self) {
        // SAFETY: allocated by cuMemAlloc, freed once; callers synchronize work on it first.
        unsafe { sys::cuMemFree_v2(self.ptr) };
    }
}

/// Another process's device allocation, mapped into this one.
#[derive(Debug)]
pub struct IpcMapping {
    ptr: sys::CUdeviceptr,
    bytes: usize,
}

impl IpcMapping {
    /// The device address in this process.
    pub fn device_ptr(&self) -> u64 {
        self.ptr
    }

    /// Copies `len` bytes at `offset` to host memory (blocking; for checks and for
    /// subscribers that asked for host copies).
    pub fn copy_to_host(&self, offset: usize, dst: &mut [u8]) -> Result<()> {
        if offset.checked_add(dst.len()).is_none_or(|e| e > self.bytes) {
            return Err(CudaError::Corrupt(format!(
                "{}+{} outside a {}-byte slot",
                offset,
                dst.len(),
                self.bytes
            )));
        }
        // SAFETY: the range is inside the mapping (checked above), `dst` is writable for
        // its length, and the mapping stays open for the call.
        check("cuMemcpyDtoH", unsafe {
            sys::cuMemcpyDtoH_v2(dst.as_mut_ptr().cast(), self.ptr + offset as u64, dst.len())
        })
    }
}

impl Drop for IpcMapping {
    fn drop(&mut self) {
        // SAFETY: opened by cuIpcOpenMemHandle, closed once.
        unsafe { sys::cuIpcCloseMemHandle(self.ptr) };
    }
}

/// Page-locked host memory from `cuMemHostAlloc`.
#[derive(Debug)]
pub struct PinnedHost {
    ptr: *mut u8,
    bytes: usize,
}

impl PinnedHost {
    /// The memory, for the host to fill.
    ///
    /// The caller must not call this while a copy from it is in flight (the stager waits
    /// on the buffer's event first).
    pub fn as_mut_slice(&mut self) -> &mut [u8] {
        // SAFETY: `ptr` is a live allocation of `bytes` bytes owned by `self`; `&mut self`
        // makes the slice unique.
        unsafe { std::slice::from_raw_parts_mut(self.ptr, self.bytes) }
    }
}

impl Drop for PinnedHost {
    fn drop(&mut self) {
        // SAFETY: allocated by cuMemHostAlloc, freed once.
        unsafe { sys::cuMemFreeHost(self.ptr.cast()) };
    }
}

/// Existing host memory (a shared-memory segment) registered as pinned, for the
/// `cuda_host` mode: the driver can then copy from it asynchronously.
#[derive(Debug)]
pub struct HostRegistration {
    ptr: *mut c_void,
}

impl HostRegistration {
    /// Registers `len` bytes at `ptr`.
    ///
    /// # Safety
    /// `ptr..ptr+len` must be mapped for as long as the registration lives, and must not
    /// overlap another registration.
    pub unsafe fn register(_device: &Device, ptr: *mut u8, len: usize) -> Result<Self> {
        // SAFETY: the caller keeps the range mapped; the device's context is current.
        check("cuMemHostRegister", unsafe {
            sys::cuMemHostRegister_v2(ptr.cast(), len, sys::CU_MEMHOSTREGISTER_PORTABLE)
        })?;
        Ok(Self { ptr: ptr.cast() })
    }
}

impl Drop for HostRegistration {
    fn drop(&mut self) {
        // SAFETY: registered in `register`, unregistered once while still mapped.
        unsafe { sys::cuMemHostUnregister(self.ptr) };
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn opening_a_device_without_a_driver_says_so() {
        match Device::open(0) {
            Err(CudaError::NoDriver) => {
                assert!(!driver_present());
                let msg = CudaError::NoDriver.to_string();
                assert!(msg.starts_with("no CUDA driver found"), "{msg}");
                assert!(msg.contains("sluice.device = 'cpu'"), "{msg}");
            }
            Ok(d) => assert!(driver_present() && !d.name().is_empty()),
            Err(other) => assert!(driver_present(), "a driver error without a driver: {other}"),
        }
    }
}
