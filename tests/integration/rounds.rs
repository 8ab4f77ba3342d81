//! Rounds over growing data: files arrive while a trainer trains, a `rows:N` trigger
//! starts the next round, the trainer's reported losses steer its selection, and a
//! producer SIGKILLed between rounds resumes with its feedback intact.

use std::collections::BTreeSet;
use std::path::Path;
use std::sync::Arc;
use std::time::Duration;

use arrow::array::{Array, AsArray, Int64Array, RecordBatch};
use arrow::datatypes::{DataType, Field, Int64Type, Schema};
use sluice::FeedbackWriter;
use sluice::prelude::*;
use sluice::rounds::{NEW_ROWS_KEY, ROUND_KEY, TRIGGER_KEY};

use crate::common::Harness;

/// The loss a trainer reports for sample `id`: distinct for the ids used here.
fn loss(id: i64) -> f64 {
    ((id * 37) % 101) as f64
}

/// Writes ids `ids` (and label = id % 3) as a Parquet file, into place by rename, its
/// modification time a second ago (settled: `sluice.settle_s` is 0.2 here).
fn write_ids(dir: &Path, name: &str, ids: std::ops::Range<i64>) {
    let schema = Arc::new(Schema::new(vec![
        Field::new("id", DataType::Int64, false),
        Field::new("label", DataType::Int64, false),
    ]));
    let batch = RecordBatch::try_new(
        schema.clone(),
        vec![
            Arc::new(Int64Array::from_iter_values(ids.clone())),
            Arc::new(Int64Array::from_iter_values(ids.map(|i| i % 3))),
        ],
    )
    .unwrap();
    let tmp = dir.join(format!(".{name}.tmp"));
    let file = std::fs::File::create(&tmp).unwrap();
    let mut writer = parquet::arrow::ArrowWriter::try_new(file, schema, None).unwrap();
    writer.write(&batch).unwrap();
    writer.close().unwrap();
    let settled = std::time::SystemTime::now() - Duration::from_secs(1);
    std::fs::File::options()
        .write(true)
        .open(&tmp)
        .unwrap()
        .set_modified(settled)
        .unwrap();
    std::fs::rename(&tmp, dir.join("data").join(name)).unwrap();
}

/// A plan of `rounds` rounds of one epoch over `data/`: top-`k` by reported loss, samples
/// without a report (new ones) first.
fn plan(topic: &str, rounds: u64, k: usize) -> String {
    format!(
        "SET sluice.topic = '{topic}'; SET sluice.batch_rows = 10; SET sluice.rounds = {rounds};\n\
         SET sluice.trigger = 'rows:50'; SET sluice.settle_s = 0.2; SET sluice.feedback = 'loss';\n\
         SET sluice.message_batches = 1;\n\
         CREATE EXTERNAL TABLE train STORED AS PARQUET LOCATION 'data/';\n\
         SELECT t.id, t.label FROM train t\n\
         LEFT JOIN (SELECT key, max(loss) AS loss FROM sluice_feedback GROUP BY key) f ON t.id = f.key\n\
         ORDER BY f.loss DESC NULLS FIRST, t.id LIMIT {k}"
    )
}

/// The ids of one round (one epoch), and the round's metadata as the batches carry it.
fn read_round(sub: &mut Subscriber) -> (Vec<i64>, [String; 3]) {
    let mut ids = Vec::new();
    let mut meta = None;
    loop {
        match sub.next_event().unwrap() {
            Event::Batch { batch, .. } => {
                let m = batch.schema().metadata().clone();
                meta.get_or_insert_with(|| {
                    [ROUND_KEY, TRIGGER_KEY, NEW_ROWS_KEY]
                        .map(|k| m.get(k).cloned().unwrap_or_default())
                });
                ids.extend(batch.column(0).as_primitive::<Int64Type>().values().iter());
            }
            Event::EpochEnd(_) => return (ids, meta.expect("a round without batches")),
            other => panic!("unexpected {other:?}"),
        }
    }
}

/// What top-`k` by loss over `ids` with `reported` losses selects, computed here.
fn expected(ids: std::ops::Range<i64>, reported: &BTreeSet<i64>, k: usize) -> BTreeSet<i64> {
    let mut rows: Vec<(Option<f64>, i64)> = ids
        .map(|id| (reported.contains(&id).then(|| loss(id)), id))
        .collect();
    // NULLS FIRST, then loss descending, then id.
    rows.sort_by(|a, b| match (a.0, b.0) {
        (None, None) => a.1.cmp(&b.1),
        (None, Some(_)) => std::cmp::Ordering::Less,
        (Some(_), None) => std::cmp::Ordering::Greater,
        (Some(x), Some(y)) => y.total_cmp(&x).then(a.1.cmp(&b.1)),
    });
    rows.into_iter().take(k).map(|r| r.1).collect()
}

