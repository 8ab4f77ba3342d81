//! Where a producer's batches come from: one epoch at a time, cut into the messages it
//! publishes.
//!
//! [`Source`] is what the publishing loop asks of it; [`PlanSource`] runs a plan (locally
//! or on Ballista, which differ only inside [`Plan`]). Other sources (batches produced by
//! Python code) implement the same interface.

use std::collections::{HashMap, VecDeque};
use std::sync::Arc;
use std::time::{Duration, Instant};

use arrow::datatypes::SchemaRef;
use arrow::record_batch::RecordBatch;
use futures::StreamExt;
use sluice_core::{Position, Result, Shaper, SluiceError};
use sluice_plan::{BatchStream, Plan, SluiceOptions};
use tokio::runtime::Handle;

/// A message to publish: consecutive batches of `batch_rows` rows (the last may be
/// shorter) cut from one batch without a copy.
#[derive(Debug)]
pub(crate) struct Message {
    /// Index of its first batch in the epoch.
    pub index: u64,
    /// Its rows.
    pub rows: RecordBatch,
    /// How many batches of `batch_rows` they are.
    pub batches: u64,
}

/// The epochs a producer publishes, cut into messages.
pub(crate) trait Source {
    /// Starts `epoch`, passing over its first `skip` batches (a resumed run).
    fn start(&mut self, handle: &Handle, epoch: u64, skip: u64) -> Result<()>;
    /// The next message of the epoch; `None` at its end.
    fn next(&mut self, handle: &Handle) -> Result<Option<Message>>;
    /// Whether the next message is ready without waiting.
    fn has_ready(&self) -> bool;
    /// Lets the messages from now on carry up to `max_batches` consecutive batches.
    fn set_max_batches(&mut self, max_batches: usize);
    /// The epoch started last.
    fn epoch(&self) -> Option<u64>;
    /// Batches and rows of the current epoch produced so far (published or skipped).
    fn produced(&self) -> (u64, u64);
    /// Time spent waiting for the source's batches, in all.
    fn waited(&self) -> Duration;
    /// A message like those the run from `start` publishes, to size the topic with,
    /// where the run's own first message cannot be had without waiting (a run of rounds
    /// resumed before a round's trigger fired); `None`: read the first message.
    fn sizing_message(&mut self, _handle: &Handle, _start: Position) -> Result<Option<Message>> {
        Ok(None)
    }
    /// Whether each message is a batch as the source got it, of any size (not cut into
    /// `sluice.batch_rows`): the topic is then sized by the first.
    fn batches_as_fed(&self) -> bool {
        false
    }
}

/// A plan a source runs: the producer's own, or one it made (a round's).
enum PlanRef<'a> {
    Borrowed(&'a Plan),
    Owned(Box<Plan>),
}

impl std::ops::Deref for PlanRef<'_> {
    type Target = Plan;
    fn deref(&self) -> &Plan {
        match self {
            PlanRef::Borrowed(plan) => plan,
            PlanRef::Owned(plan) => plan,
        }
    }
}

/// One epoch of the plan at a time, shaped into the published messages, with the index
/// of their first batch in the epoch.
pub(crate) struct PlanSource<'a> {
    plan: PlanRef<'a>,
    opts: &'a SluiceOptions,
    epoch: Option<u64>,
    stream: Option<BatchStream>,
    shaper: Option<Shaper>,
    pending: VecDeque<RecordBatch>,
    done: bool,
    /// Batches of the epoch produced so far (published or skipped), in `batch_rows`.
    index: u64,
    /// Consecutive batches one message may carry (see `sizing::message_batches`).
    max_batches: usize,
    /// Rows of the epoch produced so far (published or skipped).
    rows: u64,
    /// Time spent waiting for the plan (each epoch's stream, and its batches).
    waited: Duration,
    /// The plan's identity, put in every batch's schema (see [`PlanSource::stamped`]),
    /// and the schema of the last batch stamped with it.
    identity: HashMap<String, String>,
    stamped: Option<(SchemaRef, SchemaRef)>,
    /// The last epoch this source will run (see [`PlanSource::prefetching_until`]).
    last_epoch: Option<u64>,
    /// The next epoch's stream, started while this one is published.
    next_epoch: Option<(u64, BatchStream)>,
    /// Whether the next epoch is to be started once this one's first message is out.
    prefetch_due: bool,
}

