//! Comparison 10: rounds. A round whose plan selects from the data joined with the
//! trainers' feedback (top half by reported loss, unreported first; label-balanced),
//! against the same round without a selection: rows/s from the round's trigger to its
//! last batch at a trainer. And the time from a trigger (`sluice.request_round`) to the
//! round's first batch, against a new producer's time to its first batch over the same
//! data (what restarting the pipeline for a new round costs). And rounds of several
//! epochs whose choice is made once per round (`CREATE TABLE … AS`).

use std::fmt::Write as _;
use std::time::{Duration, Instant};

use anyhow::{Result, bail};
use sluice::prelude::*;
use sluice::{FeedbackWriter, RunOptions};

use crate::Bench;
use crate::report::{Report, ratio_summary, verdict};

const BATCH_ROWS: usize = 1024;
/// The selection's goal against the round without one (Modyn reports 0.8–1.0).
const GOAL: f64 = 0.9;

/// The selections measured: a name and the query after the table. The sorted and exact
/// forms choose their ids from the narrow columns, then take their rows: sorting whole
/// rows instead measured 0.53 and 0.31 of the rows/s without a selection at a 2 ms step,
/// against 0.62 and 0.27, before large limits were sorted whole
/// (docs/data/rounds-2core-2026-11-29/whole-rows.md, ids-first.md). The streaming forms
/// compute a threshold first (a median, a per-label count, a per-label cut by
/// `sample_cut`), then filter the scan as it goes. The label-balanced forms name the
/// chosen ids, counts or cuts first in their join: DataFusion builds a hash join's table
/// from the side named first unless it knows the other to be smaller, and it knows
/// nothing of a window's or an aggregate's output, so `train … WHERE id IN (…)` read and
/// hashed every whole row before the round's first batch. Every plan sets
/// `datafusion.optimizer.repartition_joins = false`, so that such a join builds its
/// table once from the small side and streams the scan through it, rather than
/// hash-partitioning every whole row of the scan first (docs/rounds.md, "Costs").
const SELECTIONS: [(&str, &str); 6] = [
    ("none", "SELECT id, label, text, features FROM train"),
    (
        "top half by loss",
        "SELECT t.id, t.label, t.text, t.features FROM train t WHERE t.id IN (\
         SELECT t.id FROM train t \
         LEFT JOIN (SELECT key, max(loss) AS loss FROM sluice_feedback GROUP BY key) f \
         ON t.id = f.key ORDER BY f.loss DESC NULLS FIRST LIMIT {half})",
    ),
    (
        "label-balanced, a tenth",
        "SELECT t.id, t.label, t.text, t.features FROM (\
         SELECT id FROM (SELECT id, ROW_NUMBER() OVER (PARTITION BY label ORDER BY \
         sample_hash(id)) AS drawn FROM train) WHERE drawn <= {tenth}) s \
         JOIN train t ON t.id = s.id",
    ),
    (
        "new, and the reported at or above their median loss (streaming)",
        "SELECT t.id, t.label, t.text, t.features FROM train t \
         LEFT JOIN (SELECT key, max(loss) AS loss FROM sluice_feedback GROUP BY key) f \
         ON t.id = f.key \
         CROSS JOIN (SELECT median(loss) AS cut FROM \
           (SELECT max(loss) AS loss FROM sluice_feedback GROUP BY key)) c \
         WHERE f.loss IS NULL OR f.loss >= c.cut",
    ),
    (
        "label-balanced, a tenth, exact, at a cut per label (streaming)",
        "SELECT t.id, t.label, t.text, t.features \
         FROM (SELECT coalesce(label, -1) AS label, sample_cut(sample_hash(id), {tenth}) AS cut \
           FROM train GROUP BY 1) c \
         JOIN train t ON coalesce(t.label, -1) = c.label \
         WHERE sample_hash(t.id) <= c.cut",
    ),
    (
        "label-balanced, a tenth, drawn at a rate per label (streaming)",
        "SELECT t.id, t.label, t.text, t.features \
         FROM (SELECT coalesce(label, -1) AS label, count(*) AS n FROM train GROUP BY 1) c \
         JOIN train t ON coalesce(t.label, -1) = c.label \
         WHERE sample_hash(t.id) < {tenth} / CAST(c.n AS DOUBLE)",
    ),
];

/// Rounds of several epochs: the top half chosen in every epoch's query, and chosen once
/// per round (`CREATE TABLE … AS` runs when the round is planned; each epoch takes the
/// chosen ids' rows), against the round of as many epochs without a selection.
const ROUND_EPOCHS: u64 = 3;
const ONCE_PER_ROUND: [(&str, &str); 3] = [
    ("none", SELECTIONS[0].1),
    ("top half by loss, chosen in every epoch", SELECTIONS[1].1),
    (
        "top half by loss, chosen once per round",
        "CREATE TABLE chosen AS SELECT t.id FROM train t \
         LEFT JOIN (SELECT key, max(loss) AS loss FROM sluice_feedback GROUP BY key) f \
         ON t.id = f.key ORDER BY f.loss DESC NULLS FIRST LIMIT {half};\n\
         SELECT id, label, text, features FROM train WHERE id IN (SELECT id FROM chosen)",
    ),
];

