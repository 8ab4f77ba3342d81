//! The `cuda_host` mode: each subscriber copies host batches to its own GPU.
//!
//! Where CUDA IPC is not available (MIG instances, containers in different PID
//! namespaces) or trainers sit on different GPUs without peer access, a topic stays on
//! the CPU path and every subscriber does its own host-to-device copy. To make that copy
//! an asynchronous DMA rather than a driver-staged copy from pageable memory, the
//! shared-memory segment the batch lies in is registered as pinned host memory
//! (`cuMemHostRegister`), once per segment and subscriber, a block of `PIN_BLOCK` bytes
//! (8 MiB) at a time where batches lie (see there why not the whole segment).
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

use std::collections::HashMap;
use std::path::Path;
use std::sync::atomic::{AtomicBool, AtomicU32, Ordering};
use std::sync::{Arc, Mutex, PoisonError};

use arrow::record_batch::RecordBatch;
use sluice_core::{Result, SluiceError};
use sluice_cuda::driver::HostRegistration;
use sluice_cuda::layout::{ALIGN, Planned};
use sluice_cuda::{ConsumerStream, Device, DeviceDescriptor, Mode, OwnedSlot};
use sluice_shm::{Backing, SegmentMap, backing_file};

use crate::DeviceBatch;
use crate::gpu::batch::{Held, ImporterCell};

/// Segments are registered as pinned memory in blocks of this many bytes (aligned in the
/// file), each on its first use, never as a whole: iceoryx2's data segment file is far
/// larger than what a topic uses (a sparse file whose chunks lie at a stride reserved for
/// growth: 22.9 GB for a topic of 358 MB, with 6 MB used at every 576 MB, seen on the
/// GPU machine), and registering pins, which faults in and allocates, every page of the
/// range: 26 s and 22.9 GB of memory per subscriber for that segment. Blocks of one size
/// never overlap, as the driver requires of registrations; a copy is cut at block
/// boundaries so that each piece lies in one registration.
pub(crate) const PIN_BLOCK: usize = 8 << 20;

/// `offset..offset + len` of a file cut at [`PIN_BLOCK`] boundaries: `(offset, len)` of
/// each piece, in order.
fn block_pieces(offset: usize, len: usize) -> impl Iterator<Item = (usize, usize)> {
    let end = offset.saturating_add(len);
    std::iter::successors(Some(offset).filter(|&o| o < end), move |&at| {
        Some(at - at % PIN_BLOCK + PIN_BLOCK).filter(|&next| next < end)
    })
    .map(move |at| (at, (at - at % PIN_BLOCK + PIN_BLOCK).min(end) - at))
}

/// A shared-memory segment mapped by this process, and the blocks of it registered as
/// pinned memory so far.
#[derive(Debug)]
pub(crate) struct PinnedSegment {
    // Field order is drop order: unregister before unmapping. `None`: the driver refused
    // the block (memlock limits); copies from it are staged by the driver.
    blocks: Mutex<HashMap<usize, Option<HostRegistration>>>,
    refused: AtomicBool,
    map: SegmentMap,
}

