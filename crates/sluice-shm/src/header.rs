//! The typed header that travels beside every payload.

use iceoryx2::prelude::ZeroCopySend;

/// Metadata of one message on a topic's data service.
///
/// It lives in shared memory, so a subscriber copies it out once and validates it before
/// use.
#[derive(Debug, Clone, Copy, Default, PartialEq, Eq, ZeroCopySend)]
#[type_name("SluiceFrameHeader3")]
#[repr(C)]
pub struct FrameHeader {
    /// A [`sluice_core::FrameKind`] as `u32`.
    pub kind: u32,
    /// Batch: rows of each of the producer's batches where the message carries several
    /// consecutive ones (it holds `rows` rows in all, `index` is the first's); 0: the
    /// message is one batch. Zero for every other kind.
    pub batch_rows: u32,
    /// Epoch number, from 0.
    pub epoch: u64,
    /// Batch: its (first batch's) index within the epoch. End of epoch: the number of
    /// batches.
    pub index: u64,
    /// Batch: its rows. End of epoch: the rows of the epoch.
    pub rows: u64,
    /// Payload bytes in use (the loaned slice may be longer).
    pub len: u64,
    /// Sequence number of the message on the topic, from 0, without gaps.
    pub seq: u64,
    /// When the producer published the message: `CLOCK_MONOTONIC` nanoseconds, a clock
    /// every process on the machine shares (publish-to-use latency, `sluice-bench`).
    pub published_ns: u64,
}

/// Now, on the clock of [`FrameHeader::published_ns`].
pub fn monotonic_ns() -> u64 {
    let mut t = libc::timespec {
        tv_sec: 0,
        tv_nsec: 0,
    };
    // SAFETY: a valid out-pointer; CLOCK_MONOTONIC always exists on Linux.
    unsafe { libc::clock_gettime(libc::CLOCK_MONOTONIC, &mut t) };
    (t.tv_sec as u64)
        .saturating_mul(1_000_000_000)
        .saturating_add(t.tv_nsec as u64)
}
