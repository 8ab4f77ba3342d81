//! Where a plan's final query runs: in this process (DataFusion) or on an Apache
//! DataFusion Ballista cluster (`SET sluice.engine`).
//!
//! A plan is always read, checked and planned in this process: `SET`s, tables, views and
//! the final query's schema come from a local [`SessionContext`], so every error names
//! the file and line as before. With a Ballista engine, that session (its configuration,
//! tables, object stores and Sluice's functions) becomes the Ballista session, and each
//! epoch's query is submitted to the cluster as a job. The job's result comes back over
//! Arrow Flight and is published locally like any other epoch.
//!
//! # Order
//!
//! Ballista does not preserve the order of rows that a query does not sort: which
//! executor finishes a shuffle first decides the order of an aggregate's or a join's
//! output. Sluice needs a fixed order (a resumed run skips the batches a checkpoint
//! already delivered, and the seeded shuffle must permute the same sequence), so on
//! Ballista a final query without a top-level `ORDER BY` is sorted on the cluster by every
//! column of a flat type ([`total_order`]). A final `ORDER BY` is kept as written: make it
//! total (add a unique key) when the order of ties matters. Every row still arrives
//! exactly once per epoch whatever the order: the epoch is the job's whole result.

use std::sync::Arc;

use ballista::prelude::{SessionConfigExt, SessionContextExt};
use datafusion::arrow::datatypes::DataType;
use datafusion::common::Column;
use datafusion::execution::runtime_env::{RuntimeEnv, RuntimeEnvBuilder};
use datafusion::execution::{SessionState, SessionStateBuilder};
use datafusion::logical_expr::{Expr, LogicalPlan, LogicalPlanBuilder, SortExpr};
use datafusion::prelude::{SessionConfig, SessionContext};

use sluice_core::{Result, SluiceError};

/// The engine that executes a plan's final query.
#[derive(Debug, Clone, PartialEq, Eq)]
pub enum Engine {
    /// DataFusion in this process (`'local'`, the default).
    Local,
    /// An in-process Ballista scheduler and executor (`'ballista:standalone'`): the same
    /// code path as a cluster, for tests and for trying a plan out.
    BallistaStandalone,
    /// The Ballista scheduler at `host:port` (`'ballista://HOST:PORT'`).
    BallistaRemote {
        /// Scheduler host.
        host: String,
        /// Scheduler port (Ballista's 50050 when not given).
        port: u16,
    },
}

/// Ballista's default scheduler port.
const DEFAULT_SCHEDULER_PORT: u16 = 50050;

impl Engine {
    /// Parses `sluice.engine`.
    pub fn parse(text: &str) -> Result<Self> {
        let usage = "expected 'local', 'ballista:standalone' or 'ballista://HOST:PORT'";
        match text.trim() {
            "" | "local" => Ok(Self::Local),
            "ballista:standalone" => Ok(Self::BallistaStandalone),
            other => {
                let Some(rest) = other.strip_prefix("ballista://") else {
                    return Err(SluiceError::Config(format!(
                        "sluice.engine: unknown engine '{other}'; {usage}"
                    )));
                };
                let url = url::Url::parse(&format!("df://{rest}")).map_err(|e| {
                    SluiceError::Config(format!(
                        "sluice.engine: bad address '{other}' ({e}); {usage}"
                    ))
                })?;
                let host = url.host_str().filter(|h| !h.is_empty()).ok_or_else(|| {
                    SluiceError::Config(format!("sluice.engine: '{other}' names no host; {usage}"))
                })?;
                if !matches!(url.path(), "" | "/") || url.query().is_some() {
                    return Err(SluiceError::Config(format!(
                        "sluice.engine: '{other}' has a path or query; {usage}"
                    )));
                }
                Ok(Self::BallistaRemote {
                    host: host.to_string(),
                    port: url.port().unwrap_or(DEFAULT_SCHEDULER_PORT),
                })
            }
        }
    }

    /// Whether the query runs on Ballista.
    pub fn is_ballista(&self) -> bool {
        !matches!(self, Self::Local)
    }
}

impl std::fmt::Display for Engine {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        match self {
            Self::Local => f.write_str("local"),
            Self::BallistaStandalone => f.write_str("ballista:standalone"),
            Self::BallistaRemote { host, port } => write!(f, "ballista://{host}:{port}"),
        }
    }
}

