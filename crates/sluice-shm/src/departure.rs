//! Departures: subscribers that left a topic while batches they received are still in use.
//!
//! A zero-copy view (a pyarrow array, a numpy array, a tensor) points into a chunk of the
//! topic's shared memory that the subscriber borrowed from the producer. iceoryx2 hands
//! every chunk a subscriber port borrowed back to its publisher as soon as the port is
//! dropped, and the publisher loans it again for the next message: a trainer that kept a
//! batch after leaving the topic (a `break`, an exception, the end of the stream) would
//! read another batch's bytes. So a subscriber that leaves while it holds batches keeps
//! its port until the last of them is dropped, and registers its departure under
//! `<service directory>/departed/<topic>/<port id>`:
//!
//! * the producer neither waits for its queue (messages for it are dropped once its
//!   queue is full) nor counts it among the attached subscribers (the minimum to start,
//!   the drain at the end, a successor waiting for the subscribers of a dead producer);
//! * `sluice status` shows it, with the batches it still holds.
//!
//! What a departed subscriber pins is bounded as an attached one's is: at most
//! `sluice.max_held` messages it holds plus the queue it no longer reads, which the
//! topic's shared memory was sized for. It still takes one of `sluice.max_subscribers`
//! places until its batches are dropped. A departure is a [`Registration`]: a SIGKILLed
//! trainer has no views left, and its port and registration are reclaimed as any dead
//! process's.

use std::collections::HashSet;
use std::path::PathBuf;
use std::sync::Mutex;
use std::time::{Duration, Instant};

use sluice_core::{Result, TopicName};

use crate::Namespace;
use crate::registration::{self, Registration};

/// How long a producer trusts its list of departed subscribers before reading it again.
const REFRESH: Duration = Duration::from_millis(50);

/// A subscriber's registered departure; withdrawn when dropped (once its port is gone).
#[derive(Debug)]
pub(crate) struct Departure {
    registration: Registration,
}

impl Departure {
    /// Registers that the subscriber with port `port` left `topic` holding `held` batches.
    pub(crate) fn register(
        namespace: &Namespace,
        topic: &TopicName,
        port: u128,
        held: usize,
    ) -> Result<Self> {
        let registration = Registration::create(
            &departed_dir(namespace, topic),
            &format!("{port:032x}"),
            &contents(held),
        )?;
        Ok(Self { registration })
    }

    /// The batches the departed subscriber holds now, for `sluice status`.
    pub(crate) fn held(&self, held: usize) {
        self.registration.rewrite(&contents(held));
    }
}

/// What a departure's file says: the process and the batches held, at a fixed width so
/// that a rewrite replaces the whole of it.
fn contents(held: usize) -> Vec<u8> {
    format!("{:>10} {held:>10}\n", crate::process::id()).into_bytes()
}

/// A subscriber that left its topic and still holds batches of it (see the module docs).
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct DepartedSubscriber {
    /// Its process id (as its own PID namespace numbers it).
    pub pid: u32,
    /// Its port's id.
    pub port: u128,
    /// Batches it still holds (as of its last release).
    pub held: usize,
}

/// The live departed subscribers of `topic`; removes the departures of dead processes.
pub fn departed_subscribers(namespace: &Namespace, topic: &TopicName) -> Vec<DepartedSubscriber> {
    registration::live_in(&departed_dir(namespace, topic))
        .into_iter()
        .filter_map(|(name, contents)| {
            let port = u128::from_str_radix(&name, 16).ok()?;
            let text = String::from_utf8_lossy(&contents);
            let mut fields = text.split_whitespace().map(str::parse::<u64>);
            let pid = fields.next().and_then(|f| f.ok()).unwrap_or(0);
            let held = fields.next().and_then(|f| f.ok()).unwrap_or(0);
            Some(DepartedSubscriber {
                pid: u32::try_from(pid).unwrap_or(0),
                port,
                held: usize::try_from(held).unwrap_or(usize::MAX),
            })
        })
        .collect()
}

/// The ports of `topic`'s departed subscribers, read from their names alone (no lock is
/// looked at: a dead process's port is reclaimed anyway).
pub(crate) fn departed_ports(namespace: &Namespace, topic: &TopicName) -> HashSet<u128> {
    let Ok(entries) = std::fs::read_dir(departed_dir(namespace, topic)) else {
        return HashSet::new();
    };
    entries
        .flatten()
        .filter_map(|e| u128::from_str_radix(e.file_name().to_str()?, 16).ok())
        .collect()
}

/// A producer's view of its topic's departed subscribers, read again at most every
/// [`REFRESH`]: asked on every full queue and every count of subscribers, it must cost
/// next to nothing, and a departure that shows up to 50 ms late only delays the
/// producer that long, once.
#[derive(Debug)]
pub(crate) struct Departed {
    namespace: Namespace,
    topic: TopicName,
    known: Mutex<(Option<Instant>, HashSet<u128>)>,
}

impl Departed {
    pub(crate) fn new(namespace: &Namespace, topic: &TopicName) -> Self {
        Self {
            namespace: namespace.clone(),
            topic: topic.clone(),
            known: Mutex::new((None, HashSet::new())),
        }
    }

    /// The departed ports, as last read (read again if that was long enough ago).
    pub(crate) fn ports(&self) -> HashSet<u128> {
        let mut known = self.known.lock().unwrap_or_else(|p| p.into_inner());
        if known.0.is_none_or(|t| t.elapsed() >= REFRESH) {
            *known = (
                Some(Instant::now()),
                departed_ports(&self.namespace, &self.topic),
            );
        }
        known.1.clone()
    }

    /// Whether `port` departed. Ports never come back once departed, so a port known
    /// to have departed is answered without a look.
    pub(crate) fn contains(&self, port: u128) -> bool {
        {
            let known = self.known.lock().unwrap_or_else(|p| p.into_inner());
            if known.1.contains(&port) {
                return true;
            }
        }
        self.ports().contains(&port)
    }

    /// Whether `port` is known to have departed, without reading anything.
    pub(crate) fn known(&self, port: u128) -> bool {
        let known = self.known.lock().unwrap_or_else(|p| p.into_inner());
        known.1.contains(&port)
    }
}

/// Removes the departures of dead processes for every topic of `namespace` (part of
/// [`Namespace::reclaim_dead`]).
pub(crate) fn sweep(namespace: &Namespace) {
    registration::sweep(&namespace.root().join("departed"));
}

/// In the service directory, beside the topic's declared interest.
fn departed_dir(namespace: &Namespace, topic: &TopicName) -> PathBuf {
    namespace.root().join("departed").join(topic.as_str())
}
