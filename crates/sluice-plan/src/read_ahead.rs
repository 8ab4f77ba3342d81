//! Read-ahead for Parquet scans of remote object stores (`sluice.read_ahead`).
//!
//! DataFusion 55's Parquet reader asks for one row group's column chunks, decodes them,
//! and only then asks for the next row group's. Against an object store every row group
//! therefore costs a request round trip during which the partition's CPU waits, and a
//! file costs as many requests as it has row groups. pyarrow's scan coalesces a file's
//! row groups into few large requests instead, which is why it was faster than Sluice on
//! the same server (docs/benchmarks.md, "S3").
//!
//! This reader sits between DataFusion and the store. When the decoder asks for row group
//! `g`, it fetches the same columns of `g` and of the next row groups this scan reads, up
//! to `sluice.read_ahead` bytes, in few requests (ranges less than 64 KiB apart are
//! merged; up to 8 requests run at once), and as soon as that window is in hand it starts fetching the
//! next window in the background, so the next row groups' I/O overlaps this one's
//! decoding. DataFusion opens a partition's next file only when the current one is done,
//! so a partition also fetches the first window of its next file (the projection's
//! columns, then the leaf columns its readers were asked for) while it reads the current
//! one. A partition holds at most three windows: the one being decoded, the one in
//! flight and its next file's first. A window is `read_ahead` bytes or one row group's
//! columns, whichever is larger, so memory stays bounded by three times that per
//! scanning partition.
//!
//! Read-ahead never changes what a scan returns or which errors it reports: whatever it
//! cannot serve (footers, page indexes, ranges it did not predict, a read-ahead request
//! that failed) goes to DataFusion's own reader, exactly as without it. It predicts row
//! groups in file order and turns itself off for a file read in any other order (reverse
//! scans), and it restricts itself to the row groups DataFusion will scan: those whose
//! first page lies in the file range of the partition (the rule of DataFusion's
//! `prune_by_range`) and that an access plan, if the file has one, does not skip. Row
//! groups pruned later by statistics, pages pruned by the page index and columns a
//! pushed-down filter makes unnecessary may still be fetched, whole: a selective scan of
//! a remote store can read more bytes than without read-ahead (at most the windows'
//! worth), in fewer requests.

use std::collections::{BTreeSet, HashMap};
use std::fmt;
use std::ops::Range;
use std::sync::{Arc, Mutex};

use bytes::Bytes;
use datafusion::common::tree_node::{Transformed, TreeNode};
use datafusion::datasource::listing::PartitionedFile;
use datafusion::datasource::physical_plan::parquet::{
    CachedParquetFileReaderFactory, ParquetAccessPlan, ParquetRowSelection,
};
use datafusion::datasource::physical_plan::{
    FileScanConfig, FileScanConfigBuilder, FileSource, ParquetFileReaderFactory, ParquetSource,
};
use datafusion::datasource::source::DataSourceExec;
use datafusion::execution::runtime_env::RuntimeEnv;
use datafusion::physical_plan::ExecutionPlan;
use datafusion::physical_plan::metrics::ExecutionPlanMetricsSet;
use futures::future::BoxFuture;
use futures::{FutureExt, StreamExt, TryStreamExt};
use object_store::path::Path as StorePath;
use object_store::{ObjectStore, ObjectStoreExt};
use parquet::arrow::arrow_reader::ArrowReaderOptions;
use parquet::arrow::async_reader::AsyncFileReader;
use parquet::file::metadata::{PageIndexPolicy, ParquetMetaData};
use tokio::task::JoinHandle;

use sluice_core::{Result, SluiceError};

/// Gives every Parquet scan of `plan` that reads a remote store (anything but `file://`)
/// a read-ahead of `window` bytes; `window == 0` leaves the plan as it is.
///
/// `next_files`: a partition may also fetch the first window of the file it reads next.
/// Only sound to predict when partitions read their own files in order, i.e. without
/// DataFusion's work stealing (which Sluice's plans turn off): a stolen file's window
/// would be fetched for nothing.
pub(crate) fn apply(
    plan: Arc<dyn ExecutionPlan>,
    runtime: &RuntimeEnv,
    window: u64,
    next_files: bool,
) -> Result<Arc<dyn ExecutionPlan>> {
    if window == 0 {
        return Ok(plan);
    }
    plan.transform_up(|node| {
        let Some(exec) = node.as_ref().downcast_ref::<DataSourceExec>() else {
            return Ok(Transformed::no(node));
        };
        let Some(config) = exec.data_source().as_ref().downcast_ref::<FileScanConfig>() else {
            return Ok(Transformed::no(node));
        };
        // Local files are read at memory speed from the page cache: nothing to hide.
        if config.object_store_url.as_str().starts_with("file:") {
            return Ok(Transformed::no(node));
        }
        let Some(source) = config.file_source().downcast_ref::<ParquetSource>() else {
            return Ok(Transformed::no(node));
        };
        let store = runtime.object_store(&config.object_store_url)?;
        let inner = source
            .parquet_file_reader_factory()
            .cloned()
            .unwrap_or_else(|| {
                Arc::new(CachedParquetFileReaderFactory::new(
                    store.clone(),
                    runtime.cache_manager.get_file_metadata_cache(),
                ))
            });
        // The file columns the scan reads (all without a projection): what a next file's
        // first window fetches until the readers learn the exact leaf columns.
        let file_schema = source.table_schema().file_schema();
        let projected: Vec<String> = match source.projection() {
            Some(p) => p
                .column_indices()
                .into_iter()
                .filter_map(|i| file_schema.fields().get(i))
                .map(|f| f.name().clone())
                .collect(),
            None => file_schema
                .fields()
                .iter()
                .map(|f| f.name().clone())
                .collect(),
        };
        let groups = if next_files {
            config
                .file_groups
                .iter()
                .map(|g| g.iter().cloned().collect())
                .collect()
        } else {
            Vec::new()
        };
        let source = source
            .clone()
            .with_parquet_file_reader_factory(Arc::new(ReadAheadFactory {
                inner,
                store,
                window,
                learned: Arc::new(Mutex::new(projected)),
                groups,
                next: Arc::default(),
            }));
        let config = FileScanConfigBuilder::from(config.clone())
            .with_source(Arc::new(source))
            .build();
        Ok(Transformed::yes(
            DataSourceExec::from_data_source(config) as Arc<dyn ExecutionPlan>
        ))
    })
    .map(|t| t.data)
    .map_err(|e| SluiceError::Execution(e.to_string()))
}

