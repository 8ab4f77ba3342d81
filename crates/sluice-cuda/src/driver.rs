//! Thin, owning wrappers over the CUDA driver calls Sluice uses.
//!
//! cudarc is built with `dynamic-loading`: `libcuda.so` is opened the first time a driver
//! function is called, and cudarc panics when it cannot be. [`Device::open`] therefore
//! checks [`driver_present`] first and returns [`CudaError::NoDriver`]; every other
//! wrapper here is only reachable through a [`Device`], so no driver call is ever made on
//! a machine without a driver.
//!
//! Allocations use `cuMemAlloc` (not cudarc's stream-ordered `cuMemAllocAsync`, whose
//! pools the legacy IPC API cannot export), and are made when the ring is set up.
//!
//! **Contexts and threads.** Every object made from a [`Device`] holds the device's
//! primary context (an `Arc`) and makes it current on the calling thread before each
//! driver call, its drop included, as cudarc does: a Python deleter or a tokio worker
//! that drops a mapping runs on a thread that never bound a context, and a call without
//! one fails (`CUDA_ERROR_INVALID_CONTEXT`) or, worse, acts on another context. The
//! primary context is released when the last object that needs it is gone, whatever the
//! order in which they are dropped.

use std::ffi::c_void;
use std::ptr;
use std::sync::Arc;

use cudarc::driver::sys;

use sluice_core::process::Owner;

use crate::descriptor::HANDLE_BYTES;
use crate::error::{CudaError, Result, check};
use crate::identity::DeviceUuid;
use crate::retire::Completion;
use crate::stream::ConsumerStream;

/// Whether `libcuda.so` can be loaded on this machine. Asked once per process: the
/// answer cannot change, and each try opens (and searches the library path for) every
/// candidate name, which multi-part device batches would otherwise pay per batch.
pub fn driver_present() -> bool {
    static PRESENT: std::sync::OnceLock<bool> = std::sync::OnceLock::new();
    // SAFETY: `is_culib_present` only tries to dlopen the driver's library names and
    // drops what it opened; it calls no driver function.
    *PRESENT.get_or_init(|| unsafe { sys::is_culib_present() })
}

/// A device's retained primary context, shared by everything made from the device.
#[derive(Debug)]
struct Context {
    device: sys::CUdevice,
    raw: sys::CUcontext,
}

// SAFETY: a CUcontext is a process-wide handle that the driver lets any thread make
// current; every use goes through `bind`, which makes it current on the calling thread.
unsafe impl Send for Context {}
// SAFETY: as above; `bind` only reads the handle.
unsafe impl Sync for Context {}

impl Context {
    /// Makes the context current on the calling thread (a no-op when it already is).
    fn bind(&self) -> Result<()> {
        let mut current = ptr::null_mut();
        // SAFETY: valid out-pointer; the driver was initialized when the context was made.
        check("cuCtxGetCurrent", unsafe {
            sys::cuCtxGetCurrent(&mut current)
        })?;
        if current == self.raw {
            return Ok(());
        }
        // SAFETY: `raw` is the primary context retained in `Device::open`, alive while
        // `self` is.
        check("cuCtxSetCurrent", unsafe { sys::cuCtxSetCurrent(self.raw) })
    }
}

impl Drop for Context {
    fn drop(&mut self) {
        if in_forked_child() {
            return;
        }
        // SAFETY: balances the retain in `Device::open`; every object made from the
        // device holds this context, so none is left when it is released.
        unsafe { sys::cuDevicePrimaryCtxRelease_v2(self.device) };
    }
}

/// The process that initialized the driver.
static INITIALIZED_IN: std::sync::OnceLock<Owner> = std::sync::OnceLock::new();

