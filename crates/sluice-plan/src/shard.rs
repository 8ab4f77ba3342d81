//! Sharding a plan across nodes: `--shard RANK/WORLD` or `SET sluice.shard = 'RANK/WORLD'`.
//!
//! Every file scan of the physical plan lists its files in a fixed order (by path, then
//! by byte offset). Their bytes, laid end to end, are cut into `WORLD` contiguous spans
//! of (nearly) equal size, and shard `RANK` keeps its span: whole files, or byte ranges of
//! files. A Parquet reader given a byte range reads exactly the row groups whose first
//! page starts inside it, and a CSV reader the lines that start inside it, so spans that
//! tile the bytes give shards that are disjoint and, together, complete — without reading
//! any footer to plan. Formats that cannot read ranges (Arrow IPC, JSON) are split by
//! whole files.
//!
//! The shard's span is then cut the same way into as many file groups as the scan had
//! partitions, so a shard still reads with the node's parallelism.

use std::sync::Arc;

use datafusion::common::tree_node::{Transformed, TreeNode};
use datafusion::datasource::listing::PartitionedFile;
use datafusion::datasource::physical_plan::{FileGroup, FileScanConfig, FileScanConfigBuilder};
use datafusion::datasource::source::DataSourceExec;
use datafusion::physical_plan::ExecutionPlan;
use datafusion::physical_plan::empty::EmptyExec;
use datafusion::physical_plan::placeholder_row::PlaceholderRowExec;

use sluice_core::{Result, SluiceError};

/// `RANK/WORLD`: this node reads shard `rank` of `world`.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub struct Shard {
    /// This shard, `0 ≤ rank < world`.
    pub rank: u64,
    /// Number of shards.
    pub world: u64,
}

impl Shard {
    /// Parses `RANK/WORLD`.
    pub fn parse(text: &str) -> Result<Self> {
        let bad = || {
            SluiceError::Config(format!(
                "invalid shard '{text}': expected RANK/WORLD with 0 <= RANK < WORLD, e.g. 0/4"
            ))
        };
        let (rank, world) = text.trim().split_once('/').ok_or_else(bad)?;
        let rank: u64 = rank.trim().parse().map_err(|_| bad())?;
        let world: u64 = world.trim().parse().map_err(|_| bad())?;
        if world == 0 || rank >= world {
            return Err(bad());
        }
        Ok(Self { rank, world })
    }

    /// Whether this is the whole dataset (`0/1`).
    pub fn is_whole(&self) -> bool {
        self.world == 1
    }
}

impl std::fmt::Display for Shard {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        write!(f, "{}/{}", self.rank, self.world)
    }
}

/// A piece of a file: `[start, end)` bytes.
#[derive(Debug, Clone)]
struct Piece {
    file: PartitionedFile,
    start: u64,
    end: u64,
}

/// Restricts every file scan of `plan` to `shard`.
pub(crate) fn apply(plan: Arc<dyn ExecutionPlan>, shard: Shard) -> Result<Arc<dyn ExecutionPlan>> {
    if shard.is_whole() {
        return Ok(plan);
    }
    let mut scans = 0usize;
    let out = plan
        .transform_up(|node| {
            if node.children().is_empty() {
                let Some(exec) = node.as_ref().downcast_ref::<DataSourceExec>() else {
                    return leaf_error(&node);
                };
                let Some(config) = exec.data_source().as_ref().downcast_ref::<FileScanConfig>()
                else {
                    return leaf_error(&node);
                };
                scans += 1;
                let sharded = shard_scan(config, shard);
                return Ok(Transformed::yes(
                    DataSourceExec::from_data_source(sharded) as Arc<dyn ExecutionPlan>
                ));
            }
            if node.name().contains("Join") {
                return Err(datafusion::error::DataFusionError::Plan(format!(
                    "sharding a query with a join ({}) would drop matches between shards; \
                     shard plans that read one table (or a UNION of tables), or join on each \
                     node without --shard",
                    node.name()
                )));
            }
            Ok(Transformed::no(node))
        })
        .map_err(|e| SluiceError::Config(e.to_string()))?
        .data;
    if scans == 0 {
        return Err(SluiceError::Config(format!(
            "shard {shard}: the query reads no files, so there is nothing to shard"
        )));
    }
    Ok(out)
}

fn leaf_error(
    node: &Arc<dyn ExecutionPlan>,
) -> datafusion::error::Result<Transformed<Arc<dyn ExecutionPlan>>> {
    // Constant sources produce the same rows on every node: keep them only where they
    // are harmless (no rows).
    if node.as_ref().is::<EmptyExec>() {
        return Ok(Transformed::no(node.clone()));
    }
    let what = if node.as_ref().is::<PlaceholderRowExec>() {
        "a query without a table".to_string()
    } else {
        format!("a source that is not files ({})", node.name())
    };
    Err(datafusion::error::DataFusionError::Plan(format!(
        "cannot shard {what}: only file sources (CREATE EXTERNAL TABLE) can be split across nodes"
    )))
}

