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
        let dir = sluice_shm::user_dir()?;
        sweep_stale(&dir, port);
        let path = dir.join(file_name(port));
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

/// Removes the token files in `dir` of servers that died without removing theirs
/// (killed): those of ports, other than `port`, where nothing listens on loopback. A
/// live server listens from before it writes its token; a port some other program took
/// since keeps its stale file until that program lets go of it.
fn sweep_stale(dir: &std::path::Path, port: u16) {
    let Ok(entries) = std::fs::read_dir(dir) else {
        return;
    };
    for entry in entries.flatten() {
        let name = entry.file_name();
        let Some(other) = name
            .to_str()
            .and_then(|n| n.strip_prefix("flight-")?.strip_suffix(".token"))
            .and_then(|p| p.parse::<u16>().ok())
        else {
            continue;
        };
        if other != port && !listened_on(other) {
            let _ = std::fs::remove_file(entry.path());
        }
    }
}

/// Whether a server may listen on loopback `port`: anything but a refused connection
/// (on IPv4 and IPv6 both) counts as one.
fn listened_on(port: u16) -> bool {
    let wait = std::time::Duration::from_millis(200);
    [
        std::net::IpAddr::from(std::net::Ipv4Addr::LOCALHOST),
        std::net::IpAddr::from(std::net::Ipv6Addr::LOCALHOST),
    ]
    .into_iter()
    .any(|ip| {
        match std::net::TcpStream::connect_timeout(&std::net::SocketAddr::new(ip, port), wait) {
            Ok(_) => true,
            Err(e) => !matches!(
                e.kind(),
                std::io::ErrorKind::ConnectionRefused | std::io::ErrorKind::AddrNotAvailable
            ),
        }
    })
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
        // A port something listens on, as a server's does: another test's sweep keeps
        // its token.
        let listener = std::net::TcpListener::bind("127.0.0.1:0").unwrap();
        let port = listener.local_addr().unwrap().port();
        let token = LoopbackToken::create(port).unwrap();
        assert_eq!(token.value().len(), 64);
        let mode = std::os::unix::fs::PermissionsExt::mode(
            &std::fs::metadata(token.path()).unwrap().permissions(),
        );
        assert_eq!(mode & 0o777, 0o600);
        for host in ["127.0.0.1", "localhost", "[::1]", "127.0.0.2"] {
            let server = format!("{host}:{port}");
            assert_eq!(find(&server).as_deref(), Some(token.value()), "{server}");
        }
        let other = port.wrapping_add(1).max(1);
        let refused = [
            format!("10.0.0.5:{port}"),
            format!("node0:{port}"),
            format!("127.0.0.1:{other}"),
            "127.0.0.1".to_string(),
        ];
        for server in refused {
            if server.ends_with(&format!(":{other}")) && find(&server).is_some() {
                continue; // another server's token on that port
            }
            assert_eq!(find(&server), None, "{server}");
        }
        let path = token.path().to_path_buf();
        drop(token);
        assert!(!path.exists());
    }

    /// A killed server's token file goes when the next server starts: its port has no
    /// listener; a listening one's stays.
    #[test]
    fn a_dead_servers_token_file_is_swept_and_a_live_ones_kept() {
        let dir = sluice_shm::user_dir().unwrap();
        let live = std::net::TcpListener::bind("127.0.0.1:0").unwrap();
        let dead_port = {
            let gone = std::net::TcpListener::bind("127.0.0.1:0").unwrap();
            gone.local_addr().unwrap().port()
        };
        let live_port = live.local_addr().unwrap().port();
        for p in [dead_port, live_port] {
            std::fs::write(dir.join(file_name(p)), "stale").unwrap();
        }
        let token = LoopbackToken::create(3).unwrap();
        assert!(
            !dir.join(file_name(dead_port)).exists(),
            "a dead server's token stayed"
        );
        assert!(
            dir.join(file_name(live_port)).exists(),
            "a live server's token went"
        );
        let _ = std::fs::remove_file(dir.join(file_name(live_port)));
        drop(token);
    }
}
