//! A topic in this machine's shared memory as a transport of the delivery protocol
//! ([`Inlet`]): the [`super::port::Port`] of a local subscriber, and the live topic a
//! catch-up hands over to.

use std::sync::Arc;
use std::time::Duration;

use sluice_core::delivery::Inbound;
use sluice_core::{Columns, Inlet, Result, Rows, SluiceError, TopicName};
use sluice_shm::{Frame, TopicSubscriber};

use super::payload::Payload;
use crate::gpu::batch::{DeviceBatch, ImporterCell};

/// A topic in this machine's shared memory: host batches decoded in place, device
/// batches imported; with `reconnect`, a restarted producer's stream continues where
/// the dead one's stopped.
pub(crate) struct LocalInlet {
    /// The port; `None` only after a reconnection failed (the producer is lost).
    pub(crate) inner: Option<TopicSubscriber>,
    topic: TopicName,
    reconnect: Option<Duration>,
    /// The columns decoded, which a GPU topic's batches are imported with.
    columns: Columns,
    /// Opens the device slots of a GPU topic, on first use.
    importer: Arc<ImporterCell>,
}

impl LocalInlet {
    pub(crate) fn new(
        inner: TopicSubscriber,
        reconnect: Option<Duration>,
        columns: Columns,
    ) -> Self {
        Self {
            topic: inner.topic().clone(),
            inner: Some(inner),
            reconnect,
            columns,
            importer: Arc::default(),
        }
    }

    fn port(&mut self) -> Result<&mut TopicSubscriber> {
        // Only a failed reconnection leaves no port: the producer is lost for good.
        let topic = &self.topic;
        self.inner
            .as_mut()
            .ok_or_else(|| SluiceError::ProducerLost(topic.to_string()))
    }

    /// A frame as the delivery protocol takes it: batches, host or device, decoded.
    fn inbound(&mut self, frame: Frame) -> Result<Inbound<Payload>> {
        let frame = match frame.control() {
            Ok(message) => return Ok(message),
            Err(batch) => batch,
        };
        match frame {
            Frame::Batch {
                epoch,
                index,
                batch_rows,
                batch,
                shm_range,
            } => {
                if tracing::enabled!(tracing::Level::TRACE) {
                    let mut sum = sluice_core::Checksum::default();
                    let _ = sum.update(&batch);
                    tracing::trace!(epoch, index, rows = batch.num_rows(), sum = %sum.hex(), "producer batch");
                }
                Ok(Inbound::Batch {
                    epoch,
                    index,
                    batch_rows,
                    payload: Payload::Host {
                        batch,
                        shm: shm_range,
                    },
                })
            }
            Frame::DeviceBatch {
                epoch,
                index,
                rows,
                payload,
                beyond_max_held,
            } => {
                let batch =
                    DeviceBatch::from_sample(payload, rows, &self.columns, self.importer.clone())?;
                // Received beyond `max_held`: a private device copy, and the sample (with
                // its slot) goes back at once.
                let batch = match beyond_max_held {
                    true => batch.to_private()?.unwrap_or(batch),
                    false => batch,
                };
                Ok(Inbound::Batch {
                    epoch,
                    index,
                    batch_rows: 0,
                    payload: Payload::Device(batch),
                })
            }
            other => Err(SluiceError::Internal(format!(
                "a frame without rows was taken for a batch: {other:?}"
            ))),
        }
    }

    /// The producer is gone: attaches to its successor (see
    /// [`TopicSubscriber::successor`]). The protocol, told [`Inbound::Reconnected`],
    /// drops the successor's repeats of what this subscriber already had.
    fn reconnect_to_successor(&mut self, wait: Duration) -> Result<()> {
        // A failure leaves no port: the producer is lost for good.
        if let Some(old) = self.inner.take() {
            self.inner = old.successor(wait, || true)?;
        }
        Ok(())
    }
}

impl Inlet<Payload> for LocalInlet {
    fn recv(&mut self, timeout: Option<Duration>) -> Result<Inbound<Payload>> {
        let importer = self.importer.clone();
        let port = self.port()?;
        importer.make_room(|| port.held() >= port.max_held());
        match (port.recv(timeout), self.reconnect) {
            (Err(SluiceError::ProducerLost(_)), Some(wait)) => {
                self.reconnect_to_successor(wait)?;
                Ok(Inbound::Reconnected)
            }
            (received, _) => self.inbound(received?),
        }
    }
}
