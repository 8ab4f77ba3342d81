//! The benchmark's dataset: the demo dataset of `sluice demo` (same schema and values),
//! written as four Parquet files, the plan that reads it, and its batches (the plan's
//! output, run once) that comparisons 3 and 4 serve.

use std::fs::File;
use std::path::{Path, PathBuf};

use anyhow::{Context, Result};
use arrow::record_batch::RecordBatch;
use futures::StreamExt;
use parquet::arrow::ArrowWriter;
use parquet::basic::Compression;
use parquet::file::properties::WriterProperties;
use sluice::core::Shaper;
use sluice::demo::demo_batch;
use sluice::prelude::*;

use crate::BATCH_ROWS;

/// Parquet files the dataset is split into.
const FILES: usize = 4;

/// The dataset on disk.
#[derive(Debug, Clone)]
pub struct Dataset {
    /// The directory of the Parquet files.
    pub dir: PathBuf,
    /// The files, sorted.
    pub files: Vec<PathBuf>,
    /// Rows in all files.
    pub rows: u64,
    /// Bytes of all files.
    pub bytes: u64,
}

/// Rows per Parquet row group of the benchmark's dataset, unless `--row-group-rows` says
/// otherwise.
pub const ROW_GROUP_ROWS: usize = 10_000;

/// Writes `rows` deterministic rows (`id`, `label`, `text`, 16 float32 `features`) as four
/// Snappy Parquet files with row groups of `row_group_rows` rows.
///
/// DataFusion reads a row group in batches of its `batch_size` (8 192 rows), the last one
/// shorter: a 10 000-row row group is two batches, 8 192 rows and 1 808.
pub fn write(dir: &Path, rows: usize, row_group_rows: usize) -> Result<Dataset> {
    std::fs::create_dir_all(dir).with_context(|| format!("cannot create {}", dir.display()))?;
    let per_file = rows.div_ceil(FILES);
    let props = WriterProperties::builder()
        .set_compression(Compression::SNAPPY)
        .set_max_row_group_row_count(Some(row_group_rows))
        .build();
    let mut files = Vec::new();
    for f in 0..FILES {
        let start = (f * per_file).min(rows);
        let end = ((f + 1) * per_file).min(rows);
        let batch = demo_batch(start as i64, end as i64)?;
        let path = dir.join(format!("part-{f:02}.parquet"));
        let file =
            File::create(&path).with_context(|| format!("cannot create {}", path.display()))?;
        let mut writer = ArrowWriter::try_new(file, batch.schema(), Some(props.clone()))?;
        writer.write(&batch)?;
        writer.close()?;
        files.push(path);
    }
    let bytes = files
        .iter()
        .map(|f| std::fs::metadata(f).map(|m| m.len()))
        .sum::<std::io::Result<u64>>()?;
    Ok(Dataset {
        dir: dir.to_path_buf(),
        files,
        rows: rows as u64,
        bytes,
    })
}

/// `sluice.window` of the benchmark's topics (`--window`): how many batches a
/// subscriber may have queued, and so how long a burst may run before it wakes them
/// (half of it); 0: 'auto', the default.
pub static WINDOW: std::sync::atomic::AtomicUsize = std::sync::atomic::AtomicUsize::new(0);

/// The benchmark's topics' window (see [`WINDOW`]): `None` for 'auto'.
pub fn window() -> Option<usize> {
    match WINDOW.load(std::sync::atomic::Ordering::Relaxed) {
        0 => None,
        n => Some(n),
    }
}

/// `--flight-threads`: the worker threads of comparison 3b's Flight server; 0 for the
/// server's default.
pub static FLIGHT_THREADS: std::sync::atomic::AtomicUsize = std::sync::atomic::AtomicUsize::new(0);

/// `--flight-threads` as [`sluice::flight::ServeOptions::threads`] takes it.
pub fn flight_threads() -> Option<std::num::NonZeroUsize> {
    std::num::NonZeroUsize::new(FLIGHT_THREADS.load(std::sync::atomic::Ordering::Relaxed))
}

