//! Allocating a topic's shared memory when the topic is created, so that a `/dev/shm`
//! filled later is an error and never a crash.
//!
//! tmpfs allocates a page when it is first written: a producer that writes a message into
//! a page of its segment after another program filled `/dev/shm` gets SIGBUS. The free
//! space checked when the topic is created (`statvfs`) is no promise. So the pages every
//! message may write are allocated then, through the producer's own mapping with
//! `madvise(MADV_POPULATE_WRITE)`, which fails with EFAULT where writing would raise
//! SIGBUS. (Through the mapping rather than with `posix_fallocate` on the file: no path to
//! open again beside iceoryx2, and the pages are the ones this process writes.)
//!
//! iceoryx2's data segment is a pool of equal buckets, each far larger than a message
//! under its power-of-two allocation (room to grow in place), so the whole file is not
//! allocated (it would take tens of times the topic's planned size): only the part of
//! each bucket a message writes, the sample's headers and `message_bytes` of payload.
//! Where each bucket lies is read from two samples loaned at once.

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
/// `message_bytes` write (see the module's docs), through this process's mapping of it.
/// Where the segment's layout cannot be read (not a file in a shared mapping, buckets not
/// as expected) or the kernel cannot populate a mapping (before Linux 5.14) it allocates
/// nothing and says so in the log; a full `/dev/shm` is [`SluiceError::ShmTooSmall`].
pub(crate) fn reserve(
    publisher: &Publisher<Ipc, [u8], FrameHeader>,
    topic: &str,
    message_bytes: usize,
    chunks: u64,
) -> Result<()> {
    let Some((segment, buckets)) = layout(publisher, topic, message_bytes, chunks)? else {
        return Ok(());
    };
    let started = std::time::Instant::now();
    let mut needed = 0u64;
    for (start, bytes) in buckets.written(segment.len, message_bytes as u64) {
        needed = needed.saturating_add(bytes);
        match segment.populate(start, bytes) {
            Ok(()) => {}
            // Populating would have been a SIGBUS: tmpfs has no page left.
            Err(e) if matches!(e.raw_os_error(), Some(libc::EFAULT | libc::ENOMEM)) => {
                return Err(SluiceError::ShmTooSmall {
                    topic: topic.to_string(),
                    needed,
                    available: shm_available().unwrap_or(0),
                    path: SHM_DIR.into(),
                });
            }
            Err(e) if e.raw_os_error() == Some(libc::EINVAL) => {
                tracing::warn!(%topic, "this kernel cannot populate a mapping ahead (Linux 5.14 can): the topic's pages are allocated as messages are written, and a /dev/shm filled meanwhile crashes the producer");
                return Ok(());
            }
            Err(e) => {
                return Err(SluiceError::io(
                    "cannot allocate a topic's shared memory",
                    e,
                ));
            }
        }
    }
    tracing::debug!(%topic, bytes = needed, ms = started.elapsed().as_secs_f64() * 1e3, "allocated the topic's shared memory");
    Ok(())
}

/// Where this process maps the data segment of `publisher`, and its buckets, read from two
/// samples loaned at once; `None` (logged) where that cannot be read.
fn layout(
    publisher: &Publisher<Ipc, [u8], FrameHeader>,
    topic: &str,
    message_bytes: usize,
    chunks: u64,
) -> Result<Option<(Segment, Buckets)>> {
    let len = message_bytes.max(1);
    let loan = || {
        publisher
            .loan_slice_uninit(len)
            .map_err(transport("cannot loan shared memory for a message"))
    };
    let (mut first, mut second) = (loan()?, loan()?);
    let (a, b) = (
        first.payload_mut().as_ptr() as usize,
        second.payload_mut().as_ptr() as usize,
    );
    drop((first, second));
    let (
        Backing::File {
            path,
            inode,
            offset: offset_a,
        },
        Backing::File {
            offset: offset_b, ..
        },
    ) = (backing_file(a, len), backing_file(b, len))
    else {
        tracing::debug!(%topic, "the topic's segment is no file this process maps: not allocated ahead");
        return Ok(None);
    };
    let file = std::fs::metadata(&path)
        .map_err(|e| SluiceError::io(format!("cannot read {}", path.display()), e))?;
    let buckets = Buckets::from_offsets(offset_a as u64, offset_b as u64, file.len(), chunks);
    let (Some(base), Some(buckets), true) = (a.checked_sub(offset_a), buckets, file.ino() == inode)
    else {
        tracing::warn!(%topic, offset_a, offset_b, len = file.len(), chunks, "unexpected layout of the topic's segment: its pages are allocated as messages are written");
        return Ok(None);
    };
    let segment = Segment {
        base,
        len: file.len(),
        inode,
    };
    Ok(Some((segment, buckets)))
}

/// A data segment as this process maps it: the file's first byte at `base`.
struct Segment {
    base: usize,
    len: u64,
    inode: u64,
}

impl Segment {
    /// Allocates the pages of bytes `[start, start + bytes)` of the file, as writing them
    /// would, but failing where writing would be a SIGBUS.
    fn populate(&self, start: u64, bytes: u64) -> std::io::Result<()> {
        let page = page_size();
        let range = usize::try_from(start)
            .ok()
            .zip(usize::try_from(bytes).ok())
            .and_then(|(start, bytes)| {
                let first = self.base.checked_add(start)? / page * page;
                let end = self.base.checked_add(start)?.checked_add(bytes)?;
                Some((first, end.checked_next_multiple_of(page)?))
            });
        let Some((first, end)) = range else {
            return Err(std::io::Error::from_raw_os_error(libc::EOVERFLOW));
        };
        // The range must lie in this process's mapping of the segment's file, at the
        // offsets computed: iceoryx2 maps the whole file once, so this holds unless the
        // layout was misread.
        let Backing::File { inode, offset, .. } = backing_file(first, end - first) else {
            return Err(std::io::Error::from_raw_os_error(libc::EFAULT));
        };
        if inode != self.inode || self.base.checked_add(offset) != Some(first) {
            return Err(std::io::Error::from_raw_os_error(libc::EFAULT));
        }
        // SAFETY: `[first, end)` lies in a shared mapping of the segment's file that the
        // publisher keeps (checked just above against /proc/self/maps, and the caller
        // borrows the publisher); MADV_POPULATE_WRITE faults its pages in writable without
        // writing to them, so no byte another process may read changes, and it reports
        // a fault that would be a SIGBUS (a full tmpfs) as EFAULT instead of raising it.
        let done = unsafe {
            libc::madvise(
                first as *mut libc::c_void,
                end - first,
                libc::MADV_POPULATE_WRITE,
            )
        };
        if done == 0 {
            Ok(())
        } else {
            Err(std::io::Error::last_os_error())
        }
    }
}

/// The size of a memory page.
fn page_size() -> usize {
    // SAFETY: sysconf reads a constant of the system.
    let size = unsafe { libc::sysconf(libc::_SC_PAGESIZE) };
    usize::try_from(size)
        .ok()
        .filter(|&s| s > 0)
        .unwrap_or(4096)
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
