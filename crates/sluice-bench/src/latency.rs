//! Comparison 4: publish→receive latency of small batches against a hand-off between
//! two threads and against the bare wake-up, with the costs of single operations
//! (encoding, decoding, a reclaim); measured with `transport`, rendered here.

use std::fmt::Write as _;
use std::path::Path;

use anyhow::Result;

use crate::Bench;
use crate::plot;
use crate::report::{Report, ratio_summary};
use crate::stats::{Summary, percentile};
use crate::transport;

const SMALL_ROWS: [usize; 3] = [1, 16, 64];
/// Subscribers alive during comparison 4's measurement of a reclaim (with their
/// producer, 20 nodes, all of this one process).
const RECLAIM_SUBSCRIBERS: usize = 19;

/// Comparison 4's measurements of single operations (see [`Report::latency`]).
#[derive(Clone, Copy)]
struct Costs<'a> {
    /// Encoding a small batch: (fresh stream, schema kept) µs, per repetition.
    encoding: &'a [(f64, f64)],
    /// Rows of the batch `decoding` decodes.
    decoded_rows: usize,
    decoding: &'a [transport::Decoding],
    /// (reclaim, iceoryx2's listing) µs, per repetition (`transport::reclaim_us`).
    reclaims: &'a [(f64, f64)],
}

/// Latencies in microseconds, one list per repetition.
type Repetitions = Vec<Vec<f64>>;

/// Comparison 4: measures it and renders its section.
pub(crate) fn compare(bench: &Bench<'_>, report: &mut Report) -> Result<()> {
    let (ns, batches, scale) = (bench.ns, bench.batches, bench.scale);
    bench.step("4. small-batch latency");
    let mut lat = Vec::new();
    for &rows in &SMALL_ROWS {
        let batch = batches[0].slice(0, rows);
        let mut s = Vec::new();
        let mut h = Vec::new();
        for rep in 0..scale.reps {
            s.push(transport::sluice_latency(
                ns,
                &batch,
                scale.latency_warmup,
                scale.latency_samples,
                &format!("lat{rows}r{rep}"),
            )?);
            h.push(transport::handoff_latency(
                &batch,
                scale.latency_warmup,
                scale.latency_samples,
            )?);
        }
        lat.push((rows, s, h));
    }
    let mut wake = Vec::new();
    for rep in 0..scale.reps {
        wake.push(transport::event_latency(
            ns,
            scale.latency_warmup,
            scale.latency_samples,
            &format!("wake{rep}"),
        )?);
    }
    let mut encoding = Vec::new();
    for _ in 0..scale.reps {
        encoding.push(transport::encode_us(
            &batches[0].slice(0, SMALL_ROWS[SMALL_ROWS.len() - 1]),
            20_000,
        )?);
    }
    let mut decoding = Vec::new();
    for _ in 0..scale.reps {
        decoding.push(transport::decode_us(&batches[0], 20_000)?);
    }
    let mut reclaims = Vec::new();
    for _ in 0..scale.reps {
        reclaims.push(transport::reclaim_us(ns, RECLAIM_SUBSCRIBERS, 100)?);
    }
    report.latency(
        &lat,
        &wake,
        &Costs {
            encoding: &encoding,
            decoded_rows: batches[0].num_rows(),
            decoding: &decoding,
            reclaims: &reclaims,
        },
        bench.img,
        bench.plots,
    )?;
    Ok(())
}

impl Report {
    /// Comparison 4's section and its plot.
    fn latency(
        &mut self,
        lat: &[(usize, Vec<transport::Latency>, Repetitions)],
        wake: &[(Vec<f64>, f64)],
        costs: &Costs<'_>,
        img: &Path,
        plots: bool,
    ) -> Result<()> {
        let b = &mut self.body;
        writeln!(b, "\n## 4. Transport floor: small-batch latency\n")?;
        writeln!(
            b,
            "One batch at a time (the next once the last was received): the time from just before the \
             publisher encodes a batch to the subscriber's `next_event` returning it, for slices of 1, 16 and \
             64 rows of the dataset. Baseline: the same batch handed to another thread over a channel \
             (`std::sync::mpsc`), the cost of waking a thread in one process. Percentiles are per \
             repetition; the table gives their median (min–max).\n"
        )?;
        let (wake, w50, w99) = wake_floor(b, wake)?;
        writeln!(
            b,
            "Each Sluice sample is split at the header's `published_ns` (taken just before the \
             sample is sent): the publisher's part (encoding, loan, the copy into shared memory) and \
             the delivery (send and notify, the wake-up, receive, decode, the delivery protocol).\n"
        )?;
        costs_paragraphs(b, costs)?;
        let (mut hist, p50_64, p99_64) = latency_table(b, lat)?;
        hist.push(("event wake-up alone (floor)".into(), wake.concat()));
        self.summary.push(format!(
            "small-batch latency: p50 {p50_64:.1} µs publish→receive for 64-row batches; \
             the wake-up alone: p50 {:.1} µs, p99 {:.1} µs",
            w50.median, w99.median
        ));
        self.goals.push((
            "publish → receive, 64-row batches, p99".into(),
            format!("{} µs", p99_64.show_against(50.0, 0)),
            "< 50 µs",
            Some(p99_64.median < 50.0),
        ));
        self.image(
            plots,
            img,
            "bench-latency.png",
            "small-batch latency distribution",
            |p| plot::histogram(p, "Publish → receive latency of small batches", &hist),
        )
    }
}

