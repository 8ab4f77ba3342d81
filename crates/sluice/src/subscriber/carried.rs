//! A transport of one's own as a subscriber's port ([`super::Subscriber::over`]): what it
//! carries, rows in this process's memory or descriptors of batches in device slots,
//! turned into the payload the delivery protocol cuts and hands out.

use std::any::Any;
use std::sync::Arc;
use std::time::Duration;

use arrow::record_batch::RecordBatch;
use sluice_core::delivery::Inbound;
use sluice_core::{Columns, Inlet, Result};
use sluice_cuda::DeviceDescriptor;

use super::payload::Payload;
use crate::gpu::batch::{DeviceBatch, ImporterCell};

/// A producer batch as a transport of one's own hands it to a subscriber
/// ([`super::Subscriber::over`]).
#[derive(Clone)]
pub enum Carried {
    /// Rows in this process's memory.
    Host(RecordBatch),
    /// A batch in one of a GPU topic's device slots. The subscriber hands it out as
    /// [`crate::Event::DeviceBatch`] and opens the slot only when the batch is read.
    Device {
        /// The batch's descriptor as a producer encodes it
        /// ([`sluice_cuda::DeviceDescriptor::encode`]); decoded on receipt, which checks
        /// it as one from shared memory is checked (every buffer inside the slot's used
        /// bytes, the layout matching the schema): a corrupt one is an error, not a read
        /// out of bounds.
        descriptor: Vec<u8>,
        /// Held by every batch cut from this one and every column view of it, and
        /// dropped with the last: the slot's bytes must not change until then, so a
        /// transport reuses the slot only after its pin is dropped (shared memory's pin
        /// is the message the descriptor came in, which goes back to the producer then).
        pin: Arc<dyn Any + Send + Sync>,
    },
}

impl std::fmt::Debug for Carried {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        match self {
            Self::Host(batch) => f.debug_tuple("Host").field(batch).finish(),
            Self::Device { descriptor, .. } => f
                .debug_struct("Device")
                .field("descriptor_bytes", &descriptor.len())
                .finish_non_exhaustive(),
        }
    }
}

impl From<RecordBatch> for Carried {
    fn from(batch: RecordBatch) -> Self {
        Self::Host(batch)
    }
}

/// A transport of anything [`Carried`] is made from.
struct Converting<P>(Box<dyn Inlet<P> + Send>);

impl<P: Into<Carried>> Inlet<Carried> for Converting<P> {
    fn recv(&mut self, timeout: Option<Duration>) -> Result<Inbound<Carried>> {
        Ok(self.0.recv(timeout)?.map(Into::into))
    }
}

/// A transport of one's own, with the columns the subscriber asked for and the importer
/// of its device batches.
pub(crate) struct CarriedInlet {
    inlet: Box<dyn Inlet<Carried> + Send>,
    columns: Columns,
    importer: Arc<ImporterCell>,
}

impl CarriedInlet {
    pub(crate) fn new<P: Into<Carried> + 'static>(
        inlet: Box<dyn Inlet<P> + Send>,
        columns: Columns,
    ) -> Self {
        Self {
            inlet: Box::new(Converting(inlet)),
            columns,
            importer: Arc::default(),
        }
    }
}

impl Inlet<Payload> for CarriedInlet {
    fn recv(&mut self, timeout: Option<Duration>) -> Result<Inbound<Payload>> {
        let (columns, importer) = (&self.columns, &self.importer);
        self.inlet.recv(timeout)?.try_map(|carried| match carried {
            Carried::Host(batch) => Ok(Payload::private(columns.project(batch)?)),
            Carried::Device { descriptor, pin } => {
                let descriptor = DeviceDescriptor::decode(&descriptor)?;
                let rows = descriptor.rows;
                let batch =
                    DeviceBatch::described(descriptor, pin, rows, columns, importer.clone())?;
                Ok(Payload::Device(batch))
            }
        })
    }
}
