//! Writable, private views of shared memory for DLPack consumers that write in place.
//!
//! A subscriber maps its topic's shared memory read-only: every trainer reads the same
//! pages, and none may change what the others see. numpy honours DLPack's read-only flag
//! (its arrays are read-only) and pyarrow arrays are immutable, but torch has no
//! read-only tensors: it ignores the flag, and `torch.from_dlpack(col).mul_(2)` (or
//! `x.div_(255)`, which trainers do every day) stored into the read-only mapping and
//! killed the trainer with SIGSEGV.
//!
//! So a DLPack export of values that lie in a shared file mapping points into a mapping
//! of its own: the same file pages mapped again with `MAP_PRIVATE`, readable and
//! writable. Reading shares the page cache (no copy: tmpfs pages are mapped, not
//! copied); the first write to a page gives this mapping its own copy of that page, which
//! no other view and no other process sees, and which goes away with the tensor. The
//! sample stays borrowed for as long as the mapping exists (the capsule's owner holds
//! both), so the producer cannot reuse the pages meanwhile. Where no such mapping can be
//! made (memory that is not a shared file mapping, a segment removed from `/dev/shm`),
//! the caller copies instead.

use std::os::fd::AsRawFd;
use std::ptr::NonNull;

use sluice::shm::{Backing as Shared, backing_file};

/// What is behind some values, for a consumer that may write to them.
#[derive(Debug)]
pub enum Backing {
    /// Process memory: writes change this process's copy only.
    NotShared,
    /// Shared memory, mapped again privately: the mapping and the values' address in it.
    Private(PrivateMapping, *mut u8),
    /// Shared memory that cannot be mapped again (its file was removed): copy it.
    Unavailable,
}

/// A private, writable mapping of the file pages behind some shared memory; unmapped on
/// drop.
#[derive(Debug)]
pub struct PrivateMapping {
    base: NonNull<libc::c_void>,
    len: usize,
}

// SAFETY: the mapping is plain memory owned by this value alone; nothing in it is tied
// to the thread that created it, and munmap may be called from any thread.
unsafe impl Send for PrivateMapping {}
// SAFETY: `PrivateMapping` exposes no access to the memory through `&self`.
unsafe impl Sync for PrivateMapping {}

impl PrivateMapping {
    /// A private mapping of the pages behind `bytes`, if they are in a shared mapping.
    pub fn of(bytes: &[u8]) -> Backing {
        if bytes.is_empty() {
            return Backing::NotShared;
        }
        match backing_file(bytes.as_ptr() as usize, bytes.len()) {
            Shared::NotShared => Backing::NotShared,
            Shared::Unusable => Backing::Unavailable,
            Shared::File {
                path,
                inode,
                offset,
            } => match Self::map(&path, inode, offset, bytes.len()) {
                Some((mapping, data)) => Backing::Private(mapping, data),
                None => Backing::Unavailable,
            },
        }
    }

    fn map(
        file: &std::path::Path,
        inode: u64,
        file_offset: usize,
        len: usize,
    ) -> Option<(Self, *mut u8)> {
        // SAFETY: sysconf has no preconditions.
        let page = usize::try_from(unsafe { libc::sysconf(libc::_SC_PAGESIZE) }).ok()?;
        let aligned = file_offset - file_offset % page;
        let delta = file_offset - aligned;
        let len = delta + len;
        // Read access to the file is all a private writable mapping needs; the file
        // must still be the mapped one (a segment removed and created again under its
        // name would give another producer's pages).
        let file = sluice::shm::open_inode(file, inode).ok()?;
        let offset = libc::off_t::try_from(aligned).ok()?;
        // SAFETY: a new mapping at an address the kernel chooses (no MAP_FIXED), so no
        // existing memory is affected; `file` is an open descriptor, `len` is non-zero and
        // `offset` page-aligned. MAP_PRIVATE makes writes copy-on-write, never reaching
        // the file. The descriptor may be closed once the mapping exists.
        let base = unsafe {
            libc::mmap(
                std::ptr::null_mut(),
                len,
                libc::PROT_READ | libc::PROT_WRITE,
                libc::MAP_PRIVATE,
                file.as_raw_fd(),
                offset,
            )
        };
        if base == libc::MAP_FAILED {
            return None;
        }
        let base = NonNull::new(base)?;
        let mapping = Self { base, len };
        // SAFETY: `delta < len`, so the pointer stays inside the new mapping.
        let data = unsafe { base.as_ptr().cast::<u8>().add(delta) };
        Some((mapping, data))
    }
}

impl Drop for PrivateMapping {
    fn drop(&mut self) {
        // SAFETY: `base` and `len` describe a mapping this value created and nothing else
        // unmaps; the DLPack owner that holds it is dropped only by the tensor's deleter,
        // after the consumer stopped using the memory.
        unsafe { libc::munmap(self.base.as_ptr(), self.len) };
    }
}