/// Whether this process is a child forked after its parent initialized the driver.
/// CUDA does not support such a child: its copies of the parent's contexts, streams,
/// events and mappings are not its own, and a driver call on them fails or worse. The
/// drops below leave them to the parent (a child's copy is never released), as
/// `sluice_core::process::Local` leaves a forked child's copies of iceoryx2 handles.
pub fn in_forked_child() -> bool {
    INITIALIZED_IN.get().is_some_and(|owner| !owner.is_here())
}

fn init_and_count() -> Result<i32> {
    if !driver_present() {
        return Err(CudaError::NoDriver);
    }
    INITIALIZED_IN.get_or_init(Owner::this);
    // SAFETY: the driver library is loadable (checked above), so cudarc's lazy loader
    // finds it; cuInit has no other precondition.
    check("cuInit", unsafe { sys::cuInit(0) })?;
    let mut count = 0;
    // SAFETY: `count` is a valid out-pointer; the driver is initialized.
    check("cuDeviceGetCount", unsafe {
        sys::cuDeviceGetCount(&mut count)
    })?;
    Ok(count)
}

fn uuid_of(device: sys::CUdevice) -> Result<DeviceUuid> {
    let mut u = sys::CUuuid { bytes: [0; 16] };
    // SAFETY: valid out-pointer and device handle.
    check("cuDeviceGetUuid", unsafe {
        sys::cuDeviceGetUuid_v2(&mut u, device)
    })?;
    Ok(DeviceUuid(u.bytes.map(|c| c as u8)))
}

/// The UUIDs of the GPUs this process sees, in ordinal order (after
/// `CUDA_VISIBLE_DEVICES`).
pub fn visible_uuids() -> Result<Vec<DeviceUuid>> {
    let count = init_and_count()?;
    (0..count)
        .map(|i| {
            let mut device = 0;
            // SAFETY: valid out-pointer; `i` < device count.
            check("cuDeviceGet", unsafe { sys::cuDeviceGet(&mut device, i) })?;
            uuid_of(device)
        })
        .collect()
}

/// A CUDA device and its primary context. Cloning it is cheap and shares the context.
#[derive(Debug, Clone)]
pub struct Device {
    ordinal: u32,
    uuid: DeviceUuid,
    name: String,
    ctx: Arc<Context>,
}

impl Device {
    /// Opens the GPU this process knows as `uuid` (see [`crate::identity`]).
    pub fn open_uuid(uuid: DeviceUuid) -> Result<Self> {
        let visible = visible_uuids()?;
        let ordinal = crate::identity::local_ordinal(uuid, &visible)
            .ok_or(CudaError::DeviceNotVisible { uuid, visible })?;
        Self::open(ordinal)
    }

    /// Opens GPU `ordinal`, or says clearly that there is no driver or no such GPU.
    pub fn open(ordinal: u32) -> Result<Self> {
        let count = init_and_count()?;
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
        let ctx = Arc::new(Context {
            device,
            raw: context,
        });
        let d = Self {
            ordinal,
            uuid: uuid_of(device)?,
            name,
            ctx,
        };
        d.bind()?;
        Ok(d)
    }

    /// Makes the device's primary context current on the calling thread. Objects made
    /// from the device do this themselves before every driver call.
    pub fn bind(&self) -> Result<()> {
        self.ctx.bind()
    }

    /// The device's UUID, the same in every process.
    pub fn uuid(&self) -> DeviceUuid {
        self.uuid
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
        self.bind()?;
        let mut s = ptr::null_mut();
        // SAFETY: valid out-pointer; the context is current (bound above).
        check("cuStreamCreate", unsafe {
            sys::cuStreamCreate(&mut s, sys::CUstream_flags::CU_STREAM_NON_BLOCKING as u32)
        })?;
        Ok(Stream {
            raw: s,
            ctx: self.ctx.clone(),
        })
    }

