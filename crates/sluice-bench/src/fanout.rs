//! Comparisons 1 and 2: one Sluice producer feeding N subscribers, against N
//! independent pipelines that each run the same plan themselves.
//!
//! Everything runs in this process: the producer on a thread (its plan on a tokio
//! runtime of its own), each subscriber on a thread, each independent pipeline on a
//! thread with a tokio runtime of its own, as a trainer process would have. CPU-seconds
//! are the whole process's user + system time over the run.
//!
//! Comparison 2b (total CPU at N = 8 against batch size) runs the same two sides, and the
//! sections of all three are rendered here.

use std::fmt::Write as _;
use std::path::Path;
use std::time::{Duration, Instant};

use anyhow::{Context, Result, anyhow, bail};
use futures::StreamExt;
use sluice::core::Shaper;
use sluice::prelude::*;

use crate::data::{self, Dataset, plan_sql};
use crate::plot::{self, Series, XAxis};
use crate::report::{Report, ratio_summary, verdict};
use crate::stats::{Summary, against, process_cpu_seconds, thread_cpu_seconds};
use crate::{BATCH_ROWS, Bench, N8, NS};

/// One run of either side.
#[derive(Debug, Clone, Copy)]
pub struct Run {
    /// Rows per second seen by each consumer (median over consumers), from its first
    /// batch to its end of stream.
    pub per_consumer: f64,
    /// CPU-seconds of the whole process over the run.
    pub cpu: f64,
    /// Wall-clock seconds of the run.
    pub wall: f64,
    /// CPU-seconds of the consumers' threads (subscribers); 0 for independent pipelines,
    /// whose whole cost is the pipeline.
    pub consumer_cpu: f64,
    /// Rows each consumer received.
    pub rows: u64,
    /// CPU-seconds of the thread that publishes (Sluice's producer loop: pulling batches
    /// from DataFusion, encoding, the copy into shared memory, delivery and wake-ups), and
    /// the wall-clock seconds it ran; 0 for independent pipelines.
    pub publisher: (f64, f64),
    /// Seconds the publishing thread waited for the plan's next batch, and slept on a
    /// subscriber's full queue (`RunStats::waited_for_pipeline`, `waited_for_subscribers`);
    /// 0 for independent pipelines.
    pub waits: (f64, f64),
    /// The topic's window (as `sluice.window` sized it); 0 for independent pipelines.
    pub window: usize,
    /// Batches published per message and per wake-up of the subscribers
    /// (`RunStats::batches` over `RunStats::messages` and `RunStats::wakeups`); 0 for
    /// independent pipelines.
    pub batches_per: (f64, f64),
}

/// A multi-threaded tokio runtime whose workers are named `name` (so that a per-thread
/// profile, `perf report --sort comm`, tells each run's and each role's threads apart).
fn runtime(name: &str) -> Result<tokio::runtime::Runtime> {
    tokio::runtime::Builder::new_multi_thread()
        .enable_all()
        .thread_name(name)
        .build()
        .context("cannot start a tokio runtime")
}

/// Spawns `f` on a thread named `name` (at most 15 bytes: Linux truncates the rest).
fn spawn_named<T: Send + 'static>(
    name: String,
    f: impl FnOnce() -> Result<T> + Send + 'static,
) -> Result<std::thread::JoinHandle<Result<T>>> {
    std::thread::Builder::new()
        .name(name)
        .spawn(f)
        .context("cannot start a thread")
}

fn median(mut v: Vec<f64>) -> f64 {
    v.sort_by(f64::total_cmp);
    v.get((v.len().max(1) - 1) / 2).copied().unwrap_or(f64::NAN)
}

/// The plan of comparisons 1, 2 and 2b ([`plan_sql`]), with DataFusion's batch size
/// when `--datafusion-batch-size` sets it: the producer's and every independent
/// pipeline's alike.
fn fanout_plan(topic: &str, data: &Dataset, batch_rows: usize, epochs: u64) -> String {
    format!(
        "{}{}",
        crate::data::datafusion_batch_size_option(),
        plan_sql(
            topic,
            &format!("{}/", data.dir.display()),
            "",
            batch_rows,
            epochs
        )
    )
}

