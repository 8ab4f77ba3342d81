//! Live status of the topics of a namespace, for `sluice status`.
//!
//! Every producer and subscriber keeps a small JSON report of where it is in the
//! namespace's state directory ([`Namespace::state_dir`]), rewritten at most every
//! [`REPORT_INTERVAL`] (atomically: a temporary file renamed over the old one) and
//! removed when it ends. [`snapshot`] reads them all, drops those of dead processes,
//! and joins each topic's subscribers to its producer to tell their lag.

use std::path::PathBuf;
use std::sync::{Mutex, PoisonError};
use std::time::{Duration, Instant, SystemTime, UNIX_EPOCH};

use serde::{Deserialize, Serialize};
use sluice_core::{Result, SluiceError, TopicName};
use sluice_shm::Namespace;

/// How often, at most, a report is rewritten.
pub const REPORT_INTERVAL: Duration = Duration::from_millis(250);

/// What a producer reports.
#[derive(Debug, Clone, Default, PartialEq, Serialize, Deserialize)]
pub struct ProducerReport {
    /// Its process id.
    pub pid: u32,
    /// When that process started ([`process_start`]): a process that later has the
    /// same pid is not the one that wrote this.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub started: Option<u64>,
    /// The topic.
    pub topic: String,
    /// `waiting` (for subscribers), `publishing`, `draining`, `failed`.
    pub state: String,
    /// Current epoch.
    pub epoch: u64,
    /// Epochs in the run.
    pub epochs: u64,
    /// Next batch of the current epoch.
    pub batch: u64,
    /// Messages published so far (the topic's next sequence number).
    pub seq: u64,
    /// Rows published so far.
    pub rows: u64,
    /// Rows per second over the last report interval.
    pub rows_per_s: f64,
    /// Subscribers attached.
    pub subscribers: usize,
    /// Shared memory the topic reserved, in bytes.
    pub shm_bytes: u64,
    /// Batches the producer may run ahead of the slowest subscriber.
    pub window: usize,
    /// The lag limit (0: the slowest subscriber sets the pace).
    pub lag_limit: usize,
    /// Batches and rows of an epoch, where known: those of the run's last whole epoch,
    /// or before it ends what the loader feeding the producer says of itself
    /// ([`EpochSize`]).
    #[serde(default)]
    pub epoch_size: EpochSize,
    /// Why the run failed (`state` `failed`), as its subscribers are told.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub error: Option<String>,
    /// `sluice.trigger` of a run of several rounds (`""`: each at once); `None` for a run
    /// of one.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub trigger: Option<String>,
    /// When the report was written, in seconds since the Unix epoch.
    pub updated: f64,
}

/// How large an epoch of a topic is: what `len()` of a shared loader tells a training
/// loop (a learning-rate schedule's steps, a progress bar's total). Either may be
/// unknown: a plan's before its first epoch ended, a loader's rows where its batches are
/// made by its own sampler.
#[derive(Debug, Clone, Copy, Default, PartialEq, Eq, Serialize, Deserialize)]
pub struct EpochSize {
    /// Batches as the producer publishes them.
    pub batches: Option<u64>,
    /// Rows.
    pub rows: Option<u64>,
}

/// What a subscriber reports.
#[derive(Debug, Clone, Default, PartialEq, Serialize, Deserialize)]
pub struct SubscriberReport {
    /// Its process id.
    pub pid: u32,
    /// When that process started ([`process_start`]).
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub started: Option<u64>,
    /// The topic.
    pub topic: String,
    /// Epoch of the last batch received.
    pub epoch: u64,
    /// Messages received from the current producer (its next sequence number).
    pub seq: u64,
    /// Rows received so far.
    pub rows: u64,
    /// Rows per second over the last report interval.
    pub rows_per_s: f64,
    /// Shared-memory samples it holds now (batches not yet dropped).
    pub held: usize,
    /// Messages it missed under a lag limit.
    pub missed: u64,
    /// Its port's id (32 hex digits), as the producer names the subscriber it waits for.
    #[serde(default)]
    pub port: String,
    /// When the report was written, in seconds since the Unix epoch.
    pub updated: f64,
}

/// A topic as `sluice status` shows it.
#[derive(Debug, Clone, Serialize)]
pub struct TopicStatus {
    /// The topic.
    pub topic: String,
    /// Its producer, if one is running.
    pub producer: Option<ProducerReport>,
    /// Its subscribers.
    pub subscribers: Vec<SubscriberStatus>,
    /// Subscribers that left the topic while batches they received are still in use:
    /// their ports stay (pinning those batches' shared memory) until they are dropped.
    pub departed: Vec<DepartedStatus>,
    /// The subscriber whose full queue the producer has been waiting for, if it has
    /// waited for a while: the one that paces the stream.
    pub paced_by: Option<PacedBy>,
}

