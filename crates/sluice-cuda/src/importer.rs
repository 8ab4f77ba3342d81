//! Subscriber side: device descriptors into usable device addresses.

use std::collections::HashMap;

use arrow::array::RecordBatch;
use arrow::buffer::Buffer;

use crate::descriptor::{DeviceDescriptor, HANDLE_BYTES, Mode};
use crate::driver::{Device, Event, IpcMapping, Stream};
use crate::error::{CudaError, Result};
use crate::layout::unpack;

struct Opened {
    mem_handle: [u8; HANDLE_BYTES],
    event_handle: [u8; HANDLE_BYTES],
    mapping: IpcMapping,
    event: Event,
}

/// A batch in a producer's device slot, ready for work queued on the importer's stream.
#[derive(Debug, Clone, Copy)]
pub struct Imported {
    /// Device address of the slot in this process; buffers are at `base + offset`.
    pub base: u64,
    /// The slot.
    pub slot: u32,
}

/// Opens each slot's IPC handles once, caches the mapping, and orders the subscriber's
/// stream after the producer's copy.
pub struct DeviceImporter {
    opened: HashMap<u32, Opened>,
    stream: Stream,
    device: Device,
}

impl DeviceImporter {
    /// An importer on `device` (the producer's GPU, or a peer of it).
    pub fn new(device: Device) -> Result<Self> {
        Ok(Self {
            opened: HashMap::new(),
            stream: device.stream()?,
            device,
        })
    }

    /// The stream consumers must use (or synchronize with) to see the data.
    pub fn stream(&self) -> &Stream {
        &self.stream
    }

    /// Maps the descriptor's slot (once per slot and handle) and makes the stream wait
    /// on the slot's event.
    pub fn import(&mut self, d: &DeviceDescriptor) -> Result<Imported> {
        if d.mode != Mode::Ipc {
            return Err(CudaError::Unsupported(
                "a cuda_host descriptor has no device slot".into(),
            ));
        }
        let stale = self
            .opened
            .get(&d.slot)
            .is_some_and(|o| o.mem_handle != d.mem_handle || o.event_handle != d.event_handle);
        if stale {
            // A restarted producer reuses slot numbers with new allocations.
            self.opened.remove(&d.slot);
        }
        if !self.opened.contains_key(&d.slot) {
            let mapping = self
                .device
                .open_ipc_memory(&d.mem_handle, d.slot_bytes as usize)?;
            let event = self.device.open_ipc_event(&d.event_handle)?;
            self.opened.insert(
                d.slot,
                Opened {
                    mem_handle: d.mem_handle,
                    event_handle: d.event_handle,
                    mapping,
                    event,
                },
            );
        }
        let o = self
            .opened
            .get(&d.slot)
            .ok_or_else(|| CudaError::Unsupported("internal: slot not cached".into()))?;
        self.stream.wait(&o.event)?;
        Ok(Imported {
            base: o.mapping.device_ptr(),
            slot: d.slot,
        })
    }

    /// Slots mapped so far.
    pub fn mapped_slots(&self) -> usize {
        self.opened.len()
    }

    /// Copies the batch back to host memory and rebuilds it (for checks against the CPU
    /// path, and for subscribers that asked for host batches).
    pub fn to_host(&mut self, d: &DeviceDescriptor) -> Result<RecordBatch> {
        self.import(d)?;
        self.stream.synchronize()?;
        let o = self
            .opened
            .get(&d.slot)
            .ok_or_else(|| CudaError::Unsupported("internal: slot not cached".into()))?;
        let mut bytes = vec![0u8; d.used_bytes as usize];
        o.mapping.copy_to_host(0, &mut bytes)?;
        unpack(&d.schema, d.rows, &d.nodes, &Buffer::from(bytes))
    }
}