impl<'a> PlanSource<'a> {
    pub(crate) fn new(plan: &'a Plan, opts: &'a SluiceOptions) -> Self {
        Self::of(PlanRef::Borrowed(plan), opts)
    }

    /// A source of a plan it keeps (a round's).
    pub(crate) fn owned(plan: Box<Plan>, opts: &'a SluiceOptions) -> Self {
        Self::of(PlanRef::Owned(plan), opts)
    }

    fn of(plan: PlanRef<'a>, opts: &'a SluiceOptions) -> Self {
        Self {
            plan,
            opts,
            epoch: None,
            stream: None,
            shaper: None,
            pending: VecDeque::new(),
            done: false,
            index: 0,
            max_batches: 1,
            rows: 0,
            waited: Duration::ZERO,
            identity: HashMap::new(),
            stamped: None,
            last_epoch: None,
            next_epoch: None,
            prefetch_due: false,
        }
    }

    /// Starts each epoch's stream up to `last` once the epoch before it published its
    /// first message, so that
    /// what comes before an epoch's first batch (planning, the blocking part of a query:
    /// a sort, a join's build side, the first reads) runs while the epoch before is
    /// published and read. Its partitions then wait with a few batches each.
    pub(crate) fn prefetching_until(mut self, last: u64) -> Self {
        self.last_epoch = Some(last);
        self
    }

    /// `epoch`'s stream: the one started ahead, or a new one.
    fn stream_of(&mut self, handle: &Handle, epoch: u64) -> Result<BatchStream> {
        match self.next_epoch.take() {
            Some((next, stream)) if next == epoch => Ok(stream),
            _ => handle.block_on(self.plan.execute_epoch(epoch)),
        }
    }

    /// Starts the epoch after this one if this source runs it and its start is due. A
    /// failure is left for that epoch's own start to meet again and report.
    fn prefetch(&mut self, handle: &Handle) {
        if !std::mem::take(&mut self.prefetch_due) {
            return;
        }
        let next = self.epoch.and_then(|e| e.checked_add(1));
        let Some(next) = next.filter(|n| Some(*n) <= self.last_epoch) else {
            return;
        };
        let asked = Instant::now();
        if let Ok(stream) = handle.block_on(self.plan.execute_epoch(next)) {
            self.next_epoch = Some((next, stream));
        }
        self.waited += asked.elapsed();
    }

    /// Puts the plan's identity in every batch's schema metadata: the hash of its
    /// fingerprint, `plan_hash`, and its shuffle seed (`crate::cursor::PLAN_KEY`,
    /// `SEED_KEY`), so that a trainer's cursor names the stream it was taken on.
    pub(crate) fn stamped(mut self, plan_hash: &str) -> Self {
        self.identity
            .insert(crate::cursor::PLAN_KEY.into(), plan_hash.into());
        if let Some((seed, _)) = self.opts.shuffle() {
            self.identity
                .insert(crate::cursor::SEED_KEY.into(), seed.to_string());
        }
        self
    }

    /// Puts `key = value` in every batch's schema metadata too.
    pub(crate) fn with_identity(mut self, key: &str, value: String) -> Self {
        self.identity.insert(key.into(), value);
        self
    }

    /// `rows` with the plan's identity in its schema (one schema built per schema met).
    fn stamp(&mut self, rows: RecordBatch) -> Result<RecordBatch> {
        if self.identity.is_empty() {
            return Ok(rows);
        }
        let schema = rows.schema();
        let stamped = match &self.stamped {
            Some((from, to)) if Arc::ptr_eq(from, &schema) || **from == *schema => to.clone(),
            _ => {
                let mut metadata = schema.metadata().clone();
                metadata.extend(self.identity.clone());
                let to = Arc::new(schema.as_ref().clone().with_metadata(metadata));
                self.stamped = Some((schema, to.clone()));
                to
            }
        };
        Ok(rows.with_schema(stamped)?)
    }

