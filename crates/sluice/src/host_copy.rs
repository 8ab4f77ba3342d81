//! The `cuda_host` mode: each subscriber copies host batches to its own GPU.
//!
//! Where CUDA IPC is not available (MIG instances, containers in different PID
//! namespaces) or trainers sit on different GPUs without peer access, a topic stays on
//! the CPU path and every subscriber does its own host-to-device copy. To make that copy
//! an asynchronous DMA rather than a driver-staged copy from pageable memory, the
//! shared-memory segment the batch lies in is registered as pinned host memory
//! (`cuMemHostRegister`), once per segment and subscriber.
//!
//! iceoryx2 owns its mapping of the segment and unmaps it when it chooses; a registration
//! must end before its pages are unmapped. So the segment's file is mapped again, by
//! [`sluice_shm::SegmentMap`], read-only and shared (the same page-cache pages), and that
//! mapping is registered: its lifetime is Sluice's, and the registration is dropped
//! before it. Copies read each Arrow buffer at its offset in this second mapping.
//!
//! A copy is queued on the consumer's stream. The batch (its shared-memory samples) is
//! held until an event recorded after the copies has completed — not until the device
//! batch is dropped — so a trainer that keeps device tensors does not hold the producer
//! back (see `sluice.max_held`).

use std::path::Path;
use std::sync::atomic::{AtomicU32, Ordering};
use std::sync::{Arc, Mutex, PoisonError};

use arrow::record_batch::RecordBatch;
use sluice_core::{Result, SluiceError};
use sluice_cuda::driver::HostRegistration;
use sluice_cuda::layout::{ALIGN, Planned};
use sluice_cuda::{ConsumerStream, Device, DeviceDescriptor, Mode, OwnedSlot};
use sluice_shm::{Backing, Maps, SegmentMap};

use crate::DeviceBatch;
use crate::device::{Held, ImporterCell};

/// A shared-memory segment mapped by this process and, where the driver allows it,
/// registered as pinned memory.
#[derive(Debug)]
pub(crate) struct PinnedSegment {
    // Field order is drop order: unregister before unmapping. Held, never read: the
    // driver knows the registration by address.
    _registration: Option<HostRegistration>,
    map: SegmentMap,
}

/// Copies host batches to one GPU (the `cuda_host` mode; works for any host batch).
///
/// ```no_run
/// # fn main() -> sluice::Result<()> {
/// use sluice::cuda::ConsumerStream;
/// use sluice::{Event, HostCopier, SubscribeOptions, Subscriber};
///
/// let copier = HostCopier::new(0)?;
/// let mut sub = Subscriber::connect("demo", SubscribeOptions::default())?;
/// while let Event::Batch { batch, .. } = sub.next_event()? {
///     let on_gpu = copier.to_device(&batch, ConsumerStream::LegacyDefault)?;
///     let pixels = on_gpu.column(0, ConsumerStream::LegacyDefault, false)?;
///     // ... launch kernels on the legacy default stream reading pixels.device_ptr()
/// }
/// # Ok(()) }
/// ```
pub struct HostCopier {
    cell: Arc<ImporterCell>,
    device: Device,
    segments: Mutex<Vec<Arc<PinnedSegment>>>,
    next_copy: AtomicU32,
}

impl std::fmt::Debug for HostCopier {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.debug_struct("HostCopier")
            .field("device", &self.device.name())
            .field("ordinal", &self.device.ordinal())
            .finish()
    }
}

impl HostCopier {
    /// A copier to GPU `ordinal`, numbered as this process sees them
    /// (`CUDA_VISIBLE_DEVICES`). Without a driver: [`sluice_cuda::NO_DRIVER`].
    pub fn new(ordinal: u32) -> Result<Self> {
        let device = Device::open(ordinal)?;
        Ok(Self {
            cell: Arc::new(ImporterCell::on(device.clone())?),
            device,
            segments: Mutex::default(),
            next_copy: AtomicU32::new(0),
        })
    }

    /// The GPU's ordinal in this process.
    pub fn ordinal(&self) -> u32 {
        self.device.ordinal()
    }

