//! Registrations: files whose lock says that the process that made them lives.
//!
//! Two kinds are kept in a topic's directories under the namespace's service directory
//! (owner-only, in `/dev/shm`): a subscriber's declared interest while it waits for the
//! topic ([`crate::interest`]) and a subscriber's departure while the batches it keeps
//! still pin its port ([`crate::departure`]).
//!
//! # Liveness
//! A registration is a file on which its process holds an exclusive lock for as long as
//! the registration lasts. The kernel releases the lock when the process dies, however
//! it dies, so a looker that can take the lock knows the registration is stale and
//! removes it. Locks rather than PIDs, because a lock cannot be kept alive by a reused
//! PID and works across PID namespaces; record locks, which a forked child does not
//! inherit (see [`crate::lock`]). A registration is created under a temporary name,
//! locked, then renamed into place, so a looker never sees an unlocked live
//! registration. Those of this process are known from its registry of locks.

use std::collections::BTreeMap;
use std::fs::{File, OpenOptions};
use std::os::unix::fs::FileExt;
use std::path::{Path, PathBuf};
use std::sync::{Mutex, PoisonError};
use std::time::{Duration, SystemTime};

use sluice_core::{Result, SluiceError};

use crate::lock::{LockedFile, registry};

/// A temporary registration older than this whose lock can be taken was left by a
/// process that died between creating and renaming it.
const STALE_TEMPORARY: Duration = Duration::from_secs(60);

/// The contents of this process's registrations, which it cannot read from their files
/// (opening one and closing it again would drop its lock, see [`crate::lock`]).
static OWN: Mutex<BTreeMap<PathBuf, Vec<u8>>> = Mutex::new(BTreeMap::new());

fn own() -> std::sync::MutexGuard<'static, BTreeMap<PathBuf, Vec<u8>>> {
    OWN.lock().unwrap_or_else(PoisonError::into_inner)
}

/// A registration, held until dropped (which removes it).
#[derive(Debug)]
pub(crate) struct Registration {
    file: LockedFile,
}

impl Registration {
    /// Registers `name` in `dir` (created owner-only if missing), with `contents`.
    pub(crate) fn create(dir: &Path, name: &str, contents: &[u8]) -> Result<Self> {
        create_private_dir(dir)?;
        let tmp = dir.join(format!(".{name}.tmp"));
        let path = dir.join(name);
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
                .map_err(|e| SluiceError::io(format!("cannot register {}", tmp.display()), e))?
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
        let placed = file
            .write_all_at(contents, 0)
            .and_then(|()| std::fs::rename(&tmp, &path));
        if let Err(e) = placed {
            let _ = std::fs::remove_file(&tmp);
            held.release(&path);
            return Err(SluiceError::io(
                format!("cannot register {}", path.display()),
                e,
            ));
        }
        own().insert(path.clone(), contents.to_vec());
        Ok(Self {
            file: LockedFile::new(path, file),
        })
    }

    /// Overwrites the start of the registration's contents with `contents` (of the same
    /// length as before, so that a reader never sees a mix of two lengths). Best effort.
    pub(crate) fn rewrite(&self, contents: &[u8]) {
        if let Some(file) = self.file.file() {
            own().insert(self.file.path().to_path_buf(), contents.to_vec());
            let _ = file.write_all_at(contents, 0);
        }
    }
}

impl Drop for Registration {
    fn drop(&mut self) {
        // Before the file goes (with the field, right after): a looker finds either both
        // or the file without its contents, which it reads as empty.
        if self.file.file().is_some() {
            own().remove(self.file.path());
        }
    }
}

/// The live registrations in `dir`, by name, with their contents (empty where they
/// cannot be read); removes those of processes that died.
pub(crate) fn live_in(dir: &Path) -> Vec<(String, Vec<u8>)> {
    let Ok(entries) = std::fs::read_dir(dir) else {
        return Vec::new();
    };
    // Throughout: a registration of this process must not be made between the look at
    // a file and its removal (see `crate::lock`).
    let mut held = registry();
    let mut live = Vec::new();
    for entry in entries.flatten() {
        let path = entry.path();
        let name = entry.file_name().to_string_lossy().into_owned();
        let temporary = name.starts_with('.');
        // One of this process's: opening its file would drop its lock when closed, so
        // its contents are taken from memory.
        if held.holds(&path) {
            let contents = own().get(&path).cloned().unwrap_or_default();
            live.push((name, contents));
            continue;
        }
        // A temporary is locked before it is renamed into place, within microseconds:
        // one that young is left alone (looking at it could make its owner find its
        // fresh file locked), and only an old one, of a process that died between
        // creating and renaming it, is looked at.
        if temporary && !older_than(&path, STALE_TEMPORARY) {
            continue;
        }
        let file = match OpenOptions::new().read(true).write(true).open(&path) {
            Ok(file) => file,
            // Removed in between: its registration ended.
            Err(e) if e.kind() == std::io::ErrorKind::NotFound => continue,
            // Cannot be looked at: counted as live, never removed.
            Err(e) => {
                tracing::debug!("cannot check {}: {e}", path.display());
                if !temporary {
                    live.push((name, Vec::new()));
                }
                continue;
            }
        };
        match held.probe(&file) {
            // Nobody holds it: its process is gone.
            Ok(true) => {
                let _ = std::fs::remove_file(&path);
            }
            Ok(false) if temporary => {}
            Ok(false) => live.push((name, read_all(&file))),
            Err(e) => {
                tracing::debug!("cannot check {}: {e}", path.display());
                if !temporary {
                    live.push((name, Vec::new()));
                }
            }
        }
    }
    live
}

/// Removes the registrations of dead processes in every topic's directory under `dir`.
pub(crate) fn sweep(dir: &Path) {
    let topics = std::fs::read_dir(dir);
    for topic in topics.into_iter().flatten().flatten() {
        live_in(&topic.path());
    }
}

/// The contents of a small registration file (empty if it cannot be read).
fn read_all(file: &File) -> Vec<u8> {
    // Registrations are small; a producer's error message is the longest.
    let mut buf = vec![0u8; 64 << 10];
    let n = file.read_at(&mut buf, 0).unwrap_or(0);
    buf.truncate(n);
    buf
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
