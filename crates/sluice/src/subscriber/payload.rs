//! Rows as they travel through a subscriber: in shared memory (or this process's memory),
//! or in device slots.

use std::ops::Range;

use arrow::record_batch::RecordBatch;
use sluice_core::{Result, Rows, SluiceError};

use crate::gpu::batch::DeviceBatch;

/// A batch (or a part of one) as the delivery protocol handles it.
#[derive(Debug)]
pub(crate) enum Payload {
    /// Host rows, with the shared-memory sample every buffer of them lies in (`None`:
    /// this process's memory: assembled from two samples, copied beyond `max_held`, or
    /// from a remote topic). A slice lies in its batch's sample; anything assembled or
    /// copied lies in none.
    Host {
        batch: RecordBatch,
        shm: Option<Range<usize>>,
    },
    /// Rows in a GPU topic's device slots.
    Device(DeviceBatch),
}

impl Payload {
    /// Host rows in this process's memory.
    pub(crate) fn private(batch: RecordBatch) -> Self {
        Self::Host { batch, shm: None }
    }
}

impl Rows for Payload {
    fn num_rows(&self) -> usize {
        match self {
            Self::Host { batch, .. } => batch.num_rows(),
            Self::Device(b) => b.num_rows(),
        }
    }

    fn slice(&self, offset: usize, len: usize) -> Self {
        match self {
            Self::Host { batch, shm } => Self::Host {
                batch: batch.slice(offset, len),
                shm: shm.clone(),
            },
            Self::Device(b) => Self::Device(Rows::slice(b, offset, len)),
        }
    }

    fn concat(parts: Vec<Self>) -> Result<Self> {
        let mut host = Vec::new();
        let mut device = Vec::new();
        for p in parts {
            match p {
                Self::Host { batch, .. } => host.push(batch),
                Self::Device(b) => device.push(b),
            }
        }
        match (host.is_empty(), device.is_empty()) {
            (false, true) => Ok(Self::private(<RecordBatch as Rows>::concat(host)?)),
            (true, false) => Ok(Self::Device(<DeviceBatch as Rows>::concat(device)?)),
            _ => Err(SluiceError::Corrupt(
                "one topic sent both host and device batches".into(),
            )),
        }
    }

    fn to_private(&self) -> Result<Option<Self>> {
        Ok(match self {
            Self::Host { batch, .. } => batch.to_private()?.map(Self::private),
            Self::Device(b) => b.to_private()?.map(Self::Device),
        })
    }
}
