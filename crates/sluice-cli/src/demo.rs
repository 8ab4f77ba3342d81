//! `sluice demo`: a local dataset, pipelines/demo.sql, one producer, several subscribers.
//!
//! `sluice demo --images` does the same with generated JPEGs of mixed sizes and
//! pipelines/images.sql (decode, resize, random crop, flip, normalize).

use std::fs::File;
use std::io::{BufRead, BufReader};
use std::path::{Path, PathBuf};
use std::process::{Child, Command, Stdio};
use std::sync::Arc;
use std::time::Duration;

use anyhow::{Context, bail};
use arrow::array::{ArrayRef, BinaryArray, Int32Array, Int64Array};
use arrow::record_batch::RecordBatch;
use parquet::arrow::ArrowWriter;
use parquet::basic::Compression;
use parquet::file::properties::WriterProperties;
use sluice::demo::{demo_batch, mix};
use sluice::{Plan, RunOptions};

/// Width of the demo's feature vectors.
const DEMO_PLAN: &str = include_str!("../../../pipelines/demo.sql");
const IMAGES_PLAN: &str = include_str!("../../../pipelines/images.sql");

#[derive(Debug, clap::Args)]
pub(crate) struct DemoArgs {
    /// Rows in the generated dataset [default: 200000, with --images 3000].
    #[arg(long)]
    rows: Option<usize>,
    /// Subscriber processes to start.
    #[arg(long, default_value_t = 4)]
    subscribers: usize,
    /// Where the dataset lives (generated if absent) [default: data/demo, with --images data/images].
    #[arg(long)]
    data: Option<PathBuf>,
    /// The plan to run (written from the built-in plan if absent) [default: pipelines/demo.sql, with --images pipelines/images.sql].
    #[arg(long)]
    plan: Option<PathBuf>,
    /// Image classification instead: JPEGs of mixed sizes, decoded and augmented by the plan.
    #[arg(long)]
    images: bool,
    /// Only generate the dataset and the plan file, then exit.
    #[arg(long)]
    prepare_only: bool,
}

/// The demo's settings, defaults resolved.
struct Demo {
    rows: usize,
    data: PathBuf,
    plan: PathBuf,
    plan_text: &'static str,
    images: bool,
    prepare_only: bool,
    subscribers: usize,
}

impl From<DemoArgs> for Demo {
    fn from(a: DemoArgs) -> Self {
        let (rows, data, plan, plan_text) = if a.images {
            (3_000, "data/images", "pipelines/images.sql", IMAGES_PLAN)
        } else {
            (200_000, "data/demo", "pipelines/demo.sql", DEMO_PLAN)
        };
        Demo {
            rows: a.rows.unwrap_or(rows),
            data: a.data.unwrap_or_else(|| data.into()),
            plan: a.plan.unwrap_or_else(|| plan.into()),
            plan_text,
            images: a.images,
            prepare_only: a.prepare_only,
            subscribers: a.subscribers,
        }
    }
}

