//! The GPU path of Sluice: device slots, pinned staging, CUDA IPC handles and events.
//!
//! ```text
//! producer                                              subscriber (another process)
//! batch ─► layout::Planned ─► pinned staging ─► HtoD async ─► slot k ◄── cuIpcOpenMemHandle (cached per slot)
//!                                                   │                       │
//!                                      event k recorded (interprocess) ◄── cuStreamWaitEvent
//!                 DeviceDescriptor (slot, offsets, handles, schema) ─► iceoryx2 sample ─►
//! ```
//!
//! * [`driver`]: owning wrappers over the CUDA driver calls (cudarc, `dynamic-loading`):
//!   the crate always builds, and [`Device::open`] returns [`CudaError::NoDriver`] where
//!   `libcuda.so` cannot be loaded.
//! * [`layout`]: where each buffer of a batch goes in a slot (pure, tested on the CPU).
//! * [`descriptor`]: the versioned, validated message that crosses processes (pure).
//! * [`ledger`]: which slot a batch may use; reuse follows the iceoryx2 sample that
//!   carries the descriptor, so a held batch is never overwritten (pure).
//! * [`ring`]: the ring of slots, preallocated under `sluice.device_memory` (pure).
//! * [`identity`]: devices named by UUID, mapped to each process's ordinal (pure).
//! * [`stream`]: the consumer's stream of `__dlpack__(stream=…)` (pure).
//! * [`retire`]: a released batch goes back only once its consumers' queued work on it
//!   has completed (pure).
//! * [`registry`]: slots exported by this process, used directly by subscribers in it
//!   (`cuIpcOpenMemHandle` refuses a process's own handles).
//! * [`nvjpeg`]: nvJPEG, loaded at run time, decoding JPEGs into device memory.
//! * [`DeviceStager`] (producer) and [`DeviceImporter`] (subscriber) put them together.
#![warn(missing_docs)]

pub mod descriptor;
pub mod driver;
mod error;
pub mod identity;
mod importer;
pub mod layout;
pub mod ledger;
pub mod nvjpeg;
pub mod registry;
pub mod retire;
pub mod ring;
mod stager;
pub mod stream;

pub use descriptor::{DeviceDescriptor, Mode};
pub use driver::{Device, DeviceMemory, Event, driver_present, in_forked_child};
pub use error::{CudaError, NO_DRIVER, Result};
pub use identity::DeviceUuid;
pub use importer::{DeviceImporter, Imported, Mapping, OwnedSlot};
pub use ledger::{Grant, SlotLedger};
pub use retire::{Completion, Retiring};
pub use ring::RingPlan;
pub use stager::{DeviceStager, Footprint};
pub use stream::ConsumerStream;

/// Checks that GPU `ordinal` can be opened; the error says what to do when it cannot.
pub fn require_device(ordinal: u32) -> Result<String> {
    Device::open(ordinal).map(|d| d.name().to_string())
}
