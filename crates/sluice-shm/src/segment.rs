//! The files behind shared memory, and read-only mappings of them of one's own.
//!
//! iceoryx2 maps a publisher's data segment into every subscriber and unmaps it when it
//! decides to (the last sample and port of a connection gone). Code that must control the
//! lifetime of a mapping itself — a CUDA host registration must end before its pages are
//! unmapped, or the driver keeps using pages that no longer back that address — maps the
//! same file again: [`backing_file`] finds the file and the offset behind an address of
//! this process (from `/proc/self/maps`, or the mapping it found last, checked to be
//! still there), and [`SegmentMap`] maps that file read-only,
//! shared, for as long as its owner wants. Both mappings show the same page-cache pages,
//! so what the producer writes is what the second mapping reads.

use std::ffi::CString;
use std::io::{BufRead, BufReader};
use std::os::unix::ffi::OsStrExt;
use std::path::{Path, PathBuf};
use std::ptr::NonNull;

/// Opens `path` for reading if it is still the file of inode `inode`: a path found in
/// `/proc/self/maps` may name another file by the time it is opened (a segment removed
/// and created again), whose pages must not be taken for the mapped ones.
pub fn open_inode(path: &Path, inode: u64) -> std::io::Result<std::fs::File> {
    use std::os::unix::fs::MetadataExt;
    let file = std::fs::File::open(path)?;
    if file.metadata()?.ino() != inode {
        return Err(std::io::Error::new(
            std::io::ErrorKind::NotFound,
            format!("{} is another file than the one mapped", path.display()),
        ));
    }
    Ok(file)
}

/// What is behind an address range of this process.
#[derive(Debug, Clone, PartialEq, Eq)]
pub enum Backing {
    /// Not in a shared mapping (heap, stack, private mappings).
    NotShared,
    /// In a shared mapping whose file cannot be opened again (removed, anonymous) or that
    /// the range runs past.
    Unusable,
    /// In a shared mapping of `path` (inode `inode`), at byte `offset` of the file.
    File {
        /// The file's path.
        path: PathBuf,
        /// Its inode, as `/proc/self/maps` reports it.
        inode: u64,
        /// Offset of the range's first byte in the file.
        offset: usize,
    },
}

/// The file and the offset in it behind `[addr, addr + len)`, when that range lies in one
/// shared file mapping of this process. Reads `/proc/self/maps`, except when the range
/// lies in the mapping found last and that mapping is checked to be still there (see
/// `LastSegment`); to look up several ranges at once, read [`Maps`] once.
pub fn backing_file(addr: usize, len: usize) -> Backing {
    if let Some(found) = LastSegment::lookup(addr, len) {
        return found;
    }
    match Maps::read() {
        Ok(maps) => {
            LastSegment::remember(&maps, addr);
            maps.backing(addr, len)
        }
        Err(_) => Backing::Unusable,
    }
}

/// The last whole-file shared mapping [`backing_file`] found.
///
/// Reading `/proc/self/maps` costs tens of microseconds (the kernel formats every
/// mapping of the process, a Python process has hundreds), and a Python trainer looks
/// up every column of every batch it exports over DLPack (profile in
/// docs/benchmarks.md), nearly always in the same segment. A remembered mapping answers
/// only after two `stat` calls show it unchanged: `/proc/self/map_files/START-END`
/// exists only while a mapping of exactly that range does, and names the mapped file,
/// whose inode and size must be the remembered ones (a mapping of a whole file, at
/// offset 0, is the only kind remembered, so the range and the file fix the offsets);
/// and the path must still name that inode, as a segment removed and created again
/// under the same name would not.
struct LastSegment {
    start: usize,
    end: usize,
    inode: u64,
    path: PathBuf,
}

static LAST_SEGMENT: std::sync::Mutex<Option<LastSegment>> = std::sync::Mutex::new(None);

impl LastSegment {
    fn lookup(addr: usize, len: usize) -> Option<Backing> {
        let last = LAST_SEGMENT.lock().unwrap_or_else(|p| p.into_inner());
        let seg = last.as_ref()?;
        let end = addr.checked_add(len)?;
        if addr < seg.start || end > seg.end || !seg.is_current() {
            return None;
        }
        Some(Backing::File {
            path: seg.path.clone(),
            inode: seg.inode,
            offset: addr - seg.start,
        })
    }

    fn is_current(&self) -> bool {
        use std::os::unix::fs::MetadataExt;
        let mapped = std::fs::metadata(format!(
            "/proc/self/map_files/{:x}-{:x}",
            self.start, self.end
        ));
        let named = std::fs::metadata(&self.path);
        match (mapped, named) {
            (Ok(m), Ok(n)) => {
                m.ino() == self.inode
                    && n.ino() == self.inode
                    && m.dev() == n.dev()
                    && page_round(m.len()) == Some(self.end - self.start)
            }
            _ => false,
        }
    }

