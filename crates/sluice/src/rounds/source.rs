//! A producer's rounds: before each round's first epoch, wait for its trigger, take the
//! round's snapshot (files, feedback, rounds so far), record it, and plan the round.
//! Epochs are numbered across rounds (round `r` is epochs `r·E .. (r+1)·E` of `E =
//! sluice.epochs`), so the delivery contract, checkpoints and cursors hold unchanged.

use std::path::PathBuf;
use std::sync::Arc;
use std::sync::atomic::{AtomicBool, Ordering};
use std::time::{Duration, Instant, SystemTime};

use sluice_core::{Position, Result, SluiceError, TopicName};
use sluice_plan::rounds::{RoundInputs, Trigger, feedback_columns, reads_feedback};
use sluice_plan::{Plan, SluiceOptions};
use sluice_shm::Namespace;
use tokio::runtime::Handle;

use super::feedback::{feedback_dir, feedback_files, read_feedback};
use super::log::{RoundEntry, RoundLog};
use super::{from_us, to_us};
use crate::producer::{Message, PlanSource, Source};

/// Schema metadata of every batch of a round: its number, what started it, its new rows.
pub const ROUND_KEY: &str = "sluice.round";
/// See [`ROUND_KEY`].
pub const TRIGGER_KEY: &str = "sluice.round_trigger";
/// See [`ROUND_KEY`].
pub const NEW_ROWS_KEY: &str = "sluice.round_new_rows";

/// The round a batch of a plan of several rounds belongs to (its [`ROUND_KEY`]); `None`
/// for a plan of one round.
pub fn round_of(batch: &arrow::record_batch::RecordBatch) -> Option<u64> {
    batch.schema_ref().metadata().get(ROUND_KEY)?.parse().ok()
}

/// How often a trigger is looked at while a producer waits for it: a request or a clock
/// often (a file's presence, the time: a system call at most; half the period is
/// added to every round's start on average), the
/// data and a query less often (each look plans the tables again: a listing, a LIST
/// request per table on object storage).
const CHEAP_POLL: Duration = Duration::from_millis(5);
const PLANNED_POLL: Duration = Duration::from_millis(500);

/// Asks the producer of `topic` to start its next round (`sluice.trigger = 'manual'`);
/// a `Config` error where none runs in `namespace`.
pub fn request_round(namespace: &Namespace, topic: &str) -> Result<()> {
    let topic = TopicName::new(topic)?;
    // A producer clears requests when it starts: one made with no producer running
    // would be lost without a word.
    let Some(report) = crate::status::producer_report(namespace, &topic)? else {
        return Err(SluiceError::Config(format!(
            "no producer of topic '{topic}' runs in namespace '{}': a round is asked of a \
             running producer of rounds (sluice.trigger = 'manual'); start it first, or \
             check SLUICE_NAMESPACE",
            namespace.name()
        )));
    };
    // Asked of a producer that does not take requests, a round would never come.
    match report
        .trigger
        .as_deref()
        .map(sluice_plan::rounds::Trigger::parse)
    {
        Some(Ok(sluice_plan::rounds::Trigger::Manual)) => {}
        None => {
            return Err(SluiceError::Config(format!(
                "the producer of topic '{topic}' runs no rounds (sluice.rounds = 1): there is \
                 no round to ask for"
            )));
        }
        Some(_) => {
            return Err(SluiceError::Config(format!(
                "the producer of topic '{topic}' starts its rounds on sluice.trigger = '{}'{}: \
                 a round is asked only of a producer whose trigger is 'manual'",
                report.trigger.as_deref().unwrap_or_default(),
                match report.trigger.as_deref() {
                    Some("") => " (each round at once)",
                    _ => "",
                }
            )));
        }
    }
    let path = request_path(namespace, &topic);
    crate::checkpoint::write_state(&path, b"round\n")
}

fn request_path(namespace: &Namespace, topic: &TopicName) -> PathBuf {
    namespace.state_dir().join(format!("{topic}.round-request"))
}