    /// An event that other processes can open: interprocess events must not record timing.
    pub fn ipc_event(&self) -> Result<Event> {
        let flags = sys::CUevent_flags::CU_EVENT_INTERPROCESS as u32
            | sys::CUevent_flags::CU_EVENT_DISABLE_TIMING as u32;
        self.bind()?;
        let mut e = ptr::null_mut();
        // SAFETY: valid out-pointer; the context is current (bound above).
        check("cuEventCreate", unsafe {
            sys::cuEventCreate(&mut e, flags)
        })?;
        Ok(Event {
            raw: e,
            ctx: self.ctx.clone(),
        })
    }

    /// A process-local event without timing.
    pub fn event(&self) -> Result<Event> {
        self.bind()?;
        let mut e = ptr::null_mut();
        // SAFETY: valid out-pointer; the context is current (bound above).
        check("cuEventCreate", unsafe {
            sys::cuEventCreate(&mut e, sys::CUevent_flags::CU_EVENT_DISABLE_TIMING as u32)
        })?;
        Ok(Event {
            raw: e,
            ctx: self.ctx.clone(),
        })
    }

    /// `bytes` of device memory from `cuMemAlloc`, exportable with CUDA IPC.
    pub fn alloc(&self, bytes: usize) -> Result<DeviceMemory> {
        self.bind()?;
        let mut p = 0;
        // SAFETY: valid out-pointer; the context is current (bound above).
        check("cuMemAlloc", unsafe {
            sys::cuMemAlloc_v2(&mut p, bytes.max(1))
        })?;
        Ok(DeviceMemory {
            ptr: p,
            bytes,
            ctx: self.ctx.clone(),
        })
    }

    /// `bytes` of pinned (page-locked) host memory, usable by async copies.
    pub fn pinned(&self, bytes: usize) -> Result<PinnedHost> {
        self.bind()?;
        let mut p = ptr::null_mut();
        // SAFETY: valid out-pointer; the context is current (bound above).
        check("cuMemHostAlloc", unsafe {
            sys::cuMemHostAlloc(&mut p, bytes.max(1), sys::CU_MEMHOSTALLOC_PORTABLE)
        })?;
        Ok(PinnedHost {
            ptr: p.cast(),
            bytes,
            ctx: self.ctx.clone(),
        })
    }

    /// Maps another process's allocation from its IPC handle (once per slot: cache it).
    pub fn open_ipc_memory(&self, handle: &[u8; HANDLE_BYTES], bytes: usize) -> Result<IpcMapping> {
        let h = sys::CUipcMemHandle {
            reserved: handle.map(|b| b as std::ffi::c_char),
        };
        self.bind()?;
        let mut p = 0;
        // SAFETY: valid out-pointer; the handle is plain bytes the driver validates; the
        // context is current (bound above).
        check("cuIpcOpenMemHandle", unsafe {
            sys::cuIpcOpenMemHandle_v2(
                &mut p,
                h,
                sys::CUipcMem_flags::CU_IPC_MEM_LAZY_ENABLE_PEER_ACCESS as u32,
            )
        })?;
        Ok(IpcMapping {
            ptr: p,
            bytes,
            ctx: self.ctx.clone(),
        })
    }

    /// Opens another process's interprocess event from its IPC handle.
    pub fn open_ipc_event(&self, handle: &[u8; HANDLE_BYTES]) -> Result<Event> {
        let h = sys::CUipcEventHandle {
            reserved: handle.map(|b| b as std::ffi::c_char),
        };
        self.bind()?;
        let mut e = ptr::null_mut();
        // SAFETY: valid out-pointer; the handle is plain bytes the driver validates; the
        // context is current (bound above).
        check("cuIpcOpenEventHandle", unsafe {
            sys::cuIpcOpenEventHandle(&mut e, h)
        })?;
        Ok(Event {
            raw: e,
            ctx: self.ctx.clone(),
        })
    }

