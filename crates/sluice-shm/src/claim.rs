//! A producer's claim on its topic, and the generations of a topic's services.
//!
//! # One producer per topic
//! A producer holds an exclusive lock on `<service directory>/producers/<topic>` for as
//! long as it serves the topic. The kernel releases the lock when the process dies,
//! however it dies, so a claim that can be taken belongs to nobody alive. (The same
//! reasoning as the registrations of [`crate::interest`], and as iceoryx2's own node
//! monitors.) The lock is the producer's process's alone: a child it forks does not hold
//! the claim, and cannot keep it from a restarted producer once the producer died (see
//! [`crate::lock`]). Two producers of one process are told apart by its registry of
//! locks.
//!
//! # Generations
//! A topic's iceoryx2 services carry a generation in their names
//! (`sluice/<topic>/<generation>/<part>`). A producer that died leaves its services to
//! whoever still holds them: its subscribers until they have taken what it queued, and
//! a trainer that still holds one of its batches (the batch holds the sample, and the
//! sample the service) for as long as it does. A Python loop `for batch in sub` holds
//! the previous batch while it asks for the next one, so a trainer reconnecting to a
//! restarted producer always holds one. The services of a name cannot be created again
//! while they exist, so a restarted producer creates the topic's services under the
//! first generation that is free after the last producer's (recorded in
//! `generations/<topic>`: iceoryx2 removes a service's files one by one, and names being
//! removed must not be created again; see `takeover::remember_generation`), and
//! subscribers attach to the generation whose producer is alive. The old generation goes when its last holder lets go (see
//! [`crate::Namespace::reclaim_dead`]).

use std::fs::{File, OpenOptions};
use std::path::{Path, PathBuf};

use sluice_core::{Result, SluiceError, TopicName};

use crate::Namespace;
use crate::lock::{LockedFile, registry};
use crate::registration::create_private_dir;

/// How many generations of a topic's services may exist at once: one live producer's,
/// and those of dead producers that something still holds.
pub(crate) const GENERATIONS: u32 = 16;

/// How many times a claim held by someone else is looked at before the topic counts as
/// busy, and how long apart.
/// (A reclaimer holds a dead producer's claim for microseconds, but may be descheduled
/// meanwhile on a saturated machine.)
const BUSY_LOOKS: u32 = 50;
const BUSY_LOOK_INTERVAL: std::time::Duration = std::time::Duration::from_millis(20);

/// A producer's exclusive claim on a topic; dropping it gives the topic up (a claimant
/// that opened the file meanwhile sees that it locked a removed file and looks again).
#[derive(Debug)]
pub(crate) struct Claim {
    _file: LockedFile,
}

impl Claim {
    /// Claims `topic`; fails with [`SluiceError::TopicBusy`] if a live producer has it.
    pub(crate) fn take(namespace: &Namespace, topic: &TopicName) -> Result<Self> {
        namespace.prepare_root()?;
        let dir = claims_dir(namespace);
        create_private_dir(&dir)?;
        let path = dir.join(topic.as_str());
        let mut refused = 0;
        loop {
            // Under the registry: no thread of this process looks at the file (a sweep)
            // while another takes it.
            let mut held = registry();
            // Another producer of this process (record locks never conflict within a
            // process, so only the registry knows), maybe one that is giving the topic
            // up: looked at again, as a claim of another process is.
            let file = if held.holds(&path) {
                None
            } else {
                Some(open_claim(&path)?)
            };
            let locked = match &file {
                Some(file) => held.lock(file, &path),
                None => Ok(false),
            };
            match locked {
                Ok(true) => {}
                // A reclaimer looking at a dead producer's claim holds it for a moment
                // (see `sweep`); a live producer holds it for good.
                Ok(false) if refused < BUSY_LOOKS => {
                    // Closed under the registry: closing a descriptor of the file drops
                    // this process's lock on it, which another of its threads may have
                    // taken meanwhile (once the producer holding it died).
                    drop(file);
                    drop(held);
                    refused += 1;
                    std::thread::sleep(BUSY_LOOK_INTERVAL);
                    continue;
                }
                Ok(false) => return Err(SluiceError::TopicBusy(topic.to_string())),
                Err(e) => {
                    return Err(SluiceError::io(
                        format!("cannot lock {}", path.display()),
                        e,
                    ));
                }
            }
            // The claim is the file at the path: a producer giving the topic up (or a
            // reclaimer) removes it while holding its lock, so the file locked here may
            // be one that was removed since it was opened. Then take the new one.
            if let Some(file) = file.filter(|f| same_file(f, &path)) {
                return Ok(Self {
                    _file: LockedFile::new(path, file),
                });
            }
            held.release(&path);
        }
    }
}

/// Removes the claims that nobody holds (their producer died); part of
/// [`Namespace::reclaim_dead`].
pub(crate) fn sweep(namespace: &Namespace) {
    let Ok(entries) = std::fs::read_dir(claims_dir(namespace)) else {
        return;
    };
    // Throughout: this process's producers must not take a claim between the look at
    // its file and its removal (see `crate::lock`).
    let mut held = registry();
    for entry in entries.flatten() {
        let path = entry.path();
        // Opening it would drop this process's lock on it when closed.
        if held.holds(&path) {
            continue;
        }
        let Ok(file) = OpenOptions::new().write(true).open(&path) else {
            continue;
        };
        if held.probe(&file).unwrap_or(false) && same_file(&file, &path) {
            let _ = std::fs::remove_file(&path);
        }
    }
}

fn claims_dir(namespace: &Namespace) -> PathBuf {
    namespace.root().join("producers")
}

fn open_claim(path: &Path) -> Result<File> {
    use std::os::unix::fs::OpenOptionsExt;
    OpenOptions::new()
        .create(true)
        .truncate(false)
        .write(true)
        .mode(0o600)
        .open(path)
        .map_err(|e| SluiceError::io(format!("cannot open {}", path.display()), e))
}

/// Whether `file` is the file now at `path`.
fn same_file(file: &File, path: &Path) -> bool {
    use std::os::unix::fs::MetadataExt;
    match (file.metadata(), std::fs::metadata(path)) {
        (Ok(a), Ok(b)) => a.dev() == b.dev() && a.ino() == b.ino(),
        _ => false,
    }
}
