//! The benchmark's dataset: the demo dataset of `sluice demo` (same schema and values),
//! written as four Parquet files, and the plan that reads it.

use std::fs::File;
use std::path::{Path, PathBuf};
use std::sync::Arc;

use anyhow::{Context, Result};
use arrow::array::{
    ArrayRef, FixedSizeListArray, Float32Array, Int32Array, Int64Array, StringArray,
};
use arrow::datatypes::{DataType, Field};
use arrow::record_batch::RecordBatch;
use parquet::arrow::ArrowWriter;
use parquet::basic::Compression;
use parquet::file::properties::WriterProperties;

/// Float32 features per row.
const FEATURES: i32 = 16;
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

/// Writes `rows` deterministic rows (`id`, `label`, `text`, 16 float32 `features`) as four
/// Snappy Parquet files with 10 000-row row groups.
pub fn write(dir: &Path, rows: usize) -> Result<Dataset> {
    std::fs::create_dir_all(dir).with_context(|| format!("cannot create {}", dir.display()))?;
    let per_file = rows.div_ceil(FILES);
    let props = WriterProperties::builder()
        .set_compression(Compression::SNAPPY)
        .set_max_row_group_row_count(Some(10_000))
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
         SET sluice.window = 8;\n\
         SET sluice.max_subscribers = 8;\n\
         CREATE EXTERNAL TABLE train STORED AS PARQUET LOCATION '{location}'{options};\n\
         SELECT id, label, text, features FROM train;\n"
    )
}

/// SplitMix64: deterministic and dependency-free.
fn mix(x: i64) -> u64 {
    let mut z = (x as u64).wrapping_add(0x9E37_79B9_7F4A_7C15);
    z = (z ^ (z >> 30)).wrapping_mul(0xBF58_476D_1CE4_E5B9);
    z = (z ^ (z >> 27)).wrapping_mul(0x94D0_49BB_1331_11EB);
    z ^ (z >> 31)
}

fn demo_batch(start: i64, end: i64) -> Result<RecordBatch> {
    const WORDS: [&str; 8] = ["cat", "dog", "owl", "fox", "elk", "yak", "emu", "bee"];
    let ids = Int64Array::from_iter_values(start..end);
    let labels: Int32Array = (start..end)
        .map(|i| (i % 97 != 13).then_some((mix(i) % 10) as i32))
        .collect();
    let text = StringArray::from_iter_values((start..end).map(|i| {
        let h = mix(i ^ 0x5555);
        format!(
            "sample {i}: {} {} {}",
            WORDS[(h % 8) as usize],
            WORDS[((h >> 8) % 8) as usize],
            WORDS[((h >> 16) % 8) as usize]
        )
    }));
    let values = Float32Array::from_iter_values((start..end).flat_map(|i| {
        (0..FEATURES).map(move |j| (mix(i * 64 + i64::from(j)) % 10_000) as f32 / 10_000.0)
    }));
    let features = FixedSizeListArray::try_new(
        Arc::new(Field::new("item", DataType::Float32, false)),
        FEATURES,
        Arc::new(values),
        None,
    )?;
    Ok(RecordBatch::try_from_iter([
        ("id", Arc::new(ids) as ArrayRef),
        ("label", Arc::new(labels) as ArrayRef),
        ("text", Arc::new(text) as ArrayRef),
        ("features", Arc::new(features) as ArrayRef),
    ])?)
}
