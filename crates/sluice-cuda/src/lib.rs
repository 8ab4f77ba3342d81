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
//! * [`DeviceStager`] (producer) and [`DeviceImporter`] (subscriber) put them together.
//!
//! CUDA IPC does not work within one process: the GPU tests use two.
#![warn(missing_docs)]

pub mod descriptor;
pub mod driver;
mod error;
mod importer;
pub mod layout;
pub mod ledger;
mod stager;

pub use descriptor::{DeviceDescriptor, Mode};
pub use driver::{Device, driver_present};
pub use error::{CudaError, NO_DRIVER, Result};
pub use importer::{DeviceImporter, Imported};
pub use ledger::{Grant, SlotLedger};
pub use stager::DeviceStager;

/// Checks that GPU `ordinal` can be opened; the error says what to do when it cannot.
pub fn require_device(ordinal: u32) -> Result<String> {
    Device::open(ordinal).map(|d| d.name().to_string())
}