    /// Passes over the epoch's first `skip` batches: the order of rows depends only on
    /// the plan, the seed and the epoch, so they are the batches published before the
    /// checkpoint.
    fn skip(&mut self, handle: &Handle, epoch: u64, skip: u64) -> Result<()> {
        while self.index < skip {
            let Some(message) = self.next(handle)? else {
                return Err(SluiceError::Config(format!(
                    "the position to resume from is batch {skip} of epoch {epoch}, but the epoch has only {} batches: the data changed since it was taken. Start over (a producer: without --resume; a trainer: without its saved cursor)",
                    self.index
                )));
            };
            if message.index + message.batches > skip {
                // The checkpoint falls inside a message: its batches from there on are
                // the next to publish.
                let rows = message.rows.num_rows();
                let done = usize::try_from(skip - message.index)
                    .unwrap_or(usize::MAX)
                    .saturating_mul(self.opts.batch_rows)
                    .min(rows);
                let rest = message.rows.slice(done, rows - done);
                self.index = skip;
                self.rows -= rest.num_rows() as u64;
                self.pending.push_front(rest);
            }
        }
        Ok(())
    }
}

impl Source for PlanSource<'_> {
    fn set_max_batches(&mut self, max_batches: usize) {
        self.max_batches = max_batches.max(1);
        if let Some(shaper) = &mut self.shaper {
            shaper.set_max_batches(self.max_batches);
        }
    }

    fn start(&mut self, handle: &Handle, epoch: u64, skip: u64) -> Result<()> {
        self.epoch = Some(epoch);
        self.pending.clear();
        self.done = false;
        self.index = 0;
        self.rows = 0;
        let mut shaper = Shaper::new(self.opts.batch_rows, epoch, self.opts.shuffle())?;
        shaper.set_max_batches(self.max_batches);
        self.shaper = Some(shaper);
        let asked = Instant::now();
        let stream = self.stream_of(handle, epoch);
        self.stream = Some(stream?);
        self.waited += asked.elapsed();
        self.prefetch_due = true;
        self.skip(handle, epoch, skip)
    }

    fn has_ready(&self) -> bool {
        !self.pending.is_empty() || self.shaper.as_ref().is_some_and(Shaper::has_ready)
    }

    fn next(&mut self, handle: &Handle) -> Result<Option<Message>> {
        if self.index > 0 {
            self.prefetch(handle);
        }
        loop {
            if let Some(rows) = self.pending.pop_front() {
                let index = self.index;
                let batches = rows.num_rows().div_ceil(self.opts.batch_rows).max(1) as u64;
                self.index += batches;
                self.rows += rows.num_rows() as u64;
                let rows = self.stamp(rows)?;
                return Ok(Some(Message {
                    index,
                    rows,
                    batches,
                }));
            }
            if self.done {
                return Ok(None);
            }
            let (Some(stream), Some(shaper)) = (&mut self.stream, &mut self.shaper) else {
                return Err(SluiceError::Internal(
                    "an epoch was read before it started".into(),
                ));
            };
            // Cut one message at a time: the limit on batches per message is set after
            // the first (which sizes the topic), and applies to what is not cut yet.
            if let Some(message) = shaper.next_ready()? {
                self.pending.push_back(message);
                continue;
            }
            let asked = Instant::now();
            // A panic in an operator polled here (DataFusion's own, on an extreme
            // setting) is this epoch's error, which the subscribers are told, rather
            // than the end of the producer's thread, which leaves them waiting.
            let plan = &self.plan;
            let next = sluice_core::panics::catch(|| handle.block_on(stream.next()))
                .unwrap_or_else(|panic| {
                    Some(Err(SluiceError::Internal(
                        plan.redact(&format!("the plan's execution panicked: {panic}")),
                    )))
                });
            self.waited += asked.elapsed();
            match next {
                Some(batch) => shaper.add(batch?)?,
                None => {
                    self.done = true;
                    self.pending.extend(shaper.finish()?);
                }
            }
        }
    }

    fn epoch(&self) -> Option<u64> {
        self.epoch
    }

    fn produced(&self) -> (u64, u64) {
        (self.index, self.rows)
    }

    fn waited(&self) -> Duration {
        self.waited
    }
}

#[cfg(test)]
mod tests {
    use arrow::array::AsArray;
    use arrow::datatypes::Int64Type;

    use super::*;

    async fn plan(sql: &str) -> Plan {
        Plan::from_sql("t.sql", sql).await.unwrap()
    }

