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
use datafusion::execution::object_store::ObjectStoreUrl;
use datafusion::execution::runtime_env::RuntimeEnv;
use datafusion::physical_plan::ExecutionPlan;
use object_store::{ObjectMeta, ObjectStoreExt};

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

/// Files checked at most for [`changed_since_listed`]: a failed epoch over a very large
/// dataset is not held up by as many `HEAD` requests.
const MOST_CHECKED: usize = 1024;

/// A file a scan reads, as listed when the epoch was planned.
#[derive(Debug, Clone)]
pub(crate) struct ListedFile {
    store: ObjectStoreUrl,
    meta: ObjectMeta,
}

/// The files `plan`'s scans read, each once.
pub(crate) fn files(plan: &Arc<dyn ExecutionPlan>) -> Vec<ListedFile> {
    let mut out: Vec<ListedFile> = Vec::new();
    let _ = plan.apply(|node| {
        let config = node
            .as_ref()
            .downcast_ref::<DataSourceExec>()
            .and_then(|exec| exec.data_source().as_ref().downcast_ref::<FileScanConfig>());
        if let Some(config) = config {
            for file in config.file_groups.iter().flat_map(|g| g.iter()) {
                out.push(ListedFile {
                    store: config.object_store_url.clone(),
                    meta: file.object_meta.clone(),
                });
            }
        }
        Ok(TreeNodeRecursion::Continue)
    });
    out.sort_by(|a, b| a.meta.location.cmp(&b.meta.location));
    out.dedup_by(|a, b| a.meta.location == b.meta.location && a.store == b.store);
    out.truncate(MOST_CHECKED);
    out
}

/// The first of `files` that is no longer as listed (removed, or another size, entity
/// tag or modification time), said for a user: why an epoch that read it failed to
/// decode (DataFusion read the new bytes with the old footer). `None` where all are as
/// listed, or cannot be looked at.
pub(crate) async fn changed_since_listed(env: &RuntimeEnv, files: &[ListedFile]) -> Option<String> {
    // A store that fails (the likelier cause of the epoch's failure) is not asked again,
    // and all of it takes a few seconds at most: the error must reach the subscribers.
    tokio::time::timeout(LOOK_FOR, first_changed(env, files))
        .await
        .ok()
        .flatten()
}

/// How long [`changed_since_listed`] looks.
const LOOK_FOR: std::time::Duration = std::time::Duration::from_secs(5);

async fn first_changed(env: &RuntimeEnv, files: &[ListedFile]) -> Option<String> {
    for file in files {
        let Ok(store) = env.object_store(&file.store) else {
            continue;
        };
        let name = format!("{}{}", file.store.as_str(), file.meta.location);
        let was = &file.meta;
        match store.head(&was.location).await {
            Err(object_store::Error::NotFound { .. }) => {
                return Some(format!("{name} was removed after the run listed it"));
            }
            Ok(now)
                if now.size != was.size
                    || now.last_modified != was.last_modified
                    || (now.e_tag.is_some() && now.e_tag != was.e_tag) =>
            {
                return Some(format!(
                    "{name} changed after the run listed it ({} bytes then, {} now)",
                    was.size, now.size
                ));
            }
            Ok(_) => {}
            Err(_) => return None,
        }
    }
    None
}
