//! Everything GPU of the facade: device batches as subscribers receive them
//! ([`batch`]), host batches copied to a GPU by their subscriber ([`host_copy`], the
//! `cuda_host:N` mode), and the producer's side below.
//!
//! # The producer's side: `sluice.device = 'cuda:N'`
//! The batches of a device topic are copied once into a ring of device slots
//! (sluice-cuda's [`DeviceStager`]) and each message on the topic carries only the
//! batch's [`sluice_cuda::DeviceDescriptor`] (the topic's outlet, `outlet.rs`). The ring
//! and the topic's messages are sized from the first batch, before anything is created,
//! so that an over-budget ring fails before the topic exists.

pub mod batch;
pub mod host_copy;
pub(crate) mod outlet;

use arrow::record_batch::RecordBatch;
use sluice_core::{DeviceSpec, Result};
use sluice_cuda::{Device, DeviceStager, Footprint, RingPlan};

/// The GPU a plan publishes to, or `None` for the CPU path. On a machine without a
/// driver the error is [`sluice_cuda::NO_DRIVER`]; CPU plans never touch the driver.
pub(crate) fn open_device(spec: DeviceSpec) -> Result<Option<Device>> {
    match spec {
        DeviceSpec::Cpu => Ok(None),
        DeviceSpec::Cuda(ordinal) => Ok(Some(Device::open(ordinal)?)),
        DeviceSpec::CudaHost(ordinal) => {
            // The batches stay in shared memory (the CPU path) and each subscriber copies
            // them to its own GPU (`HostCopier`). The producer needs no GPU itself, but a
            // plan that names one is checked here, so that a node without a driver or
            // without that GPU fails at start rather than in every trainer.
            let device = Device::open(ordinal)?;
            tracing::info!(
                "sluice.device = '{spec}' ({}): batches stay in shared memory; subscribers \
                 copy them to their GPU (Batch.to_device)",
                device.name()
            );
            Ok(None)
        }
    }
}

/// How a device topic is sized from its first batch.
#[derive(Debug, Clone, Copy)]
pub(crate) struct DeviceSizing {
    /// The first batch's footprint.
    pub footprint: Footprint,
    /// Bytes of each device slot: room for batches half again as large as the first
    /// (later batches may carry longer strings or lists), as on the CPU path.
    pub slot_bytes: u64,
}

impl DeviceSizing {
    pub(crate) fn of(first: &RecordBatch) -> Result<Self> {
        let footprint = DeviceStager::footprint(first)?;
        let used = footprint.device_bytes;
        Ok(Self {
            footprint,
            slot_bytes: (used + used / 2).next_multiple_of(sluice_cuda::layout::ALIGN),
        })
    }
}

/// Allocates the whole ring for a topic of `chunks` shared-memory chunks, within
/// `budget` bytes (`sluice.device_memory`).
pub(crate) fn stager(
    device: Device,
    first: &RecordBatch,
    sizing: DeviceSizing,
    chunks: u64,
    budget: u64,
) -> Result<DeviceStager> {
    let ring = RingPlan::new(chunks, sizing.slot_bytes, budget)?;
    tracing::info!(
        device = %device.name(),
        slots = ring.slots,
        slot_bytes = ring.slot_bytes,
        total = ring.total(),
        "allocating the device ring"
    );
    Ok(DeviceStager::new(device, first.schema(), ring)?)
}
