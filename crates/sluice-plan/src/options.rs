//! `SET sluice.*` options: a DataFusion config extension.

use datafusion::common::config::{ConfigEntry, ConfigExtension, ExtensionOptions};
use datafusion::common::extensions_options;

use sluice_core::{ByteSize, DeviceSpec, Result, SluiceError, TopicName};

extensions_options! {
    /// Options a plan file sets with `SET sluice.<name> = <value>`.
    pub struct SluiceOptions {
        /// Name of the topic subscribers attach to (A-Z, a-z, 0-9, '_', '-', '.').
        pub topic: String, default = "sluice".to_string()
        /// Rows per published batch; the last batch of an epoch may be shorter.
        pub batch_rows: usize, default = 1024
        /// Number of passes over the data.
        pub epochs: u64, default = 1
        /// Seed of the per-epoch shuffle; unset keeps source order.
        pub shuffle_seed: Option<u64>, default = None
        /// Rows held by the shuffle buffer (memory is bounded by it); used with shuffle_seed.
        pub shuffle_buffer: usize, default = 8192
        /// Messages a subscriber may have queued: how far the producer runs ahead of the slowest subscriber. 'auto': about 2 MiB of messages per CPU core (4 to 32 MiB), 4 to 128 messages, within an eighth of the free shared memory; 4 on a 'cuda:N' topic or with a lag limit.
        pub window: String, default = "auto".to_string()
        /// Consecutive batches the producer may send as one message where they are ready at once (cut from one DataFusion batch, without a copy); subscribers still receive batches of batch_rows, cut from the message. Every cost per message is then paid once for them all. 'auto': up to about 1 MiB per message, 64 batches at most, fewer where the topic would take more shared memory than with one batch per message and more than an eighth of the free /dev/shm; 1 on a 'cuda:N' or 'cuda_host:N' topic or with a lag limit. 1: every batch alone (what plain Arrow Flight clients of `sluice serve --flight` then receive); at most 4096.
        pub message_batches: String, default = "auto".to_string()
        /// Most subscribers that can attach at once; sizes the shared memory.
        pub max_subscribers: usize, default = 16
        /// Subscribers to wait for before publishing the first batch (0: start at once).
        pub min_subscribers: usize, default = 0
        /// Seconds the producer waits, before its first batch, for subscribers that were already waiting for the topic to attach (they declare their interest; dead ones never count).
        pub attach_grace_s: f64, default = 10.0
        /// Messages a subscriber may hold (batches borrowed, not yet dropped) at once; batches cut from one message count once.
        pub max_held: usize, default = 4
        /// 0: the slowest subscriber sets the pace. Otherwise the producer waits for no one: a subscriber this many messages behind misses messages (and is detached, unless it asked to skip).
        pub lag_limit: usize, default = 0
        /// RANK/WORLD: read only shard RANK of WORLD (files and row groups split deterministically across nodes).
        pub shard: String, default = "0/1".to_string()
        /// The listing every node of a run must see, as `sluice explain` prints it ('listing' and 16 hex digits: a digest of every file's path, size, modification time and entity tag). A node whose files differ (added, removed, rewritten, another view of the store) refuses to run, so that shards never overlap or leave rows out. Empty: not checked.
        pub listing: String, default = String::new()
        /// Retries of a failed object-store request (timeouts, resets, 5xx, 429) before giving up; set before the tables.
        pub store_retries: usize, default = 10
        /// Seconds after which a failing object-store request is no longer retried; set before the tables.
        pub store_retry_timeout_s: u64, default = 120
        /// Where batches are materialized: 'cpu' (shared memory), 'cuda:N' (device slots on GPU N, shared over CUDA IPC) or 'cuda_host:N' (pinned shared memory; each subscriber copies to GPU N itself).
        pub device: String, default = "cpu".to_string()
        /// Most GPU memory a device topic preallocates for its ring of slots (e.g. '2GiB', '512MiB'); the producer refuses to start rather than allocate more, and never allocates mid-stream.
        pub device_memory: String, default = "2GiB".to_string()
        /// Bytes of Parquet column chunks a scan of a remote store (S3, GCS, Azure, HTTP) fetches ahead of its decoder, per partition ('8MiB'; '0' turns it off). A partition holds at most three such windows (each this size or one row group's columns, whichever is larger).
        pub read_ahead: String, default = "8MiB".to_string()
        /// Where the final query runs: 'local' (DataFusion in the producer), 'ballista:standalone' (an in-process Ballista scheduler and executor) or 'ballista://HOST:PORT' (a Ballista cluster's scheduler). Set before the query.
        pub engine: String, default = "local".to_string()
        /// Rounds the producer publishes: each runs sluice.epochs epochs over a snapshot of the data and the trainers' feedback taken when it starts (see docs/rounds.md). 1: one snapshot, as a plan without rounds.
        pub rounds: u64, default = 1
        /// What starts each round after the first: '' (at once), 'rows:N' (the plan's tables grew by N rows), 'every:D' (D after the last round started: '90s', '10m', '2h'), 'sql:QUERY' (a one-row boolean query over the tables, sluice_feedback and sluice_round holds) or 'manual' (a trainer or `sluice round` asks).
        pub trigger: String, default = String::new()
        /// Seconds a file must have been left unmodified to enter a round: a file still being written is never read half-way. Applies to plans with more than one round.
        pub settle_s: f64, default = 1.0
        /// The values trainers report per sample that the plan reads from sluice_feedback, comma-separated (each a Float64 column; other reported values are ignored).
        pub feedback: String, default = "loss".to_string()
    }
}

