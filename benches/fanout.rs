//! Fan-out benchmark: one producer and N = 1, 2, 4, 8 subscribers, in one process.
//!
//! Run with `cargo bench -p sluice-cli --bench fanout` (add `-- --quick` for a short
//! run). It generates the demo dataset (Parquet) in a temporary directory, runs
//! `SELECT * FROM train` through a real producer for several epochs, and reports for each
//! N: the per-subscriber rate (median over repetitions) and its ratio to N = 1, the
//! producer's CPU-seconds per epoch, and the producer's write rate into shared memory
//! against a plain `memcpy` of the same bytes measured in the same run. Subscribers
//! receive and count rows; they do not touch the data.

use std::process::Command;
use std::sync::{Arc, Barrier};
use std::time::{Duration, Instant};

use sluice::prelude::*;

fn cpu_seconds(who: i32) -> f64 {
    let mut usage = std::mem::MaybeUninit::<libc::rusage>::uninit();
    // SAFETY: getrusage writes a `rusage` into the pointer on success; `who` is one of
    // RUSAGE_SELF / RUSAGE_THREAD.
    let rc = unsafe { libc::getrusage(who, usage.as_mut_ptr()) };
    assert_eq!(rc, 0, "getrusage failed");
    // SAFETY: initialised by the successful call above.
    let u = unsafe { usage.assume_init() };
    let secs = |t: libc::timeval| t.tv_sec as f64 + t.tv_usec as f64 / 1e6;
    secs(u.ru_utime) + secs(u.ru_stime)
}

fn median(mut v: Vec<f64>) -> f64 {
    v.sort_by(f64::total_cmp);
    v[v.len() / 2]
}

struct Run {
    per_sub_rows_per_s: f64,
    producer_cpu_per_epoch: f64,
    publish_gbps: f64,
    bytes: u64,
    batches: u64,
}

fn run_once(
    ns: &Namespace,
    dir: &std::path::Path,
    n: usize,
    epochs: u64,
    batch_rows: usize,
    rep: usize,
) -> Run {
    let topic = format!("fan{n}r{rep}");
    let sql = format!(
        "SET sluice.topic = '{topic}'; SET sluice.batch_rows = {batch_rows}; SET sluice.epochs = {epochs};\n\
         SET sluice.window = 8; SET sluice.max_subscribers = {n};\n\
         CREATE EXTERNAL TABLE train STORED AS PARQUET LOCATION '{}/data/';\n\
         SELECT * FROM train",
        dir.display()
    );
    let rt = tokio::runtime::Runtime::new().unwrap();
    let plan = rt.block_on(Plan::from_sql("bench.sql", &sql)).unwrap();
    let start_line = Arc::new(Barrier::new(n + 1));
    let subs: Vec<_> = (0..n)
        .map(|_| {
            let ns = ns.clone();
            let topic = topic.clone();
            let start_line = start_line.clone();
            std::thread::spawn(move || {
                let mut sub = Subscriber::connect(
                    &topic,
                    SubscribeOptions {
                        timeout: Some(Duration::from_secs(120)),
                        namespace: Some(ns),
                        ..SubscribeOptions::default()
                    },
                )
                .unwrap();
                start_line.wait();
                let cpu0 = cpu_seconds(libc::RUSAGE_THREAD);
                let mut first = None;
                let mut rows = 0u64;
                loop {
                    match sub.next_event().unwrap() {
                        Event::Batch { batch, .. } => {
                            first.get_or_insert_with(Instant::now);
                            rows += batch.num_rows() as u64;
                        }
                        Event::EpochEnd(_) => {}
                        Event::End => break,
                    }
                }
                let secs = first.map_or(0.0, |t| t.elapsed().as_secs_f64());
                (rows, secs, cpu_seconds(libc::RUSAGE_THREAD) - cpu0)
            })
        })
        .collect();
    let producer = Producer::new(plan, ns.clone());
    let options = RunOptions {
        min_subscribers: Some(n),
        subscriber_timeout: Some(Duration::from_secs(60)),
        ..RunOptions::default()
    };
    let waiter = {
        let start_line = start_line.clone();
        std::thread::spawn(move || start_line.wait())
    };
    let cpu0 = cpu_seconds(libc::RUSAGE_SELF);
    let stats = producer.run(rt.handle(), &options, |_| {}).unwrap();
    let total_cpu = cpu_seconds(libc::RUSAGE_SELF) - cpu0;
    waiter.join().unwrap();
    let mut rates = Vec::new();
    let mut sub_cpu = 0.0;
    for s in subs {
        let (rows, secs, cpu) = s.join().unwrap();
        assert_eq!(rows, stats.rows, "a subscriber missed rows");
        rates.push(rows as f64 / secs.max(1e-9));
        sub_cpu += cpu;
    }
    Run {
        per_sub_rows_per_s: median(rates),
        producer_cpu_per_epoch: (total_cpu - sub_cpu).max(0.0) / epochs as f64,
        publish_gbps: stats.bytes as f64 / stats.elapsed.as_secs_f64() / 1e9,
        bytes: stats.bytes,
        batches: stats.batches,
    }
}