    fn remember(maps: &Maps, addr: usize) {
        use std::os::unix::fs::MetadataExt;
        let i = maps.0.partition_point(|e| e.end <= addr);
        let Some(e) = maps.0.get(i).filter(|e| e.start <= addr) else {
            return;
        };
        if !e.shared || e.offset != 0 || !e.path.starts_with('/') || e.path.ends_with(" (deleted)")
        {
            return;
        }
        let whole = std::fs::metadata(&e.path)
            .is_ok_and(|m| m.ino() == e.inode && page_round(m.len()) == Some(e.end - e.start));
        if whole {
            *LAST_SEGMENT.lock().unwrap_or_else(|p| p.into_inner()) = Some(LastSegment {
                start: e.start,
                end: e.end,
                inode: e.inode,
                path: PathBuf::from(&e.path),
            });
        }
    }
}

/// `len` rounded up to whole pages.
fn page_round(len: u64) -> Option<usize> {
    // SAFETY: sysconf has no preconditions.
    let page = usize::try_from(unsafe { libc::sysconf(libc::_SC_PAGESIZE) }).ok()?;
    usize::try_from(len).ok()?.checked_next_multiple_of(page)
}

/// One line of `/proc/self/maps`.
#[derive(Debug, Clone)]
struct MapEntry {
    start: usize,
    end: usize,
    shared: bool,
    offset: usize,
    inode: u64,
    path: String,
}

/// The mappings of this process at one moment (`/proc/self/maps`), to look up where
/// several address ranges are with one read. Only valid while the ranges looked up stay
/// mapped: hold what keeps them mapped (the samples) while using the answers.
#[derive(Debug, Clone)]
pub struct Maps(Vec<MapEntry>);

impl Maps {
    /// Reads the process's mappings.
    pub fn read() -> std::io::Result<Self> {
        let maps = std::fs::File::open("/proc/self/maps")?;
        let mut entries = Vec::new();
        for line in BufReader::new(maps).lines() {
            let line = line?;
            // start-end perms offset dev inode path
            let mut fields = line.split_whitespace();
            let (Some(range), Some(perms), Some(offset), Some(_dev), Some(inode)) = (
                fields.next(),
                fields.next(),
                fields.next(),
                fields.next(),
                fields.next(),
            ) else {
                continue;
            };
            let Some((start, end)) = range.split_once('-') else {
                continue;
            };
            let (Ok(start), Ok(end), Ok(offset), Ok(inode)) = (
                usize::from_str_radix(start, 16),
                usize::from_str_radix(end, 16),
                usize::from_str_radix(offset, 16),
                inode.parse::<u64>(),
            ) else {
                continue;
            };
            entries.push(MapEntry {
                start,
                end,
                shared: perms.as_bytes().get(3) == Some(&b's'),
                offset,
                inode,
                path: fields.collect::<Vec<_>>().join(" "),
            });
        }
        Ok(Self(entries))
    }

    /// Where `[addr, addr + len)` is (see [`backing_file`]).
    pub fn backing(&self, addr: usize, len: usize) -> Backing {
        // Lines are sorted by address.
        let i = self.0.partition_point(|e| e.end <= addr);
        let Some(e) = self.0.get(i).filter(|e| e.start <= addr) else {
            return Backing::NotShared;
        };
        if !e.shared {
            return Backing::NotShared;
        }
        // A removed file shows as "PATH (deleted)": it cannot be opened again.
        if !e.path.starts_with('/') || e.path.ends_with(" (deleted)") || addr + len > e.end {
            return Backing::Unusable;
        }
        Backing::File {
            path: PathBuf::from(&e.path),
            inode: e.inode,
            offset: e.offset + (addr - e.start),
        }
    }
}

/// A whole shared-memory file mapped read-only and shared, unmapped on drop.
#[derive(Debug)]
pub struct SegmentMap {
    base: NonNull<libc::c_void>,
    len: usize,
    path: PathBuf,
    inode: u64,
}

// SAFETY: the mapping is owned by this value alone and only ever read through raw
// pointers; munmap may be called from any thread.
unsafe impl Send for SegmentMap {}
// SAFETY: `&self` gives only addresses and metadata, never references into the memory.
unsafe impl Sync for SegmentMap {}