fn report(ns: &Namespace, topic: &str, ids: &[i64], round: u64) {
    let mut w = FeedbackWriter::open(ns, topic, "trainer").unwrap();
    let losses = ids.iter().map(|&i| Some(loss(i))).collect();
    w.report(ids.to_vec(), (round, round), vec![("loss".into(), losses)])
        .unwrap();
    w.flush().unwrap();
}

fn subscribe(ns: &Namespace, topic: &str) -> Subscriber {
    Subscriber::connect(
        topic,
        SubscribeOptions {
            timeout: Some(Duration::from_secs(60)),
            namespace: Some(ns.clone()),
            ..SubscribeOptions::default()
        },
    )
    .unwrap()
}

#[test]
fn files_that_arrive_start_rounds_whose_selection_follows_the_reported_losses() {
    let mut h = Harness::new();
    std::fs::create_dir(h.path("data")).unwrap();
    write_ids(h.dir.path(), "a.parquet", 0..100);
    h.plan("p.sql", &plan("grow", 3, 60));
    let producer = h.spawn(&["run", "p.sql", "--quiet", "--min-subscribers", "1"]);
    let mut sub = subscribe(&h.ns, "grow");

    let (round0, meta) = read_round(&mut sub);
    assert_eq!(meta, ["0".to_string(), "start".into(), "100".into()]);
    assert_eq!(
        round0.iter().copied().collect::<BTreeSet<_>>(),
        (0..60).collect()
    );
    report(&h.ns, "grow", &round0, 0);

    // Fewer than 50 new rows do not start a round; 50 more do.
    write_ids(h.dir.path(), "b.parquet", 100..130);
    std::thread::sleep(Duration::from_millis(800));
    assert!(producer.running());
    write_ids(h.dir.path(), "c.parquet", 130..150);
    let (round1, meta) = read_round(&mut sub);
    assert_eq!(meta, ["1".to_string(), "rows:50".into(), "50".into()]);
    let reported: BTreeSet<i64> = round0.iter().copied().collect();
    assert_eq!(
        round1.iter().copied().collect::<BTreeSet<_>>(),
        expected(0..150, &reported, 60)
    );
    report(&h.ns, "grow", &round1, 1);

    write_ids(h.dir.path(), "d.parquet", 150..200);
    let (round2, meta) = read_round(&mut sub);
    assert_eq!(meta[0], "2");
    let reported: BTreeSet<i64> = round0.iter().chain(&round1).copied().collect();
    assert_eq!(
        round2.iter().copied().collect::<BTreeSet<_>>(),
        expected(0..200, &reported, 60)
    );
    assert!(matches!(sub.next_event().unwrap(), Event::End));
    let out = producer.wait(Duration::from_secs(60));
    assert!(out.status.success(), "{}", out.stderr);
}

#[test]
fn a_producer_killed_between_rounds_resumes_with_its_feedback() {
    let mut h = Harness::new();
    std::fs::create_dir(h.path("data")).unwrap();
    write_ids(h.dir.path(), "a.parquet", 0..100);
    h.plan("p.sql", &plan("killed", 2, 60));
    let first = h.spawn(&["run", "p.sql", "--quiet", "--min-subscribers", "1"]);
    let mut sub = subscribe(&h.ns, "killed");
    let (round0, _) = read_round(&mut sub);
    report(&h.ns, "killed", &round0, 0);
    // Between rounds: the producer waits for 50 new rows.
    std::thread::sleep(Duration::from_millis(300));
    first.kill9();
    drop(sub);
    let _ = first.wait(Duration::from_secs(30));

    let second = h.spawn(&[
        "run",
        "p.sql",
        "--quiet",
        "--resume",
        "--min-subscribers",
        "1",
    ]);
    let mut sub = subscribe(&h.ns, "killed");
    write_ids(h.dir.path(), "b.parquet", 100..150);
    let (round1, meta) = read_round(&mut sub);
    assert_eq!(meta[0], "1", "the resumed run goes on with round 1");
    let reported: BTreeSet<i64> = round0.iter().copied().collect();
    assert_eq!(
        round1.iter().copied().collect::<BTreeSet<_>>(),
        expected(0..150, &reported, 60),
        "round 1 selects by the losses reported before the crash"
    );
    assert!(matches!(sub.next_event().unwrap(), Event::End));
    let out = second.wait(Duration::from_secs(60));
    assert!(out.status.success(), "{}", out.stderr);
}