/// Wraps the readers of another factory (DataFusion's, which caches footers) in
/// [`ReadAhead`].
#[derive(Debug)]
struct ReadAheadFactory {
    inner: Arc<dyn ParquetFileReaderFactory>,
    store: Arc<dyn ObjectStore>,
    window: u64,
    /// The columns the scan reads, as column paths or their prefixes (`features` for
    /// `features.list.item`): first the projection's, then the leaf columns its readers
    /// were asked for. A next file's first window fetches them.
    learned: Arc<Mutex<Vec<String>>>,
    /// The files of each partition, in the order it reads them.
    groups: Vec<Vec<PartitionedFile>>,
    /// Per partition: the first window of the file it reads next, fetched while it reads
    /// the current one (DataFusion opens a partition's next file only once the current
    /// one is done, so without it every file starts with a round trip).
    ///
    /// Keyed by partition and file. A reader dropped before it used its first window
    /// (DataFusion reads bloom filters through one reader and decodes through a second
    /// one of the same file) leaves the window here for its successor.
    next: Windows,
}

/// First windows of files, by partition and file, waiting for their readers.
type Windows = Arc<Mutex<HashMap<(usize, FileKey), Pending>>>;

/// A file of a scan: its path and byte range.
type FileKey = (StorePath, Option<(i64, i64)>);

fn file_key(file: &PartitionedFile) -> FileKey {
    (
        file.object_meta.location.clone(),
        file.range.as_ref().map(|r| (r.start, r.end)),
    )
}

fn scope_of(file: &PartitionedFile) -> Scope {
    Scope {
        range: file.range.as_ref().map(|r| r.start..r.end),
        access_plan: file.extensions.get::<ParquetAccessPlan>().cloned(),
        // A row selection picks rows inside row groups by its own rules: leave such
        // files to DataFusion rather than guess.
        usable: file.extensions.get::<ParquetRowSelection>().is_none(),
    }
}

impl ReadAheadFactory {
    /// Starts fetching the first window of the file `partition` reads after `current`,
    /// unless that is under way; returns the window of `current`, if one was fetched.
    fn next_file(
        &self,
        partition: usize,
        current: &FileKey,
        metadata_size_hint: Option<usize>,
        metrics: &ExecutionPlanMetricsSet,
    ) -> Option<Pending> {
        let mut next = self.next.lock().ok()?;
        let mine = next.remove(&(partition, current.clone()));
        let runtime = tokio::runtime::Handle::try_current().ok();
        let following = self.groups.get(partition).and_then(|files| {
            let i = files.iter().position(|f| file_key(f) == *current)?;
            files.get(i + 1)
        });
        let (Some(runtime), Some(file)) = (runtime, following) else {
            return mine;
        };
        let key = (partition, file_key(file));
        let scope = scope_of(file);
        if next.contains_key(&key) || !scope.usable {
            return mine;
        }
        let hint = file.metadata_size_hint.or(metadata_size_hint);
        let Ok(mut reader) = self
            .inner
            .create_reader(partition, file.clone(), hint, metrics)
        else {
            return mine;
        };
        let (store, learned, window) = (self.store.clone(), self.learned.clone(), self.window);
        let (location, size) = (file.object_meta.location.clone(), file.object_meta.size);
        let task = runtime.spawn(async move {
            let options = ArrowReaderOptions::new().with_page_index_policy(PageIndexPolicy::Skip);
            let metadata = reader.get_metadata(Some(&options)).await.ok()?;
            let layout = Layout::new(&metadata, size, &scope);
            let columns = layout.matching(&learned.lock().ok()?.clone());
            if columns.is_empty() {
                return None;
            }
            let (groups, ranges) = layout.window(0, &columns, window);
            let data = get_ranges(store.as_ref(), &location, &ranges).await.ok()?;
            Some(Window::new(groups, ranges, data))
        });
        next.insert(key, Pending { groups: None, task });
        mine
    }
}

impl Drop for ReadAheadFactory {
    fn drop(&mut self) {
        // Windows nobody took (a scan stopped early) stop fetching (`Pending::drop`).
        if let Ok(mut next) = self.next.lock() {
            next.clear();
        }
    }
}