/// The epochs of a run of several rounds.
pub(crate) struct RoundSource<'a> {
    base: &'a Plan,
    opts: &'a SluiceOptions,
    plan_hash: String,
    inner: Option<PlanSource<'a>>,
    round: Option<u64>,
    log: RoundLog,
    log_path: PathBuf,
    feedback_dir: PathBuf,
    request_path: PathBuf,
    columns: Vec<String>,
    /// Whether the plan names `sluice_feedback` (a plan that does not starts its rounds
    /// without reading the reports), and whether a probe needs them (the plan or a
    /// `sql:` trigger's query names it).
    reads_feedback: bool,
    probe_reads_feedback: bool,
    trigger: Trigger,
    stop: Arc<AtomicBool>,
    max_batches: usize,
    /// Time spent waiting by the rounds before the current one.
    waited: Duration,
}

impl<'a> RoundSource<'a> {
    /// The rounds of `base` on `topic`; `resume`: continue the rounds a crashed run
    /// recorded (a new run forgets them, and the feedback of the run before).
    #[allow(clippy::too_many_arguments)]
    pub(crate) fn new(
        base: &'a Plan,
        opts: &'a SluiceOptions,
        plan_hash: &str,
        namespace: &Namespace,
        topic: &TopicName,
        resume: bool,
        stop: Arc<AtomicBool>,
    ) -> Result<Self> {
        namespace.prepare_state_dir()?;
        let log_path = RoundLog::path(namespace, topic);
        let feedback_dir = feedback_dir(namespace, topic);
        let request_path = request_path(namespace, topic);
        let log = match resume {
            true => RoundLog::load(&log_path, topic, plan_hash)?,
            false => None,
        };
        let log = match log {
            Some(log) => log,
            None => {
                // A new run: its rounds read the feedback on its own stream only. Not
                // while another producer runs the topic (started twice by mistake: this
                // run then fails to create the topic, and must not take its reports).
                if let Some(pid) = live_producer(namespace, topic) {
                    return Err(SluiceError::Config(format!(
                        "topic '{topic}' has a running producer (pid {pid}); a new run would \
                         discard its trainers' reports: stop it first, or publish on another \
                         topic"
                    )));
                }
                let _ = std::fs::remove_dir_all(&feedback_dir);
                let _ = std::fs::remove_file(&request_path);
                RoundLog::new(topic, plan_hash)
            }
        };
        sluice_shm::private_dir(
            &feedback_dir,
            "set TMPDIR or XDG_RUNTIME_DIR to a directory of your own",
        )?;
        Ok(Self {
            base,
            opts,
            plan_hash: plan_hash.to_string(),
            inner: None,
            round: None,
            log,
            log_path,
            feedback_dir,
            request_path,
            columns: feedback_columns(&opts.feedback)?,
            reads_feedback: reads_feedback(base.sql()),
            probe_reads_feedback: reads_feedback(base.sql())
                || matches!(opts.trigger()?, Trigger::Sql(query) if reads_feedback(&query)),
            trigger: opts.trigger()?,
            stop,
            max_batches: 1,
            waited: Duration::ZERO,
        })
    }

    /// Starts `round`: the one recorded (a resumed run), else a new one once its
    /// trigger fires.
    fn begin(&mut self, handle: &Handle, round: u64) -> Result<()> {
        let recorded = self.log.get(round).cloned();
        let entry = match recorded.clone() {
            Some(entry) => entry,
            None => self.next_round(handle, round)?,
        };
        let started = Instant::now();
        let inputs = RoundInputs {
            round,
            cutoff: Some(from_us(entry.cutoff_us)),
            files: recorded.as_ref().map(|r| r.files.clone()),
            feedback: match self.reads_feedback {
                true => {
                    let mut files = self.log.feedback_before(round);
                    files.extend(entry.feedback.iter().cloned());
                    read_feedback(&self.feedback_dir, &files, &self.columns).0
                }
                false => Vec::new(),
            },
            rounds: {
                let mut rows = self.log.rows(round);
                if recorded.is_none() {
                    rows.push(entry.row());
                }
                rows
            },
        };
        let read = started.elapsed();
        let mut plan = self.plan(handle, &inputs)?;
        let planned = started.elapsed();
        let listing = handle.block_on(plan.listing())?;
        // Every epoch of the round lists these files and no others, and fails (like a
        // read error) where one was removed or rewritten: DataFusion's cache of listings
        // holds only so much, and a larger table is listed again each epoch.
        plan.restrict_listing(&listing.paths);
        plan.options_mut().listing = listing.digest.clone();
        let entry = match recorded {
            Some(entry) if entry.listing != listing.digest => {
                return Err(SluiceError::Config(format!(
                    "round {round} listed {} when it started, but lists {listing} now: files \
                     it read were removed or rewritten since. Start over without --resume",
                    entry.listing
                )));
            }
            Some(entry) => entry,
            None => {
                let entry = RoundEntry {
                    listing: listing.digest.clone(),
                    files: listing.paths.clone(),
                    ..entry
                };
                self.log.rounds.push(entry.clone());
                self.log.write(&self.log_path)?;
                entry
            }
        };
        tracing::info!(
            round,
            trigger = %entry.trigger,
            new_rows = entry.new_rows,
            feedback_files = entry.feedback.len(),
            // Where a round's start goes: reading the feedback, planning (a `CREATE
            // TABLE … AS` runs there), listing and recording the round.
            feedback_read_ms = read.as_millis(),
            planned_ms = planned.as_millis(),
            recorded_ms = started.elapsed().as_millis(),
            "round starts ({listing})"
        );
        self.waited += self.inner.as_ref().map_or(Duration::ZERO, Source::waited);
        let epochs = self.opts.epochs.max(1);
        let last = round
            .saturating_add(1)
            .saturating_mul(epochs)
            .saturating_sub(1);
        let mut inner = PlanSource::owned(plan, self.opts)
            .stamped(&self.plan_hash)
            .prefetching_until(last)
            .with_identity(ROUND_KEY, round.to_string())
            .with_identity(TRIGGER_KEY, entry.trigger.clone())
            .with_identity(NEW_ROWS_KEY, entry.new_rows.to_string());
        inner.set_max_batches(self.max_batches);
        self.inner = Some(inner);
        self.round = Some(round);
        Ok(())
    }