/// Turns the local session `local` (tables, options, object stores and functions
/// registered) into a session whose queries run on `engine`.
///
/// A standalone cluster shares `local`'s runtime (so its object stores, with their
/// credentials) and function registry; it runs on the caller's tokio runtime and stops
/// with it. A remote cluster gets the tables and options with each job; its executors
/// must be able to read the tables' locations and must have Sluice's functions
/// registered where the plan uses them (`sluice ballista executor` starts such an
/// executor).
pub async fn ballista_context(local: &SessionContext, engine: &Engine) -> Result<SessionContext> {
    let state = local.state();
    // Ballista's restrictions on DataFusion's options (no round-robin repartitioning, no
    // view types, no dynamic filters) apply on the cluster whatever the client says, so
    // they are applied here too: the scheduler plans with this configuration.
    let config = state.config().clone().upgrade_for_ballista();
    let functions: Vec<_> = state.scalar_functions().values().cloned().collect();
    let aggregates: Vec<_> = state.aggregate_functions().values().cloned().collect();
    let state = SessionStateBuilder::new_from_existing(state)
        .with_config(config)
        .build();
    let ctx = match engine {
        Engine::Local => return Ok(local.clone()),
        Engine::BallistaStandalone => standalone(state).await.map_err(|e| {
            SluiceError::Execution(format!(
                "cannot start the standalone Ballista scheduler and executor: {e}"
            ))
        })?,
        Engine::BallistaRemote { host, port } => {
            SessionContext::remote_with_state(&format!("df://{host}:{port}"), state)
                .await
                .map_err(|e| {
                    SluiceError::Config(format!(
                        "sluice.engine: cannot use the Ballista scheduler at {engine}: {}",
                        e.find_root()
                    ))
                })?
        }
    };
    // Ballista's session replaces the function list with its built-ins; the client plans
    // (and checks) queries too, so Sluice's functions go back in.
    let present = ctx.state().scalar_functions().clone();
    for udf in functions {
        if !present.contains_key(udf.name()) {
            ctx.register_udf(Arc::unwrap_or_clone(udf));
        }
    }
    let present = ctx.state().aggregate_functions().clone();
    for udaf in aggregates {
        if !present.contains_key(udaf.name()) {
            ctx.register_udaf(Arc::unwrap_or_clone(udaf));
        }
    }
    Ok(ctx)
}

/// Starts an in-process Ballista scheduler and executor that share `state` (its tables,
/// functions and object stores) and returns a session that submits to them.
///
/// This is Ballista's `SessionContext::standalone_with_state` with one difference that
/// matters: the scheduler builds each job's session from `state` *with the job's
/// settings applied*. Ballista's own version hands every job `state` as it was, so the
/// options a job carries (the epoch that Sluice's random functions draw from) never
/// reached the executors.
async fn standalone(state: SessionState) -> std::result::Result<SessionContext, String> {
    use ballista_core::extension::SessionStateExt;
    use ballista_core::serde::BallistaCodec;
    use ballista_core::serde::protobuf::scheduler_grpc_client::SchedulerGrpcClient;

    let config = state.config().clone();
    let codec = BallistaCodec::new(
        config.ballista_logical_extension_codec(),
        config.ballista_physical_extension_codec(),
    );
    let base = state.clone();
    let session_builder: ballista_scheduler::scheduler_server::SessionBuilder =
        Arc::new(move |config: SessionConfig| {
            Ok(SessionStateBuilder::new_from_existing(base.clone())
                .with_config(config)
                .build())
        });
    let producer_config = config.clone();
    let addr = ballista_scheduler::standalone::new_standalone_scheduler_with_builder(
        session_builder,
        Arc::new(move || producer_config.clone()),
        codec,
    )
    .await
    .map_err(|e| e.to_string())?;
    let url = format!("http://localhost:{}", addr.port());
    // The scheduler's server task has been spawned; its socket is bound already, so the
    // first attempts succeed unless the runtime is starved.
    let started = std::time::Instant::now();
    let scheduler = loop {
        match SchedulerGrpcClient::connect(url.clone()).await {
            Ok(client) => break client,
            Err(e) if started.elapsed() > std::time::Duration::from_secs(30) => {
                return Err(format!(
                    "the scheduler at {url} did not answer in 30 s: {e}"
                ));
            }
            Err(_) => tokio::time::sleep(std::time::Duration::from_millis(50)).await,
        }
    };
    ballista_executor::new_standalone_executor_from_state(
        scheduler,
        config.ballista_standalone_parallelism(),
        &state,
    )
    .await
    .map_err(|e| e.to_string())?;
    let state = state.upgrade_for_ballista(url).map_err(|e| e.to_string())?;
    Ok(SessionContext::new_with_state(state))
}