/// The `p`th percentile of every repetition.
fn percentiles(runs: &[Vec<f64>], p: f64) -> Vec<f64> {
    runs.iter()
        .map(|r| {
            let mut v = r.clone();
            v.sort_by(f64::total_cmp);
            percentile(&v, p)
        })
        .collect()
}

/// The floor under Sluice's latency, the wake-up alone: its paragraph. Returns its
/// latencies and their p50 and p99.
fn wake_floor(b: &mut String, wake: &[(Vec<f64>, f64)]) -> Result<(Repetitions, Summary, Summary)> {
    let wake_cpu = Summary::of(&wake.iter().map(|(_, cpu)| *cpu).collect::<Vec<_>>());
    let wake: Repetitions = wake.iter().map(|(lat, _)| lat.clone()).collect();
    let (w50, w90, w99) = (
        Summary::of(&percentiles(&wake, 50.0)),
        Summary::of(&percentiles(&wake, 90.0)),
        Summary::of(&percentiles(&wake, 99.0)),
    );
    writeln!(
        b,
        "The floor under Sluice's figure, same run: the wake-up alone. Sluice's subscribers sleep \
         on an iceoryx2 event (a Unix datagram socket per listener); one thread notifying such an \
         event and another waiting on it, one notification at a time, with no message: p50 \
         **{}** µs, p90 {} µs, p99 **{}** µs; each round trip (two wake-ups) costs {} µs of CPU.\n",
        w50.show(1),
        w90.show(1),
        w99.show(1),
        wake_cpu.show(1)
    )?;
    Ok((wake, w50, w99))
}

/// The paragraphs on single operations: encoding, decoding and a reclaim, each against
/// its baseline.
fn costs_paragraphs(b: &mut String, costs: &Costs<'_>) -> Result<()> {
    let Costs {
        encoding,
        decoded_rows,
        decoding,
        reclaims,
    } = *costs;
    let fresh = Summary::of(&encoding.iter().map(|e| e.0).collect::<Vec<_>>());
    let kept = Summary::of(&encoding.iter().map(|e| e.1).collect::<Vec<_>>());
    let ratio = ratio_summary(encoding.iter().map(|e| (e.1, e.0)));
    writeln!(
        b,
        "Encoding a {}-row batch, 20 000 times: as a fresh IPC stream (`wire::encode`, the \
         baseline) {} µs; with the topic's schema message kept (`wire::Encoder`, what producers \
         use) {} µs: **{}** of the baseline.\n",
        SMALL_ROWS[SMALL_ROWS.len() - 1],
        fresh.show(2),
        kept.show(2),
        ratio.show(2)
    )?;
    let decode = Summary::of(&decoding.iter().map(|d| d.decode_us).collect::<Vec<_>>());
    let arrow = Summary::of(&decoding.iter().map(|d| d.arrow_us).collect::<Vec<_>>());
    let deferred = ratio_summary(decoding.iter().map(|d| (d.decode_us, d.arrow_us)));
    let validate = Summary::of(&decoding.iter().map(|d| d.validate_us).collect::<Vec<_>>());
    let share = ratio_summary(decoding.iter().map(|d| (d.validate_us, d.arrow_us)));
    writeln!(
        b,
        "What a subscriber's decoding costs, 20 000 times, a {}-row batch of comparison 3 \
         ({} KiB): `wire::Decoder::decode`, in place and with the schema kept, as subscribers \
         decode, {} µs, against the same decoder validating every array as arrow-ipc builds \
         it (`with_arrow_validation`, the baseline) {} µs: **{}** of the baseline. Both \
         check the same (the safety promise: nothing in shared memory is trusted); the \
         subscribers' decoder validates the batch once it is built and checks the strings' \
         offsets with plain loops. Arrow's validation of the columns alone \
         (`ArrayData::validate_full`: UTF-8, offsets, null counts) {} µs, {} of the \
         baseline.\n",
        decoded_rows,
        decoding.first().map_or(0, |d| d.bytes) >> 10,
        decode.show(2),
        arrow.show(2),
        deferred.show(2),
        validate.show(2),
        share.show(2)
    )?;
    let named = Summary::of(&decoding.iter().map(|d| d.named_us).collect::<Vec<_>>());
    let named_share = ratio_summary(decoding.iter().map(|d| (d.named_us, d.decode_us)));
    writeln!(
        b,
        "A subscriber that names its columns decodes and validates only those: the same \
         batch by a `wire::Decoder` of its columns that are not strings ({}), what a trainer \
         that never reads the text asks for, {} µs, **{}** of decoding every column.\n",
        decoding
            .first()
            .map(|d| d.named.join(", "))
            .unwrap_or_default(),
        named.show(2),
        named_share.show(2)
    )?;
    let reclaim = Summary::of(&reclaims.iter().map(|r| r.0).collect::<Vec<_>>());
    let listing = Summary::of(&reclaims.iter().map(|r| r.1).collect::<Vec<_>>());
    let reclaim_share = ratio_summary(reclaims.iter().copied());
    writeln!(
        b,
        "What looking for dead processes costs a producer's publishing thread, which does \
         it at the end of every epoch (at most every 250 ms) and every 50 ms while a queue \
         is full: one `Namespace::reclaim_dead` with a producer and {RECLAIM_SUBSCRIBERS} \
         subscribers alive and nothing dead, {} µs, against iceoryx2's own listing of the \
         same nodes (`Node::list`, the baseline) {} µs: **{}** of the baseline. All of \
         them are threads of this process, whose nodes' states iceoryx2 knows without \
         reading their monitors' files: another process's node costs both sides a \
         monitor read more (about 30 µs, docs/benchmarks.md).\n",
        reclaim.show(0),
        listing.show(0),
        reclaim_share.show(2)
    )?;
    Ok(())
}