/// `sluice.window`: how many messages a subscriber may have queued.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum Window {
    /// Sized by the producer from the first batch's size, the machine's cores and the
    /// free shared memory (`sluice_shm::TopicConfig::auto_window`).
    Auto,
    /// This many messages.
    Batches(usize),
}

/// The most batches `sluice.message_batches` may put in one message.
pub const MAX_MESSAGE_BATCHES: usize = 4096;

/// `sluice.message_batches`: how many consecutive batches one message may carry.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum MessageBatches {
    /// Sized by the producer from the first batch's size: about 1 MiB per message, at
    /// most 64 batches; one on a GPU topic or with a lag limit.
    Auto,
    /// At most this many.
    Most(usize),
}

/// `sluice.<key>` given as 'auto' (`None`) or a positive count.
fn auto_or_count(key: &str, value: &str) -> Result<Option<usize>> {
    let text = value.trim();
    if text.eq_ignore_ascii_case("auto") {
        return Ok(None);
    }
    match text.parse::<usize>() {
        Ok(n) if n >= 1 => Ok(Some(n)),
        _ => Err(SluiceError::Config(format!(
            "sluice.{key} must be 'auto' or a number of batches (at least 1), not '{value}'"
        ))),
    }
}

impl ConfigExtension for SluiceOptions {
    const PREFIX: &'static str = "sluice";
}

impl SluiceOptions {
    /// The option names, for error messages.
    pub fn keys() -> Vec<String> {
        Self::default()
            .entries()
            .into_iter()
            .map(|ConfigEntry { key, .. }| key)
            .collect()
    }

    /// Sets `key` (without the `sluice.` prefix) from its SQL text, rejecting unknown keys
    /// with the list of valid ones.
    pub fn set_checked(&mut self, key: &str, value: &str) -> Result<()> {
        if !Self::keys().iter().any(|k| k == key) {
            return Err(SluiceError::Config(format!(
                "unknown option 'sluice.{key}'; valid options are: {}",
                Self::keys()
                    .iter()
                    .map(|k| format!("sluice.{k}"))
                    .collect::<Vec<_>>()
                    .join(", ")
            )));
        }
        self.set(key, value).map_err(|e| {
            SluiceError::Config(format!("invalid value '{value}' for sluice.{key}: {e}"))
        })?;
        self.validate()
    }

    /// Checks the values together.
    pub fn validate(&self) -> Result<()> {
        TopicName::new(self.topic.clone())?;
        self.device()?;
        self.device_memory()?;
        self.read_ahead()?;
        self.window()?;
        self.message_batches()?;
        for (name, value) in [
            ("batch_rows", self.batch_rows),
            ("max_subscribers", self.max_subscribers),
            ("max_held", self.max_held),
            ("shuffle_buffer", self.shuffle_buffer),
        ] {
            if value == 0 {
                return Err(SluiceError::Config(format!(
                    "sluice.{name} must be at least 1"
                )));
            }
        }
        if self.epochs == 0 {
            return Err(SluiceError::Config(
                "sluice.epochs must be at least 1".into(),
            ));
        }
        // Duration::from_secs_f64 panics on a negative, infinite or huge value.
        if !(self.attach_grace_s.is_finite() && (0.0..=86_400.0).contains(&self.attach_grace_s)) {
            return Err(SluiceError::Config(format!(
                "sluice.attach_grace_s must be between 0 and 86400 seconds, not {}",
                self.attach_grace_s
            )));
        }
        if self.min_subscribers > self.max_subscribers {
            return Err(SluiceError::Config(format!(
                "sluice.min_subscribers ({}) exceeds sluice.max_subscribers ({})",
                self.min_subscribers, self.max_subscribers
            )));
        }
        self.listing()?;
        self.trigger()?;
        crate::rounds::feedback_columns(&self.feedback)?;
        if self.rounds == 0 {
            return Err(SluiceError::Config(
                "sluice.rounds must be at least 1".into(),
            ));
        }
        if !(self.settle_s.is_finite() && (0.0..=86_400.0).contains(&self.settle_s)) {
            return Err(SluiceError::Config(format!(
                "sluice.settle_s must be between 0 and 86400 seconds, not {}",
                self.settle_s
            )));
        }
        let shard = crate::shard::Shard::parse(&self.shard)?;
        if self.engine()?.is_ballista() && shard.world > 1 {
            return Err(SluiceError::Config(format!(
                "sluice.shard = '{}' cannot be combined with sluice.engine = '{}': a Ballista \
                 cluster already spreads the scan over its executors, so run one producer \
                 without sluice.shard",
                self.shard, self.engine
            )));
        }
        Ok(())
    }

