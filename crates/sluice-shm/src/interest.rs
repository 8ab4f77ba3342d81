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
//! A declaration is a [`Registration`]: a file its subscriber's process holds locked
//! for as long as it waits, which a producer that finds it unlocked removes, so a
//! SIGKILLed subscriber never holds a producer back.
//!
//! # Limits
//! A subscriber that is alive but not running (stopped with SIGSTOP, or starved for
//! longer than the grace period) holds the producer back for the grace period only; the
//! producer then logs how many did not attach and starts without them, and they join
//! late (and are told so, as any late subscriber is).

use std::path::PathBuf;
use std::sync::atomic::{AtomicU64, Ordering};
use std::time::SystemTime;

use sluice_core::{Result, TopicName};

use crate::Namespace;
use crate::registration::{self, Registration};

static NEXT: AtomicU64 = AtomicU64::new(0);

/// A subscriber's declared interest in a topic, held while it waits to attach. Dropping
/// it withdraws the declaration.
#[derive(Debug)]
pub struct Interest {
    // Withdrawn when dropped.
    _registration: Registration,
}

impl Interest {
    /// Declares that this process waits for `topic` in `namespace`.
    pub fn declare(namespace: &Namespace, topic: &TopicName) -> Result<Self> {
        namespace.prepare_root()?;
        // Unique across processes that share the directory from different PID
        // namespaces (containers sharing /dev/shm, each with its own pid 1) and across
        // forked siblings (which copy the counter): the random part tells them apart.
        let name = format!(
            "{}-{}-{:016x}",
            crate::process::id(),
            NEXT.fetch_add(1, Ordering::Relaxed),
            random_u64()
        );
        let registration = Registration::create(&interest_dir(namespace, topic), &name, b"")?;
        Ok(Self {
            _registration: registration,
        })
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
    registration::live_in(&interest_dir(namespace, topic)).len()
}

/// Removes the registrations of dead processes for every topic of `namespace` (part of
/// [`Namespace::reclaim_dead`]: a subscriber killed while it waited for a topic that no
/// producer created since leaves one).
pub(crate) fn sweep(namespace: &Namespace) {
    registration::sweep(&namespace.root().join("interest"));
}

/// In the service directory (owner-only, in `/dev/shm`), not the state directory: a
/// producer and subscribers that see each other's topic see each other's registrations,
/// whatever their `TMPDIR`.
fn interest_dir(namespace: &Namespace, topic: &TopicName) -> PathBuf {
    namespace.root().join("interest").join(topic.as_str())
}
