//! A plan file's statements, run in order: `SET` lines, tables and views, then the one
//! final query.

use std::sync::Arc;

use datafusion::datasource::MemTable;
use datafusion::execution::SessionStateBuilder;
use datafusion::logical_expr::{
    CreateExternalTable, CreateMemoryTable, DdlStatement, LogicalPlan, SetVariable,
    Statement as PlanStatement,
};
use datafusion::prelude::{SessionConfig, SessionContext};
use datafusion::sql::parser::{DFParser, Statement};
use sluice_core::error::Location;
use sluice_core::{Result, SluiceError};

use crate::large_limits::LargeLimitsSortWhole;
use crate::{SluiceOptions, config_message, functions, guarded, split, store};

/// What a plan file's statements leave behind.
pub(crate) struct Planned {
    /// The session, with the file's tables, views and settings.
    pub ctx: SessionContext,
    /// Requests of the stores the tables read.
    pub counters: Arc<store::Counters>,
    /// The file's `SET sluice.*` options.
    pub options: SluiceOptions,
    /// The remote stores the tables read.
    pub stores: store::StoreSpecs,
}

/// Runs a plan file's statements in a session of Sluice's defaults.
pub(crate) struct Planner<'a> {
    file: &'a str,
    secrets: &'a mut store::Secrets,
    planned: Planned,
    /// The round planned for (`None`: a run's first); taken once the tables begin.
    round: Option<crate::rounds::RoundInputs>,
    /// Whether the first statement other than `SET` was reached.
    tables_begun: bool,
    /// A look at the tables: `CREATE TABLE … AS` tables are registered empty, not run.
    look: bool,
}

impl<'a> Planner<'a> {
    /// A planner for `file`, whose secrets (store credentials) go to `secrets`.
    pub(crate) fn new(file: &'a str, secrets: &'a mut store::Secrets) -> Self {
        let (ctx, counters) = session();
        Self {
            file,
            secrets,
            planned: Planned {
                ctx,
                counters,
                options: SluiceOptions::default(),
                stores: store::StoreSpecs::default(),
            },
            round: None,
            tables_begun: false,
            look: false,
        }
    }

    /// Plans for a look at the tables (see [`crate::Plan::tables_for_round`]).
    pub(crate) fn look_only(&mut self) {
        self.look = true;
    }

    /// Plans the file for one round (see [`crate::rounds`]) rather than as a run's first.
    pub(crate) fn for_round(&mut self, inputs: &crate::rounds::RoundInputs) {
        self.round = Some(inputs.clone());
    }

    /// Once the `SET` lines before the first table have run: cuts the listings off at the
    /// round's cutoff (a plan of several rounds: at `sluice.settle_s` ago, so that no file
    /// still being written is read) and registers `sluice_feedback` and `sluice_round`
    /// (empty, round 0, outside a round).
    fn before_tables(&mut self) -> Result<()> {
        let options = &self.planned.options;
        let round = self
            .round
            .take()
            .unwrap_or_else(|| crate::rounds::RoundInputs {
                round: 0,
                cutoff: (options.rounds > 1).then(|| {
                    let settle = std::time::Duration::try_from_secs_f64(options.settle_s)
                        .unwrap_or_default();
                    std::time::SystemTime::now() - settle
                }),
                files: None,
                feedback: Vec::new(),
                rounds: Vec::new(),
            });
        if let Some(cutoff) = round.cutoff {
            self.planned.counters.set_cutoff(cutoff);
        }
        if let Some(files) = &round.files {
            self.planned.counters.set_only(files);
        }
        let columns = crate::rounds::feedback_columns(&options.feedback)?;
        crate::rounds::register(&self.planned.ctx, &round, &columns)
    }

    /// What the statements left.
    pub(crate) fn finish(self) -> Planned {
        self.planned
    }

    fn at(&self, line: u64, column: u64) -> Location {
        Location {
            file: self.file.to_string(),
            line,
            column,
        }
    }