    /// The first values of each message an epoch's source gives from `skip` on, and its
    /// `(index, batches)`.
    fn messages(sql: &str, max_batches: usize, skip: u64) -> Vec<(u64, u64, usize, i64)> {
        let rt = tokio::runtime::Runtime::new().unwrap();
        let plan = rt.block_on(plan(sql));
        let opts = plan.options().clone();
        let mut source = PlanSource::new(&plan, &opts);
        source.set_max_batches(max_batches);
        source.start(rt.handle(), 0, skip).unwrap();
        let mut out = Vec::new();
        while let Some(message) = source.next(rt.handle()).unwrap() {
            let first = message.rows.column(0).as_primitive::<Int64Type>().value(0);
            out.push((
                message.index,
                message.batches,
                message.rows.num_rows(),
                first,
            ));
        }
        assert_eq!(source.index, 10);
        assert_eq!(source.rows, 95);
        out
    }

    const SQL: &str = "SET sluice.batch_rows = 10;\n\
                       SELECT value AS v FROM generate_series(1, 95)";

    #[test]
    fn an_epoch_goes_out_in_messages_of_whole_batches() {
        assert_eq!(
            messages(SQL, 4, 0),
            // The short last batch goes alone: a message is whole batches but the last.
            [(0, 4, 40, 1), (4, 4, 40, 41), (8, 1, 10, 81), (9, 1, 5, 91)]
        );
        let alone = messages(SQL, 1, 0);
        assert_eq!(alone.len(), 10);
        assert!(
            alone
                .iter()
                .enumerate()
                .all(|(i, m)| m.0 == i as u64 && m.1 == 1)
        );
    }

    /// A checkpoint inside a message: the source resumes at its batch, not the message's.
    #[test]
    fn a_resumed_epoch_starts_at_its_checkpoint_inside_a_message() {
        assert_eq!(
            messages(SQL, 4, 3),
            [
                (3, 1, 10, 31),
                (4, 4, 40, 41),
                (8, 1, 10, 81),
                (9, 1, 5, 91)
            ]
        );
        assert_eq!(messages(SQL, 4, 9), [(9, 1, 5, 91)]);
    }

    /// The rows of every message of `epochs`, read from one source in turn.
    fn epochs(
        source: &mut PlanSource<'_>,
        rt: &tokio::runtime::Runtime,
        epochs: &[u64],
    ) -> Vec<Vec<i64>> {
        epochs
            .iter()
            .map(|&epoch| {
                source.start(rt.handle(), epoch, 0).unwrap();
                let mut rows = Vec::new();
                while let Some(message) = source.next(rt.handle()).unwrap() {
                    let values = message.rows.column(0).as_primitive::<Int64Type>();
                    rows.extend(values.values().iter().copied());
                }
                rows
            })
            .collect()
    }

    /// An epoch started ahead (while the one before is published) gives what it gives
    /// started on its own: the same rows in the same order, shuffled as that epoch is;
    /// none is started past the last epoch, or when another epoch is asked for.
    #[test]
    fn an_epoch_started_ahead_is_the_epoch_started_on_its_own() {
        let rt = tokio::runtime::Runtime::new().unwrap();
        let sql = "SET sluice.batch_rows = 10;\nSET sluice.shuffle_seed = 5;\n\
                   SET sluice.shuffle_buffer = 40;\n\
                   SELECT value AS v FROM generate_series(1, 95)";
        let plan = rt.block_on(plan(sql));
        let opts = plan.options().clone();
        let mut alone = Vec::new();
        for epoch in 0..3 {
            alone.extend(epochs(&mut PlanSource::new(&plan, &opts), &rt, &[epoch]));
        }
        assert_ne!(alone[0], alone[1], "epochs are shuffled differently");
        let mut ahead = PlanSource::new(&plan, &opts).prefetching_until(2);
        let got = epochs(&mut ahead, &rt, &[0, 1, 2]);
        assert_eq!(got, alone);
        assert!(ahead.next_epoch.is_none(), "nothing past the last epoch");
        // Epoch 1 was started ahead during epoch 0; asked for epoch 2 instead, the
        // source runs epoch 2.
        let mut ahead = PlanSource::new(&plan, &opts).prefetching_until(2);
        ahead.start(rt.handle(), 0, 0).unwrap();
        while ahead.next(rt.handle()).unwrap().is_some() {}
        assert_eq!(ahead.next_epoch.as_ref().map(|n| n.0), Some(1));
        assert_eq!(epochs(&mut ahead, &rt, &[2]), alone[2..]);
    }
}
