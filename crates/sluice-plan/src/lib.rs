//! Sluice plan files: DataFusion SQL that defines one stream of record batches.
//!
//! A plan file is a sequence of SQL statements:
//!
//! ```sql
//! SET sluice.topic = 'demo';            -- Sluice options (a DataFusion config extension)
//! SET sluice.batch_rows = 256;
//! SET datafusion.execution.batch_size = 4096;   -- DataFusion's own options work too
//! CREATE EXTERNAL TABLE train STORED AS PARQUET LOCATION 'data/demo/';
//! SELECT id, label, features FROM train WHERE label IS NOT NULL;   -- exactly one, last
//! ```
//!
//! [`Plan::load`] parses the file with DataFusion's SQL parser, applies the options,
//! registers the tables, and plans the final query. Every error names the file, line and
//! column, and says what was expected. [`Plan::execute_epoch`] runs the query once.
//!
//! Relative `LOCATION`s are resolved against the working directory of the process, like
//! any DataFusion session.
#![warn(missing_docs)]

mod engine;
pub mod functions;
mod large_limits;
mod listing;
mod memory;
pub use listing::Listing;
mod options;
mod planner;
mod read_ahead;
pub mod rounds;
mod shard;
mod split;
mod store;

use std::path::Path;
use std::sync::Arc;

use datafusion::arrow::datatypes::SchemaRef;
use datafusion::arrow::record_batch::RecordBatch;
use datafusion::error::DataFusionError;
use datafusion::execution::{SendableRecordBatchStream, TaskContext};
use datafusion::logical_expr::{LogicalPlan, Statement as PlanStatement};
use datafusion::physical_plan::{ExecutionPlan, displayable, execute_stream_partitioned};
use datafusion::prelude::{SessionConfig, SessionContext};
use datafusion::sql::parser::DFParserBuilder;
use std::panic::AssertUnwindSafe;
use std::task::Poll;

use futures::stream::BoxStream;
use futures::{FutureExt, StreamExt};
use tokio::sync::mpsc;

pub use engine::{Engine, ExecutorOptions, run_executor, run_scheduler};
pub use options::{MessageBatches, SluiceOptions, Window};
pub use shard::Shard;
use sluice_core::shuffle::{SplitMix64, epoch_seed};
use sluice_core::{Checksum, Result, SluiceError};
pub use store::{StoreSpecs, StoreStats};

/// A stream of record batches (one epoch of a plan).
pub type BatchStream = BoxStream<'static, Result<RecordBatch>>;

/// How many batches each partition may compute ahead of the consumer.
const PARTITION_PREFETCH: usize = 2;

/// A loaded, validated plan file.
pub struct Plan {
    file: String,
    /// The plan's text, as planned.
    sql: String,
    ctx: SessionContext,
    options: SluiceOptions,
    query: LogicalPlan,
    /// Keys and tokens of object stores, blanked out of every message.
    secrets: store::Secrets,
    /// Requests made through the plan's object stores (local files included).
    counters: Arc<store::Counters>,
    /// Where the final query runs.
    engine: Engine,
    /// The round it was planned for (0 without rounds), which the selection functions
    /// draw from.
    round: u64,
}

impl std::fmt::Debug for Plan {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.debug_struct("Plan")
            .field("file", &self.file)
            .field("options", &self.options)
            .finish_non_exhaustive()
    }
}

impl Plan {
    /// Reads and plans the plan file at `path`.
    pub async fn load(path: impl AsRef<Path>) -> Result<Self> {
        let path = path.as_ref();
        let sql = std::fs::read_to_string(path).map_err(|e| match e.kind() {
            // A plan that is not there is the command's mistake (exit 2), not a failure.
            std::io::ErrorKind::NotFound => SluiceError::Config(format!(
                "cannot read plan file {}: there is no such file",
                path.display()
            )),
            _ => SluiceError::io(format!("cannot read plan file {}", path.display()), e),
        })?;
        Self::from_sql(&path.display().to_string(), &sql).await
    }

