//! How a subscriber reaches its topic: a transport of the delivery protocol
//! ([`Inlet`]) that hands it [`Payload`]s: a topic in this machine's shared memory, or
//! one that `sluice serve --flight` serves on another machine.

use std::sync::Arc;
use std::time::Duration;

use arrow::record_batch::RecordBatch;
use sluice_core::delivery::Inbound;
use sluice_core::{Columns, Inlet, Result, Rows, SluiceError, TopicName};
use sluice_flight::FlightInlet;
use sluice_shm::{Frame, TopicSubscriber};

use super::catch_up::CatchUp;
use super::payload::Payload;
use crate::gpu::batch::{DeviceBatch, ImporterCell};

/// A subscriber's transport.
pub(crate) enum Port {
    /// Shared memory on this machine.
    Local(Box<LocalInlet>),
    /// `sluice serve --flight` on another machine: its batches are this process's
    /// memory (nothing to hand back early, so no limit on held batches), and it
    /// reconnects by itself (`ClientOptions::reconnect`). `None` once left.
    Remote(Option<Box<FlightInlet>>),
    /// Any other transport of host batches (the in-memory one of the conformance tests);
    /// `None` once left.
    Other(Option<Box<dyn Inlet<RecordBatch> + Send>>),
    /// Shared memory on this machine from a position of the subscriber's own: a
    /// catch-up, then the topic.
    CatchUp(Box<CatchUp>),
}

impl std::fmt::Debug for Port {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        match self {
            Port::Local(local) => f.debug_tuple("Local").field(&local.inner).finish(),
            Port::Remote(remote) => f.debug_tuple("Remote").field(remote).finish(),
            Port::Other(_) => f.write_str("Other"),
            Port::CatchUp(c) => f
                .debug_tuple("CatchUp")
                .field(&c.live().and_then(|l| l.inner.as_ref()))
                .finish(),
        }
    }
}

impl Port {
    /// The local topic's subscriber port, if this is one and it is attached.
    pub(crate) fn local(&self) -> Option<&TopicSubscriber> {
        match self {
            Port::Local(local) => local.inner.as_ref(),
            Port::CatchUp(c) => c.live().and_then(|l| l.inner.as_ref()),
            Port::Remote(_) | Port::Other(_) => None,
        }
    }

    /// Leaves the topic: the producer (or the server, which detaches at once when its
    /// stream is dropped) stops waiting for this subscriber.
    pub(crate) fn leave(&mut self) {
        match self {
            Port::Local(local) => {
                if let Some(inner) = &mut local.inner {
                    inner.detach();
                }
            }
            Port::Remote(remote) => *remote = None,
            Port::Other(other) => *other = None,
            Port::CatchUp(c) => c.leave(),
        }
    }
}

impl Inlet<Payload> for Port {
    fn recv(&mut self, timeout: Option<Duration>) -> Result<Inbound<Payload>> {
        match self {
            Port::Local(local) => local.recv(timeout),
            Port::CatchUp(c) => c.recv(timeout),
            Port::Remote(Some(remote)) => Ok(remote.recv(timeout)?.map(Payload::private)),
            Port::Other(Some(other)) => Ok(other.recv(timeout)?.map(Payload::private)),
            Port::Remote(None) | Port::Other(None) => Ok(Inbound::EndOfStream),
        }
    }
}

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