/// The base configuration of a Sluice-aware Ballista scheduler or executor: Ballista's
/// defaults, and the keys of Sluice's function context so that a job can set them.
fn cluster_config() -> SessionConfig {
    SessionConfig::new_with_ballista()
        .with_option_extension(crate::functions::FunctionContext::default())
        .with_option_extension(crate::store::StoreSpecs::default())
}

/// The object stores a job's settings declare (see [`crate::StoreSpecs`]), registered in
/// `runtime`.
fn register_job_stores(
    config: &SessionConfig,
    runtime: &RuntimeEnv,
) -> datafusion::error::Result<()> {
    match config
        .options()
        .extensions
        .get::<crate::store::StoreSpecs>()
    {
        Some(stores) => stores
            .register(runtime)
            .map_err(datafusion::error::DataFusionError::Configuration),
        None => Ok(()),
    }
}

/// A session with DataFusion's functions and Sluice's.
fn cluster_state(config: SessionConfig) -> SessionState {
    let state = SessionStateBuilder::new()
        .with_default_features()
        .with_config(config)
        .build();
    let ctx = SessionContext::new_with_state(state);
    crate::functions::register(&ctx);
    ctx.state()
}

/// Runs a Ballista scheduler listening on `bind` whose sessions know Sluice's functions
/// (`sluice ballista scheduler`); returns when it stops or fails.
pub async fn run_scheduler(bind: std::net::SocketAddr) -> Result<()> {
    use ballista_scheduler::cluster::BallistaCluster;
    use ballista_scheduler::config::SchedulerConfig;

    let config = SchedulerConfig {
        bind_host: bind.ip().to_string(),
        bind_port: bind.port(),
        external_host: bind.ip().to_string(),
        ..SchedulerConfig::default()
    }
    .with_override_config_producer(Arc::new(cluster_config))
    .with_override_session_builder(Arc::new(|config: SessionConfig| {
        let state = cluster_state(config.clone());
        register_job_stores(&config, state.runtime_env())?;
        Ok(state)
    }));
    let failed = |e: ballista_core::error::BallistaError| {
        SluiceError::Execution(format!("the Ballista scheduler on {bind} failed: {e}"))
    };
    let cluster = BallistaCluster::new_from_config(&config)
        .await
        .map_err(failed)?;
    ballista_scheduler::scheduler_process::start_server(cluster, bind, Arc::new(config))
        .await
        .map_err(failed)
}

/// Where `sluice ballista executor` listens and which scheduler it serves.
#[derive(Debug, Clone)]
pub struct ExecutorOptions {
    /// The scheduler's host.
    pub scheduler_host: String,
    /// The scheduler's port.
    pub scheduler_port: u16,
    /// The address the executor binds and advertises.
    pub host: String,
    /// Its Arrow Flight port (results and shuffle data are fetched from it).
    pub flight_port: u16,
    /// Its gRPC port.
    pub grpc_port: u16,
    /// Tasks it runs at once.
    pub concurrency: usize,
    /// Where it keeps shuffle files (a temporary directory when `None`).
    pub work_dir: Option<String>,
}

