//! How a run's topic is sized from its first message: the shared memory of its chunks,
//! its window, and how many batches a message carries.

use sluice_core::wire::Encoded;
use sluice_core::{Result, TopicName};
use sluice_plan::{MessageBatches, SluiceOptions, Window};
use sluice_shm::{Namespace, TopicConfig, message_bytes, planned_message_bytes, shm_available};

use super::source::Message;
use crate::gpu::DeviceSizing;

/// The window under `sluice.window = 'auto'` of a `cuda:N` topic (its chunks are GPU
/// slots too) and of a topic with a lag limit (whose queues hold the limit), and the
/// window of the topic `fail_before_start` creates to carry an error.
pub(crate) const SHORT_WINDOW: usize = 4;
/// About how large a message of several batches grows under `sluice.message_batches =
/// 'auto'`: at 853 KiB per message a subscriber's fixed cost per message had become a
/// small part of its cost per row (docs/history/benchmarks-2026-11.md, "Several batches per message").
const MESSAGE_TARGET_BYTES: usize = 1 << 20;
/// The most batches a message carries under 'auto' (tiny batches).
const MAX_MESSAGE_BATCHES: usize = 64;

/// The first message of a run, read before the topic exists: it sizes the topic.
#[derive(Debug)]
pub(crate) struct First {
    /// The message.
    pub message: Message,
    /// Its encoding, on a host topic (a device topic carries descriptors).
    pub encoded: Option<Encoded>,
    /// Whether it only sizes the topic and is not published (a run of rounds resumed
    /// before a round that has not started: it waits for the round's trigger with its
    /// topic up, sized by a message of the data as it is now).
    pub sizing_only: bool,
}

/// A run's topic, planned from its first message.
#[derive(Debug)]
pub(crate) struct TopicPlan {
    /// The topic's sizing.
    pub config: TopicConfig,
    /// Consecutive batches a message may carry from the second message on.
    pub max_batches: usize,
    /// The header's `batch_rows` of a message of several batches (0: the batch size
    /// does not fit the header, and every message is one batch).
    pub header_batch_rows: u32,
    /// A device topic's slots, from the first batch.
    pub device: Option<DeviceSizing>,
}

impl TopicPlan {
    /// Plans `topic` for a run whose first message is `first` (`None`: the first epoch
    /// is empty or failed), on a device or not.
    pub(crate) fn new(
        namespace: &Namespace,
        topic: &TopicName,
        opts: &SluiceOptions,
        first: Option<&First>,
        on_device: bool,
    ) -> Result<Self> {
        let device = match (on_device, first) {
            (true, Some(first)) => Some(DeviceSizing::of(&first.message.rows)?),
            _ => None,
        };
        // The first message is one batch (a resumed run's first batches are passed over
        // one at a time); from the next on, a message may carry several.
        let (mut max_batches, batch_bytes) = match first {
            Some(First {
                message,
                encoded: Some(encoded),
                ..
            }) if message.batches == 1 && !on_device => {
                message_batches(opts, encoded.len(), message.rows.num_rows())?
            }
            _ => (1, 0),
        };
        let sizer = Sizer {
            topic,
            opts,
            window: opts.window()?,
            device,
            on_device,
            first_bytes: first.and_then(|f| f.encoded.as_ref()).map(Encoded::len),
            batch_bytes,
        };
        if (sizer.window == Window::Auto || max_batches > 1) && !on_device && opts.lag_limit == 0 {
            // A crashed predecessor's segments are not free space for long (the window
            // and the size of messages are planned against what is free).
            namespace.reclaim_dead();
        }
        let mut config = sizer.topic(max_batches)?;
        if max_batches > 1 && opts.message_batches()? == MessageBatches::Auto {
            // Under 'auto', larger messages only where the shared memory has room.
            let single = sizer.topic(1)?;
            let free = shm_available()?;
            while max_batches > 1 && !config.fits_beside(&single, free) {
                max_batches /= 2;
                config = sizer.topic(max_batches)?;
            }
        }
        Ok(Self {
            config,
            max_batches,
            header_batch_rows: u32::try_from(opts.batch_rows).unwrap_or(0),
            device,
        })
    }
}

/// Sizes the topic for messages of a given number of batches.
struct Sizer<'a> {
    topic: &'a TopicName,
    opts: &'a SluiceOptions,
    window: Window,
    device: Option<DeviceSizing>,
    on_device: bool,
    /// The first message's encoded bytes (host topics).
    first_bytes: Option<usize>,
    /// About how many bytes a full batch encodes to.
    batch_bytes: usize,
}