impl ParquetFileReaderFactory for ReadAheadFactory {
    fn create_reader(
        &self,
        partition_index: usize,
        file: PartitionedFile,
        metadata_size_hint: Option<usize>,
        metrics: &ExecutionPlanMetricsSet,
    ) -> datafusion::error::Result<Box<dyn AsyncFileReader + Send>> {
        let scope = scope_of(&file);
        let key = file_key(&file);
        let pending = self.next_file(partition_index, &key, metadata_size_hint, metrics);
        let location = file.object_meta.location.clone();
        let size = file.object_meta.size;
        let inner = self
            .inner
            .create_reader(partition_index, file, metadata_size_hint, metrics)?;
        Ok(Box::new(ReadAhead {
            inner,
            store: self.store.clone(),
            location,
            size,
            window: self.window,
            scope,
            learned: self.learned.clone(),
            windows: self.next.clone(),
            key: (partition_index, key),
            layout: None,
            columns: BTreeSet::new(),
            ready: None,
            pending,
            last: None,
            off: false,
        }))
    }
}

/// Which row groups of a file the scan reads, as DataFusion decides before statistics.
#[derive(Debug, Default)]
struct Scope {
    range: Option<Range<i64>>,
    access_plan: Option<ParquetAccessPlan>,
    usable: bool,
}

/// Where the column chunks of a file lie, from its footer.
#[derive(Debug)]
struct Layout {
    /// `(bytes, row group, column)` of every column chunk, by first byte.
    chunks: Vec<(Range<u64>, usize, usize)>,
    /// `[row group][column]`: the chunk's bytes, or `None` where the footer is bogus.
    ranges: Vec<Vec<Option<Range<u64>>>>,
    /// The row groups the scan reads, in file order.
    order: Vec<usize>,
    /// The path of every leaf column (`a.b.c`), by index.
    paths: Vec<String>,
    /// `position[g]`: where row group `g` is in `order`.
    position: Vec<Option<usize>>,
}

impl Layout {
    fn new(metadata: &ParquetMetaData, size: u64, scope: &Scope) -> Self {
        let groups = metadata.row_groups();
        let mut chunks = Vec::new();
        let mut ranges = Vec::with_capacity(groups.len());
        for (g, group) in groups.iter().enumerate() {
            let mut row = Vec::with_capacity(group.columns().len());
            for (c, column) in group.columns().iter().enumerate() {
                // Checked by hand: parquet's `byte_range` asserts, and a corrupt footer
                // must not panic the producer.
                let start = column
                    .dictionary_page_offset()
                    .unwrap_or_else(|| column.data_page_offset());
                let range = u64::try_from(start)
                    .ok()
                    .zip(u64::try_from(column.compressed_size()).ok())
                    .and_then(|(start, len)| Some(start..start.checked_add(len)?))
                    .filter(|r| r.end <= size && !r.is_empty());
                if let Some(r) = &range {
                    chunks.push((r.clone(), g, c));
                }
                row.push(range);
            }
            ranges.push(row);
        }
        chunks.sort_by_key(|(r, _, _)| r.start);
        let mut order = Vec::new();
        let mut position = vec![None; groups.len()];
        for (g, group) in groups.iter().enumerate() {
            let skipped = scope
                .access_plan
                .as_ref()
                .is_some_and(|p| p.len() != groups.len() || !p.should_scan(g));
            let first_page = group.columns().first().map(|c| {
                c.dictionary_page_offset()
                    .unwrap_or_else(|| c.data_page_offset())
            });
            let in_range = match (&scope.range, first_page) {
                (None, _) => true,
                (Some(r), Some(offset)) => r.contains(&offset),
                (Some(_), None) => false,
            };
            if !skipped && in_range {
                position[g] = Some(order.len());
                order.push(g);
            }
        }
        let paths = metadata
            .file_metadata()
            .schema_descr()
            .columns()
            .iter()
            .map(|c| c.path().string())
            .collect();
        Self {
            chunks,
            ranges,
            order,
            position,
            paths,
        }
    }

    /// The leaf columns named by `names`: exactly, or as a prefix of their path.
    fn matching(&self, names: &[String]) -> BTreeSet<usize> {
        (0..self.paths.len())
            .filter(|&i| {
                let path = &self.paths[i];
                names.iter().any(|n| {
                    path == n
                        || path
                            .strip_prefix(n.as_str())
                            .is_some_and(|rest| rest.starts_with('.'))
                })
            })
            .collect()
    }

    /// The chunk holding byte `at`: `(row group, column)`.
    fn chunk_at(&self, at: u64) -> Option<(usize, usize)> {
        let i = self.chunks.partition_point(|(r, _, _)| r.start <= at);
        let (range, g, c) = self.chunks.get(i.checked_sub(1)?)?;
        range.contains(&at).then_some((*g, *c))
    }

    /// The row group every range of a request falls in, and the columns it reads; `None`
    /// when the request is not one row group's column chunks.
    fn request(&self, ranges: &[Range<u64>]) -> Option<(usize, BTreeSet<usize>)> {
        let mut group = None;
        let mut columns = BTreeSet::new();
        for r in ranges {
            if r.start > r.end {
                return None;
            }
            let (g, c) = self.chunk_at(r.start)?;
            let chunk = self.ranges[g][c].as_ref()?;
            if r.end > chunk.end || group.is_some_and(|seen| seen != g) {
                return None;
            }
            group = Some(g);
            columns.insert(c);
        }
        Some((group?, columns))
    }