    /// Makes the consumer's `stream` wait for `event` (nothing for
    /// [`ConsumerStream::NoSync`]).
    pub fn make_wait(&self, stream: ConsumerStream, event: &Event) -> Result<()> {
        let Some(handle) = stream.driver_handle() else {
            return Ok(());
        };
        self.bind()?;
        // SAFETY: `handle` is the legacy or per-thread default stream, or a stream handle
        // the consumer passed for this process and context (the DLPack contract); the
        // event is alive for the call.
        check("cuStreamWaitEvent", unsafe {
            sys::cuStreamWaitEvent(handle as sys::CUstream, event.raw, 0)
        })
    }

    /// Records `event` on the consumer's `stream`: it completes when the work the
    /// consumer queued so far does. On [`ConsumerStream::NoSync`] (the consumer
    /// synchronized itself) it is recorded on the legacy default stream, which orders
    /// after all blocking streams' work.
    pub fn record_on(&self, stream: ConsumerStream, event: &Event) -> Result<()> {
        let handle = stream.driver_handle().unwrap_or(1);
        self.bind()?;
        // SAFETY: as in `make_wait`.
        check("cuEventRecord", unsafe {
            sys::cuEventRecord(event.raw, handle as sys::CUstream)
        })
    }
    /// Queues a copy of `len` device bytes from `src` to `dst` on the consumer's
    /// `stream` (on the legacy default stream for [`ConsumerStream::NoSync`]).
    ///
    /// # Safety
    /// `src..src + len` and `dst..dst + len` must be device memory of this device's
    /// context (allocations or IPC mappings) that stays alive until the copy completes
    /// (record an event on the same stream after it and wait for that), and nothing may
    /// write `dst` meanwhile.
    pub unsafe fn copy_dtod_on(
        &self,
        stream: ConsumerStream,
        dst: u64,
        src: u64,
        len: usize,
    ) -> Result<()> {
        let handle = stream.driver_handle().unwrap_or(1);
        self.bind()?;
        // SAFETY: the caller guarantees both ranges are live device memory of this
        // context until the copy completes; the stream handle is as in `make_wait`; the
        // context is current.
        check("cuMemcpyDtoDAsync", unsafe {
            sys::cuMemcpyDtoDAsync_v2(dst, src, len, handle as sys::CUstream)
        })
    }

    /// Queues a copy of `len` host bytes at `src` to device address `dst` on the
    /// consumer's `stream` (on the legacy default stream for [`ConsumerStream::NoSync`]).
    /// From pinned (registered) memory it is an asynchronous DMA; from pageable memory
    /// the driver stages it and returns once the source has been read.
    ///
    /// # Safety
    /// `src..src + len` must stay mapped and unchanged, and `dst..dst + len` must be
    /// device memory of this context that stays alive, until the copy completes (record
    /// an event on the same stream after it and wait for that); nothing may write `dst`
    /// meanwhile.
    pub unsafe fn copy_htod_on(
        &self,
        stream: ConsumerStream,
        dst: u64,
        src: *const u8,
        len: usize,
    ) -> Result<()> {
        let handle = stream.driver_handle().unwrap_or(1);
        self.bind()?;
        // SAFETY: the caller guarantees both ranges stay valid until the copy completes;
        // the stream handle is as in `make_wait`; the context is current.
        check("cuMemcpyHtoDAsync", unsafe {
            sys::cuMemcpyHtoDAsync_v2(dst, src.cast(), len, handle as sys::CUstream)
        })
    }

    /// Blocks the host until the work queued on the consumer's `stream` is done (the
    /// legacy default stream for [`ConsumerStream::NoSync`]).
    pub fn synchronize_on(&self, stream: ConsumerStream) -> Result<()> {
        let handle = stream.driver_handle().unwrap_or(1);
        self.bind()?;
        // SAFETY: the stream handle is as in `make_wait`; the context is current.
        check("cuStreamSynchronize", unsafe {
            sys::cuStreamSynchronize(handle as sys::CUstream)
        })
    }
}

