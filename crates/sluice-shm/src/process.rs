//! What belongs to the process that made it, and what a forked child does with its copy.
//!
//! A child forked by a process that holds Sluice's ports (a Python trainer's
//! `os.fork()`, a `multiprocessing` worker with the `fork` start method, a DataLoader
//! worker) gets a copy of their memory: handles on the same shared queues, samples,
//! nodes and services as its parent. Using them would take messages from the parent's
//! queue, and dropping them (a child that exits normally runs its destructors) would
//! give the parent's samples back a second time, deregister its ports and remove its
//! node, so that the parent loses messages or reads memory the producer reuses. So a
//! child never does either:
//! - [`Local`] holds such a handle and drops it only in the process that made it; a
//!   child's copy is forgotten (its memory is the child's own, and goes with it);
//! - ports refuse to be used in another process with [`SluiceError::Forked`]; a child
//!   subscribes itself, after the fork;
//! - except where iceoryx2's identity of the process, which a fork copies, would make
//!   the child and its parent take each other for alive forever ([`forked_identity`]):
//!   such a child may not produce, nor subscribe to its parent's topics
//!   ([`SluiceError::ForkedIdentity`]).
//!
//! `Local`'s `DerefMut` is for the owning process: assigning through it in a child
//! would drop the old value there, so every method that may replace a `Local`'s value
//! refuses to run in a child first.

use std::mem::ManuallyDrop;
use std::sync::Once;
use std::sync::atomic::{AtomicU32, Ordering};

use sluice_core::SluiceError;

/// This process's id, kept current in forked children by a `pthread_atfork` handler, so
/// that a check costs a load and not a system call.
static PID: AtomicU32 = AtomicU32::new(0);
static HOOK: Once = Once::new();

extern "C" fn forked() {
    // SAFETY: getpid has no preconditions, cannot fail, and is async-signal-safe, as a
    // handler run in a child of a multi-threaded process must be.
    let pid = unsafe { libc::getpid() };
    PID.store(pid as u32, Ordering::Relaxed);
}

/// This process's id (`std::process::id`, without a system call).
pub fn id() -> u32 {
    HOOK.call_once(|| {
        PID.store(std::process::id(), Ordering::Relaxed);
        // SAFETY: registers a child handler that only stores an atomic (above); no
        // preparation or parent handler. It fails only without memory for the entry,
        // and then `id` falls back to the system call below.
        if unsafe { libc::pthread_atfork(None, None, Some(forked)) } != 0 {
            PID.store(0, Ordering::Relaxed);
        }
    });
    match PID.load(Ordering::Relaxed) {
        0 => std::process::id(),
        pid => pid,
    }
}

/// iceoryx2's identity of the process (the host's pid in it), and this process's id when
/// Sluice first made sure of it: before its first node.
static IDENTITY: std::sync::OnceLock<(u32, u32)> = std::sync::OnceLock::new();

/// Makes iceoryx2 settle this process's identity now, before Sluice's first node, and
/// notes which process that was; see [`forked_identity`].
pub(crate) fn note_identity() {
    IDENTITY.get_or_init(|| {
        let identity = iceoryx2_bb_posix::process::Process::unique_id()
            .map_or(0, |id| id.pid().value() as u32);
        (identity, id())
    });
}

/// The process whose iceoryx2 identity this one has, when that is another: this process
/// was forked after that one first used Sluice. iceoryx2 settles a process's identity at
/// its first use (`Process::unique_id`) and keeps it for good, forks included; it writes
/// it into every node the process creates, and takes a node monitor whose identity is
/// the reader's own for alive without looking at its lock (a process's own locks never
/// conflict with it). So the parent and such a child each see the other's nodes as
/// alive, forever: a subscriber forked from its producer would never learn that the
/// producer died, nor the producer that the subscriber did. `None` in every other
/// process. (Known from the process id noted at the first use, which a fork keeps, and
/// this process's, which the atfork handler keeps current: nothing is read from `/proc`.)
pub fn forked_identity() -> Option<u32> {
    let &(identity, noted_in) = IDENTITY.get()?;
    (noted_in != id()).then_some(identity)
}

/// A value that belongs to the process that made it: dropped there, forgotten in a
/// forked child (see the module's documentation).
pub struct Local<T> {
    owner: u32,
    value: ManuallyDrop<T>,
}

impl<T> Local<T> {
    /// `value`, owned by this process.
    pub fn new(value: T) -> Self {
        Self {
            owner: id(),
            value: ManuallyDrop::new(value),
        }
    }

    /// Whether this is the process that made it.
    pub fn is_here(&self) -> bool {
        self.owner == id()
    }

    /// `Ok` in the process that made it; [`SluiceError::Forked`] in a forked child.
    pub fn here(&self, what: &'static str) -> Result<(), SluiceError> {
        if self.is_here() {
            Ok(())
        } else {
            Err(SluiceError::Forked {
                what,
                owner: self.owner,
            })
        }
    }
}

impl<T> std::ops::Deref for Local<T> {
    type Target = T;
    fn deref(&self) -> &T {
        &self.value
    }
}

impl<T> std::ops::DerefMut for Local<T> {
    fn deref_mut(&mut self) -> &mut T {
        &mut self.value
    }
}

impl<T> Drop for Local<T> {
    fn drop(&mut self) {
        if self.is_here() {
            // SAFETY: the value is dropped once, here, and `self` is never used again.
            unsafe { ManuallyDrop::drop(&mut self.value) };
        }
        // In a forked child the value stays undropped: its memory is the child's copy,
        // and its handles are the parent's.
    }
}

impl<T: std::fmt::Debug> std::fmt::Debug for Local<T> {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        self.value.fmt(f)
    }
}