/// Receives everything `sub` delivers until the end of the stream: the rows, and when the
/// first batch came.
pub fn receive_all(sub: &mut Subscriber) -> Result<(u64, Option<Instant>)> {
    let mut first = None;
    let mut rows = 0u64;
    loop {
        match sub.next_event()? {
            Event::Batch { batch, .. } => {
                first.get_or_insert_with(Instant::now);
                rows += batch.num_rows() as u64;
            }
            Event::EpochEnd(_) => {}
            Event::DeviceBatch { .. } => bail!("a CPU benchmark topic sent a GPU batch"),
            Event::End => return Ok((rows, first)),
        }
    }
}

/// One producer and `n` subscriber threads; every subscriber receives every row.
pub fn sluice(
    ns: &Namespace,
    data: &Dataset,
    n: usize,
    epochs: u64,
    batch_rows: usize,
    topic: &str,
) -> Result<Run> {
    let cpu0 = process_cpu_seconds()?;
    let start = Instant::now();
    // Threads are named by role, N and batch rows (`sub8.3/1024`, `pub8/1024`, `df8/1024`;
    // `ind8.3/1024` and `pipe8.3/1024` for independent pipelines).
    let subs = (0..n)
        .map(|i| {
            let ns = ns.clone();
            let topic = topic.to_string();
            spawn_named(
                format!("sub{n}.{i}/{batch_rows}"),
                move || -> Result<(u64, f64, f64)> {
                    let cpu0 = thread_cpu_seconds()?;
                    let mut sub = crate::transport::subscribe(&ns, &topic)?;
                    let (rows, first) = receive_all(&mut sub)?;
                    let secs = first.map_or(f64::NAN, |t| t.elapsed().as_secs_f64());
                    Ok((rows, secs, thread_cpu_seconds()? - cpu0))
                },
            )
        })
        .collect::<Result<Vec<_>>>()?;
    let rt = runtime(&format!("df{n}/{batch_rows}"))?;
    let sql = fanout_plan(topic, data, batch_rows, epochs);
    let plan = rt.block_on(Plan::from_sql("bench.sql", &sql))?;
    let producer = Producer::new(plan, ns.clone());
    let options = RunOptions {
        min_subscribers: Some(n),
        subscriber_timeout: Some(Duration::from_secs(60)),
        ..RunOptions::default()
    };
    let handle = rt.handle().clone();
    let publishing = spawn_named(format!("pub{n}/{batch_rows}"), move || {
        let (cpu0, start) = (thread_cpu_seconds()?, Instant::now());
        let stats = producer.run(&handle, &options, |_| {});
        Ok((
            stats,
            (thread_cpu_seconds()? - cpu0, start.elapsed().as_secs_f64()),
        ))
    })?;
    let (stats, publisher) = publishing
        .join()
        .map_err(|_| anyhow!("the publishing thread panicked"))??;
    let mut rates = Vec::new();
    let mut failure = None;
    for s in subs {
        match s
            .join()
            .map_err(|_| anyhow!("a subscriber thread panicked"))?
        {
            Ok(r) => rates.push(r),
            Err(e) => failure = Some(e),
        }
    }
    let stats = stats.context("the producer failed")?;
    if let Some(e) = failure {
        return Err(e.context("a subscriber failed"));
    }
    let wall = start.elapsed().as_secs_f64();
    let cpu = process_cpu_seconds()? - cpu0;
    for (rows, _, _) in &rates {
        if *rows != stats.rows || stats.rows != data.rows * epochs {
            bail!(
                "a subscriber received {rows} rows; the producer published {} of {}",
                stats.rows,
                data.rows * epochs
            );
        }
    }
    Ok(Run {
        per_consumer: median(rates.iter().map(|(r, s, _)| *r as f64 / s).collect()),
        cpu,
        wall,
        consumer_cpu: rates.iter().map(|(_, _, c)| c).sum(),
        rows: stats.rows,
        publisher,
        waits: (
            stats.waited_for_pipeline.as_secs_f64(),
            stats.waited_for_subscribers.as_secs_f64(),
        ),
        window: stats.window,
        batches_per: (
            stats.batches as f64 / stats.messages.max(1) as f64,
            stats.batches as f64 / stats.wakeups.max(1) as f64,
        ),
    })
}