pub(crate) fn run(args: DemoArgs) -> anyhow::Result<()> {
    let args = Demo::from(args);
    if args.subscribers == 0 {
        bail!("--subscribers must be at least 1");
    }
    // Each file of the dataset is made as one batch in memory.
    let most = if args.images { MAX_IMAGES } else { MAX_ROWS };
    if args.rows == 0 || args.rows > most {
        bail!("--rows must be 1 to {most}");
    }
    prepare(&args)?;
    if args.prepare_only {
        return Ok(());
    }
    let rt = crate::runtime()?;
    let plan = rt.block_on(Plan::load(&args.plan))?;
    sluice::check_min_subscribers(&plan, Some(args.subscribers))?;
    let topic = plan.options().topic.clone();
    let epochs = plan.options().epochs;
    say!(
        "demo: {} rows in {}, plan {}, topic '{}', {} epoch(s), {} subscribers",
        args.rows,
        args.data.display(),
        args.plan.display(),
        topic,
        epochs,
        args.subscribers
    );
    // One checksum per epoch: random augmentations make every epoch's rows different.
    let sources = (0..epochs)
        .map(|e| rt.block_on(plan.checksum_epoch(e)))
        .collect::<Result<Vec<_>, _>>()?;
    let source = &sources[0];

    let exe = std::env::current_exe().context("cannot find the sluice executable")?;
    let mut children = Vec::new();
    for _ in 0..args.subscribers {
        let child = Command::new(&exe)
            .args(["subscribe", &topic, "--json", "--timeout", "120"])
            .stdout(Stdio::piped())
            .stderr(Stdio::inherit())
            .spawn()
            .context("cannot start a subscriber process")?;
        children.push(KillOnDrop(child));
    }
    let options = RunOptions {
        min_subscribers: Some(args.subscribers),
        subscriber_timeout: Some(Duration::from_secs(60)),
        stop: crate::stop_flag(&rt),
        ..RunOptions::default()
    };
    let stats = crate::run_producer(rt, plan, options, false)?;

    let mut rows_out = Vec::new();
    let mut all_ok = true;
    for (i, child) in children.iter_mut().enumerate() {
        let report = collect(&mut child.0).with_context(|| format!("subscriber {i}"))?;
        let ok = report.epochs.len() as u64 == epochs
            && report
                .epochs
                .iter()
                .zip(&sources)
                .all(|((rows, sum, complete), source)| {
                    *complete && *rows == source.rows() && *sum == source.hex()
                });
        all_ok &= ok;
        rows_out.push((i, report, ok));
    }

    println!();
    println!(
        "{:<12} {:>12} {:>10} {:>14} {:>10}",
        "subscriber", "rows", "seconds", "rows/s", "verified"
    );
    let mut total_rows = 0u64;
    let mut max_secs: f64 = 0.0;
    for (i, report, ok) in &rows_out {
        total_rows += report.rows;
        max_secs = max_secs.max(report.seconds);
        println!(
            "{:<12} {:>12} {:>10.2} {:>14.0} {:>10}",
            format!("#{i}"),
            report.rows,
            report.seconds,
            report.rows as f64 / report.seconds.max(1e-9),
            if *ok { "yes" } else { "NO" }
        );
    }
    println!(
        "{:<12} {:>12} {:>10.2} {:>14.0} {:>10}",
        "aggregate",
        total_rows,
        max_secs,
        total_rows as f64 / max_secs.max(1e-9),
        if all_ok { "yes" } else { "NO" }
    );
    println!(
        "\nproducer: {} rows x {} epoch(s) in {} batches, {} written to shared memory once, read by {} subscribers",
        source.rows(),
        epochs,
        stats.batches,
        crate::human_bytes(stats.bytes),
        args.subscribers
    );
    println!(
        "source checksum (DataFusion, epoch 0 of {}): {} rows, {}",
        epochs,
        source.rows(),
        source.hex()
    );
    if !all_ok {
        bail!("a subscriber did not receive every row exactly once");
    }
    println!("every subscriber received every row of every epoch exactly once");
    Ok(())
}

struct KillOnDrop(Child);

impl Drop for KillOnDrop {
    fn drop(&mut self) {
        if let Ok(None) = self.0.try_wait() {
            let _ = self.0.kill();
            let _ = self.0.wait();
        }
    }
}

struct Report {
    epochs: Vec<(u64, String, bool)>,
    rows: u64,
    seconds: f64,
}