    /// The `sluice.*` options that `sql` sets, read without planning its tables or its
    /// query: statements that do not parse are skipped (to the next `;`), so a plan with
    /// a syntax error still names its topic. `None` where `sql` is not even made of SQL
    /// tokens (an unterminated string, a binary file): it says nothing, not even that it
    /// keeps the default topic. A producer whose plan failed to load uses them to find its
    /// topic and tell waiting subscribers why.
    pub async fn declared_options(sql: &str) -> Option<SluiceOptions> {
        let statements = lenient_statements(without_bom(sql))?;
        let mut options = SluiceOptions::default();
        let ctx = SessionContext::new_with_config(
            SessionConfig::new().with_option_extension(SluiceOptions::default()),
        );
        for statement in statements {
            let text = statement.to_string();
            if !text.trim_start().to_ascii_uppercase().starts_with("SET ") {
                continue;
            }
            if let Ok(LogicalPlan::Statement(PlanStatement::SetVariable(set))) =
                ctx.state().statement_to_plan(statement).await
                && let Some(key) = set.variable.to_ascii_lowercase().strip_prefix("sluice.")
            {
                let _ = options.set_checked(key, &set.value);
            }
        }
        Some(options)
    }

    /// Plans `sql`, reporting errors against the name `file`.
    pub async fn from_sql(file: &str, sql: &str) -> Result<Self> {
        Self::plan_redacted(file, sql, None, false).await
    }

    /// Plans `sql` for one round of a run (see [`rounds`]): its tables list the files
    /// modified before the round's cutoff, and it reads the round's `sluice_feedback` and
    /// `sluice_round`.
    pub async fn for_round(file: &str, sql: &str, inputs: &rounds::RoundInputs) -> Result<Self> {
        Self::plan_redacted(file, sql, Some(inputs), false).await
    }

    /// Plans `sql` as [`Plan::for_round`] does, for a look at the round's tables (what a
    /// `rows:` trigger counts) rather than for running it: its `CREATE TABLE … AS`
    /// statements are not run, their tables stand empty with their schemas. A selection
    /// computed that way runs once when its round starts, not at every look.
    pub async fn tables_for_round(
        file: &str,
        sql: &str,
        inputs: &rounds::RoundInputs,
    ) -> Result<Self> {
        Self::plan_redacted(file, sql, Some(inputs), true).await
    }

    async fn plan_redacted(
        file: &str,
        sql: &str,
        round: Option<&rounds::RoundInputs>,
        look: bool,
    ) -> Result<Self> {
        let sql = without_bom(sql);
        let mut secrets = store::Secrets::default();
        store::env_secrets(&mut secrets);
        secrets.add_literals(sql);
        // Secrets found in the file so far are blanked out of any error, whatever its source.
        let plan = Self::plan_sql(file, sql, &mut secrets, round, look).await;
        plan.map_err(|e| redacted(e, &secrets))
    }

    async fn plan_sql(
        file: &str,
        sql: &str,
        secrets: &mut store::Secrets,
        round: Option<&rounds::RoundInputs>,
        look: bool,
    ) -> Result<Self> {
        let mut planner = planner::Planner::new(file, secrets);
        if let Some(inputs) = round {
            planner.for_round(inputs);
        }
        if look {
            planner.look_only();
        }
        let (query, query_at) = planner.statements(sql).await?;
        let planner::Planned {
            ctx,
            counters,
            options,
            stores,
        } = planner.finish();
        let engine = options.engine()?;
        if matches!(engine, Engine::BallistaRemote { .. }) && !stores.is_empty() {
            // A remote cluster builds the plan's stores itself, from the job's settings.
            ctx.state_ref()
                .write()
                .config_mut()
                .options_mut()
                .extensions
                .insert(stores);
        }
        let (ctx, query) = if engine.is_ballista() {
            let query = engine::total_order(query).map_err(|e| SluiceError::Plan {
                location: query_at,
                message: df_message(e),
            })?;
            (engine::ballista_context(&ctx, &engine).await?, query)
        } else {
            (ctx, query)
        };
        Ok(Self {
            file: file.to_string(),
            sql: sql.to_string(),
            ctx,
            options,
            query,
            secrets: secrets.clone(),
            counters,
            engine,
            round: round.map_or(0, |r| r.round),
        })
    }

    /// The plan file's name as given.
    pub fn file(&self) -> &str {
        &self.file
    }

    /// The plan's text (`SET` lines, tables, query) as it was planned: a trainer that
    /// catches up on a stream plans it again.
    pub fn sql(&self) -> &str {
        &self.sql
    }

    /// The resolved `sluice.*` options.
    pub fn options(&self) -> &SluiceOptions {
        &self.options
    }

    /// Where the final query runs (`sluice.engine`).
    pub fn engine(&self) -> &Engine {
        &self.engine
    }