/// `n` independent pipelines, each planning and executing the same plan on a runtime
/// of its own (DataFusion scan, re-batching to `batch_rows`), counting rows.
pub fn independent(data: &Dataset, n: usize, epochs: u64, batch_rows: usize) -> Result<Run> {
    let cpu0 = process_cpu_seconds()?;
    let start = Instant::now();
    let trainers = (0..n)
        .map(|i| {
            let sql = fanout_plan("unused", data, batch_rows, epochs);
            spawn_named(
                format!("ind{n}.{i}/{batch_rows}"),
                move || -> Result<(u64, f64)> {
                    let rt = runtime(&format!("pipe{n}.{i}/{batch_rows}"))?;
                    rt.block_on(async {
                        let plan = Plan::from_sql("bench.sql", &sql).await?;
                        let opts = plan.options().clone();
                        let mut first = None;
                        let mut rows = 0u64;
                        for epoch in 0..opts.epochs {
                            let mut shaper = Shaper::new(opts.batch_rows, epoch, opts.shuffle())?;
                            let mut stream = plan.execute_epoch(epoch).await?;
                            while let Some(batch) = stream.next().await {
                                for b in shaper.push(batch?)? {
                                    first.get_or_insert_with(Instant::now);
                                    rows += b.num_rows() as u64;
                                }
                            }
                            for b in shaper.finish()? {
                                rows += b.num_rows() as u64;
                            }
                        }
                        Ok::<_, anyhow::Error>((
                            rows,
                            first.map_or(f64::NAN, |t| t.elapsed().as_secs_f64()),
                        ))
                    })
                },
            )
        })
        .collect::<Result<Vec<_>>>()?;
    let mut rates = Vec::new();
    for t in trainers {
        let (rows, secs) = t
            .join()
            .map_err(|_| anyhow!("a pipeline thread panicked"))?
            .context("an independent pipeline failed")?;
        if rows != data.rows * epochs {
            bail!(
                "an independent pipeline produced {rows} rows, not {}",
                data.rows * epochs
            );
        }
        rates.push(rows as f64 / secs);
    }
    Ok(Run {
        per_consumer: median(rates),
        cpu: process_cpu_seconds()? - cpu0,
        wall: start.elapsed().as_secs_f64(),
        consumer_cpu: 0.0,
        waits: (0.0, 0.0),
        window: 0,
        batches_per: (0.0, 0.0),
        rows: data.rows * epochs,
        publisher: (0.0, 0.0),
    })
}

/// Batch sizes (rows of the dataset) of comparison 2b, total CPU at N = 8 against batch
/// size: about 13 KiB, 107 KiB and 860 KiB.
const CPU_BATCH_ROWS: [usize; 3] = [128, 1024, 8192];

/// Comparisons 1, 2 and 2b: measures them and renders their sections.
pub(crate) fn compare(bench: &Bench<'_>, report: &mut Report) -> Result<()> {
    bench.step("1-2. fan-out and CPU: Sluice against N independent pipelines");
    let (sl, ind) = by_n(bench)?;
    report.fanout(
        &sl,
        &ind,
        bench.scale.epochs,
        bench.batch_kib,
        bench.img,
        bench.plots,
    )?;

    bench.step("2b. total CPU at N = 8 against batch size");
    let by_rows = by_batch_rows(bench)?;
    report.cpu_by_batch(&by_rows, bench.bytes_per_row, bench.img, bench.plots)
}

/// One side's runs for every N (as `NS`), one per repetition.
type ByN = Vec<Vec<Run>>;
/// Comparison 2b's runs for every batch size: (Sluice, independent), one per repetition.
type ByBatchRows = Vec<(usize, Vec<(Run, Run)>)>;

/// Comparisons 1 and 2's runs, for every N and repetition: Sluice's and the independent
/// pipelines'.
fn by_n(bench: &Bench<'_>) -> Result<(ByN, ByN)> {
    let (ns, data, scale) = (bench.ns, bench.data, bench.scale);
    let mut sl = vec![Vec::new(); NS.len()];
    let mut ind = vec![Vec::new(); NS.len()];
    for rep in 0..scale.reps {
        for (i, &n) in NS.iter().enumerate() {
            sl[i].push(sluice(
                ns,
                data,
                n,
                scale.epochs,
                BATCH_ROWS,
                &format!("fan{n}r{rep}"),
            )?);
            ind[i].push(independent(data, n, scale.epochs, BATCH_ROWS)?);
        }
    }
    Ok((sl, ind))
}

/// Comparison 2b's runs: (Sluice, independent) at N = 8, for every batch size and
/// repetition.
fn by_batch_rows(bench: &Bench<'_>) -> Result<ByBatchRows> {
    let (ns, data, scale) = (bench.ns, bench.data, bench.scale);
    let mut by_rows = Vec::new();
    for &rows in &CPU_BATCH_ROWS {
        let mut r = Vec::new();
        for rep in 0..scale.reps {
            let n = NS[N8];
            let s = sluice(ns, data, n, scale.epochs, rows, &format!("cpu{rows}r{rep}"))?;
            let d = independent(data, n, scale.epochs, rows)?;
            r.push((s, d));
        }
        by_rows.push((rows, r));
    }
    Ok(by_rows)
}