/// The first `n` batches' ids of the round being read.
fn read_batches(sub: &mut Subscriber, n: usize) -> Vec<i64> {
    let mut ids = Vec::new();
    for _ in 0..n {
        match sub.next_event().unwrap() {
            Event::Batch { batch, .. } => {
                ids.extend(batch.column(0).as_primitive::<Int64Type>().values().iter())
            }
            other => panic!("unexpected {other:?}"),
        }
    }
    ids
}

#[test]
fn a_producer_killed_mid_round_resumes_the_round_as_it_started() {
    let mut h = Harness::new();
    std::fs::create_dir(h.path("data")).unwrap();
    write_ids(h.dir.path(), "a.parquet", 0..100);
    // A window of 2 batches: the producer stays close to the trainer.
    let sql = plan("midround", 2, 80).replace(
        "SET sluice.message_batches = 1;",
        "SET sluice.message_batches = 1; SET sluice.window = 2;",
    );
    h.plan("p.sql", &sql);
    let first = h.spawn(&["run", "p.sql", "--quiet", "--min-subscribers", "1"]);
    let mut sub = subscribe(&h.ns, "midround");
    let (round0, _) = read_round(&mut sub);
    report(&h.ns, "midround", &round0, 0);
    write_ids(h.dir.path(), "b.parquet", 100..150);
    let before = read_batches(&mut sub, 3);
    // Data and feedback that come after round 1 started are not round 1's.
    write_ids(h.dir.path(), "c.parquet", 150..300);
    report(&h.ns, "midround", &(100..150).collect::<Vec<_>>(), 1);
    std::thread::sleep(Duration::from_millis(300));
    first.kill9();
    drop(sub);
    let _ = first.wait(Duration::from_secs(30));

    let second = h.spawn(&[
        "run",
        "p.sql",
        "--quiet",
        "--resume",
        "--min-subscribers",
        "1",
    ]);
    let mut sub = subscribe(&h.ns, "midround");
    let (after, meta) = read_round(&mut sub);
    assert_eq!(meta[0], "1");
    let reported: BTreeSet<i64> = round0.iter().copied().collect();
    let round1 = expected(0..150, &reported, 80);
    assert!(after.iter().all(|id| round1.contains(id)), "{after:?}");
    let seen: BTreeSet<i64> = before.iter().chain(&after).copied().collect();
    assert_eq!(seen, round1, "the resumed round is the round that started");
    assert!(matches!(sub.next_event().unwrap(), Event::End));
    let out = second.wait(Duration::from_secs(60));
    assert!(out.status.success(), "{}", out.stderr);
}

/// Rows as (id, label), label `None` where null.
type Rows = Vec<(i64, Option<i32>)>;

/// The ids and labels of `batches`.
fn ids_and_labels(batches: &[RecordBatch]) -> Rows {
    batches
        .iter()
        .flat_map(|b| {
            let ids = b.column(0).as_primitive::<Int64Type>().clone();
            let labels = b
                .column(1)
                .as_primitive::<arrow::datatypes::Int32Type>()
                .clone();
            (0..b.num_rows())
                .map(move |i| (ids.value(i), labels.is_valid(i).then(|| labels.value(i))))
        })
        .collect()
}

/// Round 1 of a shipped selection plan over 30 000 demo rows, ids below 15 000 reported
/// with loss `(id * 37 % 101) / 100`: its rows, and every demo row.
fn select_round_one(file: &str) -> (Rows, Rows) {
    let root = Path::new(env!("CARGO_MANIFEST_DIR")).join("../..");
    let sql = std::fs::read_to_string(root.join("pipelines/selection").join(file)).unwrap();
    round_one(file, &sql)
}