    /// Mutable options, for overrides from the command line.
    pub fn options_mut(&mut self) -> &mut SluiceOptions {
        &mut self.options
    }

    /// What decides the sequence of batches the plan produces: the query, the batch size,
    /// the shuffle and the [`Plan::sequence_settings`]. Two plans with the same
    /// fingerprint over the same data publish the same batches, so a checkpoint taken by
    /// one can be resumed by the other.
    pub fn fingerprint(&self) -> String {
        use std::fmt::Write;
        let mut out = format!(
            "{}\nbatch_rows={} shuffle={:?}",
            self.query.display_indent_schema(),
            self.options.batch_rows,
            self.options.shuffle()
        );
        for (key, value) in self.sequence_settings() {
            let _ = write!(out, "\n{key}={value}");
        }
        out
    }

    /// The first function in the query whose result is not a function of its arguments,
    /// the plan's seed and the epoch (`random()`, `uuid()`): a plan that calls one
    /// publishes other values each time it runs, so a trainer cannot catch up on its
    /// stream by running it again. `random_crop` and `random_flip` draw from (seed,
    /// epoch, key) and do not count.
    pub fn nondeterministic_function(&self) -> Option<String> {
        use datafusion::common::tree_node::{TreeNode, TreeNodeRecursion};
        use datafusion::logical_expr::{Expr, Volatility};
        const SEEDED: [&str; 2] = ["random_crop", "random_flip"];
        let mut found = None;
        let mut look = |e: &Expr| {
            if let Expr::ScalarFunction(f) = e
                && f.func.signature().volatility == Volatility::Volatile
                && !SEEDED.contains(&f.name())
            {
                found = Some(f.name().to_string());
                return Ok(TreeNodeRecursion::Stop);
            }
            Ok(TreeNodeRecursion::Continue)
        };
        // A failed walk finds nothing more; it cannot fail here (the closures do not).
        let _ = self
            .query
            .apply_with_subqueries(|node| node.apply_expressions(|e| e.apply(&mut look)));
        found
    }

    /// The settings beyond the query that decide the order of its batches, as this run
    /// has them, by name: DataFusion's execution and optimizer options that are set, and
    /// `sluice.shard` (as parsed: `RANK/WORLD`).
    ///
    /// Batches are taken round-robin from the partitions ([`Plan::execute_epoch`]), so
    /// the order of rows depends on how the files are split into partitions
    /// (`datafusion.execution.target_partitions`, which defaults to this machine's
    /// cores, and the optimizer's repartitioning options) and on the rows of each
    /// DataFusion batch (`datafusion.execution.batch_size`). A producer that resumes a
    /// checkpoint with any of them changed would publish different batches at the
    /// positions its subscribers already have. Left out: `planning_concurrency`, which
    /// also defaults to the cores but only says how many files are planned at once, and
    /// the Parquet writer's `created_by`, which names DataFusion's version (Sluice writes
    /// no Parquet).
    pub fn sequence_settings(&self) -> Vec<(String, String)> {
        const UNORDERING: [&str; 2] = [
            "datafusion.execution.planning_concurrency",
            "datafusion.execution.parquet.created_by",
        ];
        let mut settings: Vec<(String, String)> = self
            .ctx
            .state()
            .config_options()
            .entries()
            .into_iter()
            .filter(|e| {
                (e.key.starts_with("datafusion.execution.")
                    || e.key.starts_with("datafusion.optimizer."))
                    && !UNORDERING.contains(&e.key.as_str())
            })
            .filter_map(|e| Some((e.key, e.value?)))
            .collect();
        // An invalid shard fails the run before any checkpoint matters.
        let shard = self
            .options
            .shard()
            .map_or_else(|_| self.options.shard.clone(), |s| s.to_string());
        settings.push(("sluice.shard".into(), shard));
        settings.sort();
        settings
    }

    /// The Arrow schema of the stream.
    pub fn schema(&self) -> SchemaRef {
        Arc::new(self.query.schema().as_arrow().clone())
    }

    /// DataFusion's optimized physical plan for the query, restricted to this node's
    /// shard (`sluice.shard`).
    pub async fn physical_plan(&self) -> Result<Arc<dyn ExecutionPlan>> {
        Ok(self.physical_plan_for_epoch(0).await?.0)
    }

