//! Sluice topics over iceoryx2 shared memory.
//!
//! A topic `T` is three iceoryx2 services in the caller's [`Namespace`], of one
//! generation `G` (see the `claim` module: a producer that died leaves its services to
//! whoever still holds them, and its successor takes the next generation):
//!
//! ```text
//! sluice/T/G/data      publish-subscribe [u8] + FrameHeader   producer ──► subscribers
//! sluice/T/G/ready     event                                   producer ──► subscribers  ("data is queued")
//! sluice/T/G/released  event                                   subscribers ──► producer  ("queue has room")
//! ```
//!
//! Each batch is written once into a loaned shared-memory sample as a 64-byte-aligned
//! Arrow IPC fragment ([`sluice_core::wire`]) and decoded in place by every subscriber.
//!
//! # Flow control
//! The data service never overflows: a subscriber's queue holds at most `window`
//! messages, and when it is full the producer waits on the `released` event (it never
//! spins) until that subscriber takes one. The slowest live subscriber sets the pace.
//!
//! # Failures
//! While it waits, the producer reclaims the resources of dead processes, so a killed
//! subscriber stops holding it back. Subscribers wait on the `ready` event with a short
//! timeout and, on every timeout, check that the producer's process is still alive: a
//! producer that died makes them fail with [`SluiceError::ProducerLost`](sluice_core::SluiceError::ProducerLost) instead of
//! hanging, once they have taken what it queued for them. Sluice reclaims dead processes
//! itself, with iceoryx2's own clean-up of dead nodes off: a dead producer's segments
//! stay until nothing holds its services ([`Namespace::reclaim_dead`]).
#![warn(missing_docs)]

mod attach;
mod backpressure;
mod claim;
mod config;
mod departure;
mod ending;
mod errors;
mod frame;
mod header;
mod interest;
mod liveness;
mod lock;
mod namespace;
mod naming;
mod pacing;
pub mod process;
mod publisher;
mod reconnect;
mod registration;
mod reserve;
mod sample;
pub mod segment;
mod subscriber;
mod takeover;
#[cfg(test)]
mod tests;

pub use config::{TopicConfig, message_bytes, planned_message_bytes};
pub use departure::{DepartedSubscriber, departed_subscribers};
pub use frame::{BatchForm, Frame, OnMaxHeld};
pub use header::{FrameHeader, monotonic_ns};
pub use interest::{Interest, pending_interest};
pub use namespace::{
    Namespace, existing_user_dir, private_dir, shm_available, user_dir, write_private,
    write_private_locked,
};
pub use pacing::{Pacing, pacing};
pub use publisher::TopicPublisher;
pub use reconnect::{CONNECT_SLICE, connect_while};
pub use sample::SamplePayload;
pub use segment::{Backing, Maps, SegmentMap, backing_file, open_inode};
pub use subscriber::{TopicSubscriber, subscriber_count};

/// The iceoryx2 service flavour Sluice uses: inter-process, with thread-safe ports so
/// that samples and ports can move between threads (Python, async runtimes).
pub(crate) type Ipc = iceoryx2::service::ipc_threadsafe::Service;

pub(crate) use errors::{permission_denied, transport};
