//! The memory DataFusion may take for a plan's operators by default.
//!
//! DataFusion's own default is no limit: a sort, an aggregate or a join over more data
//! than expected grows until the kernel's OOM killer ends a process, on a node whose
//! trainers need memory too. Sluice gives each plan a pool of half the memory the
//! process may use (the machine's, or its cgroup's where that is less); operators that
//! can spill to disk then do (to private temporary files), and others fail with
//! DataFusion's `ResourcesExhausted`, naming the pool. A plan sets another with
//! `SET datafusion.runtime.memory_limit = '8G';`.

use std::sync::Arc;

use datafusion::execution::runtime_env::{RuntimeEnv, RuntimeEnvBuilder};

/// The share of the memory a plan's operators may take by default.
const SHARE: f64 = 0.5;

/// A runtime whose memory pool is [`SHARE`] of what this process may use; DataFusion's
/// default (no limit) where that cannot be read.
pub(crate) fn default_runtime() -> Arc<RuntimeEnv> {
    let builder = RuntimeEnvBuilder::new();
    let builder = match usable_memory() {
        Some(bytes) => builder.with_memory_limit(bytes, SHARE),
        None => builder,
    };
    builder
        .build_arc()
        .unwrap_or_else(|_| Arc::new(RuntimeEnv::default()))
}

/// Bytes this process may use: the machine's memory, or its cgroup's limit if lower.
pub(crate) fn usable_memory() -> Option<usize> {
    let total = std::fs::read_to_string("/proc/meminfo")
        .ok()?
        .lines()
        .find_map(|l| l.strip_prefix("MemTotal:"))
        .and_then(|rest| {
            rest.trim()
                .trim_end_matches("kB")
                .trim()
                .parse::<u64>()
                .ok()
        })?
        .checked_mul(1024)?;
    // cgroup v2: "max" or a number of bytes.
    let cgroup = std::fs::read_to_string("/sys/fs/cgroup/memory.max")
        .ok()
        .and_then(|v| v.trim().parse::<u64>().ok());
    usize::try_from(cgroup.map_or(total, |c| c.min(total))).ok()
}
