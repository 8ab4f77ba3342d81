//! Object-store benchmark: the same Parquet dataset streamed from a loopback S3 server
//! and from local disk, in one run.
//!
//! Run it next to the S3 server that the tests use:
//!
//! ```text
//! scripts/s3-server.sh cargo bench -p sluice-cli --bench object_store
//! ```
//!
//! It generates the demo dataset at two sizes (`SLUICE_BENCH_ROWS`, default 800 000
//! rows, and a quarter of that), uploads it over S3, and streams each size once from
//! each source through the producer's pipeline (DataFusion scan, prefetch, shuffle
//! buffer, re-batching) without shared memory. Each pass runs in a child process of its
//! own, so that its peak RSS is its own. For each pass it reports rows/s (and the ratio
//! to local disk), bytes fetched against the files' size, requests per file, and the
//! peak RSS. The shuffle buffer (`sluice.shuffle_buffer`) is the configured buffer;
//! both datasets are far larger than it.

use std::os::unix::process::ExitStatusExt;
use std::path::{Path, PathBuf};
use std::process::{Command, Stdio};
use std::time::Instant;

use futures::StreamExt;
use object_store::ObjectStoreExt;
use object_store::aws::AmazonS3Builder;
use sluice::core::Shaper;
use sluice::prelude::*;

const SHUFFLE_BUFFER: usize = 20_000;
const BATCH_ROWS: usize = 1_000;

fn plan_sql(location: &str) -> String {
    format!(
        "SET sluice.batch_rows = {BATCH_ROWS};\n\
         SET sluice.shuffle_seed = 7;\n\
         SET sluice.shuffle_buffer = {SHUFFLE_BUFFER};\n\
         CREATE EXTERNAL TABLE train STORED AS PARQUET LOCATION '{location}';\n\
         SELECT id, label, text, features FROM train;\n"
    )
}

/// One pass, in the child: plans, streams one epoch through the shaper, prints JSON.
fn child(sql: &str) -> Result<()> {
    let rt = tokio::runtime::Builder::new_multi_thread()
        .enable_all()
        .build()
        .map_err(|e| SluiceError::io("cannot start the runtime", e))?;
    let start = Instant::now();
    let plan = rt.block_on(Plan::from_sql("bench.sql", sql))?;
    let planned = start.elapsed().as_secs_f64();
    let opts = plan.options().clone();
    let mut shaper = Shaper::new(opts.batch_rows, 0, opts.shuffle())?;
    let start = Instant::now();
    let mut stream = rt.block_on(plan.execute_epoch(0))?;
    let (mut rows, mut batches) = (0u64, 0u64);
    while let Some(batch) = rt.block_on(stream.next()) {
        for b in shaper.push(batch?)? {
            rows += b.num_rows() as u64;
            batches += 1;
        }
    }
    for b in shaper.finish()? {
        rows += b.num_rows() as u64;
        batches += 1;
    }
    let secs = start.elapsed().as_secs_f64();
    let s = plan.store_stats();
    println!(
        "{{\"rows\":{rows},\"batches\":{batches},\"secs\":{secs},\"plan_secs\":{planned},\
         \"gets\":{},\"heads\":{},\"lists\":{},\"bytes\":{}}}",
        s.gets, s.heads, s.lists, s.bytes
    );
    Ok(())
}

struct Pass {
    rows: u64,
    secs: f64,
    gets: u64,
    heads: u64,
    lists: u64,
    bytes: u64,
    peak_rss: u64,
}

/// Runs one pass in a child process; its peak RSS comes from `wait4`.
fn pass(sql: &str, env: &[(String, String)]) -> Pass {
    let exe = std::env::current_exe().expect("own path");
    #[allow(
        clippy::zombie_processes,
        reason = "reaped by wait4 below, which also reports its peak RSS"
    )]
    let child = Command::new(exe)
        .env("SLUICE_BENCH_CHILD_PLAN", sql)
        .envs(env.iter().map(|(k, v)| (k, v)))
        .stdout(Stdio::piped())
        .spawn()
        .expect("cannot start the benchmark child");
    let pid = child.id() as libc::pid_t;
    let mut status = 0;
    let mut usage = std::mem::MaybeUninit::<libc::rusage>::uninit();
    let mut stdout = child.stdout.expect("piped");
    let mut text = String::new();
    std::io::Read::read_to_string(&mut stdout, &mut text).expect("child output");
    // SAFETY: wait4 on our own child's pid; `status` and `usage` are valid for writes and
    // `usage` is initialised when it returns the pid.
    let rc = unsafe { libc::wait4(pid, &mut status, 0, usage.as_mut_ptr()) };
    assert_eq!(rc, pid, "wait4 failed");
    let exit = std::process::ExitStatus::from_raw(status);
    assert!(exit.success(), "benchmark child failed: {exit}");
    // SAFETY: initialised by the successful wait4 above.
    let usage = unsafe { usage.assume_init() };
    let v: serde_json::Value = serde_json::from_str(text.trim()).expect("child JSON");
    let n = |k: &str| v[k].as_u64().unwrap_or(0);
    Pass {
        rows: n("rows"),
        secs: v["secs"].as_f64().unwrap_or(f64::NAN),
        gets: n("gets"),
        heads: n("heads"),
        lists: n("lists"),
        bytes: n("bytes"),
        // Linux reports kilobytes.
        peak_rss: usage.ru_maxrss as u64 * 1024,
    }
}

