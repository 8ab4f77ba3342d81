//! A producer's reports for `sluice status`.

use sluice_core::TopicName;
use sluice_shm::{Namespace, TopicPublisher};

use super::Progress;
use crate::status::{EpochSize, ProducerReport, Reporter, unix_now};

/// Writes a run's reports: at most every `REPORT_INTERVAL`, unless forced.
#[derive(Debug)]
pub(crate) struct ProducerReporter {
    reporter: Reporter,
    topic: String,
    epochs: u64,
    lag_limit: usize,
    shm_bytes: u64,
    epoch_size: EpochSize,
    /// `sluice.trigger` of a run of rounds.
    trigger: Option<String>,
    /// Why the run failed, once it did.
    error: Option<String>,
}

impl ProducerReporter {
    pub(crate) fn new(
        namespace: &Namespace,
        topic: &TopicName,
        epochs: u64,
        lag_limit: usize,
        shm_bytes: u64,
        epoch_size: EpochSize,
        trigger: Option<String>,
    ) -> Self {
        Self {
            reporter: Reporter::new(namespace, topic, "producer"),
            topic: topic.to_string(),
            epochs,
            lag_limit,
            shm_bytes,
            epoch_size,
            trigger,
            error: None,
        }
    }

    /// The run failed with `error`: reported from now on.
    pub(crate) fn failed(&mut self, error: String) {
        self.error = Some(error);
    }

    /// An epoch of `batches` and `rows` ended: the size reported from now on.
    pub(crate) fn epoch_ended(&mut self, batches: u64, rows: u64) {
        self.epoch_size = EpochSize {
            batches: Some(batches),
            rows: Some(rows),
        };
    }

    /// Reports `state` at `progress`, the current epoch's next batch being `batch`.
    pub(crate) fn report(
        &mut self,
        state: &str,
        publisher: &TopicPublisher,
        progress: &Progress,
        batch: u64,
        force: bool,
    ) {
        if !force && !self.reporter.due() {
            return;
        }
        self.reporter
            .write(progress.rows, |rows_per_s| ProducerReport {
                pid: std::process::id(),
                started: crate::status::this_process_start(),
                topic: self.topic.clone(),
                state: state.to_string(),
                epoch: progress.epoch,
                epochs: self.epochs,
                batch,
                seq: publisher.seq(),
                rows: progress.rows,
                rows_per_s,
                subscribers: publisher.subscribers(),
                shm_bytes: self.shm_bytes,
                window: publisher.config().queue_depth(),
                lag_limit: self.lag_limit,
                epoch_size: self.epoch_size,
                error: self.error.clone(),
                trigger: self.trigger.clone(),
                updated: unix_now(),
            });
    }
}