    /// The physical plan of one epoch: the random preprocessing functions
    /// (`random_crop`, `random_flip`) draw from (`sluice.shuffle_seed`, `epoch`), which
    /// reach them as a config extension ([`functions::FunctionContext`]) of the session
    /// state the epoch is planned with.
    ///
    /// Returns the task context to execute it with: it carries the same extension, which
    /// a Ballista job sends to its executors with its settings.
    async fn physical_plan_for_epoch(
        &self,
        epoch: u64,
    ) -> Result<(Arc<dyn ExecutionPlan>, Arc<TaskContext>)> {
        // Options may have been overridden since the plan was loaded (`--shard`).
        self.options.validate()?;
        let (plan, state) = self.unsharded_plan(epoch).await?;
        self.check_listing(&plan)?;
        let task = Arc::new(TaskContext::from(&state));
        let plan = shard::apply(plan, self.options.shard()?)?;
        // A Ballista plan's scans run on the cluster's executors, with their own readers.
        let plan = match self.engine {
            Engine::Local => read_ahead::apply(
                plan,
                state.runtime_env(),
                self.options.read_ahead()?.0,
                !state
                    .config_options()
                    .execution
                    .enable_file_stream_work_stealing,
            )?,
            _ => plan,
        };
        Ok((plan, task))
    }

    /// The files the plan reads, as listed now, for the whole run (every shard's): a
    /// resumed checkpoint must have been taken over the same (see [`Listing`]). Lists
    /// each table's files once more (a LIST request per table on object storage).
    pub async fn listing(&self) -> Result<Listing> {
        Ok(listing::of(&self.unsharded_plan(0).await?.0))
    }

    /// Refuses files other than the pinned `sluice.listing` (every node's shards must be
    /// cut from the same files); says a sharded run's listing otherwise, for comparing
    /// nodes.
    fn check_listing(&self, plan: &Arc<dyn ExecutionPlan>) -> Result<()> {
        let pinned = self.options.listing()?;
        let shard = self.options.shard()?;
        if pinned.is_none() && shard.is_whole() {
            return Ok(());
        }
        let seen = listing::of(plan);
        match pinned {
            Some(digest) if !seen.digest.eq_ignore_ascii_case(digest) => {
                Err(SluiceError::Config(format!(
                    "the plan's tables list {seen}, not the listing {digest} this run \
                     expects (sluice.listing): files were added, removed or rewritten, or \
                     this node sees other files than the others, whose shards would then \
                     overlap or leave rows out. Give every node the same files, or run \
                     `sluice explain` once more and set its listing on every node"
                )))
            }
            Some(_) => Ok(()),
            None => {
                tracing::info!(
                    %shard, %seen,
                    "shard of the files listed: every node must list the same; pin it \
                     with sluice.listing (or --listing) to refuse a node that does not"
                );
                Ok(())
            }
        }
    }

    /// DataFusion's physical plan of `epoch`, before sharding, and the session state it
    /// was planned with (carrying the epoch's [`functions::FunctionContext`]).
    async fn unsharded_plan(
        &self,
        epoch: u64,
    ) -> Result<(Arc<dyn ExecutionPlan>, datafusion::execution::SessionState)> {
        if self.options.listing()?.is_some() {
            // A pinned listing is checked at every epoch (`check_listing`): against the
            // files there now, not DataFusion's cached listing of the first epoch, which
            // would hide a file added since (and a rewritten one until it failed to
            // decode).
            if let Some(cache) = self.ctx.runtime_env().cache_manager.get_list_files_cache() {
                cache.clear();
            }
        }
        let mut state = self.ctx.state();
        state
            .config_mut()
            .options_mut()
            .extensions
            .insert(self.function_context(epoch));
        // The planner hands the config in the execution props to every scalar function.
        state.mark_start_execution();
        let plan = state
            .create_physical_plan(&self.query)
            .await
            .map_err(|e| SluiceError::Execution(self.redact(&df_message(e))))?;
        Ok((plan, state))
    }

    /// What the plan's functions draw from in `epoch`.
    fn function_context(&self, epoch: u64) -> functions::FunctionContext {
        functions::FunctionContext {
            seed: self.options.shuffle_seed.unwrap_or(0),
            epoch,
            round: self.round,
        }
    }

    /// Lists only `paths` (as [`Listing::paths`] has them) from now on, whatever else the
    /// tables' locations hold: a round reads the files it started with.
    pub fn restrict_listing(&self, paths: &[String]) {
        self.counters.set_only(paths);
    }