/// Points of a plot's line: N (or a batch size) and the summary there.
type Points = Vec<(f64, Summary)>;

impl Report {
    /// Comparisons 1 and 2's sections and their plots.
    fn fanout(
        &mut self,
        sl: &[Vec<Run>],
        ind: &[Vec<Run>],
        epochs: u64,
        batch_kib: f64,
        img: &Path,
        plots: bool,
    ) -> Result<()> {
        let per_sub = self.fanout_section(sl, epochs, batch_kib)?;
        let (cpu_s, cpu_i, per_ind) = self.total_cpu_section(sl, ind)?;
        self.image(
            plots,
            img,
            "bench-fanout.png",
            "per-consumer rows/s against N",
            |p| {
                plot::lines(
                    p,
                    "Rows/s per consumer against N",
                    "N (consumers)",
                    "million rows/s per consumer",
                    XAxis::Log2,
                    &[
                        Series {
                            name: "Sluice subscriber (1 shared producer)".into(),
                            points: per_sub,
                        },
                        Series {
                            name: "independent pipeline (each runs the plan)".into(),
                            points: per_ind,
                        },
                    ],
                )
            },
        )?;
        self.image(
            plots,
            img,
            "bench-cpu.png",
            "total CPU-seconds against N",
            |p| {
                plot::lines(
                    p,
                    "Total CPU-seconds against N",
                    "N (consumers)",
                    "CPU-seconds (user + system)",
                    XAxis::Log2,
                    &[
                        Series {
                            name: "Sluice: 1 producer + N subscribers".into(),
                            points: cpu_s,
                        },
                        Series {
                            name: "N independent pipelines".into(),
                            points: cpu_i,
                        },
                    ],
                )
            },
        )?;
        Ok(())
    }

    /// Comparison 1's section: the per-subscriber rate against N, and its goal at N = 8.
    /// Returns its plot's points (million rows/s per subscriber).
    fn fanout_section(&mut self, sl: &[Vec<Run>], epochs: u64, batch_kib: f64) -> Result<Points> {
        let b = &mut self.body;
        writeln!(b, "\n## 1. Fan-out: one producer, N subscribers\n")?;
        writeln!(
            b,
            "A producer runs the plan (`SELECT id, label, text, features FROM train`, {epochs} epochs) and \
             publishes every batch once; N subscribers (the `Subscriber` API) receive every batch and count \
             its rows. Baseline: the same run with N = 1. Per-subscriber rows/s is from each subscriber's \
             first batch to its end of stream (median over subscribers). Producer CPU is the process's CPU \
             minus the subscribers' threads. The publishing thread (the producer's loop: it takes each \
             batch from DataFusion's threads, encodes it, copies it into shared memory, delivers it to \
             every subscriber's queue and wakes them) is busy for the share of the run's wall time \
             given; where it is near 1, that one thread is what paces every subscriber. The next two \
             columns are shares of the same wall time: the thread waiting for the plan's next batch \
             (DataFusion decoding on its own threads: the pipeline paces the run) and asleep on a \
             subscriber's full queue (the slowest subscriber paces it). The last two are how many \
             batches one message carried, and one wake-up of the subscribers covered, on average (a \
             burst of messages ready at once, cut from one DataFusion batch, shares a wake-up).\n"
        )?;
        writeln!(
            b,
            "| N | per-subscriber rows/s | vs N=1 | aggregate rows/s | producer CPU-s / epoch | publishing thread busy | waits for the pipeline | waits for a full queue | batches per message | batches per wake-up |"
        )?;
        writeln!(b, "|---:|---:|---:|---:|---:|---:|---:|---:|---:|---:|")?;
        let (per_sub, ratio_at_8) = fanout_rows(b, sl, epochs)?;
        let target = ratio_at_8.median >= 0.9;
        let shown = against(ratio_at_8.median, 0.9, 2);
        writeln!(
            b,
            "\nPer-subscriber rate at N = 8: **{shown}** of N = 1 (target ≥ 0.90: {}). \
             The topics' window: {} messages (`sluice.window = {}`).",
            verdict(target),
            sl[N8].first().map_or(0, |r| r.window),
            data::window_option(),
        )?;
        self.goals.push((
            format!("per-subscriber rate, N = 8 against N = 1 (receive and release, {batch_kib:.0} KiB batches)"),
            ratio_at_8.show_against(0.9, 2),
            "≥ 0.90",
            Some(target),
        ));
        Ok(per_sub)
    }

