//! Received samples, kept in shared memory for as long as anything points into them, and
//! the port they came through (see [`crate::departure`]).

use std::ptr::NonNull;
use std::sync::Arc;
use std::sync::atomic::{AtomicUsize, Ordering};

use iceoryx2::port::subscriber::Subscriber;
use iceoryx2::sample::Sample;
use sluice_core::TopicName;

use crate::Ipc;
use crate::departure::Departure;
use crate::header::FrameHeader;
use crate::namespace::{Namespace, ReclaimAfter};
use crate::process::Local;

/// Keeps a received sample alive for as long as Arrow buffers point into it.
pub(crate) struct SampleOwner {
    /// The sample; `None` only while this owner is dropped. A forked child's copy is
    /// never given back (see [`crate::process`]).
    pub(crate) sample: Local<Option<Sample<Ipc, [u8], FrameHeader>>>,
    /// The subscriber's count of samples held, decremented once this one went back, so
    /// that it never reads lower than what iceoryx2 counts as borrowed: a subscriber may
    /// receive whenever it reads below `max_held`, whichever thread drops samples.
    pub(crate) held: Arc<AtomicUsize>,
    /// The port the sample came through, kept after it (fields drop in order) and after
    /// the subscriber left the topic: iceoryx2 gives a dropped port's borrowed chunks
    /// back to the producer at once (see [`crate::departure`]).
    pub(crate) hold: Local<Arc<PortHold>>,
    /// The subscriber's reclaim when all is let go (see [`ReclaimAfter`]); dropped last.
    pub(crate) _reclaim: Arc<ReclaimAfter>,
}

/// The subscriber's port.
pub(crate) type Port = Arc<Subscriber<Ipc, [u8], FrameHeader>>;

/// The subscriber's port, shared by the subscriber and every sample it handed out: the
/// port lives until both have let go (or the producer is found gone, after which nobody
/// reuses its chunks), so no chunk a live view points into goes back to the producer.
pub(crate) struct PortHold {
    /// `None` once the producer was found gone.
    pub(crate) port: std::sync::Mutex<Option<Port>>,
    /// Registered when the subscriber left while samples were still held.
    pub(crate) departure: std::sync::Mutex<Option<Departure>>,
}

impl PortHold {
    /// The subscriber left the topic (`held` samples still out): the producer must stop
    /// counting on it. Best effort: without the registration, the producer waits for its
    /// queue as for a subscriber that stopped reading.
    pub(crate) fn depart(&self, namespace: &Namespace, topic: &TopicName, held: usize) {
        let Some(id) = self
            .port
            .lock()
            .unwrap_or_else(|p| p.into_inner())
            .as_ref()
            .map(|port| port.id().value())
        else {
            return;
        };
        let mut departure = self.departure.lock().unwrap_or_else(|p| p.into_inner());
        if departure.is_some() {
            return;
        }
        match Departure::register(namespace, topic, id, held) {
            Ok(registered) => *departure = Some(registered),
            Err(e) => tracing::warn!(
                topic = %topic,
                "a subscriber that left while holding batches could not say so ({e}); \
                 the producer waits for it until they are dropped"
            ),
        }
    }

    /// The producer is gone: nobody will reuse its chunks, so the port may go (a
    /// restarted producer waits for the subscribers attached to a dead one).
    pub(crate) fn let_go(&self) {
        self.port.lock().unwrap_or_else(|p| p.into_inner()).take();
    }

    /// A sample went back; `held` are still out.
    pub(crate) fn released(&self, held: usize) {
        if let Some(departure) = &*self.departure.lock().unwrap_or_else(|p| p.into_inner()) {
            departure.held(held);
        }
    }
}

impl Drop for PortHold {
    fn drop(&mut self) {
        // The port first: the producer must not find it attached without its departure.
        drop(
            self.port
                .get_mut()
                .unwrap_or_else(|p| p.into_inner())
                .take(),
        );
        drop(
            self.departure
                .get_mut()
                .unwrap_or_else(|p| p.into_inner())
                .take(),
        );
    }
}

impl Drop for SampleOwner {
    fn drop(&mut self) {
        // A forked child's copy: the sample is the parent's to give back, and the count
        // is the child's copy too.
        if !self.sample.is_here() {
            return;
        }
        // The sample goes back first (the port, a later field, after it); Release pairs
        // with `TopicSubscriber::held`'s Acquire, so whoever reads the lower count also
        // sees the sample returned.
        drop(self.sample.take());
        let held = self.held.fetch_sub(1, Ordering::Release).saturating_sub(1);
        self.hold.released(held);
    }
}

// SAFETY: the owner is only used to keep the sample mapped until the last Arrow buffer
// that points into it is dropped; the payload is never mutated through it, and the
// thread-safe iceoryx2 service flavour (`ipc_threadsafe`) synchronises the release of the
// sample back to its publisher, whichever thread drops it.
unsafe impl Send for SampleOwner {}
// SAFETY: shared references only read the immutable payload (see above).
unsafe impl Sync for SampleOwner {}
impl std::panic::RefUnwindSafe for SampleOwner {}

/// The payload of a received sample, kept in shared memory: the sample goes back to the
/// producer when the last clone is dropped.
#[derive(Clone)]
pub struct SamplePayload {
    /// Keeps the sample, and so the memory `ptr` points into, alive.
    pub(crate) _owner: Arc<SampleOwner>,
    pub(crate) ptr: NonNull<u8>,
    pub(crate) len: usize,
}

impl SamplePayload {
    /// The payload's bytes (only those the header says are in use).
    pub fn bytes(&self) -> &[u8] {
        // SAFETY: `ptr` points to the payload of the sample `_owner` keeps alive, valid
        // for at least `len` bytes (checked against the sample's length on receipt);
        // nobody writes to a sent sample.
        unsafe { std::slice::from_raw_parts(self.ptr.as_ptr(), self.len) }
    }

    /// Address of the sample's chunk in this process (for tests of chunk reuse).
    pub fn chunk_address(&self) -> usize {
        self.ptr.as_ptr() as usize
    }
}

/// The payload's bytes, so that it can own a `bytes::Bytes` (`Bytes::from_owner`) that a
/// network stack writes without copying it out of shared memory first.
impl AsRef<[u8]> for SamplePayload {
    fn as_ref(&self) -> &[u8] {
        self.bytes()
    }
}

impl std::fmt::Debug for SamplePayload {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.debug_struct("SamplePayload")
            .field("chunk", &format_args!("{:#x}", self.chunk_address()))
            .field("len", &self.len)
            .finish()
    }
}

// SAFETY: the payload is read-only shared memory kept mapped by `owner`, which is Send
// and Sync (see above); the pointer is only dereferenced for shared reads.
unsafe impl Send for SamplePayload {}
// SAFETY: as above: shared reads only.
unsafe impl Sync for SamplePayload {}