impl Sizer<'_> {
    /// The topic planned for messages of `batches` batches, with its window.
    fn topic(&self, batches: usize) -> Result<TopicConfig> {
        let max_message_bytes = match (self.first_bytes, self.device) {
            // Descriptors have a bound: device messages never grow.
            (_, Some(sizing)) => message_bytes(sizing.footprint.descriptor_bytes),
            (Some(first), None) => {
                planned_message_bytes(first.max(self.batch_bytes.saturating_mul(batches)))
            }
            (None, None) => message_bytes(0),
        };
        let mut config = TopicConfig {
            topic: self.topic.clone(),
            window: SHORT_WINDOW,
            max_subscribers: self.opts.max_subscribers,
            max_held: self.opts.max_held,
            lag_limit: (self.opts.lag_limit > 0).then_some(self.opts.lag_limit),
            max_message_bytes,
        };
        config.window = match self.window {
            Window::Batches(n) => n,
            // A `cuda:N` topic's chunks are also GPU slots (sluice.device_memory): its
            // queues stay short.
            Window::Auto if self.on_device => SHORT_WINDOW,
            // With a lag limit the queues hold the limit and bursts wake at once: the
            // window sizes nothing.
            Window::Auto if config.lag_limit.is_some() => SHORT_WINDOW,
            Window::Auto => config.auto_window_here()?,
        };
        Ok(config)
    }
}

/// How many consecutive batches a message may carry (`sluice.message_batches`), and
/// about how many bytes a full batch encodes to, from the first batch: under 'auto',
/// about [`MESSAGE_TARGET_BYTES`] of batches, at most [`MAX_MESSAGE_BATCHES`], and one
/// under a lag limit (which counts messages) or on a GPU topic. A batch size that the frame header cannot
/// carry (over `u32::MAX` rows) is one.
pub(crate) fn message_batches(
    opts: &SluiceOptions,
    first_bytes: usize,
    first_rows: usize,
) -> Result<(usize, usize)> {
    // A short first batch (a small epoch's only one) stands for a full one.
    let per_batch = first_bytes
        .saturating_mul(opts.batch_rows)
        .checked_div(first_rows)
        .unwrap_or(first_bytes)
        .max(1);
    if u32::try_from(opts.batch_rows).is_err() {
        return Ok((1, per_batch));
    }
    let most = match opts.message_batches()? {
        MessageBatches::Most(n) => n,
        MessageBatches::Auto if opts.lag_limit > 0 => 1,
        // A `cuda_host:N` topic's batches are copied to the GPU one by one: its messages
        // stay one batch each until batches cut from one pinned sample have run on a
        // device (docs/gpu.md).
        MessageBatches::Auto if opts.device()? != sluice_core::DeviceSpec::Cpu => 1,
        MessageBatches::Auto => auto_message_batches(per_batch),
    };
    Ok((most, per_batch))
}

/// The batches a message carries under `sluice.message_batches = 'auto'` (no lag limit,
/// a host topic) when a batch encodes to `batch_bytes`: about 1 MiB of them, 1 to 64.
pub fn auto_message_batches(batch_bytes: usize) -> usize {
    (MESSAGE_TARGET_BYTES / batch_bytes.max(1)).clamp(1, MAX_MESSAGE_BATCHES)
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn auto_sends_about_a_mebibyte_per_message_and_one_batch_on_a_gpu_or_under_a_lag_limit() {
        let mut opts = SluiceOptions::default();
        assert_eq!(
            message_batches(&opts, 100 << 10, 1024).unwrap(),
            (10, 100 << 10)
        );
        // A short first batch stands for a full one.
        assert_eq!(
            message_batches(&opts, 50 << 10, 512).unwrap(),
            (10, 100 << 10)
        );
        assert_eq!(message_batches(&opts, 8 << 20, 1024).unwrap().0, 1);
        assert_eq!(message_batches(&opts, 100, 1024).unwrap().0, 64);
        opts.device = "cuda_host:0".into();
        assert_eq!(message_batches(&opts, 100 << 10, 1024).unwrap().0, 1);
        opts.device = "cpu".into();
        opts.lag_limit = 8;
        assert_eq!(message_batches(&opts, 100 << 10, 1024).unwrap().0, 1);
        opts.message_batches = "3".into();
        assert_eq!(message_batches(&opts, 100 << 10, 1024).unwrap().0, 3);
    }
}
