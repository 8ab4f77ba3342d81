//! Subscriber side: device descriptors into usable device addresses.

use std::collections::HashMap;
use std::sync::Arc;

use arrow::array::RecordBatch;
use arrow::buffer::Buffer;

use crate::descriptor::{DeviceDescriptor, HANDLE_BYTES, Mode};
use crate::driver::{Device, DeviceMemory, Event, IpcMapping, Stream};
use crate::error::{CudaError, Result};
use crate::layout::unpack;
use crate::registry::{EXPORTED, ExportedSlot};
use crate::stream::ConsumerStream;

/// Where a slot's memory is in this process.
#[derive(Debug)]
pub enum Mapping {
    /// Opened from another process's IPC handle; closed when the last holder drops it.
    Ipc(IpcMapping),
    /// Exported by this very process (a producer in the same process): the allocation
    /// itself, kept alive by its holders even after the producer stopped.
    Local(Arc<ExportedSlot>),
    /// This subscriber's own copy of a host batch (the `cuda_host` mode).
    Owned(Arc<OwnedSlot>),
}

/// Device memory a subscriber filled itself from host memory (`cuda_host`), and the
/// event recorded after the copies into it: work on any other stream waits on it.
#[derive(Debug)]
pub struct OwnedSlot {
    /// The memory, laid out as a producer's slot (see [`crate::layout`]).
    pub memory: DeviceMemory,
    /// Completes when the copies into `memory` have.
    pub ready: Event,
}

impl Mapping {
    /// The slot's device address in this process.
    pub fn device_ptr(&self) -> u64 {
        match self {
            Self::Ipc(m) => m.device_ptr(),
            Self::Local(s) => s.memory.device_ptr(),
            Self::Owned(s) => s.memory.device_ptr(),
        }
    }
}

struct Opened {
    mem_handle: [u8; HANDLE_BYTES],
    event_handle: [u8; HANDLE_BYTES],
    mapping: Arc<Mapping>,
    event: Arc<Event>,
}

/// A batch in a producer's device slot, ready for work queued on the consumer's stream.
#[derive(Debug, Clone)]
pub struct Imported {
    /// Device address of the slot in this process; buffers are at `base + offset`.
    pub base: u64,
    /// The slot.
    pub slot: u32,
    /// The mapping `base` points into: views of the batch hold it, so the mapping is
    /// closed only after the last of them is gone, even when the importer re-opened the
    /// slot for a restarted producer meanwhile.
    pub mapping: Arc<Mapping>,
}

/// Opens each slot once (from its IPC handle, or from this process's own exports),
/// caches the mapping, and orders the consumer's stream after the producer's copy.
pub struct DeviceImporter {
    opened: HashMap<u32, Opened>,
    stream: Stream,
    device: Device,
}

impl DeviceImporter {
    /// An importer on `device`: the GPU the descriptors name (see [`Device::open_uuid`]).
    pub fn new(device: Device) -> Result<Self> {
        Ok(Self {
            opened: HashMap::new(),
            stream: device.stream()?,
            device,
        })
    }

    /// The device.
    pub fn device(&self) -> &Device {
        &self.device
    }

    /// The importer's own stream, used by [`Self::to_host`].
    pub fn stream(&self) -> &Stream {
        &self.stream
    }

    /// Maps the descriptor's slot (once per slot and handle) and makes the consumer's
    /// `stream` wait until the producer's copy into it is done.
    pub fn import(&mut self, d: &DeviceDescriptor, stream: ConsumerStream) -> Result<Imported> {
        if d.mode != Mode::Ipc {
            return Err(CudaError::Unsupported(
                "a cuda_host descriptor has no device slot".into(),
            ));
        }
        if d.device_uuid != self.device.uuid() {
            return Err(CudaError::Unsupported(format!(
                "the batch is on GPU {} but this subscriber imports on {} ({})",
                d.device_uuid,
                self.device.uuid(),
                self.device.name()
            )));
        }
        let stale = self
            .opened
            .get(&d.slot)
            .is_some_and(|o| o.mem_handle != d.mem_handle || o.event_handle != d.event_handle);
        if stale {
            // A restarted producer reuses slot numbers with new allocations. Views of the
            // old slot keep its mapping (they hold the Arc) until they are gone.
            self.opened.remove(&d.slot);
        }
        if !self.opened.contains_key(&d.slot) {
            let (mapping, event) = match EXPORTED.lookup(&d.mem_handle) {
                // Ours: neither handle can be opened by the process that exported it.
                Some(own) => (Mapping::Local(own.clone()), own.event.clone()),
                None => (
                    Mapping::Ipc(
                        self.device
                            .open_ipc_memory(&d.mem_handle, d.slot_bytes as usize)?,
                    ),
                    Arc::new(self.device.open_ipc_event(&d.event_handle)?),
                ),
            };
            self.opened.insert(
                d.slot,
                Opened {
                    mem_handle: d.mem_handle,
                    event_handle: d.event_handle,
                    mapping: Arc::new(mapping),
                    event,
                },
            );
        }
        let o = self
            .opened
            .get(&d.slot)
            .ok_or_else(|| CudaError::Unsupported("internal: slot not cached".into()))?;
        if d.pending_copy {
            self.device.make_wait(stream, &o.event)?;
        }
        Ok(Imported {
            base: o.mapping.device_ptr(),
            slot: d.slot,
            mapping: o.mapping.clone(),
        })
    }

    /// Slots mapped so far.
    pub fn mapped_slots(&self) -> usize {
        self.opened.len()
    }

    /// Copies the batch back to host memory and rebuilds it (for checks against the CPU
    /// path, and for subscribers that asked for host batches).
    pub fn to_host(&mut self, d: &DeviceDescriptor) -> Result<RecordBatch> {
        let imported = self.import(d, ConsumerStream::Handle(self.stream.as_raw()))?;
        self.stream.synchronize()?;
        self.read_back(d, &imported.mapping)
    }

    /// Rebuilds the batch `d` describes from `mapping` (a slot the importer's stream
    /// already waited for, or a subscriber's own copy, whose copies are awaited here).
    pub fn read_back(&self, d: &DeviceDescriptor, mapping: &Mapping) -> Result<RecordBatch> {
        let mut bytes = vec![0u8; d.used_bytes as usize];
        match mapping {
            Mapping::Ipc(m) => m.copy_to_host(0, &mut bytes)?,
            Mapping::Local(s) => s.memory.copy_to_host(0, &mut bytes)?,
            Mapping::Owned(s) => {
                s.ready.synchronize()?;
                s.memory.copy_to_host(0, &mut bytes)?
            }
        }
        unpack(&d.schema, d.rows, &d.nodes, &Buffer::from(bytes))
    }
}