impl PinnedSegment {
    /// Registers each block that file bytes `offset..offset + len` touch, if not yet
    /// done; whether all of them are pinned.
    fn pin(&self, device: &Device, offset: usize, len: usize) -> bool {
        if len == 0 || offset.checked_add(len).is_none() {
            return false;
        }
        let mut blocks = self.blocks.lock().unwrap_or_else(PoisonError::into_inner);
        let mut pinned = true;
        for block in block_pieces(offset, len).map(|(at, _)| at / PIN_BLOCK) {
            let registration = blocks.entry(block).or_insert_with(|| {
                let start = block * PIN_BLOCK;
                let bytes = PIN_BLOCK.min(self.map.len().saturating_sub(start));
                let ptr = self.map.at(start, bytes).filter(|_| bytes > 0)?;
                let started = std::time::Instant::now();
                // SAFETY: `ptr..ptr + bytes` lies in `self.map`, which is unmapped only
                // after every registration of `blocks` is dropped (field order); blocks
                // are disjoint, so it overlaps no other registration.
                match unsafe { HostRegistration::register(device, ptr, bytes, true) } {
                    Ok(r) => {
                        tracing::debug!(
                            segment = %self.map.path().display(),
                            block,
                            bytes,
                            register_us = started.elapsed().as_micros() as u64,
                            "registered as pinned memory"
                        );
                        Some(r)
                    }
                    Err(e) => {
                        if !self.refused.swap(true, Ordering::Relaxed) {
                            tracing::warn!(
                                "cannot register {} as pinned memory ({e}); copies from it \
                                 are staged by the driver",
                                self.map.path().display()
                            );
                        }
                        None
                    }
                }
            });
            pinned &= registration.is_some();
        }
        pinned
    }
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
        let started = std::time::Instant::now();
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
        // Where each buffer lies: `backing_file` answers from the segment it found last
        // after two `stat` calls, and reads `/proc/self/maps` only on a miss (0.5 to 1 ms
        // in a process with torch loaded, measured per batch on the GPU machine, when
        // this read it for every batch). The batch holds its samples, so what it finds
        // stays mapped while it is used.
        let allocated = started.elapsed();
        let mut segments: Vec<Arc<PinnedSegment>> = Vec::new();
        let mut pageable = 0usize;
        let queued = sources.iter().try_for_each(|(bytes, at)| {
            if bytes.is_empty() {
                return Ok(());
            }
            let dst = memory.device_ptr() + at.offset;
            let pinned = self.pinned_source(bytes, &mut segments);
            let Some((segment, offset)) = pinned else {
                pageable += 1;
                // SAFETY: the buffer's bytes in the batch's own memory, kept mapped and
                // unchanged until the copy completes because `Held::host` below keeps
                // the batch (its samples: the producer does not reuse them) until an
                // event recorded on `on` after these copies has completed, and a failure
                // waits for what was queued. `dst` lies in `memory` (`Planned` put every
                // buffer inside `used` bytes), which the returned batch owns and nothing
                // else writes.
                return unsafe {
                    self.device
                        .copy_htod_on(on, dst, bytes.as_ptr(), bytes.len())
                };
            };
            // One copy per pinned block the buffer touches.
            for (at_file, piece) in block_pieces(offset, bytes.len()) {
                let done = at_file - offset;
                let Some(src) = segment.map.at(at_file, piece) else {
                    return Err(sluice_cuda::CudaError::Unsupported(
                        "internal: a pinned buffer outside its segment's mapping".into(),
                    ));
                };
                // SAFETY: `src` is the buffer's bytes at the same file offset in the
                // segment's second mapping (the same pages), pinned (`pinned_source`);
                // `segments` and the batch are held by `Held::host` below until the
                // copies complete, so the range stays mapped and unchanged, as above;
                // `dst + done` is inside the buffer's place in `memory`.
                unsafe {
                    self.device
                        .copy_htod_on(on, dst + done as u64, src, piece)?
                };
            }
            Ok(())
        });
        if let Err(e) = queued {
            // Copies already queued still read the batch and the segments: let them
            // finish before both can go.
            let _ = self.device.synchronize_on(on);
            return Err(e.into());
        }
        let ready = self.device.event()?;
        self.device.record_on(on, &ready)?;
        tracing::debug!(
            bytes = used,
            buffers = sources.len(),
            pageable,
            alloc_us = allocated.as_micros() as u64,
            queued_us = started.elapsed().as_micros() as u64,
            "to_device"
        );
        let kept = segments
            .into_iter()
            .map(|s| s as crate::gpu::batch::KeptAlive)
            .collect();
        self.cell.retire(Held::host(batch.clone(), kept), on);
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

    /// The second mapping of the shared-memory segment `bytes` lie in, and their offset
    /// in it, with every block they touch pinned (the segment joins `used`); `None` for
    /// memory that is not in a shared file mapping (a batch assembled in process memory)
    /// or that could not be pinned, which is copied from where it is, through the
    /// driver's staging.
    fn pinned_source(
        &self,
        bytes: &[u8],
        used: &mut Vec<Arc<PinnedSegment>>,
    ) -> Option<(Arc<PinnedSegment>, usize)> {
        let Backing::File {
            path,
            inode,
            offset,
        } = backing_file(bytes.as_ptr() as usize, bytes.len())
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
        seg.map.at(offset, bytes.len())?;
        seg.pin(&self.device, offset, bytes.len())
            .then_some((seg, offset))
    }

    /// The second mapping of segment file `path` (`inode`), made on first use; its blocks
    /// are pinned as copies reach them.
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
        let seg = Arc::new(PinnedSegment {
            blocks: Mutex::default(),
            refused: AtomicBool::new(false),
            map,
        });
        segments.push(seg.clone());
        Some(seg)
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn copies_are_cut_at_pin_block_boundaries_and_cover_the_range_once() {
        const B: usize = PIN_BLOCK;
        let pieces = |o, l| block_pieces(o, l).collect::<Vec<_>>();
        assert_eq!(pieces(0, 0), vec![]);
        assert_eq!(pieces(5, 10), vec![(5, 10)]);
        assert_eq!(pieces(B - 4, 4), vec![(B - 4, 4)]);
        assert_eq!(pieces(B - 4, 8), vec![(B - 4, 4), (B, 4)]);
        assert_eq!(
            pieces(3 * B - 1, 2 * B + 2),
            vec![(3 * B - 1, 1), (3 * B, B), (4 * B, B), (5 * B, 1)]
        );
        assert_eq!(pieces(2 * B, B), vec![(2 * B, B)]);
        for (offset, len) in [(1, 3 * B), (B + 7, 12_345), (7 * B - 3, B + 9)] {
            let got = pieces(offset, len);
            assert_eq!(got.iter().map(|p| p.1).sum::<usize>(), len);
            assert!(got.windows(2).all(|w| w[0].0 + w[0].1 == w[1].0));
            assert!(got.iter().all(|&(at, l)| at / B == (at + l - 1) / B));
        }
    }
}
