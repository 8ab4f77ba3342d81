//! The typed header that travels beside every payload.

use iceoryx2::prelude::ZeroCopySend;

/// Metadata of one message on a topic's data service.
///
/// It lives in shared memory, so a subscriber copies it out once and validates it before
/// use.
#[derive(Debug, Clone, Copy, Default, PartialEq, Eq, ZeroCopySend)]
#[type_name("SluiceFrameHeader1")]
#[repr(C)]
pub struct FrameHeader {
    /// A [`sluice_core::FrameKind`] as `u32`.
    pub kind: u32,
    /// Reserved flags; zero.
    pub flags: u32,
    /// Epoch number, from 0.
    pub epoch: u64,
    /// Batch: its index within the epoch. End of epoch: the number of batches.
    pub index: u64,
    /// Batch: its rows. End of epoch: the rows of the epoch.
    pub rows: u64,
    /// Payload bytes in use (the loaned slice may be longer).
    pub len: u64,
    /// Sequence number of the message on the topic, from 0, without gaps.
    pub seq: u64,
}