    /// The plan of a round (or of a probe), with the run's options.
    fn plan(&self, handle: &Handle, inputs: &RoundInputs) -> Result<Box<Plan>> {
        let mut plan =
            handle.block_on(Plan::for_round(self.base.file(), self.base.sql(), inputs))?;
        *plan.options_mut() = self.opts.clone();
        Ok(Box::new(plan))
    }

    /// Waits for the trigger of `round` (round 0 starts at once) and takes its snapshot.
    fn next_round(&mut self, handle: &Handle, round: u64) -> Result<RoundEntry> {
        let previous = self.log.rounds.last().cloned();
        let mut failures = 0u64;
        loop {
            if self.stop.load(Ordering::Relaxed) {
                return Err(SluiceError::Stopped(format!(
                    "waiting for the trigger of round {round}"
                )));
            }
            let cutoff = self.cutoff_now();
            match self.fired(handle, round, previous.as_ref(), cutoff) {
                Ok(Some((trigger, rows))) => {
                    // The files new since the last round (the record lists each once).
                    let seen: std::collections::HashSet<String> =
                        self.log.feedback_before(round).into_iter().collect();
                    let feedback = feedback_files(&self.feedback_dir)
                        .into_iter()
                        .filter(|f| !seen.contains(f))
                        .collect();
                    let new_rows = rows.saturating_sub(previous.as_ref().map_or(0, |p| p.rows));
                    return Ok(RoundEntry {
                        round,
                        trigger,
                        started_us: to_us(SystemTime::now()),
                        rows,
                        new_rows,
                        cutoff_us: to_us(cutoff),
                        listing: String::new(),
                        files: Vec::new(),
                        feedback,
                    });
                }
                Ok(None) => {}
                // A trigger that fails (a query over a file being replaced, a typo in it)
                // is reported and tried again: the round waits, the run does not end.
                Err(e) => {
                    failures += 1;
                    if failures.is_power_of_two() {
                        tracing::warn!(round, failures, "the trigger could not be evaluated: {e}");
                    }
                }
            }
            std::thread::sleep(match self.trigger {
                Trigger::Rows(_) | Trigger::Sql(_) => PLANNED_POLL,
                _ => CHEAP_POLL,
            });
        }
    }

