//! Sluice's integration tests, in one binary: every module links the whole stack
//! (DataFusion, iceoryx2, object_store), so one binary links it once instead of once per
//! file. Run one part with a filter, e.g. `cargo test --test integration cross_process::`.

mod ballista;
mod common;
mod conformance;
mod cross_process;
mod cuda_host;
mod flight;
mod functions;
mod gpu_cli;
mod gpu_subscriber;
mod in_process;
mod object_storage;
mod parquet_testing;
mod rounds;
mod trainer_resume;