/// Round 1 of the plan `sql` (named `file`) over the data and reports of
/// [`select_round_one`].
fn round_one(file: &str, sql: &str) -> (Rows, Rows) {
    let dir = tempfile::tempdir().unwrap();
    let batch = sluice::demo::demo_batch(0, 30_000).unwrap();
    let path = dir.path().join("part-0.parquet");
    let mut w = parquet::arrow::ArrowWriter::try_new(
        std::fs::File::create(&path).unwrap(),
        batch.schema(),
        None,
    )
    .unwrap();
    w.write(&batch).unwrap();
    w.close().unwrap();
    let sql = sql.replace("'data/demo/'", &format!("'{}/'", dir.path().display()));
    let columns = vec!["loss".to_string()];
    let reported: Vec<i64> = (0..15_000).collect();
    let losses = reported
        .iter()
        .map(|i| Some(((i * 37) % 101) as f64 / 100.0))
        .collect();
    let feedback =
        sluice::plan::rounds::feedback_batch(&columns, reported, "t", (0, 0), vec![losses], 0)
            .unwrap();
    let round = |r| sluice::plan::rounds::RoundRow {
        round: r,
        trigger: "start".into(),
        started_us: 0,
        rows: 30_000,
        new_rows: 0,
    };
    let inputs = sluice::plan::rounds::RoundInputs {
        round: 1,
        cutoff: None,
        files: None,
        feedback: vec![feedback],
        rounds: vec![round(0), round(1)],
    };
    let rt = tokio::runtime::Runtime::new().unwrap();
    let selected = rt.block_on(async {
        use futures::TryStreamExt;
        let plan = Plan::for_round(file, &sql, &inputs).await.unwrap();
        assert!(plan.options().rounds > 1 && plan.options().trigger().is_ok());
        let batches: Vec<RecordBatch> = plan
            .execute_epoch(1)
            .await
            .unwrap()
            .try_collect()
            .await
            .unwrap();
        batches
    });
    (ids_and_labels(&selected), ids_and_labels(&[batch]))
}

fn demo_loss(id: i64) -> f64 {
    ((id * 37) % 101) as f64 / 100.0
}

#[test]
fn the_shipped_selection_plans_select_what_they_say() {
    let labelled = |all: &[(i64, Option<i32>)]| -> BTreeSet<i64> {
        all.iter().filter(|r| r.1.is_some()).map(|r| r.0).collect()
    };
    // Top-k by loss: the unreported first, then the highest losses.
    let (got, all) = select_round_one("top_loss.sql");
    let mut order: Vec<i64> = labelled(&all).into_iter().collect();
    order.sort_by(|a, b| {
        let key = |i: i64| (i < 15_000, -demo_loss(i), i);
        key(*a).partial_cmp(&key(*b)).unwrap()
    });
    let ids: BTreeSet<i64> = got.iter().map(|r| r.0).collect();
    assert_eq!(ids, order[..20_000].iter().copied().collect());

    // Label-balanced: 1 000 of each label.
    let (got, _) = select_round_one("label_balanced.sql");
    let mut per_label = std::collections::BTreeMap::new();
    for (_, label) in &got {
        *per_label.entry(label.expect("labelled only")).or_insert(0) += 1;
    }
    assert_eq!(per_label.len(), 10);
    assert!(per_label.values().all(|&n| n == 1000), "{per_label:?}");
    // Exactly the rows a sort by the same draw within each label keeps.
    let ranked = "SET sluice.rounds = 10; SET sluice.shuffle_seed = 7;\n\
        CREATE EXTERNAL TABLE train STORED AS PARQUET LOCATION 'data/demo/';\n\
        SELECT id, label FROM (SELECT id, label, ROW_NUMBER() OVER (PARTITION BY label \
        ORDER BY sample_hash(id)) AS r FROM train WHERE label IS NOT NULL) WHERE r <= 1000";
    let (want, _) = round_one("ranked.sql", ranked);
    let ids = |rows: &Rows| rows.iter().map(|r| r.0).collect::<BTreeSet<i64>>();
    assert_eq!(ids(&got), ids(&want));

    // New data only: the unreported.
    let (got, all) = select_round_one("unseen_only.sql");
    let unseen: BTreeSet<i64> = labelled(&all)
        .into_iter()
        .filter(|&i| i >= 15_000)
        .collect();
    assert_eq!(got.iter().map(|r| r.0).collect::<BTreeSet<_>>(), unseen);

    // Freshness: every unreported sample and about a fifth of the others.
    let (got, _) = select_round_one("freshness.sql");
    let ids: BTreeSet<i64> = got.iter().map(|r| r.0).collect();
    assert!(unseen.is_subset(&ids));
    let old = ids.len() - unseen.len();
    let reported = labelled(&all).len() - unseen.len();
    let share = old as f64 / reported as f64;
    assert!((0.17..0.23).contains(&share), "{share}");

    // Above the median: the unreported and the reported at or above the median loss.
    let (got, all) = select_round_one("above_median_loss.sql");
    let mut losses: Vec<f64> = (0..15_000).map(demo_loss).collect();
    losses.sort_by(f64::total_cmp);
    let cut = (losses[7_499] + losses[7_500]) / 2.0;
    let want: BTreeSet<i64> = labelled(&all)
        .into_iter()
        .filter(|&i| i >= 15_000 || demo_loss(i) >= cut)
        .collect();
    assert_eq!(got.iter().map(|r| r.0).collect::<BTreeSet<_>>(), want);

    // Loss-weighted: heavier losses drawn more often than their share.
    let (got, all) = select_round_one("loss_weighted.sql");
    assert_eq!(got.len(), 20_000);
    let mean = |ids: &mut dyn Iterator<Item = i64>| {
        let v: Vec<f64> = ids.filter(|&i| i < 15_000).map(demo_loss).collect();
        v.iter().sum::<f64>() / v.len() as f64
    };
    let drawn = mean(&mut got.iter().map(|r| r.0));
    let everyone = mean(&mut labelled(&all).into_iter());
    assert!(drawn > everyone + 0.05, "{drawn} vs {everyone}");
}

