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

/// What one batch takes: sizes a device topic before anything is allocated.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub struct Footprint {
    /// Bytes of a device slot the batch uses.
    pub device_bytes: u64,
    /// The largest descriptor a batch of this schema can have (every array with a
    /// validity bitmap): the size of the topic's shared-memory messages.
    pub descriptor_bytes: usize,
}

impl DeviceStager {
    /// The footprint of `batch`: its bytes on the device and its descriptor's bound.
    pub fn footprint(batch: &RecordBatch) -> Result<Footprint> {
        let planned = Planned::new(batch)?;
        let schema = encode_schema(&batch.schema())?;
        let nodes: usize = planned
            .nodes()
            .iter()
            .map(|n| 20 + 16 * (n.buffers.len() + 1))
            .sum();
        Ok(Footprint {
            device_bytes: planned.used_bytes(),
            descriptor_bytes: DeviceDescriptor::FIXED + schema.len() + nodes + 8,
        })
    }

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
    /// loaned sample that will carry the descriptor) and returns the encoded descriptor
    /// and the bytes copied to the device.
    pub fn stage(&mut self, batch: &RecordBatch, chunk: usize) -> Result<(Vec<u8>, u64)> {
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
        .map(|d| (d, used))
    }

    /// Blocks until every queued copy is done (before a clean exit).
    pub fn synchronize(&self) -> Result<()> {
        self.stream.synchronize()
    }
}

#[cfg(test)]
mod tests {
    use std::sync::Arc;

    use arrow::array::{ArrayRef, Int64Array, StringArray};

    use super::*;
    use crate::identity::DeviceUuid;

    fn descriptor_len(batch: &RecordBatch) -> usize {
        let planned = Planned::new(batch).unwrap();
        DeviceDescriptor {
            mode: Mode::Ipc,
            pending_copy: true,
            device_ordinal: 0,
            device_uuid: DeviceUuid([1; 16]),
            slot: 0,
            generation: 0,
            slot_bytes: 1 << 20,
            used_bytes: planned.used_bytes(),
            rows: batch.num_rows() as u64,
            mem_handle: [0; HANDLE_BYTES],
            event_handle: [0; HANDLE_BYTES],
            schema: batch.schema(),
            nodes: planned.nodes().to_vec(),
        }
        .encode()
        .unwrap()
        .len()
    }

    /// The topic's messages are sized from the first batch: a later batch of the same
    /// schema, with nulls where the first had none, must still fit.
    #[test]
    fn the_descriptor_bound_covers_batches_with_and_without_nulls() {
        let batch = |nulls: bool| {
            let ids: ArrayRef = Arc::new(Int64Array::from_iter(
                (0..100).map(|i| (!nulls || i % 7 != 0).then_some(i)),
            ));
            let names: ArrayRef = Arc::new(StringArray::from_iter(
                (0..100).map(|i| (!nulls || i % 5 != 0).then(|| format!("row {i}"))),
            ));
            RecordBatch::try_from_iter([("id", ids), ("name", names)]).unwrap()
        };
        let first = DeviceStager::footprint(&batch(false)).unwrap();
        assert_eq!(
            first.device_bytes,
            Planned::new(&batch(false)).unwrap().used_bytes()
        );
        for nulls in [false, true] {
            let len = descriptor_len(&batch(nulls));
            assert!(len <= first.descriptor_bytes, "{len} > {first:?}");
        }
        assert!(descriptor_len(&batch(true)) > descriptor_len(&batch(false)));
    }
}
