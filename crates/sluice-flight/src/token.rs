//! The token of a loopback server started without one.
//!
//! On a shared machine, loopback is every local user's: a server without a token would
//! serve this user's topics to all of them, past the owner-only shared memory. So a
//! server always requires a token. Started on loopback without one, it makes a random
//! token and leaves it in this user's private directory ([`sluice_shm::user_dir`]), in a
//! file named for its port; a subscriber of the same user on the same machine, given no
//! token, reads it from there. Another user cannot read the directory, and is refused.

use std::io::Read;
use std::path::PathBuf;

use sluice_core::{Result, SluiceError};

/// The name of the token file of a loopback server on `port`.
fn file_name(port: u16) -> String {
    format!("flight-{port}.token")
}

/// A token made for a loopback server, removed with it.
#[derive(Debug)]
pub(crate) struct LoopbackToken {
    path: PathBuf,
    value: String,
}

impl LoopbackToken {
    /// A new random token (32 bytes from the kernel, as hex), written where subscribers
    /// of this user find it for `port`.
    pub(crate) fn create(port: u16) -> Result<Self> {
        let mut random = [0u8; 32];
        std::fs::File::open("/dev/urandom")
            .and_then(|mut f| f.read_exact(&mut random))
            .map_err(|e| SluiceError::io("cannot read /dev/urandom for a token", e))?;
        let value: String = random.iter().map(|b| format!("{b:02x}")).collect();
        let path = sluice_shm::user_dir()?.join(file_name(port));
        let tmp = path.with_extension(format!("tmp{}", std::process::id()));
        sluice_shm::write_private(&tmp, &path, value.as_bytes())
            .map_err(|e| SluiceError::io(format!("cannot write {}", path.display()), e))?;
        Ok(Self { path, value })
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
        if std::fs::read_to_string(&self.path).is_ok_and(|v| v == self.value) {
            let _ = std::fs::remove_file(&self.path);
        }
    }
}

/// The token a loopback server on `server` (`HOST:PORT`) left for this user, if `HOST`
/// is a loopback address or `localhost` and the file is there.
pub(crate) fn find(server: &str) -> Option<String> {
    let (host, port) = server.rsplit_once(':')?;
    let port: u16 = port.parse().ok()?;
    let host = host.trim_start_matches('[').trim_end_matches(']');
    let loopback = host.eq_ignore_ascii_case("localhost")
        || host
            .parse::<std::net::IpAddr>()
            .is_ok_and(|ip| ip.is_loopback());
    if !loopback {
        return None;
    }
    let dir = sluice_shm::existing_user_dir()?;
    let token = std::fs::read_to_string(dir.join(file_name(port))).ok()?;
    Some(token.trim().to_string()).filter(|t| !t.is_empty())
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn a_loopback_token_is_found_by_its_port_and_only_for_loopback_hosts() {
        let token = LoopbackToken::create(1).unwrap();
        assert_eq!(token.value().len(), 64);
        let mode = std::os::unix::fs::PermissionsExt::mode(
            &std::fs::metadata(token.path()).unwrap().permissions(),
        );
        assert_eq!(mode & 0o777, 0o600);
        for server in ["127.0.0.1:1", "localhost:1", "[::1]:1", "127.0.0.2:1"] {
            assert_eq!(find(server).as_deref(), Some(token.value()), "{server}");
        }
        for server in ["10.0.0.5:1", "node0:1", "127.0.0.1:2", "127.0.0.1"] {
            assert_eq!(find(server), None, "{server}");
        }
        let path = token.path().to_path_buf();
        drop(token);
        assert!(!path.exists());
    }
}
