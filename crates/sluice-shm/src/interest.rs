//! Declared interest: subscribers that wait for a topic say so where its producer looks.
//!
//! Trainers usually start before their producer. Without a declaration, a producer that
//! creates its topic and publishes at once can be through its first batches (or its
//! whole run) before the waiting subscribers, polling for the topic, manage to attach:
//! the PUB/SUB join race. So a subscriber that waits for a topic first registers under
//! `<service directory>/interest/<topic>/`, and a producer that has just created the topic waits
//! until every live registration is gone (each subscriber removes its own once it is
//! attached) before it publishes, bounded by a grace period (`sluice.attach_grace_s`).
//!
//! # Liveness
//! A registration is a file on which its subscriber's process holds an exclusive lock
//! for as long as it waits. The kernel releases the lock when the process dies, however
//! it dies, so a producer that can take the lock knows the registration is stale and
//! removes it: a SIGKILLed subscriber never holds a producer back. Locks rather than
//! PIDs, because a lock cannot be kept alive by a reused PID and works across PID
//! namespaces; record locks, which a forked child does not inherit (see [`crate::lock`]).
//! A registration is created under a temporary name, locked, then renamed into place,
//! so a producer never sees an unlocked live registration. Those of this process
//! (a producer and its subscribers on threads of one process) are known from its
//! registry of locks.
//!
//! # Limits
//! A subscriber that is alive but not running (stopped with SIGSTOP, or starved for
//! longer than the grace period) holds the producer back for the grace period only; the
//! producer then logs how many did not attach and starts without them, and they join
//! late (and are told so, as any late subscriber is).

use std::fs::{File, OpenOptions};
use std::path::{Path, PathBuf};
use std::sync::atomic::{AtomicU64, Ordering};
use std::time::{Duration, SystemTime};

use sluice_core::{Result, SluiceError, TopicName};

use crate::Namespace;
use crate::lock::registry;
use crate::process::Owner;

/// A temporary registration older than this whose lock can be taken was left by a
/// process that died between creating and renaming it.
const STALE_TEMPORARY: Duration = Duration::from_secs(60);

static NEXT: AtomicU64 = AtomicU64::new(0);

/// A subscriber's declared interest in a topic, held while it waits to attach. Dropping
/// it withdraws the declaration.
#[derive(Debug)]
pub struct Interest {
    path: PathBuf,
    // The process that holds the lock: a forked child's copy holds neither it nor the
    // file.
    owner: Owner,
    // Holds the lock; closing the file releases it. Closed under the registry (see
    // `Drop`).
    file: Option<File>,
}

impl Interest {
    /// Declares that this process waits for `topic` in `namespace`.
    pub fn declare(namespace: &Namespace, topic: &TopicName) -> Result<Self> {
        namespace.prepare_root()?;
        let dir = interest_dir(namespace, topic);
        create_private_dir(&dir)?;
        // Unique across processes that share the directory from different PID
        // namespaces (containers sharing /dev/shm, each with its own pid 1) and across
        // forked siblings (which copy the counter): the random part tells them apart.
        let name = format!(
            "{}-{}-{:016x}",
            crate::process::id(),
            NEXT.fetch_add(1, Ordering::Relaxed),
            random_u64()
        );
        let tmp = dir.join(format!(".{name}.tmp"));
        let path = dir.join(&name);
        // Under the registry: no thread of this process looks at the registration
        // between its lock and its entry in the registry.
        let mut held = registry();
        let file = {
            use std::os::unix::fs::OpenOptionsExt;
            // Writable by its owner whatever the umask: lookers lock it for writing.
            OpenOptions::new()
                .write(true)
                // Never another's file: a name taken is an error, not a shared file.
                .create_new(true)
                .mode(0o600)
                .open(&tmp)
                .map_err(|e| {
                    SluiceError::io(format!("cannot declare interest in {}", tmp.display()), e)
                })?
        };
        // A fresh file nobody else has opened: the lock is free.
        match held.lock(&file, &path) {
            Ok(true) => {}
            Ok(false) => {
                let _ = std::fs::remove_file(&tmp);
                return Err(SluiceError::Transport(format!(
                    "cannot lock {}: another process holds a lock on a file just created",
                    tmp.display()
                )));
            }
            Err(e) => {
                let _ = std::fs::remove_file(&tmp);
                return Err(SluiceError::io(format!("cannot lock {}", tmp.display()), e));
            }
        }
        if let Err(e) = std::fs::rename(&tmp, &path) {
            let _ = std::fs::remove_file(&tmp);
            held.release(&path);
            return Err(SluiceError::io(
                format!("cannot declare interest in {}", path.display()),
                e,
            ));
        }
        Ok(Self {
            path,
            owner: Owner::this(),
            file: Some(file),
        })
    }
}

