//! How a topic is sized: its chunks of shared memory, and the window `'auto'` gives it.

use sluice_core::wire::ALIGNMENT;
use sluice_core::{Result, SluiceError, TopicName};

use crate::namespace::{SHM_DIR, shm_available};

/// Borrows a subscriber has beyond its `max_held`: the one that receives a message to
/// be copied (see [`OnMaxHeld::Copy`]) while `max_held` samples are held.
pub(crate) const SPARE_BORROWS: usize = 1;

/// Loaned samples a producer may have in flight.
pub(crate) const MAX_LOANED: usize = 2;
/// Per-sample bookkeeping iceoryx2 adds to each chunk (header, user header, alignment).
const CHUNK_OVERHEAD: u64 = 256;

/// Smallest shared-memory chunk a topic is planned with.
const MIN_MESSAGE_BYTES: usize = 4096;

/// A topic's `max_message_bytes` for messages of at most `len` bytes: at least 4 KiB, a
/// multiple of the payload alignment.
pub fn message_bytes(len: usize) -> usize {
    len.max(MIN_MESSAGE_BYTES).next_multiple_of(ALIGNMENT)
}

/// A topic's `max_message_bytes` planned from its first batch of `first` encoded bytes:
/// half again, since later batches may carry longer strings or lists (a larger one still
/// grows the topic, see [`TopicConfig::grown_for`]).
pub fn planned_message_bytes(first: usize) -> usize {
    message_bytes(first.saturating_add(first / 2))
}

/// How a topic is sized. Fixed when the topic is created.
#[derive(Debug, Clone)]
pub struct TopicConfig {
    /// The topic's name.
    pub topic: TopicName,
    /// Messages a subscriber may have queued; the producer's lead over the slowest one.
    pub window: usize,
    /// Most subscribers at once.
    pub max_subscribers: usize,
    /// Messages a subscriber may hold (received, not yet dropped) at once.
    pub max_held: usize,
    /// Expected largest message in bytes; larger ones make the topic grow its memory.
    pub max_message_bytes: usize,
    /// `None`: the slowest subscriber sets the pace (queues hold `window` messages).
    /// `Some(n)`: queues hold `n` messages and the producer waits for no one: a
    /// subscriber `n` messages behind misses the next message. End-of-epoch, end-of-stream
    /// and error messages are always delivered.
    pub lag_limit: Option<usize>,
}

impl TopicConfig {
    /// Shared-memory chunks the producer preallocates: enough that it can always loan
    /// one, whatever its subscribers hold or have queued, and the replay history.
    /// Saturates: absurd options (`SET sluice.window = 1e18`) make a topic too large for
    /// any `/dev/shm` (`ShmTooSmall`), not an overflow.
    pub fn chunks(&self) -> u64 {
        let per_subscriber = (self.queue_depth() as u64)
            .saturating_add(self.max_held as u64)
            .saturating_add(SPARE_BORROWS as u64);
        (self.max_subscribers as u64)
            .saturating_mul(per_subscriber)
            .saturating_add(self.history() as u64)
            .saturating_add(MAX_LOANED as u64)
    }

    /// Messages the topic keeps for subscribers that join with replay (and for
    /// subscribers that reconnect to a restarted producer): as many as a queue holds.
    pub fn history(&self) -> usize {
        self.queue_depth()
    }

    /// Messages a subscriber's queue holds.
    pub fn queue_depth(&self) -> usize {
        self.lag_limit.unwrap_or(self.window)
    }

    /// Bytes of shared memory the topic's data segment takes.
    pub fn shm_bytes(&self) -> u64 {
        self.chunks()
            .saturating_mul((self.max_message_bytes as u64).saturating_add(CHUNK_OVERHEAD))
    }

    /// The topic after a message of `len` bytes, more than planned: iceoryx2 adds a
    /// segment of as many chunks, each the next power of two, beside the one in use.
    /// Fails with [`SluiceError::ShmTooSmall`] if `/dev/shm` (`shm_free` bytes free) cannot
    /// hold it: its pages are only used when written, so a segment larger than the free
    /// space would be created and then kill this process with SIGBUS mid-stream.
    pub fn grown_for(&self, len: usize, shm_free: u64) -> Result<Self> {
        let grown = Self {
            max_message_bytes: len.next_power_of_two(),
            ..self.clone()
        };
        let needed = grown.shm_bytes();
        if needed > shm_free {
            return Err(SluiceError::ShmTooSmall {
                topic: self.topic.to_string(),
                needed,
                available: shm_free,
                path: SHM_DIR.into(),
            });
        }
        Ok(grown)
    }