    /// Runs the statements of `sql`; returns the final query and where it is.
    pub(crate) async fn statements(&mut self, sql: &str) -> Result<(LogicalPlan, Location)> {
        let starts =
            split::statement_starts(sql).map_err(|(l, c, m)| plan_err(self.at(l, c), m))?;
        let statements = DFParser::parse_sql(sql).map_err(|e| {
            let (line, column, message) = split::located_message(&e.to_string());
            plan_err(self.at(line, column), format!("syntax error: {message}"))
        })?;
        let end = split::end_location(sql);
        let mut query: Option<(LogicalPlan, Location)> = None;
        for (i, statement) in statements.into_iter().enumerate() {
            let (line, column) = starts.get(i).copied().unwrap_or(end);
            let here = self.at(line, column);
            if let Some((_, first)) = &query {
                return Err(plan_err(
                    here,
                    format!(
                        "the query at {}:{} must be the last statement, but another statement follows it \
                         (a plan file has exactly one final query)",
                        first.line, first.column
                    ),
                ));
            }
            nesting_within_limit(&statement).map_err(|m| plan_err(here.clone(), m))?;
            if let Some(plan) = self.statement(statement, &here).await? {
                query = Some((plan, here));
            }
        }
        query.ok_or_else(|| {
            plan_err(
                self.at(end.0, end.1),
                "expected a final SELECT query that defines the stream, found none".into(),
            )
        })
    }

    /// Runs one statement; `Some`: it is a query (the stream, if it is the last).
    async fn statement(
        &mut self,
        statement: Statement,
        here: &Location,
    ) -> Result<Option<LogicalPlan>> {
        let is_set = statement
            .to_string()
            .trim_start()
            .to_ascii_uppercase()
            .starts_with("SET ");
        if !is_set && !self.tables_begun {
            self.tables_begun = true;
            self.before_tables()
                .map_err(|e| plan_err(here.clone(), config_message(e)))?;
        }
        let state = self.planned.ctx.state();
        let plan = guarded(state.statement_to_plan(statement))
            .await
            .map_err(|e| plan_err(here.clone(), e))?;
        match plan {
            LogicalPlan::Statement(PlanStatement::SetVariable(set)) => {
                self.set(set, here).await?;
            }
            LogicalPlan::Ddl(DdlStatement::CreateExternalTable(create)) => {
                self.create_external_table(create, here).await?;
            }
            LogicalPlan::Ddl(DdlStatement::CreateMemoryTable(create)) if self.look => {
                self.stand_in(&create, here)?;
            }
            plan @ LogicalPlan::Ddl(
                DdlStatement::CreateView(_) | DdlStatement::CreateMemoryTable(_),
            ) => self.execute(plan, here).await?,
            LogicalPlan::Ddl(_)
            | LogicalPlan::Dml(_)
            | LogicalPlan::Copy(_)
            | LogicalPlan::Statement(_)
            | LogicalPlan::Explain(_)
            | LogicalPlan::Analyze(_)
            | LogicalPlan::DescribeTable(_) => {
                return Err(plan_err(
                    here.clone(),
                    format!(
                        "unsupported statement ({}); a plan file holds SET, CREATE EXTERNAL TABLE, \
                         CREATE VIEW and one final SELECT query",
                        plan.display()
                    ),
                ));
            }
            query => return Ok(Some(query)),
        }
        Ok(None)
    }

    /// Registers `create`'s table empty, with its schema: views and queries after it plan
    /// as they would, and nothing is computed.
    fn stand_in(&self, create: &CreateMemoryTable, here: &Location) -> Result<()> {
        let schema = Arc::new(create.input.schema().as_arrow().clone());
        let table = MemTable::try_new(schema, vec![Vec::new()])
            .map_err(|e| plan_err(here.clone(), crate::df_message(e)))?;
        self.planned
            .ctx
            .register_table(create.name.clone(), Arc::new(table))
            .map(drop)
            .map_err(|e| plan_err(here.clone(), crate::df_message(e)))
    }

    async fn execute(&self, plan: LogicalPlan, here: &Location) -> Result<()> {
        guarded(self.planned.ctx.execute_logical_plan(plan))
            .await
            .map(drop)
            .map_err(|e| plan_err(here.clone(), e))
    }