/// A subscriber that left its topic and still holds batches of it.
#[derive(Debug, Clone, Serialize)]
pub struct DepartedStatus {
    /// Its process id.
    pub pid: u32,
    /// Its port's id (32 hex digits).
    pub port: String,
    /// Batches (producer messages) it still holds.
    pub held: usize,
}

/// The subscriber a producer waits for.
#[derive(Debug, Clone, Serialize)]
pub struct PacedBy {
    /// Its process id (0: unknown).
    pub pid: u32,
    /// Its port's id (32 hex digits).
    pub port: String,
    /// Seconds the producer has waited for it.
    pub waited_s: f64,
}

/// One subscriber of a topic, with its lag behind the producer.
#[derive(Debug, Clone, Serialize)]
pub struct SubscriberStatus {
    /// What it reported.
    #[serde(flatten)]
    pub report: SubscriberReport,
    /// Messages the producer published that this subscriber has not received yet.
    pub lag: Option<u64>,
    /// Whether the producer is waiting for this subscriber's full queue (see
    /// [`TopicStatus::paced_by`]).
    pub pacing: bool,
}

/// Writes one process's report, at most every [`REPORT_INTERVAL`].
#[derive(Debug)]
pub(crate) struct Reporter {
    namespace: Namespace,
    path: PathBuf,
    tmp: PathBuf,
    last: Option<(Instant, u64)>,
    failed: bool,
    /// The process whose report this is: a forked child's copy neither writes nor
    /// removes it.
    owner: sluice_core::process::Owner,
}

impl Reporter {
    /// A reporter for a `role` (`producer` or `subscriber`) of `topic`.
    pub(crate) fn new(namespace: &Namespace, topic: &TopicName, role: &str) -> Self {
        static NEXT: std::sync::atomic::AtomicU64 = std::sync::atomic::AtomicU64::new(0);
        let n = NEXT.fetch_add(1, std::sync::atomic::Ordering::Relaxed);
        let name = format!("{topic}.{role}.{}-{n}.json", std::process::id());
        let path = namespace.state_dir().join(name);
        let mut tmp = path.clone().into_os_string();
        tmp.push(".tmp");
        Self {
            namespace: namespace.clone(),
            path,
            tmp: tmp.into(),
            last: None,
            failed: false,
            owner: sluice_core::process::Owner::this(),
        }
    }

    /// Whether a report is due (always true for the first one).
    pub(crate) fn due(&self) -> bool {
        self.last
            .is_none_or(|(t, _)| t.elapsed() >= REPORT_INTERVAL)
    }

    /// Writes `report`; `rows` feeds the rate, which is returned. Reports are best
    /// effort: a failure is logged once and never disturbs the data path.
    pub(crate) fn write<T: Serialize>(&mut self, rows: u64, fill: impl FnOnce(f64) -> T) {
        if !self.owner.is_here() {
            return;
        }
        let now = Instant::now();
        let rate = match self.last {
            Some((t, before)) => {
                let secs = now.duration_since(t).as_secs_f64();
                if secs > 0.0 {
                    rows.saturating_sub(before) as f64 / secs
                } else {
                    0.0
                }
            }
            None => 0.0,
        };
        self.last = Some((now, rows));
        let report = fill(rate);
        let result = self
            .namespace
            .prepare_state_dir()
            .and_then(|_| {
                serde_json::to_vec(&report)
                    .map_err(|e| SluiceError::Internal(format!("cannot encode a report: {e}")))
            })
            .and_then(|bytes| {
                sluice_shm::write_private(&self.tmp, &self.path, &bytes).map_err(|e| {
                    SluiceError::io(format!("cannot write {}", self.path.display()), e)
                })
            });
        if let Err(e) = result
            && !self.failed
        {
            self.failed = true;
            tracing::warn!(
                "status report not written (sluice status will not show this process): {e}"
            );
        }
    }
}

impl Drop for Reporter {
    fn drop(&mut self) {
        // Not a forked child's copy: the report is its parent's.
        if !self.owner.is_here_for_sure() {
            return;
        }
        let _ = std::fs::remove_file(&self.tmp);
        let _ = std::fs::remove_file(&self.path);
    }
}

/// Seconds since the Unix epoch, for reports.
pub(crate) fn unix_now() -> f64 {
    SystemTime::now()
        .duration_since(UNIX_EPOCH)
        .map_or(0.0, |d| d.as_secs_f64())
}