impl Drop for Interest {
    fn drop(&mut self) {
        // A forked child's copy: the registration is its parent's (see `Claim`'s drop);
        // its descriptor stays open, as closing it could drop a lock this child took on
        // the file meanwhile (a look at it, under this child's registry).
        if !self.owner.is_here_for_sure() {
            std::mem::forget(self.file.take());
            return;
        }
        let mut held = registry();
        // Removed while still locked, so a producer never mistakes it for a dead one's.
        let _ = std::fs::remove_file(&self.path);
        held.release(&self.path);
        drop(self.file.take());
    }
}

/// 64 random bits from the kernel (falling back to the clock's nanoseconds, which still
/// differ between processes in practice).
fn random_u64() -> u64 {
    let mut bytes = [0u8; 8];
    // SAFETY: the buffer is valid for writes of its 8 bytes for the whole call, and
    // getrandom writes at most that many.
    let got = unsafe { libc::getrandom(bytes.as_mut_ptr().cast(), bytes.len(), 0) };
    if got == bytes.len() as isize {
        u64::from_ne_bytes(bytes)
    } else {
        SystemTime::now()
            .duration_since(SystemTime::UNIX_EPOCH)
            .map_or(0, |d| d.as_nanos() as u64)
    }
}

/// The live registrations for `topic`: subscribers that wait to attach to it. Removes
/// the registrations of processes that died.
pub fn pending_interest(namespace: &Namespace, topic: &TopicName) -> usize {
    live_in(&interest_dir(namespace, topic))
}

/// Removes the registrations of dead processes for every topic of `namespace` (part of
/// [`Namespace::reclaim_dead`]: a subscriber killed while it waited for a topic that no
/// producer created since leaves one).
pub(crate) fn sweep(namespace: &Namespace) {
    let topics = std::fs::read_dir(namespace.root().join("interest"));
    for topic in topics.into_iter().flatten().flatten() {
        live_in(&topic.path());
    }
}

/// The live registrations in `dir`; removes those of processes that died.
fn live_in(dir: &Path) -> usize {
    let Ok(entries) = std::fs::read_dir(dir) else {
        return 0;
    };
    // Throughout: a subscriber of this process must not register between the look at
    // a file and its removal (see `crate::lock`).
    let mut held = registry();
    let mut live = 0;
    for entry in entries.flatten() {
        let path = entry.path();
        let temporary = entry.file_name().to_string_lossy().starts_with('.');
        // A subscriber of this process: opening its file would drop its lock when
        // closed.
        if held.holds(&path) {
            live += 1;
            continue;
        }
        // A temporary is locked before it is renamed into place, within microseconds:
        // one that young is left alone (looking at it could make its subscriber find its
        // fresh file locked), and only an old one, of a process that died between
        // creating and renaming it, is looked at.
        if temporary && !older_than(&path, STALE_TEMPORARY) {
            continue;
        }
        let file = match OpenOptions::new().write(true).open(&path) {
            Ok(file) => file,
            // Removed in between: its subscriber attached or gave up.
            Err(e) if e.kind() == std::io::ErrorKind::NotFound => continue,
            // Cannot be looked at: counted as live (the producer's grace period bounds
            // the wait for it), never removed.
            Err(e) => {
                tracing::debug!("cannot check {}: {e}", path.display());
                live += usize::from(!temporary);
                continue;
            }
        };
        match held.probe(&file) {
            // Nobody holds it: its process is gone.
            Ok(true) => {
                let _ = std::fs::remove_file(&path);
            }
            Ok(false) => {
                if !temporary {
                    live += 1;
                }
            }
            Err(e) => {
                tracing::debug!("cannot check {}: {e}", path.display());
                live += usize::from(!temporary);
            }
        }
    }
    live
}

/// In the service directory (owner-only, in `/dev/shm`), not the state directory: a
/// producer and subscribers that see each other's topic see each other's registrations,
/// whatever their `TMPDIR`.
fn interest_dir(namespace: &Namespace, topic: &TopicName) -> PathBuf {
    namespace.root().join("interest").join(topic.as_str())
}

fn older_than(path: &Path, age: Duration) -> bool {
    std::fs::metadata(path)
        .and_then(|m| m.modified())
        .is_ok_and(|t| SystemTime::now().duration_since(t).unwrap_or_default() > age)
}

/// Creates `dir` and its missing parents, owner-only.
pub(crate) fn create_private_dir(dir: &Path) -> Result<()> {
    use std::os::unix::fs::DirBuilderExt;
    std::fs::DirBuilder::new()
        .recursive(true)
        .mode(0o700)
        .create(dir)
        .map_err(|e| SluiceError::io(format!("cannot create {}", dir.display()), e))
}