/// A histogram's series: the legend and the values of each.
type Histogram = Vec<(String, Vec<f64>)>;

/// The latency table, one row per batch size. Returns the histogram's series, and the
/// p50 and p99 of the largest size (64 rows).
fn latency_table(
    b: &mut String,
    lat: &[(usize, Vec<transport::Latency>, Repetitions)],
) -> Result<(Histogram, f64, Summary)> {
    writeln!(
        b,
        "| rows | Sluice p50 µs | p90 µs | p99 µs | publisher's part p50 µs | publisher's part p99 µs | delivery p50 µs | delivery p99 µs | hand-off p50 µs | hand-off p99 µs | Sluice / hand-off (p50) |"
    )?;
    writeln!(
        b,
        "|---:|---:|---:|---:|---:|---:|---:|---:|---:|---:|---:|"
    )?;
    let mut hist = Vec::new();
    let mut p50_64 = f64::NAN;
    let mut p99_64 = Summary::of(&[]);
    for (rows, runs, h) in lat {
        let s: Repetitions = runs.iter().map(|r| r.total.clone()).collect();
        let publish: Repetitions = runs.iter().map(|r| r.publish.clone()).collect();
        let delivery: Repetitions = runs.iter().map(|r| r.delivery.clone()).collect();
        let s = &s;
        let (s50, s90, s99) = (
            percentiles(s, 50.0),
            percentiles(s, 90.0),
            percentiles(s, 99.0),
        );
        let (h50, h99) = (percentiles(h, 50.0), percentiles(h, 99.0));
        let ratio = ratio_summary(s50.iter().copied().zip(h50.iter().copied()));
        writeln!(
            b,
            "| {rows} | {} | {} | {} | {} | {} | {} | {} | {} | {} | {} |",
            Summary::of(&s50).show(1),
            Summary::of(&s90).show(1),
            Summary::of(&s99).show(1),
            Summary::of(&percentiles(&publish, 50.0)).show(1),
            Summary::of(&percentiles(&publish, 99.0)).show(1),
            Summary::of(&percentiles(&delivery, 50.0)).show(1),
            Summary::of(&percentiles(&delivery, 99.0)).show(1),
            Summary::of(&h50).show(1),
            Summary::of(&h99).show(1),
            ratio.show(1)
        )?;
        hist.push((format!("Sluice, {rows}-row batches"), s.concat()));
        p50_64 = Summary::of(&s50).median;
        p99_64 = Summary::of(&s99);
        if *rows == SMALL_ROWS[SMALL_ROWS.len() - 1] {
            hist.push((
                format!("thread hand-off, {rows} rows (baseline)"),
                h.concat(),
            ));
        }
    }
    Ok((hist, p50_64, p99_64))
}
