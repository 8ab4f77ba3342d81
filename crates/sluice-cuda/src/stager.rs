//! Producer side: batches into device slots.

use std::sync::Arc;

use arrow::array::RecordBatch;
use arrow::datatypes::SchemaRef;

use crate::descriptor::{DeviceDescriptor, HANDLE_BYTES, Mode, encode_schema};
use crate::driver::{Device, Event, PinnedHost, Stream};
use crate::error::{CudaError, Result};
use crate::layout::Planned;
use crate::ledger::SlotLedger;
use crate::registry::{EXPORTED, ExportedSlot};
use crate::ring::RingPlan;

struct Slot {
    shared: Arc<ExportedSlot>,
    mem_handle: [u8; HANDLE_BYTES],
    event_handle: [u8; HANDLE_BYTES],
}

/// Copies batches into a ring of device slots and describes them for subscribers.
///
/// Two pinned staging buffers alternate: the host packs batch `n + 1` into one while the
/// copy of batch `n` runs from the other, so copy and compute overlap; before packing into
/// a buffer the stager waits for the copy that last read it.
///
/// The whole ring is allocated by [`DeviceStager::new`], under the budget of its
/// [`RingPlan`]: nothing is allocated mid-stream. Every slot is registered in the
/// process-wide [`EXPORTED`] registry, so subscribers in this process use it directly
/// (`cuIpcOpenMemHandle` refuses a process's own handles).
pub struct DeviceStager {
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
    /// A stager on `device` that allocates the ring of `ring` now.
    pub fn new(device: Device, schema: SchemaRef, ring: RingPlan) -> Result<Self> {
        let slot_bytes = usize::try_from(ring.slot_bytes)
            .map_err(|_| CudaError::Unsupported(format!("{}-byte slots", ring.slot_bytes)))?;
        let staging = [
            (device.pinned(slot_bytes)?, device.event()?),
            (device.pinned(slot_bytes)?, device.event()?),
        ];
        let slots = (0..ring.slots)
            .map(|_| {
                let memory = device.alloc(slot_bytes)?;
                let event = device.ipc_event()?;
                let mem_handle = memory.ipc_handle()?;
                let event_handle = event.ipc_handle()?;
                let shared = Arc::new(ExportedSlot {
                    memory,
                    event: Arc::new(event),
                });
                EXPORTED.register(mem_handle, &shared);
                Ok(Slot {
                    shared,
                    mem_handle,
                    event_handle,
                })
            })
            .collect::<Result<Vec<_>>>()?;
        Ok(Self {
            slots,
            staging,
            turn: 0,
            stream: device.stream()?,
            ledger: SlotLedger::new(ring.slots),
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
        let slot = self.slots.get(grant.slot as usize).ok_or_else(|| {
            CudaError::Unsupported("internal: a slot beyond the preallocated ring".into())
        })?;
        let (host, copied) = &mut self.staging[self.turn];
        copied.synchronize()?;
        planned.write_to(host.as_mut_slice())?;
        // SAFETY: `host` is not written again until `copied` (recorded right after the
        // copy) has completed — checked by `synchronize` above on its next turn — and the
        // slot's memory lives as long as `self`.
        unsafe {
            self.stream
                .copy_htod(&slot.shared.memory, 0, host, used as usize)?
        };
        copied.record(&self.stream)?;
        slot.shared.event.record(&self.stream)?;
        self.turn ^= 1;
        DeviceDescriptor {
            mode: Mode::Ipc,
            // Published at once, with the copy queued: subscribers wait on the slot's
            // event on their own stream (docs/gpu.md, "publish at once").
            pending_copy: true,
            device_ordinal: self.device.ordinal(),
            device_uuid: self.device.uuid(),
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