/// When process `pid` started, in clock ticks after the machine booted (the 22nd field
/// of `/proc/PID/stat`): with its pid, it names one process, where a pid alone is given
/// to a new process once the old one is gone. `None` where `/proc` does not say.
pub fn process_start(pid: u32) -> Option<u64> {
    start_field(&std::fs::read_to_string(format!("/proc/{pid}/stat")).ok()?)
}

/// [`process_start`] of this process, read once (again in a forked child, whose pid
/// differs): reports are written four times a second.
pub(crate) fn this_process_start() -> Option<u64> {
    static CACHE: Mutex<Option<(u32, Option<u64>)>> = Mutex::new(None);
    let pid = std::process::id();
    let mut cache = CACHE.lock().unwrap_or_else(PoisonError::into_inner);
    match *cache {
        Some((cached, started)) if cached == pid => started,
        _ => {
            let started = process_start(pid);
            *cache = Some((pid, started));
            started
        }
    }
}

/// The start time of a `/proc/PID/stat` line.
fn start_field(stat: &str) -> Option<u64> {
    // The second field, the command's name, is in parentheses and may hold spaces and
    // parentheses of its own: the fields after it follow the last ')'.
    let rest = &stat[stat.rfind(')')? + 1..];
    rest.split_ascii_whitespace().nth(19)?.parse().ok()
}

/// Whether the process that wrote a report (its pid, and its start where it said) runs.
fn alive(pid: u32, started: Option<u64>) -> bool {
    let Ok(raw) = libc::pid_t::try_from(pid) else {
        return false;
    };
    // SAFETY: kill(2) with signal 0 sends nothing; it only checks that the process
    // exists (EPERM: it exists but belongs to someone else).
    let rc = unsafe { libc::kill(raw, 0) };
    let exists = rc == 0 || std::io::Error::last_os_error().raw_os_error() == Some(libc::EPERM);
    match (exists, started) {
        (false, _) => false,
        // The pid was given to a process started since.
        (true, Some(then)) => process_start(pid).is_none_or(|now| now == then),
        (true, None) => true,
    }
}

/// The status of every topic of `namespace` with a live producer or subscriber. Reports
/// of processes that died are removed.
pub fn snapshot(namespace: &Namespace) -> Result<Vec<TopicStatus>> {
    // Checked to be this user's alone, as where reports are written: another user who
    // made it first could forge them, or plant files this removes.
    let dir = namespace.prepare_state_dir()?;
    let entries = std::fs::read_dir(&dir)
        .map_err(|e| SluiceError::io(format!("cannot read {}", dir.display()), e))?;
    let mut topics: std::collections::BTreeMap<String, TopicStatus> = Default::default();
    let topic_entry = |topics: &mut std::collections::BTreeMap<String, TopicStatus>, t: &str| {
        topics
            .entry(t.to_string())
            .or_insert_with(|| TopicStatus {
                topic: t.to_string(),
                producer: None,
                subscribers: Vec::new(),
                departed: Vec::new(),
                paced_by: None,
            })
            .topic
            .clone()
    };
    for entry in entries.flatten() {
        let path = entry.path();
        let name = entry.file_name().to_string_lossy().into_owned();
        if !name.ends_with(".json") || name.ends_with(".checkpoint.json") {
            continue;
        }
        // Written atomically, so a file is whole; one removed meanwhile is skipped.
        let Ok(Some(text)) = crate::checkpoint::read_state(&path, "report") else {
            continue;
        };
        if name.contains(".producer.") {
            let Ok(report) = serde_json::from_str::<ProducerReport>(&text) else {
                continue;
            };
            if !alive(report.pid, report.started) {
                let _ = std::fs::remove_file(&path);
                continue;
            }
            let key = topic_entry(&mut topics, &report.topic);
            if let Some(t) = topics.get_mut(&key) {
                t.producer = Some(report);
            }
        } else if name.contains(".subscriber.") {
            let Ok(report) = serde_json::from_str::<SubscriberReport>(&text) else {
                continue;
            };
            if !alive(report.pid, report.started) {
                let _ = std::fs::remove_file(&path);
                continue;
            }
            let key = topic_entry(&mut topics, &report.topic);
            if let Some(t) = topics.get_mut(&key) {
                t.subscribers.push(SubscriberStatus {
                    report,
                    lag: None,
                    pacing: false,
                });
            }
        }
    }
    // Topics that only subscribers which left still hold.
    let departed_dir = namespace.root().join("departed");
    for entry in std::fs::read_dir(departed_dir)
        .into_iter()
        .flatten()
        .flatten()
    {
        if let Some(name) = entry.file_name().to_str() {
            topic_entry(&mut topics, name);
        }
    }
    let mut out: Vec<TopicStatus> = topics.into_values().collect();
    for topic in &mut out {
        if let Ok(name) = TopicName::new(&topic.topic) {
            join_live_state(namespace, &name, topic);
        }
    }
    out.retain(|t| t.producer.is_some() || !t.subscribers.is_empty() || !t.departed.is_empty());
    Ok(out)
}