/// A trainer on another machine subscribes over Flight and reports over Flight: the
/// next round selects by its reports as by a local trainer's.
#[test]
fn a_remote_trainer_s_reports_reach_the_next_round_over_flight() {
    let mut h = Harness::new();
    std::fs::create_dir(h.path("data")).unwrap();
    write_ids(h.dir.path(), "a.parquet", 0..100);
    h.plan("p.sql", &plan("remote", 2, 60));
    let producer = h.spawn(&["run", "p.sql", "--quiet", "--min-subscribers", "1"]);
    // A loopback server without a token: this user's clients find the one it made.
    let server = h.spawn(&["serve", "--flight", "127.0.0.1:0"]);
    let url = format!("flight://{}/remote", crate::flight::address_of(&server));
    let mut sub = Subscriber::connect(
        &url,
        SubscribeOptions {
            timeout: Some(Duration::from_secs(60)),
            namespace: Some(h.ns.clone()),
            ..SubscribeOptions::default()
        },
    )
    .unwrap();
    let (round0, _) = read_round(&mut sub);
    let mut w = FeedbackWriter::open(&h.ns, &url, "far").unwrap();
    let losses = round0.iter().map(|&i| Some(loss(i))).collect();
    w.report(round0.clone(), (0, 0), vec![("loss".into(), losses)])
        .unwrap();
    w.flush().unwrap();
    write_ids(h.dir.path(), "b.parquet", 100..150);
    let (round1, meta) = read_round(&mut sub);
    assert_eq!(meta[0], "1");
    let reported: BTreeSet<i64> = round0.iter().copied().collect();
    assert_eq!(
        round1.iter().copied().collect::<BTreeSet<_>>(),
        expected(0..150, &reported, 60)
    );
    assert!(matches!(sub.next_event().unwrap(), Event::End));
    let out = producer.wait(Duration::from_secs(60));
    assert!(out.status.success(), "{}", out.stderr);
    server.signal(libc::SIGINT);
    let _ = server.wait(Duration::from_secs(30));
}

/// `sluice round TOPIC` starts the next round of a plan whose trigger is `manual`; the
/// same plan started a second time meanwhile is refused and takes no reports away.
#[test]
fn sluice_round_starts_a_manual_round() {
    let mut h = Harness::new();
    std::fs::create_dir(h.path("data")).unwrap();
    write_ids(h.dir.path(), "a.parquet", 0..100);
    h.plan("p.sql", &plan("man", 2, 60).replace("rows:50", "manual"));
    // Asked of nobody: said so, not a request that a producer starting later clears.
    let early = h.run(&["round", "man"]);
    assert_eq!(early.status.code(), Some(2), "{}", early.stderr);
    assert!(
        early.stderr.contains("no producer of topic 'man'"),
        "{}",
        early.stderr
    );
    let producer = h.spawn(&["run", "p.sql", "--quiet", "--min-subscribers", "1"]);
    let mut sub = subscribe(&h.ns, "man");
    let (round0, _) = read_round(&mut sub);
    assert_eq!(round0.len(), 60);
    report(&h.ns, "man", &round0, 0);
    // The same plan started again by mistake: refused, and the reports stay.
    let twice = h.run(&["run", "p.sql", "--quiet"]);
    assert_eq!(twice.status.code(), Some(2), "{}", twice.stderr);
    assert!(
        twice.stderr.contains("running producer"),
        "{}",
        twice.stderr
    );
    let asked = h.run(&["round", "man"]);
    assert!(asked.status.success(), "{}", asked.stderr);
    let (round1, meta) = read_round(&mut sub);
    assert_eq!(meta[..2], ["1".to_string(), "manual".into()]);
    let reported: BTreeSet<i64> = round0.iter().copied().collect();
    assert_eq!(
        round1.iter().copied().collect::<BTreeSet<_>>(),
        expected(0..100, &reported, 60),
        "round 1 read the reports made before the second start"
    );
    assert!(matches!(sub.next_event().unwrap(), Event::End));
    assert!(producer.wait(Duration::from_secs(60)).status.success());
}

