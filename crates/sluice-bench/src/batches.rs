//! Comparisons 5 and 5b: batches from 1 KiB to 64 MiB to N = 1 to 16 subscribers,
//! against `memcpy` of the same bytes and against N = 1; measured with `transport`,
//! rendered here.

use std::fmt::Write as _;
use std::path::Path;

use anyhow::Result;

use crate::plot::{self, Series, XAxis};
use crate::report::{Report, median, ratio_summary, size_label, verdict};
use crate::stats::{Summary, against};
use crate::transport;
use crate::{Bench, N8, NS};

/// The largest batch (KiB) comparison 5b sends to more than one subscriber.
const GRID_MAX_KIB: usize = 16 << 10;
/// Batches from this size (KiB) up are "large": the memcpy target applies to them.
const LARGE_KIB: usize = 4 << 10;
/// The most batches one batch-size measurement publishes (small batches would take
/// minutes at `large_bytes`).
const MAX_MESSAGES: usize = 20_000;

/// One batch size's cells of comparison 5b: for each N, per repetition, every
/// subscriber's GB/s and (N = 1 only) memcpy's GB/s.
type GridCells = Vec<(usize, Vec<(Vec<f64>, f64)>)>;

/// Batches from this size (KiB) up carry the fan-out goal in comparison 5b.
const GRID_GOAL_KIB: usize = 64;

/// Comparisons 5 and 5b: measures them and renders their sections.
pub(crate) fn compare(bench: &Bench<'_>, report: &mut Report) -> Result<()> {
    let (ns, scale) = (bench.ns, bench.scale);
    bench.step("5. batch sizes and N against memcpy");
    let mut grid = Vec::new();
    for &kib in &scale.batch_kib {
        let batch = transport::large_batch(kib << 10)?;
        let messages = (scale.large_bytes / (kib << 10)).clamp(8, MAX_MESSAGES);
        let mut cells = Vec::new();
        for (i, &n) in NS.iter().enumerate() {
            // The largest batches go to one subscriber only: each subscriber of a
            // topic reserves chunks of the largest message (the curve to N stops at
            // 16 MiB, as issue 18 asks).
            if n > 1 && kib > GRID_MAX_KIB {
                break;
            }
            let mut r = Vec::new();
            for rep in 0..scale.reps {
                let s = transport::fanout_gbps(
                    ns,
                    &batch,
                    n,
                    8,
                    messages,
                    &format!("big{kib}kn{n}r{rep}"),
                )?;
                // memcpy is measured once per size and repetition, with N = 1.
                let m = if i == 0 {
                    transport::memcpy_gbps(&batch, messages)?
                } else {
                    f64::NAN
                };
                r.push((s, m));
            }
            cells.push((n, r));
        }
        grid.push((kib, cells));
    }
    report.large(&grid, bench.img, bench.plots)?;
    report.grid(&grid, bench.img, bench.plots)?;
    Ok(())
}

impl Report {
    /// Comparison 5: the N = 1 row of the batch-size grid against memcpy.
    fn large(&mut self, grid: &[(usize, GridCells)], img: &Path, plots: bool) -> Result<()> {
        let b = &mut self.body;
        writeln!(b, "\n## 5. Transport floor: batch sizes against memcpy\n")?;
        writeln!(
            b,
            "Batches of one float32 column, from 1 KiB to 16 MiB or more, published (encoded and written \
             once into shared memory) and received (decoded in place, not read further) by one subscriber, \
             after 8 warm-up batches that fault in the topic's memory; timed from the first publish to the \
             last receipt. Baseline: a single-threaded `memcpy` of the same bytes into 8 destinations \
             already written once. Target: ≥ 80% of memcpy for batches of 4 MiB and more; below that the \
             per-message cost (a few µs: encode, notify, wake-up, decode) dominates, and the batches/s \
             column shows it.\n"
        )?;
        writeln!(
            b,
            "| batch | Sluice GB/s | memcpy GB/s | Sluice / memcpy | Sluice batches/s |"
        )?;
        writeln!(b, "|---:|---:|---:|---:|---:|")?;
        let mut ps = Vec::new();
        let mut pm = Vec::new();
        let mut worst = f64::INFINITY;
        for (kib, cells) in grid {
            let Some((_, r)) = cells.first() else {
                continue;
            };
            let r: Vec<(f64, f64)> = r.iter().map(|(s, m)| (s[0], *m)).collect();
            let s = Summary::of(&r.iter().map(|x| x.0).collect::<Vec<_>>());
            let m = Summary::of(&r.iter().map(|x| x.1).collect::<Vec<_>>());
            let ratio = ratio_summary(r.iter().copied());
            let size = size_label(*kib);
            let per_s = s.median * 1e9 / (*kib as f64 * 1024.0);
            writeln!(
                b,
                "| {size} | {} | {} | **{}** | {} |",
                s.show(2),
                m.show(2),
                ratio.show(2),
                crate::stats::metric(per_s)
            )?;
            ps.push((*kib as f64, s));
            pm.push((*kib as f64, m));
            if *kib >= LARGE_KIB {
                worst = worst.min(ratio.median);
            }
        }
        writeln!(
            b,
            "\nFrom 4 MiB up, Sluice reaches at least **{}%** of memcpy (target ≥ 80%: {}).",
            against(worst * 100.0, 80.0, 0),
            verdict(worst >= 0.8)
        )?;
        self.summary.push(format!(
            "batches of 4 MiB and more: at least {}% of memcpy (target ≥ 80%: {})",
            against(worst * 100.0, 80.0, 0),
            verdict(worst >= 0.8)
        ));
        self.image(
            plots,
            img,
            "bench-large.png",
            "large-batch GB/s against memcpy",
            |p| {
                plot::lines(
                    p,
                    "Batch sizes: Sluice against memcpy",
                    "batch size (KiB)",
                    "GB/s",
                    XAxis::Log2,
                    &[
                        Series {
                            name: "Sluice publish → receive".into(),
                            points: ps,
                        },
                        Series {
                            name: "memcpy of the same bytes".into(),
                            points: pm,
                        },
                    ],
                )
            },
        )
    }

