//! Files whose lock says that the process holding it lives: producers' claims
//! ([`crate::claim`]) and subscribers' declared interest ([`crate::interest`]).
//!
//! # Why POSIX record locks
//! The lock is a POSIX record lock (`fcntl(F_SETLK)`) on the whole file, as iceoryx2's
//! node monitors use. The kernel releases it when its process dies, however it dies. Unlike
//! an `flock`, it belongs to the process and not to the open file, so a child that the
//! holder forks does not inherit it: with `flock`, a Python producer that forked its
//! trainers (`multiprocessing`'s default on Linux) left its claim to them when it was
//! killed, and its restart failed with `TopicBusy` for as long as they lived.
//!
//! # What that asks of this process
//! A process never conflicts with its own record locks, and closing *any* of its
//! descriptors of a file drops every lock it holds on that file. So this process must
//! never open a file it holds to look at it. Every lock taken here is registered in
//! [`Held`], and the lookers (the claim's sweep, the interest scan) take the registry
//! and skip what it holds. Taking a lock and registering it happen under the registry's
//! mutex, so that no thread of this process looks at a file another thread of it is
//! locking.
//!
//! Registrations carry the holder's process id. A forked child inherits the memory, but
//! not the locks: entries of another process id are not this process's, and neither is
//! the file they name (the child must not remove it when it drops its copy of the
//! holder).
//!
//! # Limit
//! A child forked while another thread of its parent held the registry's mutex (for a
//! lock's system calls, or a sweep of the claims or of a topic's registrations) cannot
//! take it: that child would wait forever if it then claimed a topic or declared
//! interest. (Dropping a copy it inherited looks at the owner first and never takes the
//! mutex.) Forking a multi-threaded process has that hazard for every lock it holds;
//! Python warns about it since 3.12, and docs/python.md says to prefer 'spawn'.

use std::collections::HashSet;
use std::fs::File;
use std::os::fd::AsRawFd;
use std::path::{Path, PathBuf};
use std::sync::{Mutex, MutexGuard, PoisonError};

/// The files this process holds locks on, with the holder's process id.
#[derive(Debug, Default)]
pub(crate) struct Held {
    files: HashSet<(u32, PathBuf)>,
}

static HELD: Mutex<Option<Held>> = Mutex::new(None);

/// The registry of this process's locks; held while a lock is taken, given up, or a
/// file that may be this process's is looked at.
pub(crate) struct Registry(MutexGuard<'static, Option<Held>>);

/// Takes the registry.
pub(crate) fn registry() -> Registry {
    // Nothing that panics runs under this lock; if something did, the set is still whole.
    Registry(HELD.lock().unwrap_or_else(PoisonError::into_inner))
}

impl Registry {
    fn held(&mut self) -> &mut Held {
        self.0.get_or_insert_with(Held::default)
    }

    /// Whether this process holds the lock on `path`.
    pub(crate) fn holds(&mut self, path: &Path) -> bool {
        let key = (crate::process::id(), path.to_path_buf());
        self.held().files.contains(&key)
    }

    /// Locks `file` (at `path`) for this process and registers it. `Ok(false)`: another
    /// process holds it.
    pub(crate) fn lock(&mut self, file: &File, path: &Path) -> std::io::Result<bool> {
        if !try_lock(file)? {
            return Ok(false);
        }
        self.held()
            .files
            .insert((crate::process::id(), path.to_path_buf()));
        Ok(true)
    }

    /// Tries the lock of a file this process does not hold (see [`Registry::holds`]):
    /// `Ok(true)` if nobody held it, and then this process holds it until `file` is
    /// closed, unregistered.
    pub(crate) fn probe(&mut self, file: &File) -> std::io::Result<bool> {
        try_lock(file)
    }

    /// Forgets this process's lock on `path`, before its file is closed.
    pub(crate) fn release(&mut self, path: &Path) {
        let key = (crate::process::id(), path.to_path_buf());
        self.held().files.remove(&key);
    }
}

/// A file this process holds locked (a claim, a registration): when dropped, it is removed
/// while still locked (so a looker never mistakes it for a dead process's) and closed
/// under the registry.
#[derive(Debug)]
pub(crate) struct LockedFile {
    path: PathBuf,
    // The process that holds the lock: a forked child has a copy of this value, but
    // neither the lock nor the file.
    owner: crate::process::Owner,
    // Holds the lock; closing the file releases it. Closed under the registry (see
    // `Drop`), as every descriptor of such a file is.
    file: Option<File>,
}

impl LockedFile {
    /// `file`, at `path`, which this process has just locked under the registry.
    pub(crate) fn new(path: PathBuf, file: File) -> Self {
        Self {
            path,
            owner: crate::process::Owner::this(),
            file: Some(file),
        }
    }

    /// The path.
    pub(crate) fn path(&self) -> &Path {
        &self.path
    }

    /// The open file, in the process that holds it (`None` in a forked child's copy).
    pub(crate) fn file(&self) -> Option<&File> {
        self.file.as_ref().filter(|_| self.owner.is_here())
    }
}

impl Drop for LockedFile {
    fn drop(&mut self) {
        // A forked child's copy: the file is its parent's. (Asked before the registry,
        // which a thread of the parent may have held at the fork.) Left open: closing
        // it could drop a lock this child took on the file meanwhile (a look at it,
        // under this child's registry).
        if !self.owner.is_here_for_sure() {
            std::mem::forget(self.file.take());
            return;
        }
        let mut held = registry();
        let _ = std::fs::remove_file(&self.path);
        held.release(&self.path);
        drop(self.file.take());
    }
}

/// An exclusive record lock on the whole of `file`, without waiting: `Ok(false)` if
/// another process holds a lock on it.
fn try_lock(file: &File) -> std::io::Result<bool> {
    // SAFETY: `flock` is plain data, for which all zeroes is a valid value (the fields
    // not set below stay zero, as POSIX expects of them).
    let mut lock: libc::flock = unsafe { std::mem::zeroed() };
    lock.l_type = libc::F_WRLCK as libc::c_short;
    lock.l_whence = libc::SEEK_SET as libc::c_short;
    lock.l_start = 0;
    // Zero: to the end of the file, however it grows.
    lock.l_len = 0;
    // SAFETY: the descriptor is `file`'s, open for writing (as F_WRLCK needs) for the
    // whole call since `file` is borrowed; `lock` is a valid `flock` that F_SETLK only
    // reads.
    let rc = unsafe { libc::fcntl(file.as_raw_fd(), libc::F_SETLK, &lock) };
    if rc == 0 {
        return Ok(true);
    }
    let error = std::io::Error::last_os_error();
    match error.raw_os_error() {
        // POSIX allows either for a lock held elsewhere.
        Some(libc::EACCES | libc::EAGAIN) => Ok(false),
        _ => Err(error),
    }
}