    /// Whether this topic may take its size to carry larger messages than `single`, the
    /// same topic with one batch per message (`sluice.message_batches`): it may take as
    /// much as `single` takes, or up to an eighth of the free shared memory (`shm_free`
    /// bytes), the share [`Self::auto_window`] keeps to. Messages of several batches
    /// make every chunk larger, including those the subscribers may hold (which do not
    /// shrink with the window), so where `/dev/shm` is small (a container's 64 MiB) the
    /// producer keeps the messages of one batch that fitted before.
    pub fn fits_beside(&self, single: &TopicConfig, shm_free: u64) -> bool {
        self.shm_bytes() <= single.shm_bytes().max(shm_free / AUTO_SHM_SHARE)
    }

    /// The window `sluice.window = 'auto'` gives this topic (its other fields set) on this
    /// machine: its CPU cores and the bytes free in `/dev/shm` now.
    ///
    /// A subscriber's queue holds about 2 MiB of messages per core, from 4 to 32 MiB, as
    /// a power of two of 4 to 128 messages; then the window is halved (not below 4) while
    /// the topic would take more than an eighth of the free shared memory. An eighth,
    /// because a batch larger than planned makes iceoryx2 add a segment of the same
    /// chunks at the next power of two while the first may still be in use: the topic
    /// must be able to triple.
    ///
    /// Why bytes and cores: a deeper queue absorbs the moments a subscriber is late (a
    /// wake-up, a preempted core) and wakes subscribers once per longer burst, so
    /// fan-out and CPU improve with depth, but only up to what the caches hold on a small
    /// machine. Measured (docs/benchmarks.md, "The window in bytes"): 107 KiB batches on 2
    /// cores were best at 16 to 32 messages (128 cost CPU); on 16 cores 128 took fan-out
    /// at N = 8 from 0.64 (8) and 0.68 (32) to 0.84.
    pub fn auto_window_here(&self) -> Result<usize> {
        let cores = std::thread::available_parallelism().map_or(1, |n| n.get());
        Ok(self.auto_window(cores, shm_available()?))
    }

    /// [`Self::auto_window_here`] on a machine with `cores` CPU cores and `shm_free` bytes
    /// free in `/dev/shm`: the rule itself, a pure function.
    pub fn auto_window(&self, cores: usize, shm_free: u64) -> usize {
        let queue_bytes = (cores.max(1) as u64 * AUTO_QUEUE_BYTES_PER_CORE)
            .clamp(AUTO_QUEUE_BYTES.0, AUTO_QUEUE_BYTES.1);
        let chunk = self.max_message_bytes as u64 + CHUNK_OVERHEAD;
        let fits = queue_bytes / chunk;
        let mut window = match fits {
            0 => AUTO_WINDOW.0,
            n => (1usize << n.ilog2()).clamp(AUTO_WINDOW.0, AUTO_WINDOW.1),
        };
        while window > AUTO_WINDOW.0 {
            let sized = Self {
                window,
                lag_limit: None,
                ..self.clone()
            };
            if sized.shm_bytes() <= shm_free / AUTO_SHM_SHARE {
                break;
            }
            window /= 2;
        }
        window
    }
}

/// Bytes of queued messages per CPU core that `sluice.window = 'auto'` aims for, per
/// subscriber (see [`TopicConfig::auto_window`]).
const AUTO_QUEUE_BYTES_PER_CORE: u64 = 2 << 20;
/// The least and most bytes of a queue under `sluice.window = 'auto'`.
const AUTO_QUEUE_BYTES: (u64, u64) = (4 << 20, 32 << 20);
/// `sluice.window = 'auto'` keeps a topic to this fraction (1/n) of the free `/dev/shm`.
const AUTO_SHM_SHARE: u64 = 8;
/// The least and most messages of a queue under `sluice.window = 'auto'`.
const AUTO_WINDOW: (usize, usize) = (4, 128);
