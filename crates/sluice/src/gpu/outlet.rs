//! A `cuda:N` topic as a transport of the delivery protocol ([`Outlet`]): each batch
//! copied once into a device slot (sluice-cuda's [`DeviceStager`]), each message on the
//! shared-memory topic carrying only the batch's descriptor.

use arrow::record_batch::RecordBatch;
use sluice_core::{Outlet, Result};
use sluice_cuda::DeviceStager;
use sluice_shm::TopicPublisher;

/// A device topic's outlet for one message: the topic and its ring of slots.
///
/// A slot holds one producer batch, so a message of several batches goes as one device
/// batch each (the trait's [`Outlet::message`]); a producer of a device topic sends
/// messages of one batch (`sluice.message_batches` applies to host topics). Every message
/// wakes its subscribers at once: the slot it names is reused only after they read it.
pub(crate) struct DeviceOutlet<'a> {
    publisher: &'a mut TopicPublisher,
    stager: &'a mut DeviceStager,
    /// Bytes copied to the device so far.
    pub(crate) staged: u64,
}

impl<'a> DeviceOutlet<'a> {
    pub(crate) fn new(publisher: &'a mut TopicPublisher, stager: &'a mut DeviceStager) -> Self {
        Self {
            publisher,
            stager,
            staged: 0,
        }
    }
}

impl Outlet<RecordBatch> for DeviceOutlet<'_> {
    fn batch(&mut self, epoch: u64, index: u64, payload: &RecordBatch) -> Result<()> {
        let stager = &mut *self.stager;
        let mut used = 0;
        let rows = payload.num_rows() as u64;
        self.publisher
            .publish_device_batch(epoch, index, rows, |chunk| {
                let (descriptor, bytes) = stager.stage(payload, chunk)?;
                used = bytes;
                Ok(descriptor)
            })?;
        self.staged += used;
        Ok(())
    }

    fn end_of_epoch(&mut self, epoch: u64, batches: u64, rows: u64) -> Result<()> {
        self.publisher.end_of_epoch(epoch, batches, rows)
    }

    fn end_of_stream(&mut self, epochs: u64) -> Result<()> {
        self.publisher.end_of_stream(epochs)
    }
}
