//! `sluice ballista scheduler|executor`: an Apache DataFusion Ballista cluster whose
//! scheduler and executors know Sluice's preprocessing functions, for plans that set
//! `sluice.engine = 'ballista://HOST:PORT'`. Stock Ballista processes run plans that use
//! only DataFusion's own functions.

use std::net::SocketAddr;

use clap::{Args, Subcommand};
use sluice::plan::ExecutorOptions;

#[derive(Debug, Args)]
pub struct BallistaArgs {
    #[command(subcommand)]
    role: Role,
}

#[derive(Debug, Subcommand)]
enum Role {
    /// Run a scheduler: it plans each job and hands its tasks to the executors.
    Scheduler {
        /// Address to listen on (plans name it in `ballista://HOST:PORT`).
        #[arg(long, default_value = "127.0.0.1:50050")]
        bind: SocketAddr,
    },
    /// Run an executor: it runs tasks and serves their results over Arrow Flight.
    Executor {
        /// The scheduler, HOST:PORT.
        #[arg(long, default_value = "127.0.0.1:50050")]
        scheduler: String,
        /// Address this executor binds and advertises to the scheduler and to clients.
        #[arg(long, default_value = "127.0.0.1")]
        host: String,
        /// Arrow Flight port (results and shuffle data are fetched from it).
        #[arg(long, default_value_t = 50051)]
        flight_port: u16,
        /// gRPC port.
        #[arg(long, default_value_t = 50052)]
        grpc_port: u16,
        /// Tasks run at once [default: the number of CPUs].
        #[arg(long)]
        concurrency: Option<usize>,
        /// Directory for shuffle files [default: a temporary directory].
        #[arg(long)]
        work_dir: Option<String>,
    },
}

pub fn run(args: BallistaArgs) -> anyhow::Result<()> {
    let rt = crate::runtime()?;
    match args.role {
        Role::Scheduler { bind } => {
            say!("Ballista scheduler with Sluice's functions listening on {bind}");
            rt.block_on(sluice::plan::run_scheduler(bind))?;
        }
        Role::Executor {
            scheduler,
            host,
            flight_port,
            grpc_port,
            concurrency,
            work_dir,
        } => {
            let (scheduler_host, scheduler_port) = scheduler
                .rsplit_once(':')
                .and_then(|(h, p)| Some((h.to_string(), p.parse::<u16>().ok()?)))
                .filter(|(h, _)| !h.is_empty())
                .ok_or_else(|| {
                    anyhow::anyhow!(
                        "--scheduler must be HOST:PORT, e.g. 127.0.0.1:50050, not '{scheduler}'"
                    )
                })?;
            let concurrency = concurrency
                .unwrap_or_else(|| std::thread::available_parallelism().map_or(1, |n| n.get()));
            say!(
                "Ballista executor with Sluice's functions on {host}:{flight_port} \
                 (gRPC {grpc_port}), scheduler {scheduler_host}:{scheduler_port}"
            );
            rt.block_on(sluice::plan::run_executor(ExecutorOptions {
                scheduler_host,
                scheduler_port,
                host,
                flight_port,
                grpc_port,
                concurrency,
                work_dir,
            }))?;
        }
    }
    Ok(())
}