fn handle_bytes(reserved: [std::ffi::c_char; HANDLE_BYTES]) -> [u8; HANDLE_BYTES] {
    reserved.map(|c| c as u8)
}

/// A CUDA stream.
#[derive(Debug)]
pub struct Stream {
    raw: sys::CUstream,
    ctx: Arc<Context>,
}

// SAFETY: stream handles may be used from any thread of the process once their context
// is current; every method and the drop bind it first.
unsafe impl Send for Stream {}
// SAFETY: as above; the driver serializes work queued on one stream from many threads.
unsafe impl Sync for Stream {}

impl Stream {
    /// Makes later work on this stream wait for `event` (recorded in this or another
    /// process), without blocking the host.
    pub fn wait(&self, event: &Event) -> Result<()> {
        self.ctx.bind()?;
        // SAFETY: both handles are alive for the call; the context is current.
        check("cuStreamWaitEvent", unsafe {
            sys::cuStreamWaitEvent(self.raw, event.raw, 0)
        })
    }

    /// Blocks the host until the stream's work is done.
    pub fn synchronize(&self) -> Result<()> {
        self.ctx.bind()?;
        // SAFETY: the stream is alive; the context is current.
        check("cuStreamSynchronize", unsafe {
            sys::cuStreamSynchronize(self.raw)
        })
    }

    /// The raw handle, for consumers such as `__cuda_array_interface__`'s `stream`.
    pub fn as_raw(&self) -> usize {
        self.raw as usize
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
        self.ctx.bind()?;
        // SAFETY: both ranges are inside their allocations (checked above); the caller
        // keeps them alive and `src` unmodified until the copy completes; the context is
        // current.
        check("cuMemcpyHtoDAsync", unsafe {
            sys::cuMemcpyHtoDAsync_v2(
                dst.ptr + offset as u64,
                src.ptr as *const c_void,
                len,
                self.raw,
            )
        })
    }
}

impl Drop for Stream {
    fn drop(&mut self) {
        // The parent's, in a forked child (see `in_forked_child`).
        if in_forked_child() {
            return;
        }
        // A drop cannot report a failure; without the context the destroy below would
        // fail the same way, leaking only the handle.
        let _ = self.ctx.bind();
        // SAFETY: the stream was created by `Device::stream` and is destroyed once; the
        // driver finishes queued work first.
        unsafe { sys::cuStreamDestroy_v2(self.raw) };
    }
}

/// A CUDA event (local, interprocess, or opened from another process).
#[derive(Debug)]
pub struct Event {
    raw: sys::CUevent,
    ctx: Arc<Context>,
}

// SAFETY: event handles may be used from any thread once their context is current;
// every method and the drop bind it first.
unsafe impl Send for Event {}
// SAFETY: as above; recording and querying an event from several threads is allowed.
unsafe impl Sync for Event {}

impl Event {
    /// Records the event on `stream`: it completes when the work queued so far does.
    pub fn record(&self, stream: &Stream) -> Result<()> {
        self.ctx.bind()?;
        // SAFETY: both handles are alive; the context is current.
        check("cuEventRecord", unsafe {
            sys::cuEventRecord(self.raw, stream.raw)
        })
    }

    /// Blocks the host until the event completes.
    pub fn synchronize(&self) -> Result<()> {
        self.ctx.bind()?;
        // SAFETY: the event is alive; the context is current.
        check("cuEventSynchronize", unsafe {
            sys::cuEventSynchronize(self.raw)
        })
    }

    /// Whether the work recorded before the event has finished, without blocking.
    pub fn query(&self) -> Result<bool> {
        self.ctx.bind()?;
        // SAFETY: the event is alive; the context is current.
        match unsafe { sys::cuEventQuery(self.raw) } {
            sys::CUresult::CUDA_SUCCESS => Ok(true),
            sys::CUresult::CUDA_ERROR_NOT_READY => Ok(false),
            code => Err(CudaError::Driver {
                call: "cuEventQuery",
                code,
            }),
        }
    }

