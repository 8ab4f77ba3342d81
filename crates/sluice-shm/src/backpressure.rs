//! What the producer does when a subscriber's queue is full, and its wake-ups of the
//! subscribers (see the crate docs, "Flow control").

use std::sync::Arc;
use std::sync::atomic::{AtomicBool, AtomicU64, Ordering};
use std::time::{Duration, Instant};

use iceoryx2::port::listener::Listener;
use iceoryx2::port::notifier::{Notifier, NotifierNotifyError};
use iceoryx2::port::{BackpressureAction, BackpressureInfo};
use iceoryx2::prelude::*;

use crate::Ipc;
use crate::departure::Departed;
use crate::namespace::Namespace;
use crate::naming::DataService;
use crate::pacing::PacingRecord;

/// How long a waiting producer sleeps on the `released` event before it looks for dead
/// subscribers again; bounds the stall a killed subscriber causes.
pub(crate) const DEAD_CHECK_INTERVAL: Duration = Duration::from_millis(50);

/// A topic's wake-ups of its subscribers, shared by the publishing thread and its
/// backpressure handler (which runs on that thread, inside `send`: the atomics need no
/// ordering, only sharing with the handler's closure).
pub(crate) struct Wakeups {
    /// Notifies every subscriber's `ready` listener.
    ready: Notifier<Ipc>,
    /// Messages were sent whose wake-up is still owed (see
    /// [`TopicPublisher::publish_batches_in_burst`]).
    owed: AtomicBool,
    /// Wake-ups paid so far ([`TopicPublisher::wakeups`]).
    count: AtomicU64,
}

impl Wakeups {
    /// Wake-ups through `ready`, none owed yet.
    pub(crate) fn new(ready: Notifier<Ipc>) -> Self {
        Self {
            ready,
            owed: AtomicBool::new(false),
            count: AtomicU64::new(0),
        }
    }

    /// A message was sent whose wake-up is owed.
    pub(crate) fn owe(&self) {
        self.owed.store(true, Ordering::Relaxed);
    }

    /// Wake-ups paid so far.
    pub(crate) fn count(&self) -> u64 {
        self.count.load(Ordering::Relaxed)
    }

    /// Wakes the subscribers if a wake-up is owed, and counts it.
    pub(crate) fn pay(&self) -> std::result::Result<(), NotifierNotifyError> {
        if self.owed.swap(false, Ordering::Relaxed) {
            self.count.fetch_add(1, Ordering::Relaxed);
            self.ready.notify()?;
        }
        Ok(())
    }
}

/// Decides what the producer does when a subscriber's queue is full.
pub(crate) struct BackpressureWaiter {
    /// Subscribers that left (their queues are never waited for).
    pub(crate) departed: Arc<Departed>,
    /// Says which subscriber a long wait is for.
    pub(crate) pacing: Arc<PacingRecord>,
    /// Messages published so far (the publisher's next sequence number).
    pub(crate) seq: Arc<AtomicU64>,
    /// Messages a subscriber's queue holds.
    pub(crate) queue_depth: usize,
    pub(crate) released: Arc<Listener<Ipc>>,
    pub(crate) data: DataService,
    pub(crate) namespace: Namespace,
    pub(crate) stop: Arc<AtomicBool>,
    pub(crate) last_check: std::sync::Mutex<Instant>,
    /// Whether a full queue means "too far behind" rather than "wait".
    pub(crate) lag_limit: bool,
    /// Set while a batch (not a control message) is being sent.
    pub(crate) sending_batch: Arc<AtomicBool>,
    /// The topic's wake-ups, and whether one is owed for a burst.
    pub(crate) wakeups: Arc<Wakeups>,
    /// Nanoseconds spent on full queues (see [`TopicPublisher::full_queue_wait`]).
    pub(crate) waited_ns: Arc<AtomicU64>,
}

impl BackpressureWaiter {
    /// Counts the whole time spent on a full queue (the dead-subscriber checks included)
    /// in [`TopicPublisher::full_queue_wait`].
    pub(crate) fn on_full_queue(&self, info: &BackpressureInfo) -> BackpressureAction {
        let entered = Instant::now();
        let action = self.decide(info);
        self.waited_ns
            .fetch_add(entered.elapsed().as_nanos() as u64, Ordering::Relaxed);
        action
    }

    fn decide(&self, info: &BackpressureInfo) -> BackpressureAction {
        // A subscriber that left: its queue stays full until its batches are dropped.
        // Checked first, so that its full queue costs nothing more, burst wake-ups
        // included.
        if self.departed.known(info.receiver_port_id) {
            return BackpressureAction::DiscardData;
        }
        // A subscriber whose queue is full may be asleep, waiting for the wake-up of a
        // burst: pay it before waiting for (or skipping) that subscriber.
        let _ = self.wakeups.pay();
        if self.stop.load(Ordering::Relaxed) {
            return BackpressureAction::DiscardData;
        }
        // Dead subscribers are looked for at most every DEAD_CHECK_INTERVAL.
        let check = {
            let mut last = self.last_check.lock().unwrap_or_else(|p| p.into_inner());
            let due = last.elapsed() >= DEAD_CHECK_INTERVAL;
            if due {
                *last = Instant::now();
            }
            due
        };
        if check {
            if self.departed.contains(info.receiver_port_id) {
                return BackpressureAction::DiscardData;
            }
            self.namespace.reclaim_dead();
            // A listing taken while another process edits the subscriber list can miss
            // an entry: a subscriber counts as gone only if two listings agree.
            if !self.subscriber_attached(info.receiver_port_id)
                && !{
                    std::thread::sleep(Duration::from_millis(2));
                    self.subscriber_attached(info.receiver_port_id)
                }
            {
                tracing::warn!("a subscriber went away with a full queue; continuing without it");
                return BackpressureAction::DiscardData;
            }
        }
        if self.lag_limit && self.sending_batch.load(Ordering::Relaxed) {
            // The subscriber is a whole queue (the lag limit) behind: it misses this
            // batch, and notices the gap in sequence numbers.
            return BackpressureAction::DiscardData;
        }
        let port = info.receiver_port_id;
        self.pacing.waiting(
            port,
            self.seq.load(Ordering::Relaxed),
            self.queue_depth,
            || self.subscriber_pid(port),
        );
        // Sleep until some subscriber takes a message (or the interval passes).
        let _ = self.released.timed_wait(|_| {}, DEAD_CHECK_INTERVAL);
        BackpressureAction::Retry
    }

    /// The process of the subscriber with port `port_id` (0 if unknown).
    fn subscriber_pid(&self, port_id: u128) -> u32 {
        let mut pid = 0;
        self.data.dynamic_config().list_subscribers(|details| {
            if details.subscriber_id.value() == port_id {
                pid = details
                    .node_id
                    .pid::<Ipc>()
                    .map_or(0, |p| u32::try_from(p.value()).unwrap_or(0));
                CallbackProgression::Stop
            } else {
                CallbackProgression::Continue
            }
        });
        pid
    }

    fn subscriber_attached(&self, port_id: u128) -> bool {
        let mut found = false;
        self.data.dynamic_config().list_subscribers(|details| {
            if details.subscriber_id.value() == port_id {
                found = true;
                CallbackProgression::Stop
            } else {
                CallbackProgression::Continue
            }
        });
        found
    }
}