    /// The row groups of the window that starts at position `from` of `order`, and the
    /// byte ranges of `columns` in them: at least one row group, then more while the
    /// window stays within `budget` bytes.
    fn window(
        &self,
        from: usize,
        columns: &BTreeSet<usize>,
        budget: u64,
    ) -> (Vec<usize>, Vec<Range<u64>>) {
        let mut groups = Vec::new();
        let mut ranges = Vec::new();
        let mut total = 0u64;
        for &g in self.order.iter().skip(from) {
            let wanted: Vec<Range<u64>> = columns
                .iter()
                .filter_map(|&c| self.ranges[g].get(c).cloned().flatten())
                .collect();
            let bytes: u64 = wanted.iter().map(|r| r.end - r.start).sum();
            if !groups.is_empty() && total.saturating_add(bytes) > budget {
                break;
            }
            total = total.saturating_add(bytes);
            groups.push(g);
            ranges.extend(wanted);
        }
        (groups, ranges)
    }
}

/// Fetched column chunks of some row groups.
#[derive(Debug)]
struct Window {
    groups: Vec<usize>,
    /// `(bytes, data)`, by first byte.
    pieces: Vec<(Range<u64>, Bytes)>,
}

impl Window {
    fn new(groups: Vec<usize>, ranges: Vec<Range<u64>>, data: Vec<Bytes>) -> Self {
        let mut pieces: Vec<_> = ranges.into_iter().zip(data).collect();
        pieces.sort_by_key(|(r, _)| r.start);
        Self { groups, pieces }
    }

    /// The bytes of every range of `ranges`, if this window holds them all.
    fn serve(&self, ranges: &[Range<u64>]) -> Option<Vec<Bytes>> {
        ranges
            .iter()
            .map(|r| {
                let i = self.pieces.partition_point(|(p, _)| p.start <= r.start);
                let (piece, data) = self.pieces.get(i.checked_sub(1)?)?;
                if r.start > r.end
                    || r.end > piece.end
                    || data.len() as u64 != piece.end.checked_sub(piece.start)?
                {
                    return None;
                }
                let from = usize::try_from(r.start - piece.start).ok()?;
                let to = usize::try_from(r.end - piece.start).ok()?;
                Some(data.slice(from..to))
            })
            .collect()
    }
}

/// Ranges closer than this are fetched as one request (the bytes between them are read
/// and dropped). object_store's own `get_ranges` merges across up to 1 MiB, which over a
/// window of row groups would read a whole file for a narrow projection of small row
/// groups; pyarrow's pre-buffering uses 8 KiB. 64 KiB costs a fraction of a request's
/// latency on S3 in extra bytes.
const HOLE: u64 = 64 << 10;

/// The longest request a window is cut into: larger windows become several requests in
/// flight at once, which an object store serves faster than one.
const MAX_REQUEST: u64 = 8 << 20;

/// Requests of one window in flight at once.
const CONCURRENCY: usize = 8;

/// The bytes of `ranges` (one `Bytes` each, in order), in as few requests as `HOLE` and
/// `MAX_REQUEST` allow, up to `CONCURRENCY` of them at once.
async fn get_ranges(
    store: &dyn ObjectStore,
    location: &StorePath,
    ranges: &[Range<u64>],
) -> object_store::Result<Vec<Bytes>> {
    let merged = merge(ranges);
    let fetched: Vec<Bytes> = futures::stream::iter(merged.iter().cloned())
        .map(|r| store.get_range(location, r))
        .buffered(CONCURRENCY)
        .try_collect()
        .await?;
    Ok(ranges
        .iter()
        .map(|r| {
            if r.is_empty() {
                return Bytes::new();
            }
            // `merge` made a request that covers every range: the last one that starts
            // at or before it (they are sorted and disjoint).
            let i = merged
                .partition_point(|m| m.start <= r.start)
                .saturating_sub(1);
            let (m, data) = (&merged[i], &fetched[i]);
            let from = (r.start - m.start) as usize;
            let to = ((r.end - m.start) as usize).min(data.len());
            data.slice(from.min(to)..to)
        })
        .collect())
}

/// The requests that cover `ranges`: sorted, merged across gaps of at most `HOLE`, and
/// no longer than `MAX_REQUEST` unless a single range is.
fn merge(ranges: &[Range<u64>]) -> Vec<Range<u64>> {
    let mut sorted: Vec<Range<u64>> = ranges.iter().filter(|r| !r.is_empty()).cloned().collect();
    sorted.sort_by_key(|r| r.start);
    let mut out: Vec<Range<u64>> = Vec::new();
    for r in sorted {
        match out.last_mut() {
            Some(last)
                if r.start <= last.end.saturating_add(HOLE)
                    && r.end.max(last.end) - last.start <= MAX_REQUEST.max(r.end - r.start) =>
            {
                last.end = last.end.max(r.end);
            }
            _ => out.push(r),
        }
    }
    out
}