    /// Comparison 5b: per-subscriber GB/s of every batch size at every N, against N = 1
    /// and against memcpy.
    fn grid(&mut self, grid: &[(usize, GridCells)], img: &Path, plots: bool) -> Result<()> {
        let b = &mut self.body;
        writeln!(b, "\n### 5b. Batch size and N: the scale curves\n")?;
        writeln!(
            b,
            "As comparison 5, with N = 1 to 16 subscriber threads receiving every batch (batches up \
             to {} MiB; the topic reserves chunks of the largest message for every subscriber). \
             Per-subscriber GB/s is from the first timed publish to that subscriber's last receipt \
             (median over subscribers); baselines: the same size at N = 1 (the fan-out ratio, \
             goal ≥ 0.90 from 64 KiB), and memcpy of the same bytes, both in the same repetition. \
             Every batch wakes every idle subscriber (`publish_batch`), as a producer whose \
             batches arrive one at a time does.\n",
            GRID_MAX_KIB >> 10
        )?;
        let ns: Vec<usize> = NS.to_vec();
        write!(b, "| batch |")?;
        for n in &ns {
            write!(b, " N = {n} GB/s (vs N = 1) |")?;
        }
        writeln!(b, " N = 8 / memcpy |")?;
        write!(b, "|---:|")?;
        for _ in &ns {
            write!(b, "---:|")?;
        }
        writeln!(b, "---:|")?;
        let mut lines: Vec<Series> = ns
            .iter()
            .map(|n| Series {
                name: format!("N = {n}"),
                points: Vec::new(),
            })
            .collect();
        let mut worst = (f64::INFINITY, 0usize);
        for (kib, cells) in grid {
            write!(b, "| {} |", size_label(*kib))?;
            let Some((_, base)) = cells.first() else {
                writeln!(b)?;
                continue;
            };
            let base_rate = |rep: usize| median(&base[rep].0);
            let mut vs_memcpy = String::from("—");
            for (col, n) in ns.iter().enumerate() {
                let Some((_, runs)) = cells.iter().find(|(m, _)| m == n) else {
                    write!(b, " — |")?;
                    continue;
                };
                let rate = Summary::of(&runs.iter().map(|(s, _)| median(s)).collect::<Vec<_>>());
                let ratio = Summary::of(
                    &runs
                        .iter()
                        .enumerate()
                        .map(|(rep, (s, _))| median(s) / base_rate(rep))
                        .collect::<Vec<_>>(),
                );
                write!(b, " {} ({}) |", rate.show(2), ratio.show(2))?;
                lines[col].points.push((*kib as f64, rate));
                if *n == NS[N8] {
                    let m = Summary::of(
                        &runs
                            .iter()
                            .enumerate()
                            .map(|(rep, (s, _))| median(s) / base[rep].1)
                            .collect::<Vec<_>>(),
                    );
                    vs_memcpy = m.show(2);
                }
                if *n == NS[N8] && *kib >= GRID_GOAL_KIB && ratio.median < worst.0 {
                    worst = (ratio.median, *kib);
                }
            }
            writeln!(b, " {vs_memcpy} |")?;
        }
        if worst.0.is_finite() {
            writeln!(
                b,
                "\nAt N = 8 the per-subscriber rate is at least **{}** of N = 1 for batches of 64 KiB \
                 and more (lowest at {}; goal ≥ 0.90: {}).",
                against(worst.0, 0.9, 2),
                size_label(worst.1),
                verdict(worst.0 >= 0.9)
            )?;
            self.summary.push(format!(
                "batch-size curve at N = 8: at least {:.2} of N = 1 from 64 KiB (lowest at {})",
                worst.0,
                size_label(worst.1)
            ));
        }
        self.image(
            plots,
            img,
            "bench-grid.png",
            "per-subscriber GB/s against batch size, N = 1 to 16",
            |p| {
                plot::lines(
                    p,
                    "Per-subscriber GB/s against batch size, for each N",
                    "batch size (KiB)",
                    "GB/s per subscriber",
                    XAxis::Log2,
                    &lines,
                )
            },
        )
    }
}
