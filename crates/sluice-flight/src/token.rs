//! The token of a loopback server started without one.
//!
//! On a shared machine, loopback is every local user's: a server without a token would
//! serve this user's topics to all of them, past the owner-only shared memory. So a
//! server always requires a token. Started on loopback without one, it makes a random
//! token and leaves it in this user's private directory ([`sluice_shm::user_dir`]), in a
//! file named for its port; a subscriber of the same user on the same machine, given no
//! token, reads it from there. Another user cannot read the directory, and is refused.
//!
//! The file also names the address the server listens on, and a subscriber sends the
//! token only there, and only while the server holds the file's lock: any local user
//! can listen on another loopback address of the same port (`127.0.0.2`, `[::1]`, where
//! `localhost` may lead first) or on the port of a server that ended, and would collect
//! a token sent to any of them.

use std::io::Read;
use std::net::{IpAddr, Ipv4Addr, Ipv6Addr, SocketAddr};
use std::path::{Path, PathBuf};

use sluice_core::{Result, SluiceError};

/// The name of the token file of a loopback server on `port`.
fn file_name(port: u16) -> String {
    format!("flight-{port}.token")
}

/// A token made for a loopback server, removed with it. The server holds a lock on its
/// file for as long as it runs (the kernel lets go of it however the process ends), so
/// the next server to start can tell a killed server's file from a live one's.
#[derive(Debug)]
pub(crate) struct LoopbackToken {
    path: PathBuf,
    value: String,
    _locked: std::fs::File,
}

impl LoopbackToken {
    /// A new random token (32 bytes from the kernel, as hex), written with `addr` (where
    /// the server listens) where subscribers of this user find it for its port.
    pub(crate) fn create(addr: SocketAddr) -> Result<Self> {
        let mut random = [0u8; 32];
        std::fs::File::open("/dev/urandom")
            .and_then(|mut f| f.read_exact(&mut random))
            .map_err(|e| SluiceError::io("cannot read /dev/urandom for a token", e))?;
        let value: String = random.iter().map(|b| format!("{b:02x}")).collect();
        let dir = sluice_shm::user_dir()?;
        sweep_stale(&dir);
        let path = dir.join(file_name(addr.port()));
        let tmp = path.with_extension(format!("tmp{}", std::process::id()));
        let text = format!("{value}\n{addr}\n");
        let locked = sluice_shm::write_private_locked(&tmp, &path, text.as_bytes())
            .map_err(|e| SluiceError::io(format!("cannot write {}", path.display()), e))?;
        Ok(Self {
            path,
            value,
            _locked: locked,
        })
    }

    pub(crate) fn value(&self) -> &str {
        &self.value
    }

    pub(crate) fn path(&self) -> &std::path::Path {
        &self.path
    }
}

impl Drop for LoopbackToken {
    fn drop(&mut self) {
        // Only our own: a later server on the same port may have replaced it.
        if std::fs::read_to_string(&self.path).is_ok_and(|v| v.lines().next() == Some(&self.value))
        {
            let _ = std::fs::remove_file(&self.path);
        }
    }
}

/// Removes the token files in `dir` that no live server holds locked: those of servers
/// that were killed (or of builds before the lock).
fn sweep_stale(dir: &Path) {
    let Ok(entries) = std::fs::read_dir(dir) else {
        return;
    };
    for entry in entries.flatten() {
        let name = entry.file_name();
        let is_token = name
            .to_str()
            .and_then(|n| n.strip_prefix("flight-")?.strip_suffix(".token"))
            .is_some_and(|p| p.parse::<u16>().is_ok());
        if is_token {
            remove_if_unlocked(&entry.path());
        }
    }
}

/// Removes `path` if nobody holds its lock, while holding it: a server that is writing
/// its token holds the lock from before the file has that name.
fn remove_if_unlocked(path: &Path) {
    use std::os::unix::fs::MetadataExt;
    // A regular file (the directory is this user's alone: nobody swaps it for a link).
    if !std::fs::symlink_metadata(path).is_ok_and(|m| m.file_type().is_file()) {
        return;
    }
    let Ok(file) = std::fs::File::open(path) else {
        return;
    };
    if file.try_lock().is_err() {
        return;
    }
    // Still the file at the path (a server may have put its own there meanwhile).
    let same = match (file.metadata(), std::fs::symlink_metadata(path)) {
        (Ok(a), Ok(b)) => a.dev() == b.dev() && a.ino() == b.ino(),
        _ => false,
    };
    if same {
        let _ = std::fs::remove_file(path);
    }
}

/// A live loopback server's token, and the address it listens on.
#[derive(Debug, Clone, PartialEq, Eq)]
pub(crate) struct Found {
    pub(crate) token: String,
    /// Where to connect: the address the server recorded (for `localhost`, whatever it
    /// resolves to first may be another user's listener).
    pub(crate) addr: SocketAddr,
}