/// A window being fetched in the background.
#[derive(Debug)]
struct Pending {
    /// Its row groups, when known before it arrives (not for a next file's first
    /// window, planned once that file's footer is read).
    groups: Option<Vec<usize>>,
    task: JoinHandle<Option<Window>>,
}

impl Drop for Pending {
    fn drop(&mut self) {
        // Dropped unused (a scan stopped early, a mispredicted window) or while awaited
        // (a cancelled scan): the request stops. Aborting a finished task does nothing.
        self.task.abort();
    }
}

/// Fetches `ranges` of row groups `groups` in the background.
fn spawn_window(
    runtime: &tokio::runtime::Handle,
    store: Arc<dyn ObjectStore>,
    location: StorePath,
    groups: Vec<usize>,
    ranges: Vec<Range<u64>>,
) -> Pending {
    let known = groups.clone();
    let task = runtime.spawn(async move {
        let data = get_ranges(store.as_ref(), &location, &ranges).await.ok()?;
        Some(Window::new(groups, ranges, data))
    });
    Pending {
        groups: Some(known),
        task,
    }
}

/// A Parquet reader that reads ahead (module docs).
struct ReadAhead {
    inner: Box<dyn AsyncFileReader + Send>,
    store: Arc<dyn ObjectStore>,
    location: StorePath,
    size: u64,
    window: u64,
    scope: Scope,
    learned: Arc<Mutex<Vec<String>>>,
    /// The factory's first windows, and this reader's key in them.
    windows: Windows,
    key: (usize, FileKey),
    layout: Option<Layout>,
    /// The columns asked for so far (a filter pushed into the scan reads its columns
    /// first and the others after): what later windows fetch.
    columns: BTreeSet<usize>,
    /// The window being decoded.
    ready: Option<Window>,
    pending: Option<Pending>,
    /// Position in `order` of the last row group asked for.
    last: Option<usize>,
    /// Set once the reads stop following the prediction: everything goes to `inner`.
    off: bool,
}

impl fmt::Debug for ReadAhead {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        f.debug_struct("ReadAhead")
            .field("location", &self.location)
            .field("window", &self.window)
            .field("off", &self.off)
            .finish_non_exhaustive()
    }
}

impl Drop for ReadAhead {
    fn drop(&mut self) {
        // A reader that never served a request hands its first window to the next
        // reader of the same file (see `ReadAheadFactory::next`); any other window stops
        // fetching with its `Pending`.
        if self.last.is_none()
            && let Some(pending) = self.pending.take()
            && let Ok(mut windows) = self.windows.lock()
        {
            windows.entry(self.key.clone()).or_insert(pending);
        }
    }
}

impl ReadAhead {
    async fn fetch(&mut self, ranges: Vec<Range<u64>>) -> parquet::errors::Result<Vec<Bytes>> {
        if self.off || !self.scope.usable {
            return self.inner.get_byte_ranges(ranges).await;
        }
        if self.layout.is_none() {
            // DataFusion hands the decoder a fresh reader, without asking it for the
            // footer, when it read bloom filters through the first one. The footer is
            // in DataFusion's metadata cache by then (it was read to plan), so asking
            // costs no request; without it, this is one request per file.
            let options = ArrowReaderOptions::new().with_page_index_policy(PageIndexPolicy::Skip);
            match self.inner.get_metadata(Some(&options)).await {
                Ok(metadata) => {
                    self.layout = Some(Layout::new(&metadata, self.size, &self.scope));
                }
                Err(_) => self.off = true,
            }
        }
        let Some(layout) = &self.layout else {
            return self.inner.get_byte_ranges(ranges).await;
        };
        let Some((group, columns)) = layout.request(&ranges) else {
            return self.inner.get_byte_ranges(ranges).await;
        };
        let Some(position) = layout.position.get(group).copied().flatten() else {
            return self.inner.get_byte_ranges(ranges).await;
        };
        if self.pending.is_none()
            && self.last.is_none()
            && let Ok(mut windows) = self.windows.lock()
        {
            self.pending = windows.remove(&self.key);
        }
        if self.last.is_some_and(|last| position < last) {
            // Not file order (a reverse scan): stop predicting for this file.
            self.off = true;
            self.ready = None;
            self.pending = None;
            return self.inner.get_byte_ranges(ranges).await;
        }
        self.last = Some(position);
        if !columns.is_subset(&self.columns) {
            self.columns.extend(columns);
            if let Ok(mut learned) = self.learned.lock() {
                *learned = self
                    .columns
                    .iter()
                    .filter_map(|&c| layout.paths.get(c).cloned())
                    .collect();
            }
        }

        let mut served = self.ready.as_ref().and_then(|w| w.serve(&ranges));
        if served.is_none()
            && let Some(mut p) = self.pending.take()
            && p.groups.as_ref().is_none_or(|g| g.contains(&group))
        {
            match (&mut p.task).await {
                Ok(Some(window)) => {
                    served = window.serve(&ranges);
                    self.ready = Some(window);
                }
                // The store failed (or the footer could not be read): DataFusion's
                // reader asks once more and reports the error its own way, and the
                // store is not asked again by read-ahead.
                _ => {
                    self.off = true;
                    self.ready = None;
                    return self.inner.get_byte_ranges(ranges).await;
                }
            }
        }
        if served.is_none() {
            let (groups, wanted) = layout.window(position, &self.columns, self.window);
            match get_ranges(self.store.as_ref(), &self.location, &wanted).await {
                Ok(data) => {
                    let window = Window::new(groups, wanted, data);
                    served = window.serve(&ranges);
                    self.ready = Some(window);
                }
                // DataFusion's reader asks again and reports the error its own way; a
                // failing store is not asked twice for every later row group.
                Err(_) => {
                    self.ready = None;
                    self.off = true;
                }
            }
        }
        let Some(data) = served else {
            return self.inner.get_byte_ranges(ranges).await;
        };
        self.spawn_next();
        Ok(data)
    }