    /// The round the plan was made for (0 without rounds).
    pub fn round(&self) -> u64 {
        self.round
    }

    /// Rows in the plan's file tables (each table counted once, whatever the query
    /// reads of it): what a `rows:N` trigger compares. Parquet files answer from their
    /// footers; other formats are read.
    pub async fn table_rows(&self) -> Result<u64> {
        use datafusion::catalog::CatalogProvider;
        use datafusion::datasource::listing::ListingTable;
        let run = |e: DataFusionError| SluiceError::Execution(self.redact(&df_message(e)));
        let mut rows = 0u64;
        let Some(catalog) = self.ctx.catalog("datafusion") else {
            return Ok(0);
        };
        for schema_name in catalog.schema_names() {
            let Some(schema) = CatalogProvider::schema(catalog.as_ref(), &schema_name) else {
                continue;
            };
            for name in schema.table_names() {
                let Some(table) = schema.table(&name).await.map_err(run)? else {
                    continue;
                };
                if !table.is::<ListingTable>() {
                    continue;
                }
                let qualified = format!("{schema_name}.\"{}\"", name.replace('"', "\"\""));
                let count = self.ctx.table(qualified.as_str()).await.map_err(run)?;
                let n = count.count().await.map_err(run)?;
                rows = rows.saturating_add(n as u64);
            }
        }
        Ok(rows)
    }

    /// Whether `query` holds: its one row's first column is `true` (no row, `NULL` or
    /// `false`: it does not). It reads what the plan's query may, `sluice_round()` being
    /// the plan's round; statements other than a query are refused.
    pub async fn holds(&self, query: &str) -> Result<bool> {
        use datafusion::arrow::array::{Array, AsArray};
        use datafusion::execution::context::SQLOptions;
        let mut state = self.ctx.state();
        state
            .config_mut()
            .options_mut()
            .extensions
            .insert(self.function_context(0));
        let ctx = SessionContext::new_with_state(state);
        let only_queries = SQLOptions::new()
            .with_allow_ddl(false)
            .with_allow_dml(false)
            .with_allow_statements(false);
        let batches = guarded(async {
            ctx.sql_with_options(query, only_queries)
                .await?
                .collect()
                .await
        })
        .await
        .map_err(|m| {
            SluiceError::Execution(format!("the trigger query failed: {}", self.redact(&m)))
        })?;
        let Some(batch) = batches.iter().find(|b| b.num_rows() > 0) else {
            return Ok(false);
        };
        let column = batch.column(0);
        match column.data_type() {
            datafusion::arrow::datatypes::DataType::Boolean => {
                let values = column.as_boolean();
                Ok(values.is_valid(0) && values.value(0))
            }
            other => Err(SluiceError::Config(format!(
                "the trigger query must give one boolean (e.g. SELECT count(*) > 100 FROM \
                 sluice_feedback), not a column of {other}"
            ))),
        }
    }

    /// Requests and bytes read through the plan's object stores so far (local files
    /// included), e.g. to check that a run reads each file about once.
    pub fn store_stats(&self) -> StoreStats {
        self.counters.snapshot()
    }

    /// `message` with every known store secret blanked out.
    pub fn redact(&self, message: &str) -> String {
        self.secrets.redact(message)
    }

    /// A human-readable account of the plan: options, schema and physical plan.
    pub async fn explain(&self) -> Result<String> {
        use std::fmt::Write;
        let mut out = String::new();
        let _ = writeln!(out, "plan file: {}", self.file);
        let _ = writeln!(out, "\noptions:");
        for (k, v) in self.options.resolved() {
            let _ = writeln!(out, "  {k} = {v}");
        }
        let _ = writeln!(out, "\nschema:");
        for field in self.schema().fields() {
            let _ = writeln!(
                out,
                "  {}: {}{}",
                field.name(),
                field.data_type(),
                if field.is_nullable() { "" } else { " not null" }
            );
        }
        // What a resumed checkpoint must match, and the shards of one run must agree on.
        let _ = writeln!(out, "\ndata: {}", self.listing().await?);
        let physical = self.physical_plan().await?;
        let _ = writeln!(out, "\nphysical plan:");
        let _ = write!(out, "{}", displayable(physical.as_ref()).indent(true));
        Ok(self.redact(&out))
    }