    /// The validated `sluice.engine`.
    pub fn engine(&self) -> Result<crate::engine::Engine> {
        crate::engine::Engine::parse(&self.engine)
    }

    /// The shard this node reads (`0/1`: everything).
    pub fn shard(&self) -> Result<crate::shard::Shard> {
        crate::shard::Shard::parse(&self.shard)
    }

    /// The validated `sluice.listing`: the digest every node must see, if pinned.
    pub fn listing(&self) -> Result<Option<&str>> {
        let digest = self.listing.trim();
        let digest = digest.strip_prefix("listing").unwrap_or(digest).trim();
        if digest.is_empty() {
            return Ok(None);
        }
        if digest.len() != 16 || !digest.bytes().all(|b| b.is_ascii_hexdigit()) {
            return Err(SluiceError::Config(format!(
                "sluice.listing must be the 16 hex digits `sluice explain` prints after \
                 'listing', not '{}'",
                self.listing
            )));
        }
        Ok(Some(digest))
    }

    /// The validated `sluice.trigger`.
    pub fn trigger(&self) -> Result<crate::rounds::Trigger> {
        crate::rounds::Trigger::parse(&self.trigger)
    }

    /// The epochs of the whole run: `sluice.epochs` per round.
    pub fn total_epochs(&self) -> u64 {
        self.epochs.saturating_mul(self.rounds)
    }

    /// `(seed, buffer rows)` when shuffling is on.
    pub fn shuffle(&self) -> Option<(u64, usize)> {
        self.shuffle_seed.map(|seed| (seed, self.shuffle_buffer))
    }

    /// The validated topic name.
    pub fn topic_name(&self) -> Result<TopicName> {
        TopicName::new(self.topic.clone())
    }

    /// The validated `sluice.device`.
    pub fn device(&self) -> Result<DeviceSpec> {
        self.device
            .parse()
            .map_err(|e| SluiceError::Config(format!("sluice.device: {e}")))
    }

    /// The validated `sluice.device_memory`: the device ring's budget.
    pub fn device_memory(&self) -> Result<ByteSize> {
        let size: ByteSize = self
            .device_memory
            .parse()
            .map_err(|e| SluiceError::Config(format!("sluice.device_memory: {e}")))?;
        if size.0 == 0 {
            return Err(SluiceError::Config(
                "sluice.device_memory must be more than 0 bytes".into(),
            ));
        }
        Ok(size)
    }

    /// The validated `sluice.window`.
    pub fn window(&self) -> Result<Window> {
        Ok(auto_or_count("window", &self.window)?.map_or(Window::Auto, Window::Batches))
    }

    /// The validated `sluice.message_batches` (at most [`MAX_MESSAGE_BATCHES`]).
    pub fn message_batches(&self) -> Result<MessageBatches> {
        match auto_or_count("message_batches", &self.message_batches)? {
            Some(n) if n > MAX_MESSAGE_BATCHES => Err(SluiceError::Config(format!(
                "sluice.message_batches must be 'auto' or at most {MAX_MESSAGE_BATCHES} batches, not {n}"
            ))),
            n => Ok(n.map_or(MessageBatches::Auto, MessageBatches::Most)),
        }
    }

    /// The validated `sluice.read_ahead`: bytes a remote Parquet scan fetches ahead of
    /// its decoder, per partition (0: none).
    pub fn read_ahead(&self) -> Result<ByteSize> {
        self.read_ahead
            .parse()
            .map_err(|e| SluiceError::Config(format!("sluice.read_ahead: {e}")))
    }