    /// `SET sluice.<option>` is Sluice's, checked against its options; any other `SET`
    /// is DataFusion's.
    async fn set(&mut self, set: SetVariable, here: &Location) -> Result<()> {
        let variable = set.variable.to_ascii_lowercase();
        // What the tables' listings and `sluice_feedback` are made with, once they are.
        const BEFORE_TABLES: [&str; 3] = ["feedback", "rounds", "settle_s"];
        if let Some(key) = variable.strip_prefix("sluice.")
            && self.tables_begun
            && BEFORE_TABLES.contains(&key)
        {
            return Err(plan_err(
                here.clone(),
                format!("SET sluice.{key} must come before the first table or view"),
            ));
        }
        match variable.strip_prefix("sluice.") {
            Some(key) => self
                .planned
                .options
                .set_checked(key, &set.value)
                .map_err(|e| plan_err(here.clone(), config_message(e))),
            None => {
                let plan = LogicalPlan::Statement(PlanStatement::SetVariable(set));
                self.execute(plan, here).await
            }
        }
    }

    /// Registers the table's object stores (remote ones with the store options its
    /// `OPTIONS` carry, which are taken out of the statement as secrets), then the table.
    async fn create_external_table(
        &mut self,
        mut create: Box<CreateExternalTable>,
        here: &Location,
    ) -> Result<()> {
        let secrets = &mut *self.secrets;
        let store_options = store::take_store_options(&mut create.options, secrets);
        if let Some(definition) = &create.definition {
            create.definition = Some(secrets.redact(definition));
        }
        let options = &self.planned.options;
        let retry = store::Retry {
            max_retries: options.store_retries,
            timeout: std::time::Duration::from_secs(options.store_retry_timeout_s),
        };
        let mut remote = false;
        for location in &create.locations {
            if let Some(what) = not_data(location) {
                return Err(plan_err(
                    here.clone(),
                    format!("LOCATION '{location}' is {what}, not a file or directory of data"),
                ));
            }
            let is_remote = store::register(
                &self.planned.ctx,
                location,
                &store_options,
                retry,
                &self.planned.counters,
            )
            .await
            .map_err(|e| SluiceError::Storage {
                location: here.clone(),
                url: secrets.redact(&e.url),
                message: secrets.redact(&e.message),
            })?;
            if is_remote {
                self.planned.stores.add(location, &store_options, retry);
            }
            remote |= is_remote;
        }
        let format = store::FileFormat::of(&create.file_type);
        let locations = create.locations.clone();
        let plan = LogicalPlan::Ddl(DdlStatement::CreateExternalTable(create));
        let Err(message) = guarded(self.planned.ctx.execute_logical_plan(plan)).await else {
            return Ok(());
        };
        let message = self.secrets.redact(&message);
        if let Some(format) = format {
            for location in &locations {
                if let Some((bad, why)) =
                    store::find_corrupt(&self.planned.ctx, location, format).await
                {
                    return Err(SluiceError::Storage {
                        location: here.clone(),
                        url: self.secrets.redact(&bad),
                        message: format!("{why}; replace or remove the object ({message})"),
                    });
                }
            }
        }
        if remote {
            return Err(SluiceError::Storage {
                location: here.clone(),
                url: self.secrets.redact(&locations.join(", ")),
                message,
            });
        }
        Err(plan_err(here.clone(), message))
    }
}

/// The deepest expression a plan may hold: DataFusion plans an expression by recursion,
/// a level per operator of a chain (`a + b + c …` nests to the left), and a chain of
/// 5,000 terms overflowed even the 32 MiB stack of the planning thread in a test build,
/// which ends the process (4,000 planned).
const MAX_NESTING: usize = 2_500;