    /// `Some((what fired, rows of the tables))` once the trigger holds.
    fn fired(
        &self,
        handle: &Handle,
        round: u64,
        previous: Option<&RoundEntry>,
        cutoff: SystemTime,
    ) -> Result<Option<(String, u64)>> {
        let Some(previous) = previous.filter(|_| round > 0) else {
            return Ok(Some(("start".into(), self.rows(handle, round, cutoff)?)));
        };
        let name = self.trigger.name();
        match &self.trigger {
            Trigger::Immediate => {}
            Trigger::Every(every) => {
                let due = from_us(previous.started_us) + *every;
                if SystemTime::now() < due {
                    return Ok(None);
                }
            }
            Trigger::Manual => {
                if std::fs::remove_file(&self.request_path).is_err() {
                    return Ok(None);
                }
            }
            Trigger::Rows(n) => {
                let rows = self.rows(handle, round, cutoff)?;
                return Ok((rows >= previous.rows.saturating_add(*n)).then_some((name, rows)));
            }
            Trigger::Sql(query) => {
                // One plan answers the query and counts the rows.
                let plan = self.plan(handle, &self.probe(previous.round, cutoff))?;
                if !handle.block_on(plan.holds(query))? {
                    return Ok(None);
                }
                return Ok(Some((name, handle.block_on(plan.table_rows())?)));
            }
        }
        Ok(Some((name, self.rows(handle, round, cutoff)?)))
    }

    /// What a look at the data as it is now plans with: the files before `cutoff`, every
    /// report so far, the rounds up to `round`.
    fn probe(&self, round: u64, cutoff: SystemTime) -> RoundInputs {
        let feedback = match self.probe_reads_feedback {
            true => {
                read_feedback(
                    &self.feedback_dir,
                    &feedback_files(&self.feedback_dir),
                    &self.columns,
                )
                .0
            }
            false => Vec::new(),
        };
        RoundInputs {
            round,
            cutoff: Some(cutoff),
            files: None,
            feedback,
            rounds: self.log.rows(round),
        }
    }

    /// The cutoff of a round starting now: files left unmodified for `sluice.settle_s`.
    fn cutoff_now(&self) -> SystemTime {
        SystemTime::now() - Duration::try_from_secs_f64(self.opts.settle_s).unwrap_or_default()
    }

    /// Rows in the plan's tables as listed at `cutoff`. A look at the tables only: the
    /// plan's `CREATE TABLE … AS` selections run when the round starts, not here.
    fn rows(&self, handle: &Handle, round: u64, cutoff: SystemTime) -> Result<u64> {
        let inputs = RoundInputs {
            round,
            cutoff: Some(cutoff),
            files: None,
            feedback: Vec::new(),
            rounds: Vec::new(),
        };
        handle.block_on(async {
            let plan = Plan::tables_for_round(self.base.file(), self.base.sql(), &inputs).await?;
            plan.table_rows().await
        })
    }

    fn inner(&mut self) -> Result<&mut PlanSource<'a>> {
        self.inner
            .as_mut()
            .ok_or_else(|| SluiceError::Internal("a round was read before it started".into()))
    }
}

impl Source for RoundSource<'_> {
    /// A run resumed before a round that has not started sizes its topic from the
    /// round's data as it is now (the first message of a probe of it), and waits for the
    /// trigger with the topic up, so that trainers can attach meanwhile.
    fn sizing_message(&mut self, handle: &Handle, start: Position) -> Result<Option<Message>> {
        let round = start.epoch / self.opts.epochs.max(1);
        if round == 0 || start.index > 0 || self.log.get(round).is_some() {
            return Ok(None);
        }
        let inputs = self.probe(round, self.cutoff_now());
        let mut probe = PlanSource::owned(self.plan(handle, &inputs)?, self.opts);
        probe.start(handle, start.epoch, 0)?;
        probe.next(handle)
    }

    fn start(&mut self, handle: &Handle, epoch: u64, skip: u64) -> Result<()> {
        let round = epoch / self.opts.epochs.max(1);
        if self.round != Some(round) {
            self.begin(handle, round)?;
        }
        self.inner()?.start(handle, epoch, skip)
    }

    fn next(&mut self, handle: &Handle) -> Result<Option<Message>> {
        self.inner()?.next(handle)
    }

    fn has_ready(&self) -> bool {
        self.inner.as_ref().is_some_and(Source::has_ready)
    }

    fn set_max_batches(&mut self, max_batches: usize) {
        self.max_batches = max_batches;
        if let Some(inner) = &mut self.inner {
            inner.set_max_batches(max_batches);
        }
    }

    fn epoch(&self) -> Option<u64> {
        self.inner.as_ref().and_then(Source::epoch)
    }

    fn produced(&self) -> (u64, u64) {
        self.inner.as_ref().map_or((0, 0), Source::produced)
    }

    fn waited(&self) -> Duration {
        self.waited + self.inner.as_ref().map_or(Duration::ZERO, Source::waited)
    }
}

use crate::status::other_live_producer as live_producer;
