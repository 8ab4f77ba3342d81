//! Allocating a topic's shared memory when the topic is created, so that a `/dev/shm`
//! filled later is an error and never a crash.
//!
//! tmpfs allocates a page when it is first written: a producer that writes a message into
//! a page of its segment after another program filled `/dev/shm` gets SIGBUS. The free
//! space checked when the topic is created (`statvfs`) is no promise. So the pages every
//! message may write are allocated then, with `posix_fallocate`, which fails with ENOSPC
//! instead.
//!
//! iceoryx2's data segment is a pool of equal buckets, each far larger than a message
//! under its power-of-two allocation (room to grow in place), so the whole file is not
//! allocated (it would take tens of times the topic's planned size): only the part of
//! each bucket a message writes, the sample's headers and `message_bytes` of payload.
//! Where each bucket lies is read from two samples loaned at once.

use std::os::fd::AsRawFd;
use std::os::unix::fs::MetadataExt;

use iceoryx2::port::publisher::Publisher;
use sluice_core::{Result, SluiceError};

use crate::header::FrameHeader;
use crate::namespace::{SHM_DIR, shm_available};
use crate::segment::{Backing, backing_file};
use crate::{Ipc, transport};

/// Where the pool's buckets lie in the segment's file.
#[derive(Debug, PartialEq, Eq)]
struct Buckets {
    /// Bytes from one bucket's start to the next.
    stride: u64,
    /// Bytes of headers before a sample's payload, from its bucket's start.
    header: u64,
}

impl Buckets {
    /// The layout two samples at file offsets `a` and `b` show in a file of `len` bytes
    /// that holds `chunks` buckets: the two must lie in neighbouring buckets (as the first
    /// two loans of a new segment do), which the file's length confirms.
    fn from_offsets(a: u64, b: u64, len: u64, chunks: u64) -> Option<Self> {
        let stride = a.abs_diff(b);
        let header = a.min(b);
        let holds = stride.checked_mul(chunks)? <= len && len < stride.checked_mul(chunks + 1)?;
        (stride > 0 && header < stride && holds).then_some(Self { stride, header })
    }

    /// The byte ranges of a file of `len` bytes that messages of up to `message_bytes`
    /// write.
    fn written(&self, len: u64, message_bytes: u64) -> impl Iterator<Item = (u64, u64)> {
        let per_bucket = self.header.saturating_add(message_bytes);
        let stride = self.stride;
        (0..len.div_ceil(stride)).filter_map(move |i| {
            let start = i.checked_mul(stride)?;
            let end = start.saturating_add(per_bucket).min(len);
            (end > start).then_some((start, end - start))
        })
    }
}

/// Allocates the pages of `publisher`'s data segment that messages of up to
/// `message_bytes` write (see the module's docs). Where the segment's layout cannot be
/// read (not a file in a shared mapping, buckets not as expected) it allocates nothing and
/// says so in the log; ENOSPC is [`SluiceError::ShmTooSmall`].
pub(crate) fn reserve(
    publisher: &Publisher<Ipc, [u8], FrameHeader>,
    topic: &str,
    message_bytes: usize,
    chunks: u64,
) -> Result<()> {
    let len = message_bytes.max(1);
    let loan = || {
        publisher
            .loan_slice_uninit(len)
            .map_err(transport("cannot loan shared memory for a message"))
    };
    let (mut first, mut second) = (loan()?, loan()?);
    let (a, b) = (first.payload_mut().as_ptr(), second.payload_mut().as_ptr());
    let (
        Backing::File {
            path,
            inode,
            offset: a,
        },
        Backing::File { offset: b, .. },
    ) = (backing_file(a as usize, len), backing_file(b as usize, len))
    else {
        tracing::debug!(%topic, "the topic's segment is no file this process maps: not allocated ahead");
        return Ok(());
    };
    drop((first, second));
    let file = std::fs::OpenOptions::new()
        .read(true)
        .write(true)
        .open(&path)
        .map_err(|e| SluiceError::io(format!("cannot open {}", path.display()), e))?;
    let size = file
        .metadata()
        .map_err(|e| SluiceError::io(format!("cannot read {}", path.display()), e))?;
    if size.ino() != inode {
        return Err(SluiceError::Transport(format!(
            "{} was replaced while topic '{topic}' was created",
            path.display()
        )));
    }
    let Some(buckets) = Buckets::from_offsets(a as u64, b as u64, size.len(), chunks) else {
        tracing::warn!(%topic, a, b, len = size.len(), chunks, "unexpected layout of the topic's segment: its pages are allocated as messages are written");
        return Ok(());
    };
    let mut needed = 0u64;
    for (start, bytes) in buckets.written(size.len(), message_bytes as u64) {
        needed = needed.saturating_add(bytes);
        allocate(&file, start, bytes).map_err(|e| match e.raw_os_error() {
            Some(libc::ENOSPC) => SluiceError::ShmTooSmall {
                topic: topic.to_string(),
                needed,
                available: shm_available().unwrap_or(0),
                path: SHM_DIR.into(),
            },
            _ => SluiceError::io(format!("cannot allocate {}", path.display()), e),
        })?;
    }
    Ok(())
}

/// Allocates `len` bytes of `file` from `offset` (tmpfs: its pages).
fn allocate(file: &std::fs::File, offset: u64, len: u64) -> std::io::Result<()> {
    let (Ok(offset), Ok(len)) = (libc::off_t::try_from(offset), libc::off_t::try_from(len)) else {
        return Err(std::io::Error::from_raw_os_error(libc::EFBIG));
    };
    // SAFETY: posix_fallocate reads its integer arguments only; the descriptor is open
    // for writing for the duration of the call (`file` is borrowed).
    match unsafe { libc::posix_fallocate(file.as_raw_fd(), offset, len) } {
        0 => Ok(()),
        errno => Err(std::io::Error::from_raw_os_error(errno)),
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn buckets_are_read_from_two_neighbouring_samples_in_either_order() {
        // As iceoryx2 0.10 lays out 20 buckets for 4 KiB messages.
        let len = 20 * 262_272 + 743;
        let layout = Buckets {
            stride: 262_272,
            header: 320,
        };
        assert_eq!(Buckets::from_offsets(320, 262_592, len, 20), Some(layout));
        let reversed = Buckets::from_offsets(262_592, 320, len, 20);
        assert_eq!(reversed.map(|b| b.stride), Some(262_272));
        // Not neighbours (a bucket between them): the file is too short for that stride.
        assert_eq!(Buckets::from_offsets(320, 524_864, len, 20), None);
        assert_eq!(Buckets::from_offsets(320, 320, len, 20), None);
    }

    #[test]
    fn every_bucket_is_allocated_for_its_headers_and_a_message() {
        let buckets = Buckets {
            stride: 1000,
            header: 100,
        };
        let ranges: Vec<_> = buckets.written(2_500, 300).collect();
        assert_eq!(ranges, vec![(0, 400), (1000, 400), (2000, 400)]);
        // A message larger than a bucket: up to the end of the file.
        let ranges: Vec<_> = buckets.written(1_500, 2_000).collect();
        assert_eq!(ranges, vec![(0, 1_500), (1000, 500)]);
    }
}