/// The token a live loopback server on `server` (`HOST:PORT`) left for this user: if
/// `HOST` is `localhost` or the very address the server listens on (a loopback one, or
/// loopback of the family of an unspecified one), the file is there and its server
/// still holds its lock.
pub(crate) fn find(server: &str) -> Option<Found> {
    let (host, port) = server.rsplit_once(':')?;
    let port: u16 = port.parse().ok()?;
    let host = host.trim_start_matches('[').trim_end_matches(']');
    let dir = sluice_shm::existing_user_dir()?;
    let path = dir.join(file_name(port));
    let text = read_if_locked(&path)?;
    let mut lines = text.lines();
    let token = lines.next()?.trim().to_string();
    let recorded: SocketAddr = lines.next()?.trim().parse().ok()?;
    if token.is_empty() || recorded.port() != port {
        return None;
    }
    let addr = if host.eq_ignore_ascii_case("localhost") {
        let ip = recorded.ip();
        if ip.is_unspecified() {
            let loopback = match ip {
                IpAddr::V4(_) => IpAddr::V4(Ipv4Addr::LOCALHOST),
                IpAddr::V6(_) => IpAddr::V6(Ipv6Addr::LOCALHOST),
            };
            SocketAddr::new(loopback, port)
        } else {
            recorded
        }
    } else {
        let ip: IpAddr = host.parse().ok()?;
        let same = ip == recorded.ip()
            || (recorded.ip().is_unspecified()
                && ip.is_loopback()
                && ip.is_ipv4() == recorded.ip().is_ipv4());
        if !same {
            return None;
        }
        SocketAddr::new(ip, port)
    };
    addr.ip().is_loopback().then_some(Found { token, addr })
}

/// The text of `path` if a live server holds its lock (a file nobody holds is a killed
/// server's: its port may be anyone's now).
fn read_if_locked(path: &Path) -> Option<String> {
    if !std::fs::symlink_metadata(path).is_ok_and(|m| m.file_type().is_file()) {
        return None;
    }
    let mut file = std::fs::File::open(path).ok()?;
    match file.try_lock_shared() {
        Ok(()) => return None,
        Err(std::fs::TryLockError::WouldBlock) => {}
        Err(std::fs::TryLockError::Error(_)) => return None,
    }
    let mut text = String::new();
    file.by_ref().take(4096).read_to_string(&mut text).ok()?;
    Some(text)
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn a_loopback_token_is_found_by_its_port_and_only_for_loopback_hosts() {
        let token = LoopbackToken::create("127.0.0.1:1".parse().unwrap()).unwrap();
        assert_eq!(token.value().len(), 64);
        let mode = std::os::unix::fs::PermissionsExt::mode(
            &std::fs::metadata(token.path()).unwrap().permissions(),
        );
        assert_eq!(mode & 0o777, 0o600);
        for server in ["127.0.0.1:1", "localhost:1", "LOCALHOST:1"] {
            let found = find(server).unwrap_or_else(|| panic!("{server}"));
            assert_eq!(found.token, token.value(), "{server}");
            assert_eq!(found.addr, "127.0.0.1:1".parse().unwrap(), "{server}");
        }
        // Any local user may listen on the other loopback addresses of the port.
        for server in [
            "[::1]:1",
            "127.0.0.2:1",
            "10.0.0.5:1",
            "node0:1",
            "127.0.0.1:2",
            "127.0.0.1",
        ] {
            assert_eq!(find(server), None, "{server}");
        }
        let path = token.path().to_path_buf();
        drop(token);
        assert!(!path.exists());
    }

    /// A killed server's token file (or one of an older build) goes when the next
    /// server starts; a live one's, locked by its server, stays.
    #[test]
    fn a_dead_servers_token_file_is_swept_and_a_live_ones_kept() {
        let live = LoopbackToken::create("127.0.0.1:4".parse().unwrap()).unwrap();
        let dir = live.path().parent().unwrap().to_path_buf();
        let dead = dir.join(file_name(5));
        std::fs::write(&dead, "left by a killed server\n127.0.0.1:5\n").unwrap();
        // Never sent: whoever listens on a killed server's port now would get it.
        assert_eq!(find("127.0.0.1:5"), None);
        let next = LoopbackToken::create("[::]:6".parse().unwrap()).unwrap();
        assert!(!dead.exists(), "a dead server's token stayed");
        assert!(live.path().exists(), "a live server's token went");
        assert_eq!(
            find("127.0.0.1:4").map(|f| f.token).as_deref(),
            Some(live.value())
        );
        // A server on every address: localhost means its loopback, of its family.
        let found = find("localhost:6").unwrap();
        assert_eq!(
            (found.token.as_str(), found.addr),
            (next.value(), "[::1]:6".parse().unwrap())
        );
        assert_eq!(
            find("[::1]:6").map(|f| f.addr),
            Some("[::1]:6".parse().unwrap())
        );
        assert_eq!(find("127.0.0.1:6"), None);
        drop((live, next));
    }
}
