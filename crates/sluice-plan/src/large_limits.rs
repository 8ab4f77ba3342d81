//! `ORDER BY … LIMIT k` with a large k: a whole sort, then the first k rows.
//!
//! DataFusion runs a sort with a limit as a TopK heap (`SortExec` with a fetch), which
//! is what a small k wants. A selection that keeps a good share of the data ("the top
//! half by loss", `pipelines/selection/`) is the opposite case: every row that enters
//! the heap costs a heap insert of its encoded key, and most rows enter. Over 400 000
//! in-memory rows on 2 cores (DataFusion 55, release build), the heap took as long as
//! the whole sort (50–100 ms) at k ≈ 1–2 % of the rows, 3–5 times as long at k = 1/8 and
//! 10 times at k = half (DuckDB switches at 0.7 %: duckdb/duckdb#17140; end to end:
//! `sluice-bench` comparison 10, docs/benchmarks.md "Rounds"). So where the sort's input
//! is estimated at most [`ROWS_PER_FETCH`] times k (and k ≥ [`MIN_FETCH`]), the sort runs
//! whole and a limit takes its first k rows. Where DataFusion cannot estimate the input,
//! the heap stays: on an input far larger than k it holds k rows where a whole sort would
//! spill.

use std::sync::Arc;

use datafusion::common::config::ConfigOptions;
use datafusion::common::tree_node::{Transformed, TransformedResult, TreeNode};
use datafusion::error::Result;
use datafusion::physical_optimizer::PhysicalOptimizerRule;
use datafusion::physical_plan::ExecutionPlan;
use datafusion::physical_plan::limit::{GlobalLimitExec, LocalLimitExec};
use datafusion::physical_plan::sorts::sort::SortExec;
use datafusion::physical_plan::statistics::{StatisticsArgs, StatisticsContext};

/// A limit of at least 1/`ROWS_PER_FETCH` of its input's rows is taken from a whole sort.
pub(crate) const ROWS_PER_FETCH: usize = 32;
/// Below this many rows the heap is as fast as the sort whatever the input.
pub(crate) const MIN_FETCH: usize = 4096;

/// The rule (see the module's documentation).
#[derive(Debug, Default)]
pub(crate) struct LargeLimitsSortWhole;

impl PhysicalOptimizerRule for LargeLimitsSortWhole {
    fn optimize(
        &self,
        plan: Arc<dyn ExecutionPlan>,
        _config: &ConfigOptions,
    ) -> Result<Arc<dyn ExecutionPlan>> {
        plan.transform_up(|node| {
            let Some(sort) = node.downcast_ref::<SortExec>() else {
                return Ok(Transformed::no(node));
            };
            match sort.fetch() {
                Some(fetch) if sorts_whole(sort, fetch)? => {
                    Ok(Transformed::yes(whole(sort, fetch)))
                }
                _ => Ok(Transformed::no(node)),
            }
        })
        .data()
    }

    fn name(&self) -> &str {
        "sluice_large_limits_sort_whole"
    }

    fn schema_check(&self) -> bool {
        true
    }
}

/// Whether `sort`'s input is estimated at most [`ROWS_PER_FETCH`] times `fetch` rows.
fn sorts_whole(sort: &SortExec, fetch: usize) -> Result<bool> {
    if fetch < MIN_FETCH {
        return Ok(false);
    }
    let stats = StatisticsContext::new().compute(sort.input().as_ref(), &StatisticsArgs::new())?;
    Ok(stats
        .num_rows
        .get_value()
        .is_some_and(|&rows| rows <= fetch.saturating_mul(ROWS_PER_FETCH)))
}

/// `sort` without its fetch, under a limit that takes its first `fetch` rows (of each
/// partition where it sorts each apart).
fn whole(sort: &SortExec, fetch: usize) -> Arc<dyn ExecutionPlan> {
    let partitioned = sort.preserve_partitioning();
    let sorted = Arc::new(
        SortExec::new(sort.expr().clone(), Arc::clone(sort.input()))
            .with_preserve_partitioning(partitioned),
    );
    if partitioned {
        Arc::new(LocalLimitExec::new(sorted, fetch))
    } else {
        Arc::new(GlobalLimitExec::new(sorted, 0, Some(fetch)))
    }
}