/// `sluice round` asked of a producer whose rounds start on another trigger is refused,
/// naming its trigger (it was taken, and no round came of it).
#[test]
fn sluice_round_is_refused_by_a_producer_of_another_trigger() {
    let mut h = Harness::new();
    std::fs::create_dir(h.path("data")).unwrap();
    write_ids(h.dir.path(), "a.parquet", 0..100);
    h.plan("p.sql", &plan("rows", 2, 60));
    let producer = h.spawn(&["run", "p.sql", "--quiet", "--min-subscribers", "1"]);
    let mut sub = subscribe(&h.ns, "rows");
    let (round0, _) = read_round(&mut sub);
    assert_eq!(round0.len(), 60);
    let asked = h.run(&["round", "rows"]);
    assert_eq!(asked.status.code(), Some(2), "{}", asked.stderr);
    assert!(
        asked.stderr.contains("sluice.trigger = 'rows:50'"),
        "{}",
        asked.stderr
    );
    producer.kill9();
}

/// `every:D` starts each round D after the last one started, over the files then (a
/// file written just after round 0 is in round 2, which starts 2 s after round 0).
#[test]
fn an_interval_trigger_starts_rounds_over_the_files_of_their_time() {
    let mut h = Harness::new();
    std::fs::create_dir(h.path("data")).unwrap();
    write_ids(h.dir.path(), "a.parquet", 0..100);
    h.plan(
        "p.sql",
        &plan("every", 3, 1000).replace("rows:50", "every:1s"),
    );
    let producer = h.spawn(&["run", "p.sql", "--quiet", "--min-subscribers", "1"]);
    let mut sub = subscribe(&h.ns, "every");
    let (round0, meta) = read_round(&mut sub);
    assert_eq!((round0.len(), meta[0].as_str()), (100, "0"));
    write_ids(h.dir.path(), "b.parquet", 100..120);
    for r in 1..3 {
        let (ids, meta) = read_round(&mut sub);
        assert_eq!(meta[..2], [r.to_string(), "every:1000ms".into()]);
        // b.parquet may land before or after round 1 starts; round 2 has it.
        assert!(ids.len() == 100 || ids.len() == 120, "{}", ids.len());
        if r == 2 {
            assert_eq!(ids.len(), 120);
        }
    }
    assert!(matches!(sub.next_event().unwrap(), Event::End));
    assert!(producer.wait(Duration::from_secs(60)).status.success());
}

/// A file removed during a round fails the round's next epoch: every epoch of a round
/// reads the files it started with, or none.
#[test]
fn a_file_removed_during_a_round_fails_its_next_epoch() {
    let mut h = Harness::new();
    std::fs::create_dir(h.path("data")).unwrap();
    write_ids(h.dir.path(), "a.parquet", 0..100);
    write_ids(h.dir.path(), "b.parquet", 100..200);
    let sql = plan("removed", 2, 1000).replace(
        "SET sluice.message_batches = 1;",
        "SET sluice.message_batches = 1; SET sluice.window = 2; SET sluice.epochs = 2;",
    );
    h.plan("p.sql", &sql);
    let producer = h.spawn(&["run", "p.sql", "--quiet", "--min-subscribers", "1"]);
    let mut sub = subscribe(&h.ns, "removed");
    read_batches(&mut sub, 1);
    std::fs::remove_file(h.path("data/b.parquet")).unwrap();
    let failed = loop {
        match sub.next_event() {
            Ok(Event::End) => panic!("the round went on without its file"),
            Ok(_) => {}
            Err(e) => break e.to_string(),
        }
    };
    // A read of the file (this epoch), or the listing of the next: never a round that
    // goes on without it.
    assert!(
        failed.contains("listing") || failed.contains("not found"),
        "{failed}"
    );
    let out = producer.wait(Duration::from_secs(60));
    assert!(!out.status.success());
}