/// `sluice.message_batches` of the benchmark's topics (`--message-batches`): the most
/// consecutive batches one message carries; 0: 'auto', the default.
pub static MESSAGE_BATCHES: std::sync::atomic::AtomicUsize = std::sync::atomic::AtomicUsize::new(0);

/// The benchmark's `sluice.message_batches` (see [`MESSAGE_BATCHES`]): `None` for 'auto'.
pub fn message_batches() -> Option<usize> {
    match MESSAGE_BATCHES.load(std::sync::atomic::Ordering::Relaxed) {
        0 => None,
        n => Some(n),
    }
}

/// `sluice.message_batches` as a plan file sets it.
pub fn message_batches_option() -> String {
    message_batches().map_or_else(|| "'auto'".to_string(), |n| n.to_string())
}

/// `datafusion.execution.batch_size` of the plans of comparisons 1, 2 and 2b
/// (`--datafusion-batch-size`): the rows of each batch DataFusion's scan yields, and so
/// the most rows one message can carry (a message is cut from one DataFusion batch); 0:
/// DataFusion's default (8 192).
pub static DATAFUSION_BATCH_SIZE: std::sync::atomic::AtomicUsize =
    std::sync::atomic::AtomicUsize::new(0);

/// The `SET` line of [`DATAFUSION_BATCH_SIZE`], or nothing for DataFusion's default.
pub fn datafusion_batch_size_option() -> String {
    match DATAFUSION_BATCH_SIZE.load(std::sync::atomic::Ordering::Relaxed) {
        0 => String::new(),
        n => format!("SET datafusion.execution.batch_size = {n};\n"),
    }
}

/// `sluice.window` as a plan file sets it.
pub fn window_option() -> String {
    window().map_or_else(|| "'auto'".to_string(), |n| n.to_string())
}

/// The plan every Sluice producer and every independent pipeline runs: the whole
/// dataset, `batch_rows` rows per batch, `epochs` passes. `location` is a directory or an
/// object-store URL (with its `OPTIONS`).
pub fn plan_sql(
    topic: &str,
    location: &str,
    options: &str,
    batch_rows: usize,
    epochs: u64,
) -> String {
    format!(
        "SET sluice.topic = '{topic}';\n\
         SET sluice.batch_rows = {batch_rows};\n\
         SET sluice.epochs = {epochs};\n\
         SET sluice.window = {window};\n\
         SET sluice.message_batches = {message_batches};\n\
         SET sluice.max_subscribers = 16;\n\
         CREATE EXTERNAL TABLE train STORED AS PARQUET LOCATION '{location}'{options};\n\
         SELECT id, label, text, features FROM train;\n",
        window = window_option(),
        message_batches = message_batches_option(),
    )
}

/// The dataset's plan, run once and re-batched: the batches that the Flight and
/// transport comparisons serve.
pub fn materialize(data: &Dataset) -> Result<Vec<RecordBatch>> {
    let rt = tokio::runtime::Runtime::new()?;
    rt.block_on(async {
        let sql = plan_sql(
            "unused",
            &format!("{}/", data.dir.display()),
            "",
            BATCH_ROWS,
            1,
        );
        let plan = Plan::from_sql("bench.sql", &sql).await?;
        let mut shaper = Shaper::new(BATCH_ROWS, 0, None)?;
        let mut stream = plan.execute_epoch(0).await?;
        let mut out = Vec::new();
        while let Some(batch) = stream.next().await {
            out.extend(shaper.push(batch?)?);
        }
        out.extend(shaper.finish()?);
        Ok::<_, anyhow::Error>(out)
    })
}

/// Bytes of one epoch of `batches` encoded as Arrow IPC, and its rows.
pub fn epoch_size(batches: &[RecordBatch]) -> Result<(usize, u64)> {
    let bytes_per_epoch: usize = batches
        .iter()
        .map(|b| sluice::core::wire::encode(b).map(|e| e.len()))
        .sum::<sluice::Result<usize>>()?;
    let rows_per_epoch: u64 = batches.iter().map(|b| b.num_rows() as u64).sum();
    Ok((bytes_per_epoch, rows_per_epoch))
}