/// `Err` with what to do when `statement` nests expressions, or set operations (`UNION`
/// chains nest to the left too), deeper than [`MAX_NESTING`]. The walk stops as soon as
/// it gets there, so it never recurses deeper itself. `EXPLAIN` and `COPY` are looked
/// into: DataFusion plans what they hold before it refuses them.
fn nesting_within_limit(statement: &Statement) -> std::result::Result<(), String> {
    use datafusion::sql::parser::CopyToSource;
    use datafusion::sql::sqlparser::ast::{Expr, Query, SetExpr, Visit, Visitor};
    use std::ops::ControlFlow;

    struct Depth(usize);
    impl Visitor for Depth {
        type Break = ();
        fn pre_visit_expr(&mut self, _: &Expr) -> ControlFlow<()> {
            self.0 += 1;
            if self.0 > MAX_NESTING {
                ControlFlow::Break(())
            } else {
                ControlFlow::Continue(())
            }
        }
        fn post_visit_expr(&mut self, _: &Expr) -> ControlFlow<()> {
            self.0 -= 1;
            ControlFlow::Continue(())
        }
        fn pre_visit_query(&mut self, query: &Query) -> ControlFlow<()> {
            // The left spine of a chain of set operations, walked without recursion.
            let mut body = query.body.as_ref();
            let mut operations = 0;
            while let SetExpr::SetOperation { left, .. } = body {
                operations += 1;
                if operations > MAX_NESTING {
                    return ControlFlow::Break(());
                }
                body = left.as_ref();
            }
            ControlFlow::Continue(())
        }
    }
    let refused = || {
        format!(
            "an expression or a chain of set operations nests more than {MAX_NESTING} deep (a + b + c …, or SELECT … UNION ALL SELECT …): write long lists as IN (…), or split the query"
        )
    };
    let outcome = match statement {
        Statement::Statement(statement) => statement.visit(&mut Depth(0)),
        Statement::Explain(explain) => return nesting_within_limit(&explain.statement),
        Statement::CopyTo(copy) => match &copy.source {
            CopyToSource::Query(query) => query.visit(&mut Depth(0)),
            CopyToSource::Relation(_) => ControlFlow::Continue(()),
        },
        _ => ControlFlow::Continue(()),
    };
    match outcome {
        ControlFlow::Continue(()) => Ok(()),
        ControlFlow::Break(()) => Err(refused()),
    }
}

/// What a local `location` is when it exists but is neither a file nor a directory (a
/// device such as `/dev/null`, a FIFO, a socket), which DataFusion reads as an empty table.
fn not_data(location: &str) -> Option<&'static str> {
    use std::os::unix::fs::FileTypeExt;
    let path = match location.strip_prefix("file://") {
        Some(path) => path,
        None if location.contains("://") => return None,
        None => location,
    };
    let kind = std::fs::metadata(path).ok()?.file_type();
    match () {
        _ if kind.is_file() || kind.is_dir() => None,
        _ if kind.is_char_device() || kind.is_block_device() => Some("a device"),
        _ if kind.is_fifo() => Some("a FIFO"),
        _ if kind.is_socket() => Some("a socket"),
        _ => Some("neither"),
    }
}

fn plan_err(location: Location, message: String) -> SluiceError {
    SluiceError::Plan { location, message }
}

/// A session with Sluice's defaults and functions, its local files read through a
/// counting store.
fn session() -> (SessionContext, Arc<store::Counters>) {
    let config = SessionConfig::new()
        .with_option_extension(SluiceOptions::default())
        // Round-robin repartitioning interleaves batches by timing; without it, each
        // partition reads a fixed set of files and row groups, so the order of rows
        // depends only on the plan.
        .set_bool("datafusion.optimizer.enable_round_robin_repartition", false)
        // File scans would otherwise let an idle partition steal its siblings' files at
        // run time, so which partition reads a file (and the order of batches) would
        // depend on timing: a cold page cache alone changes it. A resumed run must
        // publish the same batches at the same positions.
        .set_bool(
            "datafusion.execution.enable_file_stream_work_stealing",
            false,
        )
        // Plain Utf8/Binary columns are what most Arrow consumers (numpy, older pyarrow,
        // many trainers) expect; plans can SET it back to true.
        .set_bool(
            "datafusion.execution.parquet.schema_force_view_types",
            false,
        )
        // Keep Arrow field metadata from Parquet files, so extension types such as
        // `arrow.fixed_shape_tensor` reach subscribers with their shape.
        .set_bool("datafusion.execution.parquet.skip_metadata", false)
        // Registered up front so that its keys travel with a Ballista job's settings;
        // each epoch sets its values.
        .with_option_extension(functions::FunctionContext::default());
    let state = SessionStateBuilder::new()
        .with_config(config)
        .with_runtime_env(crate::memory::default_runtime())
        .with_default_features()
        .with_physical_optimizer_rule(Arc::new(LargeLimitsSortWhole))
        .build();
    let ctx = SessionContext::new_with_state(state);
    functions::register(&ctx);
    // Local files go through a counting store too, so that local and remote runs report
    // their requests alike.
    let counters = Arc::new(store::Counters::default());
    if let Ok(file) = url::Url::parse("file://") {
        ctx.register_object_store(
            &file,
            Arc::new(store::Counting::new(
                Arc::new(object_store::local::LocalFileSystem::new()),
                counters.clone(),
            )),
        );
    }
    (ctx, counters)
}