    /// `(key, value)` pairs of every option, for `sluice explain`.
    pub fn resolved(&self) -> Vec<(String, String)> {
        self.entries()
            .into_iter()
            .map(|e| {
                (
                    format!("sluice.{}", e.key),
                    e.value.unwrap_or_else(|| "(unset)".into()),
                )
            })
            .collect()
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn defaults_are_valid() {
        SluiceOptions::default().validate().unwrap();
    }

    #[test]
    fn options_are_typed() {
        let mut o = SluiceOptions::default();
        o.set_checked("batch_rows", "256").unwrap();
        o.set_checked("shuffle_seed", "42").unwrap();
        o.set_checked("topic", "train-a").unwrap();
        assert_eq!(o.batch_rows, 256);
        assert_eq!(o.shuffle_seed, Some(42));
        assert_eq!(o.topic, "train-a");
        let err = o.set_checked("batch_rows", "many").unwrap_err().to_string();
        assert!(err.contains("sluice.batch_rows"), "{err}");
    }

    #[test]
    fn message_batches_is_auto_or_a_number_of_batches() {
        let mut o = SluiceOptions::default();
        assert_eq!(o.message_batches().unwrap(), MessageBatches::Auto);
        o.set_checked("message_batches", "1").unwrap();
        assert_eq!(o.message_batches().unwrap(), MessageBatches::Most(1));
        o.set_checked("message_batches", "4096").unwrap();
        assert_eq!(o.message_batches().unwrap(), MessageBatches::Most(4096));
        let err = o
            .set_checked("message_batches", "1000000000000000")
            .unwrap_err()
            .to_string();
        assert!(err.contains("at most 4096"), "{err}");
        for bad in ["0", "-3", "several", ""] {
            let err = SluiceOptions::default()
                .set_checked("message_batches", bad)
                .unwrap_err()
                .to_string();
            assert!(
                err.contains("sluice.message_batches must be 'auto' or a number"),
                "{bad:?}: {err}"
            );
        }
    }

    #[test]
    fn the_window_is_auto_or_a_number_of_batches() {
        let mut o = SluiceOptions::default();
        assert_eq!(o.window().unwrap(), Window::Auto);
        o.set_checked("window", "32").unwrap();
        assert_eq!(o.window().unwrap(), Window::Batches(32));
        o.set_checked("window", "AUTO").unwrap();
        assert_eq!(o.window().unwrap(), Window::Auto);
        for bad in ["0", "-1", "many", "", "4.5"] {
            let err = SluiceOptions::default()
                .set_checked("window", bad)
                .unwrap_err()
                .to_string();
            assert!(
                err.contains("'auto' or a number of batches"),
                "{bad:?}: {err}"
            );
        }
    }

    #[test]
    fn unknown_options_list_the_valid_ones() {
        let err = SluiceOptions::default()
            .set_checked("bach_rows", "1")
            .unwrap_err()
            .to_string();
        assert!(err.contains("unknown option 'sluice.bach_rows'"), "{err}");
        assert!(
            err.contains("sluice.batch_rows") && err.contains("sluice.window"),
            "{err}"
        );
    }

    #[test]
    fn zero_and_inconsistent_values_are_rejected() {
        let mut o = SluiceOptions::default();
        assert!(o.set_checked("batch_rows", "0").is_err());
        let mut o = SluiceOptions::default();
        assert!(o.set_checked("min_subscribers", "99").is_err());
        let mut o = SluiceOptions::default();
        assert!(o.set_checked("topic", "a/b").is_err());
        let mut o = SluiceOptions::default();
        assert!(o.set_checked("shard", "3/3").is_err());
        o.set_checked("shard", "2/3").unwrap();
        assert_eq!(o.shard().unwrap().to_string(), "2/3");
    }

    #[test]
    fn device_defaults_to_cpu_and_accepts_cuda_ordinals() {
        let mut o = SluiceOptions::default();
        assert_eq!(o.device().unwrap(), DeviceSpec::Cpu);
        o.set_checked("device", "cuda:1").unwrap();
        assert_eq!(o.device().unwrap(), DeviceSpec::Cuda(1));
        o.set_checked("device", "cuda_host:0").unwrap();
        assert_eq!(o.device().unwrap(), DeviceSpec::CudaHost(0));
        let err = o.set_checked("device", "gpu0").unwrap_err().to_string();
        assert!(
            err.contains("sluice.device") && err.contains("'cuda:N'"),
            "{err}"
        );
    }

    #[test]
    fn device_memory_is_a_size_with_units() {
        let mut o = SluiceOptions::default();
        assert_eq!(o.device_memory().unwrap(), ByteSize(2 << 30));
        o.set_checked("device_memory", "512MiB").unwrap();
        assert_eq!(o.device_memory().unwrap(), ByteSize(512 << 20));
        for bad in ["lots", "0", "-1GiB"] {
            let err = SluiceOptions::default()
                .set_checked("device_memory", bad)
                .unwrap_err()
                .to_string();
            assert!(err.contains("sluice.device_memory"), "{bad}: {err}");
        }
    }
}