    /// Runs the query once and returns its rows.
    ///
    /// Partitions run in parallel, each at most a few batches ahead, and their batches
    /// are taken round-robin in partition order, so the order of rows depends only on the
    /// plan and the data, not on timing.
    ///
    /// With `sluice.shuffle_seed` set, the order in which partitions are taken is a
    /// permutation drawn from the seed and the epoch (the rows themselves are shuffled
    /// by the producer's shuffle buffer).
    pub async fn execute_epoch(&self, epoch: u64) -> Result<BatchStream> {
        let (physical, task) = self.physical_plan_for_epoch(epoch).await?;
        let files = listing::files(&physical);
        // DataFusion's operators allocate as they start, from settings that may be
        // extreme (`datafusion.execution.batch_size = 18446744073709551615` made the sort
        // panic): that is the plan's error, which subscribers are told.
        let mut streams = sluice_core::panics::catch(|| execute_stream_partitioned(physical, task))
            .map_err(|panic| {
                SluiceError::Execution(self.redact(&format!(
                    "DataFusion failed starting the plan (it panicked: {panic}); check the plan's datafusion.* settings"
                )))
            })?
            .map_err(|e| SluiceError::Execution(self.redact(&df_message(e))))?;
        if let Some(seed) = self.options.shuffle_seed {
            let mut rng = SplitMix64::new(epoch_seed(seed, epoch));
            for i in (1..streams.len()).rev() {
                streams.swap(i, rng.below(i + 1));
            }
        }
        let failure = Arc::new(EpochFailure {
            secrets: self.secrets.clone(),
            engine: match &self.engine {
                Engine::Local => None,
                Engine::BallistaStandalone => Some(self.engine.to_string()),
                Engine::BallistaRemote { .. } => Some(format!(
                    "{}; check that its scheduler and executors run and are reachable",
                    self.engine
                )),
            },
            files,
            env: self.ctx.runtime_env(),
        });
        Ok(round_robin(streams)
            .then(move |item| {
                let failure = failure.clone();
                async move {
                    match item {
                        Err(SluiceError::Execution(m)) => Err(failure.said(m).await),
                        other => other,
                    }
                }
            })
            .boxed())
    }

    /// The order-independent checksum of epoch 0, computed directly by DataFusion.
    pub async fn checksum(&self) -> Result<Checksum> {
        self.checksum_epoch(0).await
    }

    /// The order-independent checksum of `epoch`, computed directly by DataFusion. Epochs
    /// differ when the plan uses random preprocessing functions (`random_crop`, …).
    pub async fn checksum_epoch(&self, epoch: u64) -> Result<Checksum> {
        let mut stream = self.execute_epoch(epoch).await?;
        let mut checksum = Checksum::default();
        while let Some(batch) = stream.next().await {
            checksum.update(&batch?)?;
        }
        Ok(checksum)
    }
}

/// What an epoch's failure is said with: where the query ran, and whether a file it
/// read changed after it was listed (then DataFusion decoded new bytes with the old
/// footer, and says only that they do not decode).
struct EpochFailure {
    secrets: store::Secrets,
    engine: Option<String>,
    files: Vec<listing::ListedFile>,
    env: Arc<datafusion::execution::runtime_env::RuntimeEnv>,
}

impl EpochFailure {
    async fn said(&self, message: String) -> SluiceError {
        let message = match listing::changed_since_listed(&self.env, &self.files).await {
            Some(changed) => {
                format!("{changed}: rerun once the data stays as it is ({message})")
            }
            None => message,
        };
        let message = self.secrets.redact(&message);
        SluiceError::Execution(match &self.engine {
            Some(engine) => format!("{message} (query run on {engine})"),
            None => message,
        })
    }
}

/// Drains partition streams in a fixed round-robin order, each prefetching on its own task.
fn round_robin(streams: Vec<SendableRecordBatchStream>) -> BatchStream {
    let mut receivers = Vec::with_capacity(streams.len());
    for mut stream in streams {
        let (tx, rx) = mpsc::channel(PARTITION_PREFETCH);
        tokio::spawn(async move {
            loop {
                // A panic in a scan (a reader bug on a corrupt file) must fail the epoch,
                // not end the partition early as if its data were complete.
                let item = match AssertUnwindSafe(stream.next()).catch_unwind().await {
                    Ok(Some(item)) => item.map_err(|e| SluiceError::Execution(df_message(e))),
                    Ok(None) => break,
                    Err(panic) => Err(SluiceError::Execution(format!(
                        "a data source failed unexpectedly: {}",
                        panic_message(&panic)
                    ))),
                };
                let failed = item.is_err();
                if tx.send(item).await.is_err() || failed {
                    break;
                }
            }
        });
        receivers.push(rx);
    }
    let state = (receivers, 0usize);
    futures::stream::unfold(state, |(mut receivers, mut next)| async move {
        while !receivers.is_empty() {
            next %= receivers.len();
            match receivers[next].recv().await {
                Some(item) => {
                    let failed = item.is_err();
                    next += 1;
                    if failed {
                        receivers.clear();
                    }
                    return Some((item, (receivers, next)));
                }
                None => {
                    receivers.remove(next);
                }
            }
        }
        None
    })
    .fuse()
    .boxed()
}