/// The trainer's step per batch: none (the pipeline paces it), or a fixed training step
/// (the trainer paces the stream, as a GPU-bound one does): 2 ms, and 20 ms, a small
/// model's step on a batch of 1 024 rows, where a selection's start weighs less against
/// the round's training (rounds of one epoch only: a round without a selection then
/// trains for 8 s).
const STEPS: [(&str, Duration); 3] = [
    ("as fast as the pipeline", Duration::ZERO),
    ("at a 2 ms step", Duration::from_millis(2)),
    ("at a 20 ms step", Duration::from_millis(20)),
];

/// One round measured: rows, seconds from the trigger to the last batch, and to the first.
struct Round {
    rows: u64,
    seconds: f64,
    first: f64,
}

pub(crate) fn compare(bench: &Bench<'_>, report: &mut Report) -> Result<()> {
    bench.step("10. rounds: selection over data and feedback");
    writeln!(
        report.body,
        "\n## 10. Rounds: a selection over the data and the trainers' feedback\n\n\
         Round 1 of a producer of {} rows ({BATCH_ROWS}-row batches), started by \
         `sluice.request_round`, after a trainer reported a loss for every row of round \
         0. Rows/s from the request to the round's last batch at the trainer, against the \
         round without a selection in the same run (goal ≥ {GOAL}); time from the request \
         to the round's first batch, against a new producer's time to its first batch \
         (a round without a selection: last column). Rounds of {ROUND_EPOCHS} epochs: \
         the top half chosen in each epoch's query, or once per round (`CREATE TABLE … \
         AS`, run when the round is planned), against {ROUND_EPOCHS} epochs without a \
         selection.\n\n\
         | trainer | selection | rows | rows/s / without a selection | trigger to first \
         batch / a new producer's first batch | the same without a selection |\n\
         |---|---|---|---|---|---|",
        bench.data.rows
    )?;
    let mut fresh = Vec::new();
    for rep in 0..bench.scale.reps {
        fresh.push(new_producer_first_batch(bench, &format!("roundsnew{rep}"))?);
    }
    table(bench, report, &SELECTIONS, 1, &STEPS, &fresh)?;
    table(
        bench,
        report,
        &ONCE_PER_ROUND,
        ROUND_EPOCHS,
        &STEPS[..2],
        &fresh,
    )
}

/// The rows of `selections` (the first: none, the baseline) in rounds of `epochs`.
fn table(
    bench: &Bench<'_>,
    report: &mut Report,
    selections: &[(&str, &str)],
    epochs: u64,
    steps: &[(&str, Duration)],
    fresh: &[f64],
) -> Result<()> {
    for (s, (pace, step)) in steps.iter().enumerate() {
        let pace = match epochs {
            1 => pace.to_string(),
            n => format!("{pace}, rounds of {n} epochs"),
        };
        let reps: Vec<Vec<Round>> = (0..bench.scale.reps)
            .map(|rep| {
                (0..selections.len())
                    .map(|i| {
                        let topic = format!("rounds{epochs}x{s}{i}r{rep}");
                        measure(bench, &topic, selections[i].1, epochs, *step)
                    })
                    .collect::<Result<_>>()
            })
            .collect::<Result<_>>()?;
        for (i, (name, _)) in selections.iter().enumerate().skip(1) {
            let rate = |r: &[Round], j: usize| r[j].rows as f64 / r[j].seconds;
            let ratio = ratio_summary(reps.iter().map(|r| (rate(r, i), rate(r, 0))));
            let first = ratio_summary(reps.iter().zip(fresh).map(|(r, f)| (r[i].first, *f)));
            let plain = ratio_summary(reps.iter().zip(fresh).map(|(r, f)| (r[0].first, *f)));
            writeln!(
                report.body,
                "| {pace} | {name} | {} of {} | {} | {} | {} |",
                reps[0][i].rows,
                bench.data.rows * epochs,
                ratio.show_against(GOAL, 2),
                first.show(2),
                plain.show(2),
            )?;
            let what = format!("10. a round selecting {name}, trainer {pace}");
            report.goal(
                format!("{what}: rows/s / without a selection"),
                ratio.show_against(GOAL, 2),
                "≥ 0.9",
                Some(ratio.median >= GOAL),
            );
            report.summary.push(format!(
                "{what}: {} of the rows/s without ({}); trigger to first batch {} of a new \
                 producer's",
                ratio.show(2),
                verdict(ratio.median >= GOAL),
                first.show(2)
            ));
        }
    }
    Ok(())
}