impl SegmentMap {
    /// Maps all of `path` (as it is now) read-only.
    pub fn open(path: &Path) -> std::io::Result<Self> {
        let c_path = CString::new(path.as_os_str().as_bytes())
            .map_err(|e| std::io::Error::new(std::io::ErrorKind::InvalidInput, e))?;
        // SAFETY: a valid NUL-terminated path; the descriptor is closed below.
        let fd = unsafe { libc::open(c_path.as_ptr(), libc::O_RDONLY | libc::O_CLOEXEC) };
        if fd < 0 {
            return Err(std::io::Error::last_os_error());
        }
        let result = Self::map_fd(fd, path);
        // SAFETY: `fd` was opened above and is closed once; a mapping outlives its fd.
        unsafe { libc::close(fd) };
        result
    }

    fn map_fd(fd: libc::c_int, path: &Path) -> std::io::Result<Self> {
        // SAFETY: `stat` is plain data; all zeroes is a valid value to overwrite.
        let mut st: libc::stat = unsafe { std::mem::zeroed() };
        // SAFETY: `fd` is open and `st` a valid out-pointer.
        if unsafe { libc::fstat(fd, &mut st) } != 0 {
            return Err(std::io::Error::last_os_error());
        }
        let len = usize::try_from(st.st_size)
            .ok()
            .filter(|&n| n > 0)
            .ok_or_else(|| {
                std::io::Error::new(
                    std::io::ErrorKind::InvalidData,
                    format!("{} is empty", path.display()),
                )
            })?;
        // SAFETY: a new mapping at an address the kernel chooses (no MAP_FIXED), so no
        // existing memory is affected; `fd` is open and `len` non-zero. PROT_READ: this
        // process never writes the producer's memory.
        let base = unsafe {
            libc::mmap(
                std::ptr::null_mut(),
                len,
                libc::PROT_READ,
                libc::MAP_SHARED,
                fd,
                0,
            )
        };
        if base == libc::MAP_FAILED {
            return Err(std::io::Error::last_os_error());
        }
        let base = NonNull::new(base).ok_or_else(|| {
            std::io::Error::new(std::io::ErrorKind::InvalidData, "mmap returned null")
        })?;
        Ok(Self {
            base,
            len,
            path: path.to_path_buf(),
            inode: st.st_ino,
        })
    }

    /// The address of the file's first byte in this mapping.
    pub fn base(&self) -> *const u8 {
        self.base.as_ptr().cast()
    }

    /// Bytes mapped (the file's size when it was mapped).
    pub fn len(&self) -> usize {
        self.len
    }

    /// Whether the mapping is empty (never: empty files are refused).
    pub fn is_empty(&self) -> bool {
        self.len == 0
    }

    /// The file's inode.
    pub fn inode(&self) -> u64 {
        self.inode
    }

    /// The file's path.
    pub fn path(&self) -> &Path {
        &self.path
    }

    /// Whether this maps `path`'s file `inode`.
    pub fn is(&self, path: &Path, inode: u64) -> bool {
        self.inode == inode && self.path == path
    }

    /// Whether the path still names the mapped file (a producer that went away removed
    /// it; a new one may have created another under the same name).
    pub fn is_current(&self) -> bool {
        std::fs::metadata(&self.path)
            .is_ok_and(|m| std::os::unix::fs::MetadataExt::ino(&m) == self.inode)
    }

    /// The address in this mapping of the file's byte `offset`, when `offset..offset +
    /// len` lies in the mapping.
    pub fn at(&self, offset: usize, len: usize) -> Option<*const u8> {
        let end = offset.checked_add(len)?;
        // SAFETY: `offset <= end <= self.len`, so the pointer stays inside the mapping.
        (end <= self.len).then(|| unsafe { self.base().add(offset) })
    }

    /// Copies `len` bytes at file offset `offset` out (tests, checks).
    pub fn read(&self, offset: usize, len: usize) -> Option<Vec<u8>> {
        let src = self.at(offset, len)?;
        let mut out = vec![0u8; len];
        // SAFETY: `src..src + len` is inside the live mapping (`at` checked it) and `out`
        // is a distinct allocation of `len` bytes. Raw copy, no reference: the producer
        // may write other parts of the file meanwhile.
        unsafe { std::ptr::copy_nonoverlapping(src, out.as_mut_ptr(), len) };
        Some(out)
    }
}