    /// Copies `batch` into new device memory of this process, laid out as a producer's
    /// slot, with one host-to-device copy per Arrow buffer queued on `stream` (for
    /// [`ConsumerStream::NoSync`] on the copier's own stream, finished before this
    /// returns). Work queued on `stream` afterwards sees the rows; other streams wait
    /// (the device batch's columns make them).
    ///
    /// The batch's shared memory is held until the copies complete, then handed back;
    /// the returned batch is this process's own memory (writes to it are private).
    pub fn to_device(&self, batch: &RecordBatch, stream: ConsumerStream) -> Result<DeviceBatch> {
        self.cell.collect();
        let planned = Planned::new(batch)?;
        let sources = planned.sources()?;
        let used = planned.used_bytes();
        let memory = self
            .device
            .alloc(usize::try_from(used.max(ALIGN)).map_err(|_| {
                SluiceError::Config(format!("a batch of {used} bytes is too large to copy"))
            })?)?;
        let on = match stream {
            ConsumerStream::NoSync => self
                .cell
                .with_open(|i| Ok(ConsumerStream::Handle(i.stream().as_raw())))?,
            s => s,
        };
        // One look at the process's mappings for all buffers; the batch holds its
        // samples, so what it finds stays mapped while it is used.
        let maps = Maps::read().ok();
        let mut segments: Vec<Arc<PinnedSegment>> = Vec::new();
        let queued = sources.iter().try_for_each(|(bytes, at)| {
            if bytes.is_empty() {
                return Ok(());
            }
            let pinned = maps
                .as_ref()
                .and_then(|m| self.pinned_source(m, bytes, &mut segments));
            let src = pinned.unwrap_or(bytes.as_ptr());
            // SAFETY: `src` is the buffer's bytes, either in the batch's own memory or at
            // the same file offset in a segment's second mapping (`pinned_source`: the
            // same pages); both stay mapped and unchanged until the copy completes,
            // because `Held::host` below keeps the batch (its samples: the producer does
            // not reuse them) and the segments until an event recorded on `on` after
            // these copies has completed, and a failure waits for what was queued. `dst`
            // lies in `memory` (`Planned` put every buffer inside `used` bytes), which
            // the returned batch owns and nothing else writes.
            unsafe {
                self.device
                    .copy_htod_on(on, memory.device_ptr() + at.offset, src, bytes.len())
            }
        });
        if let Err(e) = queued {
            // Copies already queued still read the batch and the segments: let them
            // finish before both can go.
            let _ = self.device.synchronize_on(on);
            return Err(e.into());
        }
        let ready = self.device.event()?;
        self.device.record_on(on, &ready)?;
        self.cell.retire(Held::host(batch.clone(), segments), on);
        if stream == ConsumerStream::NoSync {
            ready.synchronize()?;
        }
        let descriptor = DeviceDescriptor {
            mode: Mode::Host,
            pending_copy: false,
            device_ordinal: self.device.ordinal(),
            device_uuid: self.device.uuid(),
            slot: self.next_copy.fetch_add(1, Ordering::Relaxed),
            generation: 0,
            slot_bytes: memory.len() as u64,
            used_bytes: used,
            rows: batch.num_rows() as u64,
            mem_handle: [0; sluice_cuda::descriptor::HANDLE_BYTES],
            event_handle: [0; sluice_cuda::descriptor::HANDLE_BYTES],
            schema: batch.schema(),
            nodes: planned.nodes().to_vec(),
        };
        DeviceBatch::own_copy(descriptor, OwnedSlot { memory, ready }, self.cell.clone())
    }

    /// Hands back the host batches whose copies have completed (also done by every
    /// [`Self::to_device`]).
    pub fn collect(&self) {
        self.cell.collect();
    }

    /// Where `bytes` are in a pinned second mapping of the shared-memory segment they
    /// lie in (the segment joins `used`); `None` for memory that is not in a shared
    /// file mapping (a batch assembled in process memory), which is copied from where
    /// it is, through the driver's staging.
    fn pinned_source(
        &self,
        maps: &Maps,
        bytes: &[u8],
        used: &mut Vec<Arc<PinnedSegment>>,
    ) -> Option<*const u8> {
        let Backing::File {
            path,
            inode,
            offset,
        } = maps.backing(bytes.as_ptr() as usize, bytes.len())
        else {
            return None;
        };
        let seg = match used.iter().find(|s| s.map.is(&path, inode)) {
            Some(seg) => seg.clone(),
            None => {
                let seg = self.segment(&path, inode)?;
                used.push(seg.clone());
                seg
            }
        };
        seg.map.at(offset, bytes.len())
    }

    /// The pinned mapping of segment file `path` (`inode`), made on first use.
    fn segment(&self, path: &Path, inode: u64) -> Option<Arc<PinnedSegment>> {
        let mut segments = self.segments.lock().unwrap_or_else(PoisonError::into_inner);
        if let Some(seg) = segments.iter().find(|s| s.map.is(path, inode)) {
            return Some(seg.clone());
        }
        // A new segment: a restarted producer, or one that grew its segment. Segments
        // whose file is gone are dropped here (copies in flight hold their own).
        segments.retain(|s| s.map.is_current());
        let map = match SegmentMap::open(path) {
            Ok(map) if map.inode() == inode => map,
            Ok(_) => return None,
            Err(e) => {
                tracing::warn!(
                    "cannot map {} again ({e}); copying from pageable memory",
                    path.display()
                );
                return None;
            }
        };
        // SAFETY: `map` is mapped for as long as the registration lives: both are in one
        // `PinnedSegment`, whose field order drops the registration first. The mapping
        // is new, so it overlaps no other registration.
        let registration = match unsafe {
            HostRegistration::register(&self.device, map.base(), map.len(), true)
        } {
            Ok(r) => Some(r),
            Err(e) => {
                tracing::warn!(
                    "cannot register {} as pinned memory ({e}); copies from it are \
                         staged by the driver",
                    path.display()
                );
                None
            }
        };
        let seg = Arc::new(PinnedSegment {
            _registration: registration,
            map,
        });
        segments.push(seg.clone());
        Some(seg)
    }
}