fn collect(child: &mut Child) -> anyhow::Result<Report> {
    let stdout = child.stdout.take().context("no output")?;
    let mut report = Report {
        epochs: Vec::new(),
        rows: 0,
        seconds: 0.0,
    };
    for line in BufReader::new(stdout).lines() {
        let v: serde_json::Value = serde_json::from_str(&line?)?;
        if v.get("end").is_some() {
            report.rows = v["rows"].as_u64().unwrap_or(0);
            report.seconds = v["seconds"].as_f64().unwrap_or(0.0);
        } else {
            report.epochs.push((
                v["rows"].as_u64().unwrap_or(0),
                v["checksum"].as_str().unwrap_or("").to_string(),
                v["complete"].as_bool().unwrap_or(false),
            ));
        }
    }
    let status = child.wait()?;
    if !status.success() {
        bail!("subscriber exited with {status}");
    }
    Ok(report)
}

fn prepare(args: &Demo) -> anyhow::Result<()> {
    let marker = args.data.join(format!(".complete-{}", args.rows));
    let replace = !marker.exists() && args.data.exists();
    if replace && !made_by_demo(&args.data)? {
        bail!(
            "{} holds files the demo did not make: give --data a new or empty directory (the demo replaces what it generated there, nothing else)",
            args.data.display()
        );
    }
    write_plan(args)?;
    if marker.exists() {
        return Ok(());
    }
    if replace {
        std::fs::remove_dir_all(&args.data)
            .with_context(|| format!("cannot replace {}", args.data.display()))?;
    }
    std::fs::create_dir_all(&args.data)?;
    std::fs::write(args.data.join(DEMO_MARK), b"")?;
    say!(
        "demo: generating {} rows in {}",
        args.rows,
        args.data.display()
    );
    if args.images {
        write_images(&args.data, args.rows)?;
    } else {
        write_dataset(&args.data, args.rows)?;
    }
    std::fs::write(marker, b"")?;
    Ok(())
}

/// Writes the built-in plan to `--plan` unless a file is there, reading `--data`.
fn write_plan(args: &Demo) -> anyhow::Result<()> {
    // The data directory as a plan's LOCATION names it: quoted, with one trailing '/'.
    let data =
        format!("{}/", args.data.display().to_string().trim_end_matches('/')).replace('\'', "''");
    let location = format!("'{data}'");
    if args.plan.exists() {
        // A plan there already (pipelines/demo.sql in a checkout) must read --data.
        let text = std::fs::read_to_string(&args.plan)
            .with_context(|| format!("cannot read {}", args.plan.display()))?;
        if !text.contains(&location) {
            bail!(
                "{} does not read {} (its LOCATION is another directory): give --plan a new file, which the demo writes for --data",
                args.plan.display(),
                args.data.display()
            );
        }
        return Ok(());
    }
    if let Some(dir) = args.plan.parent() {
        std::fs::create_dir_all(dir)?;
    }
    let default_data = if args.images {
        "data/images/"
    } else {
        "data/demo/"
    };
    let text = args.plan_text.replace(default_data, &data);
    std::fs::write(&args.plan, text)
        .with_context(|| format!("cannot write {}", args.plan.display()))
}

/// The most rows of `--rows`, and of `--rows` with `--images`.
const MAX_ROWS: usize = 50_000_000;
const MAX_IMAGES: usize = 1_000_000;

/// The file that marks a directory as the demo's, written before anything else in it.
const DEMO_MARK: &str = ".sluice-demo";

/// Whether `dir` is the demo's to replace: empty, or marked as the demo's (by
/// [`DEMO_MARK`], or a completion marker of an earlier version) and holding only what
/// the demo writes. A directory of `part-*.parquet` files alone is not: pyarrow's
/// `write_dataset` names its files so.
fn made_by_demo(dir: &Path) -> anyhow::Result<bool> {
    if !dir.is_dir() {
        return Ok(false);
    }
    let mut marked = false;
    let mut empty = true;
    for entry in std::fs::read_dir(dir).with_context(|| format!("cannot read {}", dir.display()))? {
        let entry = entry?;
        empty = false;
        let name = entry.file_name();
        let name = name.to_string_lossy();
        let mark = name == DEMO_MARK || name.starts_with(".complete-");
        marked |= mark;
        let ours = mark || (name.starts_with("part-") && name.ends_with(".parquet"));
        if !ours || !entry.file_type()?.is_file() {
            return Ok(false);
        }
    }
    Ok(empty || marked)
}