    /// Comparison 2's section: total CPU against N independent pipelines, and its goal at
    /// N = 8. Returns its plots' points: Sluice's and the pipelines' CPU-seconds, and the
    /// pipelines' million rows/s per trainer.
    fn total_cpu_section(
        &mut self,
        sl: &[Vec<Run>],
        ind: &[Vec<Run>],
    ) -> Result<(Points, Points, Points)> {
        let b = &mut self.body;
        writeln!(
            b,
            "\n## 2. Total CPU: Sluice against N independent pipelines\n"
        )?;
        writeln!(
            b,
            "The status quo: N trainers each run the same plan themselves (DataFusion in-process: plan, scan, \
             re-batch to {BATCH_ROWS} rows), counting rows. Sluice: one producer and N subscribers as above. \
             CPU-seconds are the whole process's user + system time over the run; the baseline is the N \
             independent pipelines of the same repetition. Target: Sluice ≤ 1/N of the baseline plus a \
             small overhead.\n"
        )?;
        writeln!(
            b,
            "| N | Sluice CPU-s | independent CPU-s | Sluice / independent | 1/N | Sluice wall s | independent wall s | per-trainer rows/s (independent) |"
        )?;
        writeln!(b, "|---:|---:|---:|---:|---:|---:|---:|---:|")?;
        let mut cpu_s = Vec::new();
        let mut cpu_i = Vec::new();
        let mut per_ind = Vec::new();
        let mut last = Summary::of(&[]);
        for (i, &n) in NS.iter().enumerate() {
            let s = Summary::of(&sl[i].iter().map(|r| r.cpu).collect::<Vec<_>>());
            let d = Summary::of(&ind[i].iter().map(|r| r.cpu).collect::<Vec<_>>());
            let ratio = ratio_summary(sl[i].iter().zip(&ind[i]).map(|(a, b)| (a.cpu, b.cpu)));
            let sw = Summary::of(&sl[i].iter().map(|r| r.wall).collect::<Vec<_>>());
            let dw = Summary::of(&ind[i].iter().map(|r| r.wall).collect::<Vec<_>>());
            let rate = Summary::of(&ind[i].iter().map(|r| r.per_consumer).collect::<Vec<_>>());
            writeln!(
                b,
                "| {n} | {} | {} | {} | {:.2} | {} | {} | {} |",
                s.show(2),
                d.show(2),
                ratio.show(2),
                1.0 / n as f64,
                sw.show(2),
                dw.show(2),
                rate.show_count()
            )?;
            cpu_s.push((n as f64, s));
            cpu_i.push((n as f64, d));
            per_ind.push((
                n as f64,
                Summary::of(
                    &ind[i]
                        .iter()
                        .map(|r| r.per_consumer / 1e6)
                        .collect::<Vec<_>>(),
                ),
            ));
            if i == N8 {
                last = ratio;
            }
        }
        let target = last.median <= 1.0 / 8.0 + 0.05;
        let shown = against(last.median, 1.0 / 8.0 + 0.05, 2);
        writeln!(
            b,
            "\nAt N = 8 Sluice uses **{shown}×** the CPU of 8 independent pipelines (target ≤ 1/8 + 0.05 = 0.175: {}).",
            verdict(target)
        )?;
        self.goals.push((
            "total CPU, N = 8 against 8 independent DataFusion pipelines".into(),
            last.show_against(1.0 / 8.0 + 0.05, 2),
            "≤ 1/8 + 0.05",
            Some(target),
        ));
        Ok((cpu_s, cpu_i, per_ind))
    }

