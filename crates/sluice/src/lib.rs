//! Sluice: run one ML preprocessing pipeline per machine and feed its output,
//! zero-copy, to every training process on it.
//!
//! # Architecture
//!
//! ```text
//! pipelines/*.sql ─► Plan ─► DataFusion stream ─► Rebatcher ─► wire::encode ─► topic ─► Subscriber
//!                   (sluice-plan)                 (sluice-core)                 (sluice-shm)
//! ```
//!
//! A [`Producer`] runs a [`Plan`] once per epoch, cuts its output into batches of
//! exactly `sluice.batch_rows` rows, and writes each batch once into shared memory. Every
//! [`Subscriber`] on the machine reads the same memory, decoded in place.
//!
//! # Crates
//! * [`core`] (`sluice-core`): re-batching, checksums, the wire format, the error type.
//! * [`plan`] (`sluice-plan`): plan files and their execution by DataFusion.
//! * [`shm`] (`sluice-shm`): topics over iceoryx2 shared memory.
//! * `sluice` (this crate): [`Producer`] and [`Subscriber`], the API to program against.
//!
//! # Example
//! ```no_run
//! # fn main() -> sluice::Result<()> {
//! use sluice::prelude::*;
//!
//! // In the trainer process:
//! let mut sub = Subscriber::connect("demo", SubscribeOptions::default())?;
//! loop {
//!     match sub.next_event()? {
//!         Event::Batch { batch, .. } => println!("{} rows", batch.num_rows()),
//!         Event::DeviceBatch { batch, .. } => println!("{:?} on the GPU", batch.parts()),
//!         Event::EpochEnd(summary) => println!("epoch {} done", summary.epoch),
//!         Event::End => break,
//!     }
//! }
//! # Ok(())
//! # }
//! ```
#![warn(missing_docs)]

pub mod checkpoint;
pub mod cursor;
pub mod demo;
pub mod gpu;
pub mod logging;
mod producer;
pub mod rounds;
pub mod status;
mod subscriber;

pub use checkpoint::{Checkpoint, DataListing};
pub use cursor::{Cursor, LoaderRecord};
pub use gpu::batch::{DeviceBatch, DeviceColumn, DevicePart};
pub use gpu::host_copy::HostCopier;
pub use producer::{
    Feeder, Producer, ProducerHandle, Progress, RunOptions, RunStats, auto_message_batches,
    check_min_subscribers,
};
pub use rounds::{FeedbackWriter, request_round};
pub use sluice_core::{Checksum, Columns, Position, Result, SluiceError};
pub use sluice_plan::{Plan, Shard, SluiceOptions, StoreStats};
pub use sluice_shm::{Namespace, OnMaxHeld};
pub use subscriber::{
    Carried, CatchUpSender, Connector, EpochSummary, Event, Join, LoaderCatchUp, OnLag,
    SubscribeOptions, Subscriber, catch_up_channel, lies_within, remote_catch_up,
};

/// `sluice-core`: re-batching, checksums, wire format, errors.
pub mod core {
    pub use sluice_core::*;
}

/// `sluice-plan`: plan files.
pub mod plan {
    pub use sluice_plan::*;
}

/// `sluice-shm`: shared-memory topics.
pub mod shm {
    pub use sluice_shm::*;
}

/// `sluice-flight`: topics for trainers on other machines, over Arrow Flight.
pub mod flight {
    pub use sluice_flight::*;
}

/// `sluice-cuda`: the GPU path's slots, descriptors and driver wrappers.
pub mod cuda {
    pub use sluice_cuda::*;
}

/// The usual imports.
pub mod prelude {
    pub use crate::{
        Checksum, Columns, EpochSummary, Event, Join, Namespace, OnLag, Plan, Producer, Result,
        RunOptions, SluiceError, SubscribeOptions, Subscriber,
    };
}