/// Writes `rows` deterministic rows as four Parquet files with several row groups each.
pub(crate) fn write_dataset(dir: &Path, rows: usize) -> anyhow::Result<()> {
    const FILES: usize = 4;
    let per_file = rows.div_ceil(FILES);
    let props = WriterProperties::builder()
        .set_compression(Compression::SNAPPY)
        .set_max_row_group_row_count(Some(10_000))
        .build();
    for f in 0..FILES {
        let start = (f * per_file).min(rows);
        let end = ((f + 1) * per_file).min(rows);
        let batch = demo_batch(start as i64, end as i64)?;
        let file = File::create(dir.join(format!("part-{f:02}.parquet")))?;
        let mut writer = ArrowWriter::try_new(file, batch.schema(), Some(props.clone()))?;
        writer.write(&batch)?;
        writer.close()?;
    }
    Ok(())
}

/// Writes `rows` deterministic JPEGs (48 to 127 pixels a side, a label from 0 to 9) as two
/// Parquet files: columns `id`, `label`, `image` (the encoded bytes).
pub(crate) fn write_images(dir: &Path, rows: usize) -> anyhow::Result<()> {
    const FILES: usize = 2;
    let per_file = rows.div_ceil(FILES);
    let props = WriterProperties::builder()
        .set_compression(Compression::UNCOMPRESSED)
        .set_max_row_group_row_count(Some(500))
        .build();
    for f in 0..FILES {
        let (start, end) = (
            (f * per_file).min(rows) as i64,
            ((f + 1) * per_file).min(rows) as i64,
        );
        let mut jpegs = Vec::with_capacity((end - start) as usize);
        for i in start..end {
            jpegs.push(demo_jpeg(i)?);
        }
        let batch = RecordBatch::try_from_iter([
            (
                "id",
                Arc::new(Int64Array::from_iter_values(start..end)) as ArrayRef,
            ),
            (
                "label",
                Arc::new(Int32Array::from_iter_values(
                    (start..end).map(|i| (mix(i) % 10) as i32),
                )) as ArrayRef,
            ),
            (
                "image",
                Arc::new(BinaryArray::from_iter_values(jpegs.iter())) as ArrayRef,
            ),
        ])?;
        let file = File::create(dir.join(format!("part-{f:02}.parquet")))?;
        let mut writer = ArrowWriter::try_new(file, batch.schema(), Some(props.clone()))?;
        writer.write(&batch)?;
        writer.close()?;
    }
    Ok(())
}

/// One demo picture: a colour gradient, a disc and some noise, so JPEG has real work.
fn demo_jpeg(i: i64) -> anyhow::Result<Vec<u8>> {
    let h = mix(i);
    let (w, ht) = (48 + (h % 80) as u32, 48 + ((h >> 8) % 80) as u32);
    let (cx, cy, r) = (
        (h >> 16) % w as u64,
        (h >> 24) % ht as u64,
        10 + (h >> 32) % 20,
    );
    let img = image::RgbImage::from_fn(w, ht, |x, y| {
        let d2 = (x as i64 - cx as i64).pow(2) + (y as i64 - cy as i64).pow(2);
        let noise = (mix(i * 1_000_003 + (y * w + x) as i64) % 24) as u8;
        if d2 < (r * r) as i64 {
            image::Rgb([220u8.saturating_sub(noise), 40 + noise, (h % 200) as u8])
        } else {
            image::Rgb([
                ((x * 255) / w) as u8 ^ noise,
                ((y * 255) / ht) as u8,
                ((h >> 40) as u8).wrapping_add(noise),
            ])
        }
    });
    let mut out = std::io::Cursor::new(Vec::new());
    img.write_to(&mut out, image::ImageFormat::Jpeg)?;
    Ok(out.into_inner())
}