/// GB/s of a plain memcpy of `total` bytes in chunks of `chunk` bytes into fresh
/// destinations, like the producer writing each batch into a new sample.
fn memcpy_gbps(total: u64, chunk: usize) -> f64 {
    let src = vec![7u8; chunk];
    let slots = 16;
    let mut dst = vec![vec![0u8; chunk]; slots];
    let copies = (total as usize / chunk).max(1);
    let start = Instant::now();
    for i in 0..copies {
        dst[i % slots].copy_from_slice(&src);
        std::hint::black_box(&dst[i % slots]);
    }
    (copies * chunk) as f64 / start.elapsed().as_secs_f64() / 1e9
}

fn main() {
    let quick = std::env::args().any(|a| a == "--quick");
    let (rows, epochs, reps) = if quick {
        (50_000, 2, 1)
    } else {
        (200_000, 3, 3)
    };
    let batch_rows = 1024;
    let dir = tempfile::tempdir().unwrap();
    let status = Command::new(env!("CARGO_BIN_EXE_sluice"))
        .args([
            "demo",
            "--prepare-only",
            "--rows",
            &rows.to_string(),
            "--data",
        ])
        .arg(dir.path().join("data"))
        .arg("--plan")
        .arg(dir.path().join("unused.sql"))
        .status()
        .unwrap();
    assert!(status.success());
    let ns = Namespace::new(&format!("bench{}", std::process::id())).unwrap();

    println!(
        "fan-out: {rows} rows x {epochs} epochs of the demo dataset (Parquet), batch_rows = {batch_rows}, {reps} repetition(s), median"
    );
    println!();
    println!(
        "| subscribers | per-subscriber rows/s | vs N=1 | aggregate rows/s | producer CPU-s / epoch | write GB/s | memcpy GB/s | write / memcpy |"
    );
    println!("|---:|---:|---:|---:|---:|---:|---:|---:|");
    let mut base = None;
    for n in [1usize, 2, 4, 8] {
        let runs: Vec<Run> = (0..reps)
            .map(|rep| run_once(&ns, dir.path(), n, epochs, batch_rows, rep))
            .collect();
        let per_sub = median(runs.iter().map(|r| r.per_sub_rows_per_s).collect());
        let cpu = median(runs.iter().map(|r| r.producer_cpu_per_epoch).collect());
        let write = median(runs.iter().map(|r| r.publish_gbps).collect());
        let chunk = (runs[0].bytes / runs[0].batches.max(1)) as usize;
        let floor = median((0..3).map(|_| memcpy_gbps(runs[0].bytes, chunk)).collect());
        let base_rate = *base.get_or_insert(per_sub);
        println!(
            "| {n} | {per_sub:.0} | {:.2} | {:.0} | {cpu:.3} | {write:.2} | {floor:.2} | {:.3} |",
            per_sub / base_rate,
            per_sub * n as f64,
            write / floor
        );
    }
    let left = ns.leftovers();
    ns.purge();
    assert!(left.is_empty(), "left behind: {left:?}");
}