impl Drop for SegmentMap {
    fn drop(&mut self) {
        // SAFETY: `base`/`len` describe the mapping this value created and nothing else
        // unmaps it; owners that registered it elsewhere (CUDA) unregister first.
        unsafe { libc::munmap(self.base.as_ptr(), self.len) };
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use std::io::Write;

    #[test]
    fn heap_memory_is_not_shared() {
        let v = vec![1u8; 4096];
        assert_eq!(
            backing_file(v.as_ptr() as usize, v.len()),
            Backing::NotShared
        );
    }

    #[test]
    fn a_shared_file_mapping_is_found_and_mapped_again_with_the_same_bytes() {
        let path = std::env::temp_dir().join(format!(
            "sluice-segment-test-{}-{:?}",
            std::process::id(),
            std::thread::current().id()
        ));
        let mut f = std::fs::File::create(&path).unwrap();
        let data: Vec<u8> = (0..3 * 4096u32).map(|i| (i % 251) as u8).collect();
        f.write_all(&data).unwrap();
        drop(f);
        let first = SegmentMap::open(&path).unwrap();
        // An address inside `first`, as iceoryx2's mapping would be.
        let addr = first.base() as usize + 5000;
        let Backing::File {
            path: found,
            inode,
            offset,
        } = backing_file(addr, 100)
        else {
            panic!("not found")
        };
        assert_eq!(offset, 5000);
        assert!(first.is(&found, inode) && first.is_current());
        let second = SegmentMap::open(&found).unwrap();
        assert_eq!(second.read(offset, 100).unwrap(), &data[5000..5100]);
        assert!(second.at(3 * 4096 - 10, 11).is_none());
        // Running past the end of the mapping is not usable.
        assert_eq!(backing_file(addr, 3 * 4096), Backing::Unusable);
        // One read answers for several ranges.
        let maps = Maps::read().unwrap();
        assert_eq!(maps.backing(addr, 100), backing_file(addr, 100));
        assert_eq!(
            maps.backing(first.base() as usize, 1),
            Backing::File {
                path: found.clone(),
                inode,
                offset: 0
            }
        );
        std::fs::remove_file(&path).unwrap();
        assert!(!second.is_current());
    }

    #[test]
    fn a_path_is_opened_again_only_while_it_names_the_same_inode() {
        use std::os::unix::fs::MetadataExt;
        let dir = std::env::temp_dir().join(format!("sluice-inode-{}", std::process::id()));
        std::fs::create_dir_all(&dir).unwrap();
        let (path, other) = (dir.join("segment"), dir.join("other"));
        std::fs::write(&path, b"mapped").unwrap();
        let inode = std::fs::metadata(&path).unwrap().ino();
        assert!(open_inode(&path, inode).is_ok());
        // Removed and created again under the same name: another file.
        std::fs::write(&other, b"someone else's").unwrap();
        std::fs::rename(&other, &path).unwrap();
        let err = open_inode(&path, inode).unwrap_err();
        assert_eq!(err.kind(), std::io::ErrorKind::NotFound);
        std::fs::remove_dir_all(&dir).unwrap();
    }

    #[test]
    fn a_remembered_mapping_answers_only_while_it_is_still_the_same_file() {
        use std::os::fd::AsRawFd;
        let dir = std::env::temp_dir().join(format!("sluice-remember-{}", std::process::id()));
        std::fs::create_dir_all(&dir).unwrap();
        let write = |name: &str, byte: u8| {
            let path = dir.join(name);
            std::fs::write(&path, vec![byte; 2 * 4096]).unwrap();
            path
        };
        let a = write("a", 1);
        let map = SegmentMap::open(&a).unwrap();
        let addr = map.base() as usize + 100;
        let found = |addr| match backing_file(addr, 10) {
            Backing::File { path, offset, .. } => Some((path, offset)),
            _ => None,
        };
        // Found from /proc/self/maps, then remembered: the same answer.
        assert_eq!(found(addr), Some((a.clone(), 100)));
        assert_eq!(found(addr + 4096), Some((a.clone(), 4196)));

        // Another file mapped over exactly the same range: found, not remembered.
        let b = write("b", 2);
        let file = std::fs::File::open(&b).unwrap();
        // SAFETY: MAP_FIXED replaces `map`'s own pages (same address and length) with a
        // read-only shared mapping of `b`; nothing else uses that range, and `map`'s
        // drop unmaps it.
        let fixed = unsafe {
            libc::mmap(
                map.base().cast_mut().cast(),
                2 * 4096,
                libc::PROT_READ,
                libc::MAP_SHARED | libc::MAP_FIXED,
                file.as_raw_fd(),
                0,
            )
        };
        assert_eq!(fixed as usize, map.base() as usize);
        assert_eq!(found(addr), Some((b.clone(), 100)));

        // `b` removed and a new file made under its name: the mapping shows the old,
        // deleted file, which cannot be mapped again.
        std::fs::remove_file(&b).unwrap();
        write("b", 3);
        assert_eq!(backing_file(addr, 10), Backing::Unusable);
        drop(map);
        std::fs::remove_dir_all(&dir).unwrap();
    }
}