fn sql(bench: &Bench<'_>, topic: &str, query: &str, rounds: u64, epochs: u64) -> String {
    let rows = bench.data.rows;
    format!(
        "SET sluice.topic = '{topic}'; SET sluice.batch_rows = {BATCH_ROWS};\n\
         SET sluice.rounds = {rounds}; SET sluice.epochs = {epochs};\n\
         SET sluice.trigger = 'manual'; SET sluice.settle_s = 0;\n\
         SET sluice.window = 8; SET sluice.message_batches = 1; SET sluice.shuffle_seed = 3;\n\
         SET datafusion.optimizer.repartition_joins = false;\n\
         CREATE EXTERNAL TABLE train STORED AS PARQUET LOCATION '{}/';\n{};",
        bench.data.dir.display(),
        query
            .replace("{half}", &(rows / 2).to_string())
            .replace("{tenth}", &(rows / 10 / 10).to_string())
    )
}

fn subscribe(ns: &Namespace, topic: &str) -> Result<Subscriber> {
    Ok(Subscriber::connect(
        topic,
        SubscribeOptions {
            timeout: Some(Duration::from_secs(120)),
            namespace: Some(ns.clone()),
            ..SubscribeOptions::default()
        },
    )?)
}

fn spawn(
    bench: &Bench<'_>,
    sql: String,
) -> std::thread::JoinHandle<sluice::Result<sluice::RunStats>> {
    let ns = bench.ns.clone();
    std::thread::spawn(move || {
        let rt = tokio::runtime::Runtime::new().map_err(|e| SluiceError::io("runtime", e))?;
        let plan = rt.block_on(Plan::from_sql("rounds.sql", &sql))?;
        let options = RunOptions {
            min_subscribers: Some(1),
            subscriber_timeout: Some(Duration::from_secs(60)),
            ..RunOptions::default()
        };
        Producer::new(plan, ns).run(rt.handle(), &options, |_| {})
    })
}

/// Round 1 of `query`, rounds of `epochs`, after a loss was reported for every row of
/// round 0's first epoch, read with a training step of `step` per batch.
fn measure(
    bench: &Bench<'_>,
    topic: &str,
    query: &str,
    epochs: u64,
    step: Duration,
) -> Result<Round> {
    let producer = spawn(bench, sql(bench, topic, query, 2, epochs));
    let mut sub = subscribe(bench.ns, topic)?;
    let mut feedback = FeedbackWriter::open(bench.ns, topic, "bench")?;
    let mut first = None;
    let mut rows = 0;
    let mut start = Instant::now();
    loop {
        match sub.next_event()? {
            Event::Batch { epoch, batch, .. } if epoch < epochs => {
                if epoch > 0 {
                    continue;
                }
                let ids = batch
                    .column(0)
                    .as_any()
                    .downcast_ref::<arrow::array::Int64Array>();
                let Some(ids) = ids else {
                    bail!("the id column is not int64")
                };
                let keys: Vec<i64> = ids.values().to_vec();
                let losses = keys.iter().map(|k| Some((k % 97) as f64)).collect();
                feedback.report(keys, (0, 0), vec![("loss".into(), losses)])?;
            }
            Event::Batch { batch, .. } => {
                first.get_or_insert_with(|| start.elapsed());
                rows += batch.num_rows() as u64;
                std::thread::sleep(step);
            }
            Event::EpochEnd(s) if s.epoch + 1 < epochs => {}
            Event::EpochEnd(s) if s.epoch + 1 == epochs => {
                feedback.flush()?;
                start = Instant::now();
                sluice::request_round(bench.ns, topic)?;
            }
            Event::EpochEnd(s) if s.epoch + 1 == 2 * epochs => break,
            Event::EpochEnd(_) => {}
            Event::End | Event::DeviceBatch { .. } => bail!("round 1 did not come"),
        }
    }
    let seconds = start.elapsed().as_secs_f64();
    drop(sub);
    producer
        .join()
        .map_err(|_| anyhow::anyhow!("the producer panicked"))??;
    let Some(first) = first else {
        bail!("round 1 had no batch")
    };
    Ok(Round {
        rows,
        seconds,
        first: first.as_secs_f64(),
    })
}

/// Seconds from a new producer's start (its plan loaded, as `sluice run` does) to the
/// first batch at a trainer waiting for it.
fn new_producer_first_batch(bench: &Bench<'_>, topic: &str) -> Result<f64> {
    let sql = sql(bench, topic, SELECTIONS[0].1, 1, 1);
    let waiting = {
        let (ns, topic) = (bench.ns.clone(), topic.to_string());
        std::thread::spawn(move || -> Result<(Subscriber, Instant)> {
            let mut sub = subscribe(&ns, &topic)?;
            loop {
                if let Event::Batch { .. } = sub.next_event()? {
                    return Ok((sub, Instant::now()));
                }
            }
        })
    };
    // The waiting trainer declares its interest before the producer starts.
    std::thread::sleep(Duration::from_millis(200));
    let start = Instant::now();
    let producer = spawn(bench, sql);
    let (sub, first) = waiting
        .join()
        .map_err(|_| anyhow::anyhow!("the trainer panicked"))??;
    drop(sub);
    let _ = producer.join();
    Ok((first - start).as_secs_f64())
}
