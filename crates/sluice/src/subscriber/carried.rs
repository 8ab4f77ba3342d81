//! A transport of one's own as a subscriber's port ([`super::Subscriber::over`]): what it
//! carries, rows in this process's memory or descriptors of batches in device slots,
//! turned into the payload the delivery protocol cuts and hands out.

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
#[derive(Debug, Clone)]
pub enum Carried {
    /// Rows in this process's memory.
    Host(RecordBatch),
    /// A batch in one of a GPU topic's device slots, as its descriptor names it. The
    /// subscriber hands it out as [`crate::Event::DeviceBatch`] and opens the slot only
    /// when the batch is read; the transport must keep the slot's bytes unchanged until
    /// the subscriber has dropped every batch cut from it (shared memory does so by
    /// handing the producer back the message the descriptor came in only then).
    Device(Box<DeviceDescriptor>),
}

impl From<RecordBatch> for Carried {
    fn from(batch: RecordBatch) -> Self {
        Self::Host(batch)
    }
}

impl From<DeviceDescriptor> for Carried {
    fn from(descriptor: DeviceDescriptor) -> Self {
        Self::Device(Box::new(descriptor))
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
            Carried::Device(descriptor) => {
                let rows = descriptor.rows;
                let batch =
                    DeviceBatch::described(*descriptor, None, rows, columns, importer.clone())?;
                Ok(Payload::Device(batch))
            }
        })
    }
}