/// The report of `topic`'s running producer in `namespace`, if there is one: its report
/// file alone is read (not the topic's shared memory, as [`snapshot`] does).
pub fn producer_report(namespace: &Namespace, topic: &TopicName) -> Result<Option<ProducerReport>> {
    // Checked to be this user's alone: another user who made it first could forge reports.
    let dir = namespace.prepare_state_dir()?;
    let entries = std::fs::read_dir(&dir)
        .map_err(|e| SluiceError::io(format!("cannot read {}", dir.display()), e))?;
    let prefix = format!("{topic}.producer.");
    let reports = entries.flatten().filter_map(|entry| {
        let name = entry.file_name();
        let name = name.to_str()?;
        if !name.starts_with(&prefix) || !name.ends_with(".json") {
            return None;
        }
        let text = crate::checkpoint::read_state(&entry.path(), "report").ok()??;
        serde_json::from_str::<ProducerReport>(&text).ok()
    });
    // One producer per topic runs; a dead one's report may remain until a snapshot.
    Ok(reports
        .filter(|r| r.topic == topic.as_str() && alive(r.pid, r.started))
        .max_by(|a, b| a.updated.total_cmp(&b.updated)))
}

/// Adds to `topic` what its producer and subscribers keep in shared memory: who paces the
/// producer, and who left with batches still held; then each subscriber's lag.
fn join_live_state(namespace: &Namespace, name: &TopicName, topic: &mut TopicStatus) {
    topic.departed = sluice_shm::departed_subscribers(namespace, name)
        .into_iter()
        .map(|d| DepartedStatus {
            pid: d.pid,
            port: format!("{:032x}", d.port),
            held: d.held,
        })
        .collect();
    let pacing = topic
        .producer
        .as_ref()
        .and_then(|_| sluice_shm::pacing(namespace, name));
    // A producer waiting on a full queue has not reported since it began to wait: what
    // it waits with is newer.
    if let (Some(p), Some(producer)) = (&pacing, &mut topic.producer) {
        producer.seq = producer.seq.max(p.seq);
        producer.state = "waiting for a subscriber".into();
    }
    let published = topic.producer.as_ref().map(|p| p.seq);
    for sub in &mut topic.subscribers {
        sub.lag = published.map(|seq| seq.saturating_sub(sub.report.seq));
        if let Some(p) = &pacing
            && sub.report.port == format!("{:032x}", p.port)
        {
            sub.pacing = true;
            // Its queue is full and it reads nothing: its lag is that queue, whatever
            // it reported last (a subscriber that stopped reading stopped reporting).
            sub.lag = Some(p.queued as u64);
        }
    }
    topic.subscribers.sort_by_key(|s| s.report.pid);
    topic.paced_by = pacing.map(|p| PacedBy {
        pid: p.pid,
        port: format!("{:032x}", p.port),
        waited_s: p.waited_s,
    });
}

/// The pid of another live process that reports producing `topic`.
pub(crate) fn other_live_producer(namespace: &Namespace, topic: &TopicName) -> Option<u32> {
    let topics = snapshot(namespace).ok()?;
    topics
        .into_iter()
        .filter(|t| t.topic == topic.as_str())
        .filter_map(|t| t.producer)
        .map(|p| p.pid)
        .find(|&pid| pid != std::process::id())
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn a_report_is_alive_only_while_the_process_that_wrote_it_runs() {
        let me = std::process::id();
        let started = process_start(me);
        assert!(
            started.is_some(),
            "/proc/self/stat gives this process's start"
        );
        assert!(alive(me, started));
        // A report written before reports said when their process started.
        assert!(alive(me, None));
        assert_eq!(this_process_start(), started);
        // The same pid, another start: a later process was given the writer's pid.
        assert!(!alive(me, started.map(|s| s + 1)));
        // A child that exited and was reaped: its pid names no process.
        let mut child = std::process::Command::new("true").spawn().unwrap();
        let pid = child.id();
        child.wait().unwrap();
        assert!(!alive(pid, None));
    }

    #[test]
    fn a_command_name_with_spaces_and_parentheses_does_not_shift_the_fields() {
        let fields: String = (3..=30).map(|i| format!(" {i}")).collect();
        assert_eq!(start_field(&format!("7 (a) b (c){fields}")), Some(22));
        assert_eq!(start_field(&format!("7 (plain){fields}")), Some(22));
        assert_eq!(start_field("7 (cut short) S 1 2"), None);
        assert_eq!(start_field("no parenthesis"), None);
    }
}