    /// Starts fetching the window after the ready one, unless one is in flight.
    fn spawn_next(&mut self) {
        let next = match (&self.layout, &self.ready) {
            (Some(layout), Some(ready)) => ready
                .groups
                .last()
                .and_then(|&g| layout.position.get(g).copied().flatten())
                .map(|p| p + 1),
            _ => None,
        };
        if let Some(next) = next {
            self.spawn(next);
        }
    }

    /// Starts fetching the window at position `from` of the scan's row groups, unless a
    /// window is in flight.
    fn spawn(&mut self, from: usize) {
        if self.pending.is_some() {
            return;
        }
        let Some(layout) = &self.layout else {
            return;
        };
        let (groups, ranges) = layout.window(from, &self.columns, self.window);
        if groups.is_empty() {
            return;
        }
        // Outside a tokio runtime there is nowhere to run it: the next window is then
        // fetched when asked for.
        let Ok(runtime) = tokio::runtime::Handle::try_current() else {
            return;
        };
        self.pending = Some(spawn_window(
            &runtime,
            self.store.clone(),
            self.location.clone(),
            groups,
            ranges,
        ));
    }
}

impl AsyncFileReader for ReadAhead {
    fn get_bytes(&mut self, range: Range<u64>) -> BoxFuture<'_, parquet::errors::Result<Bytes>> {
        self.inner.get_bytes(range)
    }

    fn get_byte_ranges(
        &mut self,
        ranges: Vec<Range<u64>>,
    ) -> BoxFuture<'_, parquet::errors::Result<Vec<Bytes>>> {
        self.fetch(ranges).boxed()
    }

    fn get_metadata<'a>(
        &'a mut self,
        options: Option<&'a ArrowReaderOptions>,
    ) -> BoxFuture<'a, parquet::errors::Result<Arc<ParquetMetaData>>> {
        async move {
            let metadata = self.inner.get_metadata(options).await?;
            if self.layout.is_none() {
                self.layout = Some(Layout::new(&metadata, self.size, &self.scope));
            }
            Ok(metadata)
        }
        .boxed()
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::store::{Counters, Counting, StoreStats};
    use datafusion::arrow::array::{ArrayRef, Float64Array, Int64Array, StringArray};
    use datafusion::arrow::record_batch::RecordBatch;
    use datafusion::arrow::util::display::array_value_to_string;
    use datafusion::prelude::{SessionConfig, SessionContext};
    use object_store::memory::InMemory;
    use parquet::arrow::ArrowWriter;
    use parquet::file::properties::WriterProperties;

    /// A Parquet file of `rows` rows (`id`, `name`, `x`) in row groups of 250 rows.
    fn parquet(first: i64, rows: i64) -> Vec<u8> {
        let ids = first..first + rows;
        let batch = RecordBatch::try_from_iter([
            (
                "id",
                Arc::new(Int64Array::from_iter_values(ids.clone())) as ArrayRef,
            ),
            (
                "name",
                Arc::new(StringArray::from_iter_values(
                    ids.clone()
                        .map(|i| format!("row {i} {}", "x".repeat((i % 50) as usize))),
                )) as ArrayRef,
            ),
            (
                "x",
                Arc::new(Float64Array::from_iter_values(ids.map(|i| i as f64 * 0.5))) as ArrayRef,
            ),
        ])
        .unwrap();
        let props = WriterProperties::builder()
            .set_max_row_group_row_count(Some(250))
            .build();
        let mut out = Vec::new();
        let mut w = ArrowWriter::try_new(&mut out, batch.schema(), Some(props)).unwrap();
        w.write(&batch).unwrap();
        w.close().unwrap();
        out
    }

    /// Two files of 10 000 rows (40 row groups each) in an in-memory store that counts
    /// its requests, registered as `s3://bucket` in a session with `partitions`.
    async fn session(partitions: usize) -> (SessionContext, Arc<InMemory>, Arc<Counters>) {
        let memory = Arc::new(InMemory::new());
        for (i, first) in [0i64, 10_000].into_iter().enumerate() {
            memory
                .put(
                    &StorePath::from(format!("t/part-{i}.parquet")),
                    parquet(first, 10_000).into(),
                )
                .await
                .unwrap();
        }
        let counters = Arc::new(Counters::default());
        let config = SessionConfig::new()
            .with_target_partitions(partitions)
            // Split files into byte ranges across partitions even though they are small.
            .set_usize("datafusion.optimizer.repartition_file_min_size", 0)
            // As in Sluice's plans: partitions read their own files, in order.
            .set_bool(
                "datafusion.execution.enable_file_stream_work_stealing",
                false,
            );
        let ctx = SessionContext::new_with_config(config);
        ctx.register_object_store(
            &url::Url::parse("s3://bucket").unwrap(),
            Arc::new(Counting::new(memory.clone(), counters.clone())),
        );
        ctx.sql("CREATE EXTERNAL TABLE t STORED AS PARQUET LOCATION 's3://bucket/t/'")
            .await
            .unwrap();
        (ctx, memory, counters)
    }

    /// The rows of `sql` (sorted, so that partitioning does not matter) and the requests
    /// its scan made, with a read-ahead of `window` bytes.
    async fn run(
        ctx: &SessionContext,
        counters: &Counters,
        sql: &str,
        window: u64,
    ) -> datafusion::error::Result<(Vec<String>, StoreStats)> {
        let plan = ctx.sql(sql).await?.create_physical_plan().await?;
        let stealing = ctx
            .state()
            .config_options()
            .execution
            .enable_file_stream_work_stealing;
        let plan = apply(plan, &ctx.runtime_env(), window, !stealing)
            .map_err(|e| datafusion::error::DataFusionError::External(Box::new(e)))?;
        let before = counters.snapshot();
        let batches = datafusion::physical_plan::collect(plan, ctx.task_ctx()).await?;
        let after = counters.snapshot();
        let mut rows = Vec::new();
        for b in &batches {
            for r in 0..b.num_rows() {
                let row: Vec<String> = b
                    .columns()
                    .iter()
                    .map(|col| array_value_to_string(col, r).unwrap())
                    .collect();
                rows.push(row.join("|"));
            }
        }
        rows.sort();
        let stats = StoreStats {
            gets: after.gets - before.gets,
            heads: after.heads - before.heads,
            lists: after.lists - before.lists,
            bytes: after.bytes - before.bytes,
        };
        Ok((rows, stats))
    }

    const QUERIES: [&str; 5] = [
        "SELECT * FROM t",
        "SELECT id FROM t",
        "SELECT x, name FROM t WHERE id % 7 = 3",
        "SELECT name FROM t WHERE id >= 4000 AND id < 13000",
        "SELECT count(*), sum(x) FROM t",
    ];

    #[tokio::test]
    async fn every_query_returns_the_same_rows_with_fewer_requests_and_no_extra_bytes() {
        for partitions in [1, 2, 3] {
            let (ctx, _, counters) = session(partitions).await;
            // Every column chunk of both files, read once.
            let (_, all) = run(&ctx, &counters, "SELECT * FROM t", 0).await.unwrap();
            for sql in QUERIES {
                let (want, plain) = run(&ctx, &counters, sql, 0).await.unwrap();
                // A window below one row group (each window one row group, fetched in the
                // background), a few row groups, and a whole file.
                for window in [1, 20 << 10, 64 << 20] {
                    let (got, ahead) = run(&ctx, &counters, sql, window).await.unwrap();
                    assert_eq!(got, want, "{sql}, {partitions} partitions, window {window}");
                    // A whole scan reads every chunk once either way; a projection may
                    // also read the gaps (under 64 KiB) between its chunks, but still no
                    // byte twice. (Statistics prune the range query's row groups, which
                    // read-ahead may fetch anyway.)
                    let at = format!("{sql}, {partitions} partitions, window {window}");
                    if sql == "SELECT * FROM t" {
                        assert_eq!(ahead.bytes, plain.bytes, "{at}");
                    } else if !sql.contains(">=") {
                        assert!(ahead.bytes <= all.bytes, "{at}: {ahead:?} {all:?}");
                    }
                    if window == 64 << 20 && !sql.contains("count") {
                        assert!(
                            ahead.gets * 4 < plain.gets,
                            "{sql}, {partitions} partitions: {ahead:?} against {plain:?}"
                        );
                    }
                }
            }
        }
    }

    #[tokio::test]
    async fn filters_pushed_into_the_scan_read_the_same_rows() {
        let (ctx, _, counters) = session(2).await;
        ctx.sql("SET datafusion.execution.parquet.pushdown_filters = true")
            .await
            .unwrap();
        // Idle partitions steal files too: no next-file windows then, the same rows.
        ctx.sql("SET datafusion.execution.enable_file_stream_work_stealing = true")
            .await
            .unwrap();
        for sql in QUERIES {
            let (want, _) = run(&ctx, &counters, sql, 0).await.unwrap();
            for window in [1, 20 << 10, 64 << 20] {
                let (got, _) = run(&ctx, &counters, sql, window).await.unwrap();
                assert_eq!(got, want, "{sql}, window {window}");
            }
        }
    }

    #[tokio::test]
    async fn a_limit_stops_the_scan_and_a_lost_object_is_still_an_error() {
        let (ctx, memory, counters) = session(2).await;
        let (rows, _) = run(&ctx, &counters, "SELECT id FROM t LIMIT 10", 1 << 20)
            .await
            .unwrap();
        assert_eq!(rows.len(), 10);
        memory
            .delete(&StorePath::from("t/part-1.parquet"))
            .await
            .unwrap();
        // The footer is cached since planning: the error comes from the data requests,
        // which read-ahead hands back to DataFusion's reader.
        for window in [0, 1 << 20] {
            let err = run(&ctx, &counters, "SELECT * FROM t", window)
                .await
                .unwrap_err()
                .to_string();
            assert!(err.contains("part-1.parquet"), "window {window}: {err}");
        }
    }

    #[test]
    fn merged_requests_cover_every_range_within_the_limits() {
        assert_eq!(merge(&[]), Vec::<Range<u64>>::new());
        // Unsorted, overlapping, empty and distant ranges.
        let ranges = [
            500..600,
            0..100,
            100..100,
            150..200,
            50..120,
            HOLE * 3..HOLE * 3 + 10,
        ];
        assert_eq!(merge(&ranges), vec![0..600, HOLE * 3..HOLE * 3 + 10]);
        // Adjacent ranges stop growing at MAX_REQUEST; a longer single range stays whole.
        let step = MAX_REQUEST / 4;
        let adjacent: Vec<_> = (0..10).map(|i| i * step..(i + 1) * step).collect();
        let merged = merge(&adjacent);
        assert!(
            merged.iter().all(|m| m.end - m.start <= MAX_REQUEST),
            "{merged:?}"
        );
        assert_eq!(merged.first().unwrap().start, 0);
        assert_eq!(merged.last().unwrap().end, 10 * step);
        assert!(merged.windows(2).all(|w| w[0].end == w[1].start));
        let long = vec![Range {
            start: 0,
            end: 3 * MAX_REQUEST,
        }];
        assert_eq!(merge(&long), long);
    }

    #[tokio::test]
    async fn fetched_ranges_are_the_bytes_asked_for() {
        let memory = InMemory::new();
        let data: Vec<u8> = (0..300_000u32).map(|i| (i % 251) as u8).collect();
        let path = StorePath::from("f");
        memory.put(&path, data.clone().into()).await.unwrap();
        let ranges = [
            10..20,
            299_990..300_000,
            5..5,
            15..40,
            100_000..200_000,
            0..1,
        ];
        let got = get_ranges(&memory, &path, &ranges).await.unwrap();
        for (r, bytes) in ranges.iter().zip(got) {
            assert_eq!(&bytes[..], &data[r.start as usize..r.end as usize], "{r:?}");
        }
    }

    #[test]
    fn layout_windows_stay_within_the_budget_and_the_scope() {
        let bytes = parquet(0, 2_000);
        let reader = parquet::file::serialized_reader::SerializedFileReader::new(
            bytes::Bytes::from(bytes.clone()),
        )
        .unwrap();
        let metadata = parquet::file::reader::FileReader::metadata(&reader).clone();
        let size = bytes.len() as u64;
        let whole = Layout::new(&metadata, size, &Scope::default());
        assert_eq!(whole.order, (0..8).collect::<Vec<_>>());
        let all: BTreeSet<usize> = [0, 1, 2].into();
        let one = |g: usize| -> u64 {
            (0..3)
                .map(|c| whole.ranges[g][c].clone().map_or(0, |r| r.end - r.start))
                .sum()
        };
        // A budget below one row group still fetches one.
        let (groups, ranges) = whole.window(0, &all, 1);
        assert_eq!((groups, ranges.len()), (vec![0], 3));
        // Exactly two row groups' worth fetches two.
        let (groups, _) = whole.window(3, &all, one(3) + one(4));
        assert_eq!(groups, vec![3, 4]);
        let (groups, _) = whole.window(6, &all, u64::MAX);
        assert_eq!(groups, vec![6, 7]);
        // Every chunk is found by any of its bytes, and by no byte outside it.
        for (g, row) in whole.ranges.iter().enumerate() {
            for (c, r) in row.iter().enumerate() {
                let r = r.clone().unwrap();
                assert_eq!(whole.chunk_at(r.start), Some((g, c)));
                assert_eq!(whole.chunk_at(r.end - 1), Some((g, c)));
                assert_eq!(
                    whole.request(std::slice::from_ref(&r)),
                    Some((g, [c].into()))
                );
            }
        }
        assert_eq!(whole.chunk_at(0), None, "the magic bytes are no chunk");
        let r0 = whole.ranges[0][0].clone().unwrap();
        let r1 = whole.ranges[1][0].clone().unwrap();
        assert_eq!(
            whole.request(&[r0, r1]),
            None,
            "two row groups in one request"
        );
        // A file range keeps the row groups whose first page starts in it.
        let first = whole.ranges[3][0].as_ref().unwrap().start as i64;
        let last = whole.ranges[5][0].as_ref().unwrap().start as i64;
        let part = Layout::new(
            &metadata,
            size,
            &Scope {
                range: Some(first..last + 1),
                ..Scope::default()
            },
        );
        assert_eq!(part.order, vec![3, 4, 5]);
        assert_eq!(part.position[2], None);
        // So does an access plan.
        let mut plan = ParquetAccessPlan::new_all(8);
        plan.skip(1);
        plan.skip(6);
        let planned = Layout::new(
            &metadata,
            size,
            &Scope {
                access_plan: Some(plan),
                ..Scope::default()
            },
        );
        assert_eq!(planned.order, vec![0, 2, 3, 4, 5, 7]);
        // A footer that points outside the file gives no chunks rather than a panic.
        let tiny = Layout::new(&metadata, 10, &Scope::default());
        assert!(tiny.chunks.is_empty());
        let inside_magic = vec![Range { start: 4, end: 8 }];
        assert_eq!(tiny.request(&inside_magic), None);
    }
}