    /// The IPC handle of an interprocess event.
    pub fn ipc_handle(&self) -> Result<[u8; HANDLE_BYTES]> {
        let mut h = sys::CUipcEventHandle {
            reserved: [0; HANDLE_BYTES],
        };
        self.ctx.bind()?;
        // SAFETY: valid out-pointer; the driver rejects events not created interprocess;
        // the context is current.
        check("cuIpcGetEventHandle", unsafe {
            sys::cuIpcGetEventHandle(&mut h, self.raw)
        })?;
        Ok(handle_bytes(h.reserved))
    }

    /// The raw `CUevent`, for `ArrowDeviceArray::sync_event` (a pointer to it).
    pub fn as_raw(&self) -> sys::CUevent {
        self.raw
    }
}

impl Completion for Event {
    type Error = CudaError;
    fn completed(&self) -> Result<bool> {
        self.query()
    }
    fn wait(&self) -> Result<()> {
        self.synchronize()
    }
}

impl Drop for Event {
    fn drop(&mut self) {
        if in_forked_child() {
            return;
        }
        // See `Stream`'s drop.
        let _ = self.ctx.bind();
        // SAFETY: created or opened by this crate, destroyed once.
        unsafe { sys::cuEventDestroy_v2(self.raw) };
    }
}

/// Device memory from `cuMemAlloc`.
#[derive(Debug)]
pub struct DeviceMemory {
    ptr: sys::CUdeviceptr,
    bytes: usize,
    ctx: Arc<Context>,
}

// SAFETY: a device address is valid in every thread of the process; the handle calls
// and the drop bind the context first.
unsafe impl Send for DeviceMemory {}
// SAFETY: as above; the methods only read the address or ask the driver for a handle.
unsafe impl Sync for DeviceMemory {}

impl DeviceMemory {
    /// The IPC handle other processes open with [`Device::open_ipc_memory`].
    pub fn ipc_handle(&self) -> Result<[u8; HANDLE_BYTES]> {
        let mut h = sys::CUipcMemHandle {
            reserved: [0; HANDLE_BYTES],
        };
        self.ctx.bind()?;
        // SAFETY: valid out-pointer; `ptr` is the base of a cuMemAlloc allocation; the
        // context is current.
        check("cuIpcGetMemHandle", unsafe {
            sys::cuIpcGetMemHandle(&mut h, self.ptr)
        })?;
        Ok(handle_bytes(h.reserved))
    }

    /// The device address.
    pub fn device_ptr(&self) -> u64 {
        self.ptr
    }

    /// Copies `len` bytes at `offset` to host memory (blocking).
    pub fn copy_to_host(&self, offset: usize, dst: &mut [u8]) -> Result<()> {
        copy_dtoh(&self.ctx, self.ptr, self.bytes, offset, dst)
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
        if in_forked_child() {
            return;
        }
        // See `Stream`'s drop.
        let _ = self.ctx.bind();
        // SAFETY: allocated by cuMemAlloc, freed once; callers synchronize work on it first.
        unsafe { sys::cuMemFree_v2(self.ptr) };
    }
}

/// Another process's device allocation, mapped into this one.
#[derive(Debug)]
pub struct IpcMapping {
    ptr: sys::CUdeviceptr,
    bytes: usize,
    ctx: Arc<Context>,
}

// SAFETY: as for `DeviceMemory`: an address valid in every thread; calls bind first.
unsafe impl Send for IpcMapping {}
// SAFETY: as above; the methods only read.
unsafe impl Sync for IpcMapping {}

impl IpcMapping {
    /// The device address in this process.
    pub fn device_ptr(&self) -> u64 {
        self.ptr
    }