fn shard_scan(config: &FileScanConfig, shard: Shard) -> FileScanConfig {
    let splittable = matches!(config.file_source().file_type(), "parquet" | "csv")
        && !config.file_compression_type.is_compressed();
    let partitions = config.file_groups.len().max(1);
    let mut pieces: Vec<Piece> = config
        .file_groups
        .iter()
        .flat_map(|g| g.iter())
        .map(|f| {
            let (start, end) = match &f.range {
                Some(r) => (r.start.max(0) as u64, r.end.max(0) as u64),
                None => (0, f.object_meta.size),
            };
            let mut file = f.clone();
            file.range = None;
            Piece { file, start, end }
        })
        .collect();
    pieces.sort_by(|a, b| {
        a.file
            .object_meta
            .location
            .cmp(&b.file.object_meta.location)
            .then(a.start.cmp(&b.start))
    });
    let mine = cut(&pieces, shard.rank, shard.world, splittable);
    let groups: Vec<FileGroup> = (0..partitions as u64)
        .map(|p| FileGroup::new(to_files(cut(&mine, p, partitions as u64, splittable))))
        .collect();
    let schema = config.file_source().table_schema().table_schema().clone();
    FileScanConfigBuilder::from(config.clone())
        .with_file_groups(groups)
        .with_statistics(datafusion::common::Statistics::new_unknown(&schema))
        .build()
}

fn to_files(pieces: Vec<Piece>) -> Vec<PartitionedFile> {
    pieces
        .into_iter()
        .map(|p| {
            let mut f = p.file;
            if p.start != 0 || p.end != f.object_meta.size {
                f = f.with_range(p.start as i64, p.end as i64);
            }
            f
        })
        .collect()
}

/// Part `k` of `n` of `pieces`: the pieces (or parts of pieces, when `split`) that fall
/// in the `k`-th of `n` equal spans of their total length. Unsplittable pieces belong to
/// the span that holds their first byte.
fn cut(pieces: &[Piece], k: u64, n: u64, split: bool) -> Vec<Piece> {
    let total: u64 = pieces.iter().map(|p| p.end - p.start).sum();
    let bound = |i: u64| (total as u128 * i as u128 / n as u128) as u64;
    let (lo, hi) = (bound(k), bound(k + 1));
    let mut out = Vec::new();
    let mut at = 0u64;
    for p in pieces {
        let len = p.end - p.start;
        let (a, b) = (at, at + len);
        at = b;
        if split {
            let (s, e) = (a.max(lo), b.min(hi));
            if s < e {
                out.push(Piece {
                    file: p.file.clone(),
                    start: p.start + (s - a),
                    end: p.start + (e - a),
                });
            }
        } else if a >= lo && (a < hi || (k + 1 == n && a == total)) {
            out.push(p.clone());
        }
    }
    out
}

#[cfg(test)]
mod tests {
    use super::*;

    fn pieces(sizes: &[u64]) -> Vec<Piece> {
        sizes
            .iter()
            .enumerate()
            .map(|(i, &s)| Piece {
                file: PartitionedFile::new(format!("f{i}"), s),
                start: 0,
                end: s,
            })
            .collect()
    }

    #[test]
    fn shards_parse_and_reject_nonsense() {
        assert_eq!(Shard::parse("2/5").unwrap(), Shard { rank: 2, world: 5 });
        for bad in ["5/5", "1", "a/2", "0/0", "-1/3"] {
            assert!(Shard::parse(bad).is_err(), "{bad}");
        }
    }

    /// Every byte of every file lands in exactly one shard, for splittable and whole-file
    /// cuts alike.
    #[test]
    fn cuts_tile_the_bytes() {
        let all = pieces(&[100, 7, 0, 1000, 3, 250]);
        for split in [true, false] {
            for n in 1..=7u64 {
                let mut seen: Vec<(String, u64, u64)> = (0..n)
                    .flat_map(|k| cut(&all, k, n, split))
                    .map(|p| (p.file.object_meta.location.to_string(), p.start, p.end))
                    .collect();
                seen.sort();
                let mut want = Vec::new();
                for p in &all {
                    let name = p.file.object_meta.location.to_string();
                    let mut parts: Vec<_> = seen
                        .iter()
                        .filter(|(f, _, _)| *f == name)
                        .cloned()
                        .collect();
                    parts.sort_by_key(|x| x.1);
                    // Contiguous, starting at 0, ending at the size.
                    let mut at = 0;
                    for (_, s, e) in &parts {
                        assert_eq!(*s, at, "{name} n={n} split={split}: {parts:?}");
                        at = *e;
                    }
                    assert_eq!(at, p.end, "{name} n={n} split={split}: {parts:?}");
                    want.push(name);
                }
                assert!(!want.is_empty());
            }
        }
    }
}