fn dataset(dir: &Path, rows: u64) -> (Vec<PathBuf>, u64) {
    let out = Command::new(env!("CARGO_BIN_EXE_sluice"))
        .args(["demo", "--prepare-only", "--rows", &rows.to_string()])
        .arg("--data")
        .arg(dir)
        .args(["--plan", "unused.sql"])
        .current_dir(dir.parent().expect("parent"))
        .output()
        .expect("cannot run sluice demo");
    assert!(
        out.status.success(),
        "{}",
        String::from_utf8_lossy(&out.stderr)
    );
    let mut files: Vec<PathBuf> = std::fs::read_dir(dir)
        .expect("dataset dir")
        .map(|e| e.expect("entry").path())
        .filter(|p| p.extension().is_some_and(|e| e == "parquet"))
        .collect();
    files.sort();
    let size = files
        .iter()
        .map(|f| std::fs::metadata(f).expect("size").len())
        .sum();
    (files, size)
}

fn mib(b: u64) -> f64 {
    b as f64 / (1024.0 * 1024.0)
}

fn main() {
    if let Ok(sql) = std::env::var("SLUICE_BENCH_CHILD_PLAN") {
        if let Err(e) = child(&sql) {
            eprintln!("error: {e}");
            std::process::exit(1);
        }
        return;
    }
    if std::env::args().any(|a| a == "--list") {
        return;
    }
    let var = |k: &str| std::env::var(k).ok().filter(|v| !v.is_empty());
    let (Some(endpoint), Some(access_key), Some(secret_key), Some(root)) = (
        var("SLUICE_TEST_S3_ENDPOINT"),
        var("SLUICE_TEST_S3_ACCESS_KEY"),
        var("SLUICE_TEST_S3_SECRET_KEY"),
        var("SLUICE_TEST_S3_ROOT"),
    ) else {
        eprintln!(
            "skipped: no S3 server. Run: scripts/s3-server.sh cargo bench -p sluice-cli --bench object_store"
        );
        return;
    };
    let rows: u64 = var("SLUICE_BENCH_ROWS")
        .and_then(|r| r.parse().ok())
        .unwrap_or(800_000);
    let tmp = tempfile::tempdir().expect("temp dir");
    let bucket = "bench";
    std::fs::create_dir(Path::new(&root).join(bucket)).expect("bucket");
    let store = AmazonS3Builder::new()
        .with_endpoint(&endpoint)
        .with_allow_http(true)
        .with_region("us-east-1")
        .with_bucket_name(bucket)
        .with_access_key_id(&access_key)
        .with_secret_access_key(&secret_key)
        .build()
        .expect("S3 client");
    let rt = tokio::runtime::Runtime::new().expect("runtime");
    let env: Vec<(String, String)> = [
        ("AWS_ACCESS_KEY_ID", access_key.as_str()),
        ("AWS_SECRET_ACCESS_KEY", secret_key.as_str()),
        ("AWS_ENDPOINT_URL", endpoint.as_str()),
        ("AWS_ALLOW_HTTP", "true"),
        ("AWS_REGION", "us-east-1"),
    ]
    .into_iter()
    .map(|(k, v)| (k.to_string(), v.to_string()))
    .collect();

    println!(
        "configured buffer: sluice.shuffle_buffer = {SHUFFLE_BUFFER} rows, batch_rows = {BATCH_ROWS}"
    );
    println!(
        "| dataset | source | rows/s | vs local | bytes fetched / file size | GETs per file | HEAD + LIST | peak RSS |"
    );
    println!("|---|---|---:|---:|---:|---:|---:|---:|");
    for n in [rows / 4, rows] {
        let dir = tmp.path().join(format!("data-{n}"));
        let (files, size) = dataset(&dir, n);
        let prefix = format!("d{n}");
        for f in &files {
            let name = f.file_name().and_then(|n| n.to_str()).expect("name");
            let bytes = std::fs::read(f).expect("read");
            rt.block_on(store.put(&format!("{prefix}/{name}").as_str().into(), bytes.into()))
                .expect("upload");
        }
        let local = pass(&plan_sql(&format!("{}/", dir.display())), &[]);
        let s3 = pass(&plan_sql(&format!("s3://{bucket}/{prefix}/")), &env);
        for p in [&local, &s3] {
            assert_eq!(p.rows, n, "a pass lost rows");
        }
        let base = local.rows as f64 / local.secs;
        for (name, p) in [("local disk", &local), ("S3 (loopback)", &s3)] {
            let rate = p.rows as f64 / p.secs;
            println!(
                "| {n} rows, {} files, {:.1} MiB ({:.0}x buffer) | {name} | {:.0} | {:.2} | {:.3} | {:.1} | {} + {} | {:.0} MiB |",
                files.len(),
                mib(size),
                n as f64 / SHUFFLE_BUFFER as f64,
                rate,
                rate / base,
                p.bytes as f64 / size as f64,
                p.gets as f64 / files.len() as f64,
                p.heads,
                p.lists,
                mib(p.peak_rss),
            );
        }
    }
}