    /// Comparison 2b: total CPU at N = 8 against the batch size.
    fn cpu_by_batch(
        &mut self,
        runs: &[(usize, Vec<(Run, Run)>)],
        bytes_per_row: f64,
        img: &Path,
        plots: bool,
    ) -> Result<()> {
        let n = NS[N8];
        let b = &mut self.body;
        writeln!(b, "\n### 2b. Total CPU at N = {n} against batch size\n")?;
        writeln!(
            b,
            "Comparison 2 at N = {n} with other `batch_rows`: what each batch costs the subscribers \
             (their cost is per batch, the pipeline's per row). Baseline: {n} independent pipelines \
             with the same batch size, same repetition.\n"
        )?;
        writeln!(
            b,
            "| batch_rows | KiB per batch | window (messages) | Sluice CPU-s | independent CPU-s | Sluice / independent | subscribers' CPU µs per batch |"
        )?;
        writeln!(b, "|---:|---:|---:|---:|---:|---:|---:|")?;
        let mut points = Vec::new();
        for (rows, r) in runs {
            let s = Summary::of(&r.iter().map(|(s, _)| s.cpu).collect::<Vec<_>>());
            let d = Summary::of(&r.iter().map(|(_, d)| d.cpu).collect::<Vec<_>>());
            let ratio = ratio_summary(r.iter().map(|(s, d)| (s.cpu, d.cpu)));
            let batches = |run: &Run| run.rows as f64 / *rows as f64;
            let per_batch = Summary::of(
                &r.iter()
                    .map(|(s, _)| s.consumer_cpu / n as f64 / batches(s) * 1e6)
                    .collect::<Vec<_>>(),
            );
            writeln!(
                b,
                "| {rows} | {:.0} | {} | {} | {} | **{}** | {} |",
                *rows as f64 * bytes_per_row / 1024.0,
                r.first().map_or(0, |(s, _)| s.window),
                s.show(2),
                d.show(2),
                ratio.show(3),
                per_batch.show(1)
            )?;
            points.push((*rows as f64, ratio));
        }
        self.image(
            plots,
            img,
            "bench-cpu-batch.png",
            "total CPU at N = 8 against batch size",
            |p| {
                plot::lines(
                    p,
                    &format!("Total CPU at N = {n}: Sluice / {n} independent pipelines"),
                    "batch_rows",
                    "CPU ratio",
                    XAxis::Log2,
                    &[Series {
                        name: format!("Sluice (1 producer + {n} subscribers) / {n} pipelines"),
                        points,
                    }],
                )
            },
        )
    }
}

/// Comparison 1's table rows, one per N: returns the plot's points and the ratio at N = 8.
fn fanout_rows(b: &mut String, sl: &[Vec<Run>], epochs: u64) -> Result<(Points, Summary)> {
    let mut per_sub = Vec::new();
    let mut ratio_at_8 = Summary::of(&[]);
    for (i, &n) in NS.iter().enumerate() {
        let rates = Summary::of(&sl[i].iter().map(|r| r.per_consumer).collect::<Vec<_>>());
        let ratio = ratio_summary(
            sl[i]
                .iter()
                .zip(&sl[0])
                .map(|(r, base)| (r.per_consumer, base.per_consumer)),
        );
        let agg = Summary::of(
            &sl[i]
                .iter()
                .map(|r| r.per_consumer * n as f64)
                .collect::<Vec<_>>(),
        );
        let prod = Summary::of(
            &sl[i]
                .iter()
                .map(|r| (r.cpu - r.consumer_cpu).max(0.0) / epochs as f64)
                .collect::<Vec<_>>(),
        );
        let busy = Summary::of(
            &sl[i]
                .iter()
                .map(|r| r.publisher.0 / r.publisher.1)
                .collect::<Vec<_>>(),
        );
        // Shares of the publishing thread's wall time.
        let share = |f: fn(&Run) -> f64| {
            Summary::of(
                &sl[i]
                    .iter()
                    .map(|r| f(r) / r.publisher.1)
                    .collect::<Vec<_>>(),
            )
        };
        writeln!(
            b,
            "| {n} | {} | {} | {} | {} | {} | {} | {} | {} | {} |",
            rates.show_count(),
            ratio.show(2),
            agg.show_count(),
            prod.show(3),
            busy.show(2),
            share(|r| r.waits.0).show(2),
            share(|r| r.waits.1).show(2),
            Summary::of(&sl[i].iter().map(|r| r.batches_per.0).collect::<Vec<_>>()).show(1),
            Summary::of(&sl[i].iter().map(|r| r.batches_per.1).collect::<Vec<_>>()).show(1),
        )?;
        per_sub.push((
            n as f64,
            Summary::of(
                &sl[i]
                    .iter()
                    .map(|r| r.per_consumer / 1e6)
                    .collect::<Vec<_>>(),
            ),
        ));
        if i == N8 {
            ratio_at_8 = ratio;
        }
    }
    Ok((per_sub, ratio_at_8))
}
