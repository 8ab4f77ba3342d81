//! Comparisons 1 and 2: one Sluice producer feeding N subscribers, against N
//! independent pipelines that each run the same plan themselves.
//!
//! Everything runs in this process: the producer on a thread (its plan on a tokio
//! runtime of its own), each subscriber on a thread, each independent pipeline on a
//! thread with a tokio runtime of its own, as a trainer process would have. CPU-seconds
//! are the whole process's user + system time over the run.

use std::time::{Duration, Instant};

use anyhow::{Context, Result, anyhow, bail};
use futures::StreamExt;
use sluice::core::Shaper;
use sluice::prelude::*;

use crate::data::{Dataset, plan_sql};
use crate::stats::{process_cpu_seconds, thread_cpu_seconds};

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