    /// Copies `len` bytes at `offset` to host memory (blocking; for checks and for
    /// subscribers that asked for host copies).
    pub fn copy_to_host(&self, offset: usize, dst: &mut [u8]) -> Result<()> {
        copy_dtoh(&self.ctx, self.ptr, self.bytes, offset, dst)
    }
}

fn copy_dtoh(
    ctx: &Context,
    base: sys::CUdeviceptr,
    bytes: usize,
    offset: usize,
    dst: &mut [u8],
) -> Result<()> {
    if offset.checked_add(dst.len()).is_none_or(|e| e > bytes) {
        return Err(CudaError::Corrupt(format!(
            "{}+{} outside a {}-byte slot",
            offset,
            dst.len(),
            bytes
        )));
    }
    ctx.bind()?;
    // SAFETY: the range is inside the allocation (checked above), `dst` is writable for
    // its length, the caller's borrow keeps the allocation alive for the call, and the
    // context is current.
    check("cuMemcpyDtoH", unsafe {
        sys::cuMemcpyDtoH_v2(dst.as_mut_ptr().cast(), base + offset as u64, dst.len())
    })
}

impl Drop for IpcMapping {
    fn drop(&mut self) {
        if in_forked_child() {
            return;
        }
        // See `Stream`'s drop.
        let _ = self.ctx.bind();
        // SAFETY: opened by cuIpcOpenMemHandle, closed once.
        unsafe { sys::cuIpcCloseMemHandle(self.ptr) };
    }
}

/// Page-locked host memory from `cuMemHostAlloc`.
#[derive(Debug)]
pub struct PinnedHost {
    ptr: *mut u8,
    bytes: usize,
    ctx: Arc<Context>,
}

// SAFETY: owned host memory; moving the owner to another thread moves the only access.
unsafe impl Send for PinnedHost {}

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
        if in_forked_child() {
            return;
        }
        // See `Stream`'s drop.
        let _ = self.ctx.bind();
        // SAFETY: allocated by cuMemHostAlloc, freed once.
        unsafe { sys::cuMemFreeHost(self.ptr.cast()) };
    }
}

/// Existing host memory (a shared-memory segment) registered as pinned, for the
/// `cuda_host` mode: the driver can then copy from it asynchronously, by DMA.
#[derive(Debug)]
pub struct HostRegistration {
    ptr: *mut c_void,
    ctx: Arc<Context>,
}

// SAFETY: the registration is an address the driver knows; unregistering it (the only
// use) is valid from any thread once the context is bound, which `drop` does.
unsafe impl Send for HostRegistration {}
// SAFETY: `&self` exposes nothing.
unsafe impl Sync for HostRegistration {}

impl HostRegistration {
    /// Registers `len` bytes at `ptr` (portable: every context may copy from them).
    /// `read_only` memory (a subscriber's read-only view of a producer's segment) must
    /// say so, or the driver refuses it.
    ///
    /// # Safety
    /// `ptr..ptr+len` must be mapped for as long as the registration lives (drop it
    /// before unmapping: the driver would otherwise keep using the old pages for that
    /// address), and must not overlap another registration.
    pub unsafe fn register(
        device: &Device,
        ptr: *const u8,
        len: usize,
        read_only: bool,
    ) -> Result<Self> {
        device.bind()?;
        let flags = sys::CU_MEMHOSTREGISTER_PORTABLE
            | if read_only {
                sys::CU_MEMHOSTREGISTER_READ_ONLY
            } else {
                0
            };
        // SAFETY: the caller keeps the range mapped; the device's context is current.
        check("cuMemHostRegister", unsafe {
            sys::cuMemHostRegister_v2(ptr.cast_mut().cast(), len, flags)
        })?;
        Ok(Self {
            ptr: ptr.cast_mut().cast(),
            ctx: device.ctx.clone(),
        })
    }
}

impl Drop for HostRegistration {
    fn drop(&mut self) {
        if in_forked_child() {
            return;
        }
        // See `Stream`'s drop.
        let _ = self.ctx.bind();
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
