//! Producer side: batches into device slots.

use arrow::array::RecordBatch;
use arrow::datatypes::SchemaRef;

use crate::descriptor::{DeviceDescriptor, HANDLE_BYTES, Mode, encode_schema};
use crate::driver::{Device, DeviceMemory, Event, PinnedHost, Stream};
use crate::error::{CudaError, Result};
use crate::layout::Planned;
use crate::ledger::SlotLedger;

struct Slot {
    memory: DeviceMemory,
    event: Event,
    mem_handle: [u8; HANDLE_BYTES],
    event_handle: [u8; HANDLE_BYTES],
}

/// Copies batches into a ring of device slots and describes them for subscribers.
///
/// Two pinned staging buffers alternate: the host packs batch `n + 1` into one while the
/// copy of batch `n` runs from the other, so copy and compute overlap; before packing into
/// a buffer the stager waits for the copy that last read it.
pub struct DeviceStager {
    // Field order is drop order: everything made from the device goes before it.
    slots: Vec<Slot>,
    staging: [(PinnedHost, Event); 2],
    turn: usize,
    stream: Stream,
    ledger: SlotLedger,
    slot_bytes: usize,
    schema: SchemaRef,
    schema_bytes: Vec<u8>,
    device: Device,
}

impl DeviceStager {
    /// A stager on `device` with at most `max_slots` slots of `slot_bytes` each.
    pub fn new(
        device: Device,
        schema: SchemaRef,
        slot_bytes: usize,
        max_slots: usize,
    ) -> Result<Self> {
        let staging = [
            (device.pinned(slot_bytes)?, device.event()?),
            (device.pinned(slot_bytes)?, device.event()?),
        ];
        Ok(Self {
            slots: Vec::new(),
            staging,
            turn: 0,
            stream: device.stream()?,
            ledger: SlotLedger::new(max_slots),
            slot_bytes,
            schema_bytes: encode_schema(&schema)?,
            schema,
            device,
        })
    }

    /// The device.
    pub fn device(&self) -> &Device {
        &self.device
    }

    /// Stages `batch` into the slot bound to the shared-memory chunk at `chunk` (the
    /// loaned sample that will carry the descriptor) and returns the encoded descriptor.
    pub fn stage(&mut self, batch: &RecordBatch, chunk: usize) -> Result<Vec<u8>> {
        let planned = Planned::new(batch)?;
        let used = planned.used_bytes();
        if used > self.slot_bytes as u64 {
            return Err(CudaError::SlotTooSmall {
                needed: used,
                slot_bytes: self.slot_bytes as u64,
            });
        }
        let grant = self.ledger.grant(chunk)?;
        if grant.fresh {
            let memory = self.device.alloc(self.slot_bytes)?;
            let event = self.device.ipc_event()?;
            self.slots.push(Slot {
                mem_handle: memory.ipc_handle()?,
                event_handle: event.ipc_handle()?,
                memory,
                event,
            });
        }
        let slot = self.slots.get(grant.slot as usize).ok_or_else(|| {
            CudaError::Unsupported("internal: slot granted but not allocated".into())
        })?;
        let (host, copied) = &mut self.staging[self.turn];
        copied.synchronize()?;
        planned.write_to(host.as_mut_slice())?;
        // SAFETY: `host` is not written again until `copied` (recorded right after the
        // copy) has completed — checked by `synchronize` above on its next turn — and the
        // slot's memory lives as long as `self`.
        unsafe {
            self.stream
                .copy_htod(&slot.memory, 0, host, used as usize)?
        };
        copied.record(&self.stream)?;
        slot.event.record(&self.stream)?;
        self.turn ^= 1;
        DeviceDescriptor {
            mode: Mode::Ipc,
            device_ordinal: self.device.ordinal(),
            slot: grant.slot,
            generation: grant.generation,
            slot_bytes: self.slot_bytes as u64,
            used_bytes: used,
            rows: batch.num_rows() as u64,
            mem_handle: slot.mem_handle,
            event_handle: slot.event_handle,
            schema: self.schema.clone(),
            nodes: planned.nodes().to_vec(),
        }
        .encode_with_schema(&self.schema_bytes)
    }

    /// Blocks until every queued copy is done (before a clean exit).
    pub fn synchronize(&self) -> Result<()> {
        self.stream.synchronize()
    }
}
