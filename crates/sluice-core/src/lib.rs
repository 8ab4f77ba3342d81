//! Sluice core: the pure pieces of the runtime, with no I/O.
//!
//! ```text
//! plan ─► source ─► [rebatch] ─► [wire::encode] ─► topic ─► [wire::decode] ─► subscriber
//!                                                                  │
//!                                                          [checksum] (verification)
//! ```
//!
//! * [`shuffle`] is a bounded, seeded shuffle buffer: the same seed and epoch give the
//!   same order; [`shaper`] chains it with re-batching for one epoch.
//! * [`rebatch`] cuts a stream of record batches into batches of exactly `n` rows
//!   (the last one of an epoch may be shorter), slicing without copies where it can.
//! * [`wire`] turns a batch into self-contained Arrow IPC messages that can be written
//!   once into shared memory, and validates and decodes them in place on the other side.
//! * [`checksum`] is an order-independent fingerprint of a set of rows, so delivery can
//!   be checked against the source whatever the order or batching.
//! * [`burst`] decides when a producer wakes its subscribers for a burst of messages.
//! * [`frame`] names the kinds of message that travel on a topic.
//! * [`position`] is where a stream is, and how a subscriber joins a restarted
//!   producer's stream onto what it already received (no duplicates, no gaps).
//! * [`placement`] names where batches are materialized (`sluice.device`: CPU shared memory or a GPU).
//! * [`error`] is the one error type of Sluice.
//! * [`panics`] keeps the panics Sluice catches (and reports as errors) off stderr.
//! * [`threads`] gives the threads that plan and execute queries stacks deep enough.
#![warn(missing_docs)]

pub mod burst;
pub mod checksum;
pub mod delivery;
pub mod error;
pub mod frame;
pub mod panics;
pub mod placement;
pub mod position;
pub mod process;
pub mod rebatch;
pub mod shaper;
pub mod shuffle;
pub mod threads;
pub mod wire;

pub use burst::{Burst, Wake};
pub use checksum::Checksum;
pub use delivery::{
    EpochSummary, Inbound, Inlet, Join, OnLag, Outbound, Outlet, Receiver, ReceiverOptions,
    Subscription,
};
pub use error::{Result, SluiceError};
pub use frame::{FrameKind, TopicName};
pub use placement::{ByteSize, DeviceSpec};
pub use position::{Position, Resume, RowPosition, Verdict};
pub use rebatch::{Rebatcher, Rows};
pub use shaper::Shaper;
pub use shuffle::Shuffler;
pub use wire::Columns;
