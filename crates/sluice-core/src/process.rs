//! What belongs to the process that made it, and what a forked child does with its copy.
//!
//! A child forked by a process that holds Sluice's ports, samples, GPU handles or a
//! producer's thread (a Python trainer's `os.fork()`, a `multiprocessing` worker with the
//! `fork` start method, a DataLoader worker) gets a copy of them: handles on its parent's
//! shared queues, samples, nodes, services and driver state. Using them would take
//! messages from the parent's queue; dropping them (a child that exits normally runs its
//! destructors) would give the parent's samples back a second time, deregister its ports
//! and remove its node, so that the parent loses messages or reads memory the producer
//! reuses. So a child never does either:
//! - an [`Owner`] says which process made something, at the cost of a load ([`id`]);
//! - [`Local`] holds such a handle and drops it only in the process that made it; a
//!   child's copy is forgotten (its memory is the child's own, and goes with it);
//! - what would use one in a child fails with [`SluiceError::Forked`] first.
//!
//! `Local`'s `DerefMut` is for the owning process: assigning through it in a child would
//! drop the old value there, so every method that may replace a `Local`'s value refuses
//! to run in a child first.

use std::mem::ManuallyDrop;
use std::sync::Once;
use std::sync::atomic::{AtomicU32, Ordering};

use crate::SluiceError;

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

/// The process that made something.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub struct Owner(u32);

impl Owner {
    /// This process.
    pub fn this() -> Self {
        Self(id())
    }

    /// Its process id.
    pub fn pid(self) -> u32 {
        self.0
    }

    /// Whether this is the process that made it (a load: see [`id`]).
    pub fn is_here(self) -> bool {
        self.0 == id()
    }

    /// The same, asked of the system: for the rare drop that removes a file, which a
    /// child forked without the atfork handlers (`_Fork`, a raw `clone`) must not take
    /// for its own.
    pub fn is_here_for_sure(self) -> bool {
        self.0 == std::process::id()
    }

    /// `Ok` in the process that made it; [`SluiceError::Forked`] in a forked child.
    pub fn check(self, what: &'static str) -> Result<(), SluiceError> {
        if self.is_here() {
            Ok(())
        } else {
            Err(SluiceError::Forked {
                what,
                owner: self.0,
            })
        }
    }
}

/// A value that belongs to the process that made it: dropped there, forgotten in a
/// forked child (see the module's documentation).
pub struct Local<T> {
    owner: Owner,
    value: ManuallyDrop<T>,
}

impl<T> Local<T> {
    /// `value`, owned by this process.
    pub fn new(value: T) -> Self {
        Self {
            owner: Owner::this(),
            value: ManuallyDrop::new(value),
        }
    }

    /// Whether this is the process that made it.
    pub fn is_here(&self) -> bool {
        self.owner.is_here()
    }

    /// `Ok` in the process that made it; [`SluiceError::Forked`] in a forked child.
    pub fn here(&self, what: &'static str) -> Result<(), SluiceError> {
        self.owner.check(what)
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
