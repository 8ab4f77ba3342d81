//! Who paces a topic: the subscriber whose full queue a producer is waiting for.
//!
//! Without a lag limit the slowest subscriber sets the pace, which is the design; a
//! subscriber that is still referenced but no longer read (a forgotten iterator, a
//! DataLoader iterator kept in a variable) then holds every other subscriber back. That
//! must be visible: while the producer waits on a full queue for longer than
//! [`QUIET`], it says which subscriber in `<service directory>/pacing/<topic>`, a
//! [`Registration`] (so a killed producer's is removed by the next look), rewritten at
//! most every [`REWRITE_EVERY`] and removed once the wait is over. `sluice status` shows
//! it, and a subscriber that times out (or waits long) while another one paces the
//! stream names that one in its error (or warning).

use std::path::PathBuf;
use std::sync::Mutex;
use std::sync::atomic::{AtomicBool, Ordering};
use std::time::{Duration, Instant, SystemTime, UNIX_EPOCH};

use sluice_core::TopicName;

use crate::Namespace;
use crate::registration::{self, Registration};

/// How long a producer waits on one full queue before it says so: a slow trainer's step
/// is not worth a file write.
const QUIET: Duration = Duration::from_millis(500);
/// How often, at most, a waiting producer rewrites what it waits for.
const REWRITE_EVERY: Duration = Duration::from_millis(250);
/// A record not rewritten for this long is of a producer that stopped waiting (and is
/// about to remove it).
const STALE: Duration = Duration::from_secs(3);

/// The subscriber a topic's producer is waiting for.
#[derive(Debug, Clone, PartialEq)]
pub struct Pacing {
    /// The subscriber's port id.
    pub port: u128,
    /// Its process id (0 if unknown).
    pub pid: u32,
    /// Seconds the producer has waited for it.
    pub waited_s: f64,
    /// Messages the producer has published (its next sequence number).
    pub seq: u64,
    /// Messages queued for that subscriber, all unread: its lag.
    pub queued: usize,
}

/// What `topic`'s producer is waiting for now, if it has been waiting on a full queue
/// for a while.
pub fn pacing(namespace: &Namespace, topic: &TopicName) -> Option<Pacing> {
    let (_, contents) = registration::live_in(&pacing_dir(namespace))
        .into_iter()
        .find(|(name, _)| *name == record_name(topic))?;
    let text = String::from_utf8_lossy(&contents);
    let mut fields = text.split_whitespace();
    let port = u128::from_str_radix(fields.next()?, 16).ok()?;
    let pid = fields.next()?.parse().ok()?;
    let since: f64 = fields.next()?.parse().ok()?;
    let updated: f64 = fields.next()?.parse().ok()?;
    let seq = fields.next()?.parse().ok()?;
    let queued = fields.next()?.parse().ok()?;
    let now = unix_now();
    if now - updated > STALE.as_secs_f64() {
        return None;
    }
    Some(Pacing {
        port,
        pid,
        waited_s: (now - since).max(0.0),
        seq,
        queued,
    })
}

/// The producer's side: what its backpressure handler is waiting for.
#[derive(Debug)]
pub(crate) struct PacingRecord {
    dir: PathBuf,
    topic: TopicName,
    /// Whether a wait is being tracked: the publishing thread looks at this alone after
    /// each message.
    engaged: AtomicBool,
    state: Mutex<State>,
}

#[derive(Debug, Default)]
struct State {
    /// The port waited for and since when (monotonic and wall clock).
    waiting: Option<(u128, Instant, f64)>,
    /// The record and when it was last written; `None`: there is none.
    written: Option<(Registration, Instant)>,
}

impl PacingRecord {
    pub(crate) fn new(namespace: &Namespace, topic: &TopicName) -> Self {
        Self {
            dir: pacing_dir(namespace),
            topic: topic.clone(),
            engaged: AtomicBool::new(false),
            state: Mutex::default(),
        }
    }

    /// The producer is waiting on `port`'s full queue (of `queued` messages), with `seq`
    /// messages published; `pid` finds the port's process, asked only when written.
    pub(crate) fn waiting(&self, port: u128, seq: u64, queued: usize, pid: impl FnOnce() -> u32) {
        self.engaged.store(true, Ordering::Relaxed);
        let mut state = self.state.lock().unwrap_or_else(|p| p.into_inner());
        let (_, since, since_unix) = match state.waiting {
            Some(w) if w.0 == port => w,
            _ => {
                let w = (port, Instant::now(), unix_now());
                state.waiting = Some(w);
                w
            }
        };
        let due = match &state.written {
            Some((_, at)) => at.elapsed() >= REWRITE_EVERY,
            None => since.elapsed() >= QUIET,
        };
        if !due {
            return;
        }
        // Fixed widths: a rewrite replaces the whole record.
        let line = format!(
            "{port:032x} {:>10} {since_unix:>20.3} {:>20.3} {seq:>20} {queued:>10}\n",
            pid(),
            unix_now()
        );
        match &mut state.written {
            Some((record, at)) => {
                record.rewrite(line.as_bytes());
                *at = Instant::now();
            }
            None => {
                // A killed predecessor's record is removed by the look.
                registration::live_in(&self.dir);
                let name = record_name(&self.topic);
                if let Ok(record) = Registration::create(&self.dir, &name, line.as_bytes()) {
                    state.written = Some((record, Instant::now()));
                }
            }
        }
    }

    /// A message went out: the producer waits for nobody now.
    pub(crate) fn resumed(&self) {
        if !self.engaged.swap(false, Ordering::Relaxed) {
            return;
        }
        let mut state = self.state.lock().unwrap_or_else(|p| p.into_inner());
        state.waiting = None;
        // Dropping the record removes it.
        state.written = None;
    }
}

/// Removes the records of dead producers (part of [`Namespace::reclaim_dead`]).
pub(crate) fn sweep(namespace: &Namespace) {
    registration::live_in(&pacing_dir(namespace));
}

/// A topic's record, named so that no topic name looks like a temporary (a leading dot).
fn record_name(topic: &TopicName) -> String {
    format!("topic-{topic}")
}

fn pacing_dir(namespace: &Namespace) -> PathBuf {
    namespace.root().join("pacing")
}

fn unix_now() -> f64 {
    SystemTime::now()
        .duration_since(UNIX_EPOCH)
        .map_or(0.0, |d| d.as_secs_f64())
}
