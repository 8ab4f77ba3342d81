//! How a subscriber reaches its topic: a transport of the delivery protocol
//! ([`Inlet`]) that hands it [`Payload`]s: a topic in this machine's shared memory, or
//! one that `sluice serve --flight` serves on another machine.

use std::time::Duration;

use sluice_core::delivery::Inbound;
use sluice_core::{Inlet, Result};
use sluice_flight::FlightInlet;
use sluice_shm::TopicSubscriber;

use super::carried::CarriedInlet;
use super::catch_up::CatchUp;
use super::local::LocalInlet;
use super::payload::Payload;

/// A subscriber's transport.
pub(crate) enum Port {
    /// Shared memory on this machine.
    Local(Box<LocalInlet>),
    /// `sluice serve --flight` on another machine: its batches are this process's
    /// memory (nothing to hand back early, so no limit on held batches), and it
    /// reconnects by itself (`ClientOptions::reconnect`). `None` once left.
    Remote(Option<Box<FlightInlet>>),
    /// A transport of one's own (the in-memory one of the conformance tests), of host
    /// or device batches; `None` once left.
    Other(Option<Box<CarriedInlet>>),
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
            Port::Other(Some(other)) => other.recv(timeout),
            Port::Remote(None) | Port::Other(None) => Ok(Inbound::EndOfStream),
        }
    }
}