/// Runs a Ballista executor with Sluice's functions registered (`sluice ballista
/// executor`); returns when it stops or fails.
pub async fn run_executor(options: ExecutorOptions) -> Result<()> {
    use ballista_executor::executor_process::{ExecutorProcessConfig, start_executor_process};

    let registry =
        ballista_core::registry::BallistaFunctionRegistry::from(&cluster_state(cluster_config()));
    // Shuffle files and spills go under the work directory, as with Ballista's own
    // runtime; each job's runtime also gets the object stores its settings declare.
    // Spills hold the rows of the jobs' tables: owner-only, and, by default, under a
    // random name (a predictable one in a shared temporary directory could be made
    // first by another user), removed when the executor stops.
    let (spill_dir, _removed_at_exit) = match &options.work_dir {
        Some(dir) => {
            use std::os::unix::fs::DirBuilderExt;
            std::fs::DirBuilder::new()
                .recursive(true)
                .mode(0o700)
                .create(dir)
                .map_err(|e| SluiceError::io(format!("cannot create {dir}"), e))?;
            (dir.clone(), None)
        }
        None => {
            let dir = tempfile::Builder::new()
                .prefix("sluice-ballista-")
                .tempdir()
                .map_err(|e| SluiceError::io("cannot create a spill directory", e))?;
            (dir.path().display().to_string(), Some(dir))
        }
    };
    let runtime_producer: ballista_core::RuntimeProducer =
        Arc::new(move |config: &SessionConfig| {
            let runtime = RuntimeEnvBuilder::new()
                .with_temp_file_path(spill_dir.clone())
                .build()?;
            register_job_stores(config, &runtime)?;
            Ok(Arc::new(runtime))
        });
    let config = ExecutorProcessConfig {
        override_runtime_producer: Some(runtime_producer),
        bind_host: options.host.clone(),
        external_host: Some(options.host.clone()),
        port: options.flight_port,
        grpc_port: options.grpc_port,
        scheduler_host: options.scheduler_host.clone(),
        scheduler_port: options.scheduler_port,
        vcores: options.concurrency.max(1),
        work_dir: options.work_dir.clone(),
        print_thread_info: false,
        override_function_registry: Some(Arc::new(registry)),
        override_config_producer: Some(Arc::new(cluster_config)),
        ..ExecutorProcessConfig::default()
    };
    start_executor_process(Arc::new(config)).await.map_err(|e| {
        SluiceError::Execution(format!(
            "the Ballista executor (scheduler {}:{}) failed: {e}",
            options.scheduler_host, options.scheduler_port
        ))
    })
}

/// `query` with a fixed row order on an engine that does not keep one: a final query
/// without a top-level `ORDER BY` is sorted by every column of a flat type (nulls last),
/// in the order of the columns. Returns `query` unchanged when it already ends in an
/// `ORDER BY` (through projections, limits and aliases) or has no flat column.
pub fn total_order(query: LogicalPlan) -> datafusion::error::Result<LogicalPlan> {
    if ends_in_sort(&query) {
        return Ok(query);
    }
    let keys: Vec<SortExpr> = query
        .schema()
        .iter()
        .filter(|(_, field)| sortable(field.data_type()))
        .map(|(qualifier, field)| {
            Expr::Column(Column::new(qualifier.cloned(), field.name())).sort(true, false)
        })
        .collect();
    if keys.is_empty() {
        return Ok(query);
    }
    LogicalPlanBuilder::from(query).sort(keys)?.build()
}

fn ends_in_sort(plan: &LogicalPlan) -> bool {
    match plan {
        LogicalPlan::Sort(_) => true,
        LogicalPlan::Projection(p) => ends_in_sort(&p.input),
        LogicalPlan::Limit(l) => ends_in_sort(&l.input),
        LogicalPlan::SubqueryAlias(a) => ends_in_sort(&a.input),
        _ => false,
    }
}

/// Types every DataFusion sort handles, cheaply: no nested values.
fn sortable(t: &DataType) -> bool {
    match t {
        DataType::Dictionary(_, value) => sortable(value),
        t => {
            t.is_primitive()
                || matches!(
                    t,
                    DataType::Boolean
                        | DataType::Utf8
                        | DataType::LargeUtf8
                        | DataType::Utf8View
                        | DataType::Binary
                        | DataType::LargeBinary
                        | DataType::BinaryView
                        | DataType::FixedSizeBinary(_)
                )
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn parses_engines() {
        assert_eq!(Engine::parse("local").unwrap(), Engine::Local);
        assert_eq!(Engine::parse("").unwrap(), Engine::Local);
        assert_eq!(
            Engine::parse("ballista:standalone").unwrap(),
            Engine::BallistaStandalone
        );
        assert_eq!(
            Engine::parse("ballista://sched.example:6000").unwrap(),
            Engine::BallistaRemote {
                host: "sched.example".into(),
                port: 6000
            }
        );
        assert_eq!(
            Engine::parse("ballista://10.0.0.1").unwrap().to_string(),
            "ballista://10.0.0.1:50050"
        );
        for bad in [
            "spark://x:1",
            "ballista:",
            "ballista://",
            "ballista://h:99999",
            "ballista://h:1/path",
            "ballista:cluster",
        ] {
            let err = Engine::parse(bad).unwrap_err().to_string();
            assert!(err.contains("sluice.engine"), "{bad}: {err}");
            assert!(err.contains("ballista:standalone"), "{bad}: {err}");
        }
    }
}