/// `sql` without a leading UTF-8 byte-order mark, which editors on Windows write and
/// SQL does not parse.
fn without_bom(sql: &str) -> &str {
    sql.strip_prefix('\u{feff}').unwrap_or(sql)
}

/// The statements of `sql` that parse, each one that does not skipped up to its `;`;
/// `None` where `sql` cannot be split into SQL tokens.
fn lenient_statements(sql: &str) -> Option<Vec<datafusion::sql::parser::Statement>> {
    use datafusion::sql::sqlparser::tokenizer::Token;
    let mut parser = DFParserBuilder::new(sql).build().ok()?;
    let mut statements = Vec::new();
    loop {
        while parser.parser.consume_token(&Token::SemiColon) {}
        if parser.parser.peek_token().token == Token::EOF {
            return Some(statements);
        }
        if let Ok(statement) = parser.parse_statement() {
            statements.push(statement);
        }
        // What is left of the statement (all of it, where it did not parse) up to its
        // `;`: every turn consumes a token at least, so this ends.
        while !matches!(
            parser.parser.peek_token().token,
            Token::SemiColon | Token::EOF
        ) {
            parser.parser.next_token();
        }
    }
}

/// Runs a DataFusion future, turning both its errors and its panics (bugs in a reader
/// faced with a corrupt file, say) into messages.
///
/// Each poll runs inside [`sluice_core::panics::catch`], so that the quiet hook keeps
/// the panic off stderr whichever thread polls (planning runs on the caller's thread,
/// which is not a Sluice runtime's): the error reports it, once.
async fn guarded<T>(fut: impl Future<Output = datafusion::error::Result<T>>) -> Result<T, String> {
    let mut fut = std::pin::pin!(fut);
    std::future::poll_fn(
        |cx| match sluice_core::panics::catch(|| fut.as_mut().poll(cx)) {
            Ok(Poll::Ready(result)) => Poll::Ready(result.map_err(df_message)),
            Ok(Poll::Pending) => Poll::Pending,
            // Never polled again: a future that panicked is done.
            Err(panic) => Poll::Ready(Err(format!(
                "DataFusion failed unexpectedly (the input may be corrupt): {panic}"
            ))),
        },
    )
    .await
}

fn panic_message(panic: &Box<dyn std::any::Any + Send>) -> String {
    sluice_core::panics::describe(panic.as_ref())
}

/// DataFusion's message without its wrapper noise.
fn df_message(e: DataFusionError) -> String {
    match e.find_root() {
        // Its display asks for a bug report on DataFusion's tracker; here it is mostly
        // hostile or corrupt input (an Arrow file that does not parse), said as it is.
        DataFusionError::Internal(message) => message.trim().to_string(),
        // Its sources hold the cause a storage error's own text leaves out (a reset
        // connection, a timeout, a truncated body).
        root => sluice_core::error::with_causes(root).trim().to_string(),
    }
}

/// `e` with every secret of `secrets` blanked out of its text, of the same kind.
fn redacted(e: SluiceError, secrets: &store::Secrets) -> SluiceError {
    match e {
        SluiceError::Plan { location, message } => SluiceError::Plan {
            location,
            message: secrets.redact(&message),
        },
        SluiceError::Storage {
            location,
            url,
            message,
        } => SluiceError::Storage {
            location,
            url: secrets.redact(&url),
            message: secrets.redact(&message),
        },
        SluiceError::Config(m) => SluiceError::Config(secrets.redact(&m)),
        other => other,
    }
}

fn config_message(e: SluiceError) -> String {
    match e {
        SluiceError::Config(m) => m,
        other => other.to_string(),
    }
}

#[cfg(test)]
mod tests;
