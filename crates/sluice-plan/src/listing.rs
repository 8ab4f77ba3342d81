//! The files a plan reads, as listed when it is planned.
//!
//! A checkpoint's position counts batches, and the batches follow from the query, the
//! settings and the data. Files added, removed or rewritten between a crash and its
//! resume shift rows, which subscribers would then drop or repeat "by position"; shards
//! of one run that list different files overlap or leave rows out. So the listing is
//! part of what a resume must match, and `sluice explain` shows it for comparing nodes.

use std::sync::Arc;

use datafusion::common::tree_node::{TreeNode, TreeNodeRecursion};
use datafusion::datasource::physical_plan::FileScanConfig;
use datafusion::datasource::source::DataSourceExec;
use datafusion::physical_plan::ExecutionPlan;

/// What a plan's file scans list: counts and a digest of every file.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct Listing {
    /// Files listed (each once, however many scans or pieces read it).
    pub files: u64,
    /// Their bytes.
    pub bytes: u64,
    /// xxh3 of every file's path, size, modification time and entity tag, in path
    /// order (16 hex digits).
    pub digest: String,
    /// The files' paths in their stores, in order.
    pub paths: Vec<String>,
}

impl std::fmt::Display for Listing {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        write!(
            f,
            "{} files, {} bytes, listing {}",
            self.files, self.bytes, self.digest
        )
    }
}

/// The listing of every file scan in `plan` (before sharding: the whole run's).
pub(crate) fn of(plan: &Arc<dyn ExecutionPlan>) -> Listing {
    let mut entries: Vec<(String, u64, i64, String)> = Vec::new();
    // The closure never fails: every node is visited.
    let _ = plan.apply(|node| {
        let config = node
            .as_ref()
            .downcast_ref::<DataSourceExec>()
            .and_then(|exec| exec.data_source().as_ref().downcast_ref::<FileScanConfig>());
        for file in config
            .iter()
            .flat_map(|c| c.file_groups.iter())
            .flat_map(|g| g.iter())
        {
            let meta = &file.object_meta;
            entries.push((
                meta.location.to_string(),
                meta.size,
                meta.last_modified.timestamp_nanos_opt().unwrap_or(i64::MAX),
                meta.e_tag.clone().unwrap_or_default(),
            ));
        }
        Ok(TreeNodeRecursion::Continue)
    });
    entries.sort();
    entries.dedup();
    let mut text = String::new();
    for (path, size, modified, tag) in &entries {
        text.push_str(&format!("{path}\0{size}\0{modified}\0{tag}\n"));
    }
    Listing {
        files: entries.len() as u64,
        bytes: entries.iter().fold(0u64, |sum, e| sum.saturating_add(e.1)),
        digest: format!("{:016x}", xxhash_rust::xxh3::xxh3_64(text.as_bytes())),
        paths: entries.into_iter().map(|e| e.0).collect(),
    }
}
