//! Plan-file parsing, options and errors.

use std::fs::File;
use std::sync::Arc;

use datafusion::arrow::array::{ArrayRef, Int64Array, StringArray};
use datafusion::arrow::ipc::writer::FileWriter;
use datafusion::arrow::record_batch::RecordBatch;
use futures::StreamExt;
use parquet::arrow::ArrowWriter;
use parquet::file::properties::WriterProperties;

use super::*;

fn batch(start: i64, n: i64) -> RecordBatch {
    RecordBatch::try_from_iter([
        (
            "id",
            Arc::new(Int64Array::from_iter_values(start..start + n)) as ArrayRef,
        ),
        (
            "name",
            Arc::new(StringArray::from_iter_values(
                (start..start + n).map(|i| format!("r{i}")),
            )) as ArrayRef,
        ),
    ])
    .unwrap()
}

/// A directory with the same 1000 rows as Parquet (two files, small row groups), Arrow IPC and CSV.
fn dataset() -> tempfile::TempDir {
    let dir = tempfile::tempdir().unwrap();
    for (i, dirname) in ["pq", "ipc", "csv"].iter().enumerate() {
        std::fs::create_dir(dir.path().join(dirname)).unwrap();
        for part in 0..2 {
            let b = batch(part * 500, 500);
            let base = dir.path().join(dirname).join(format!("part-{part}"));
            match i {
                0 => {
                    let props = WriterProperties::builder()
                        .set_max_row_group_row_count(Some(77))
                        .build();
                    let mut w = ArrowWriter::try_new(
                        File::create(base.with_extension("parquet")).unwrap(),
                        b.schema(),
                        Some(props),
                    )
                    .unwrap();
                    w.write(&b).unwrap();
                    w.close().unwrap();
                }
                1 => {
                    let mut w = FileWriter::try_new(
                        File::create(base.with_extension("arrow")).unwrap(),
                        &b.schema(),
                    )
                    .unwrap();
                    w.write(&b).unwrap();
                    w.finish().unwrap();
                }
                _ => {
                    let mut w = datafusion::arrow::csv::Writer::new(
                        File::create(base.with_extension("csv")).unwrap(),
                    );
                    w.write(&b).unwrap();
                }
            }
        }
    }
    dir
}

async fn rows(plan: &Plan) -> usize {
    let mut s = plan.execute_epoch(0).await.unwrap();
    let mut n = 0;
    while let Some(b) = s.next().await {
        n += b.unwrap().num_rows();
    }
    n
}

fn plan_error(result: Result<Plan>) -> (u64, u64, String) {
    match result {
        Err(SluiceError::Plan { location, message }) => (location.line, location.column, message),
        Err(other) => panic!("expected a plan error, got {other}"),
        Ok(_) => panic!("expected a plan error, got a plan"),
    }
}

#[tokio::test]
async fn parquet_ipc_and_csv_sources_give_the_same_rows() {
    let dir = dataset();
    let d = dir.path().display();
    let mut sums = Vec::new();
    for (format, sub) in [("PARQUET", "pq"), ("ARROW", "ipc"), ("CSV", "csv")] {
        let options = if format == "CSV" {
            "OPTIONS ('format.has_header' 'true')"
        } else {
            ""
        };
        let sql = format!(
            "SET sluice.topic = 't';\nCREATE EXTERNAL TABLE src STORED AS {format} LOCATION '{d}/{sub}/' {options};\n\
             SELECT id, name FROM src;"
        );
        let plan = Plan::from_sql("test.sql", &sql).await.unwrap();
        assert_eq!(rows(&plan).await, 1000, "{format}");
        sums.push(plan.checksum().await.unwrap());
    }
    assert_eq!(sums[0], sums[1]);
    assert_eq!(sums[0], sums[2]);
}

#[tokio::test]
async fn options_are_applied_and_datafusion_options_pass_through() {
    let dir = dataset();
    let sql = format!(
        "SET sluice.batch_rows = 128;\nSET sluice.epochs = 3;\nSET sluice.shuffle_seed = 7;\n\
         SET datafusion.execution.batch_size = 100;\n\
         CREATE EXTERNAL TABLE src STORED AS PARQUET LOCATION '{}/pq/';\nSELECT * FROM src WHERE id % 2 = 0",
        dir.path().display()
    );
    let plan = Plan::from_sql("p.sql", &sql).await.unwrap();
    let o = plan.options();
    assert_eq!(
        (o.batch_rows, o.epochs, o.shuffle_seed, o.window().unwrap()),
        (128, 3, Some(7), crate::Window::Auto)
    );
    assert_eq!(rows(&plan).await, 500);
    let explain = plan.explain().await.unwrap();
    assert!(explain.contains("sluice.batch_rows = 128"), "{explain}");
    assert!(explain.contains("DataSourceExec"), "{explain}");
}

#[tokio::test]
async fn execution_order_is_the_same_on_every_run() {
    let dir = dataset();
    let sql = format!(
        "SET datafusion.execution.target_partitions = 4;\n\
         CREATE EXTERNAL TABLE src STORED AS PARQUET LOCATION '{}/pq/';\nSELECT id FROM src WHERE id % 3 <> 0",
        dir.path().display()
    );
    let plan = Plan::from_sql("p.sql", &sql).await.unwrap();
    let mut orders = Vec::new();
    for _ in 0..5 {
        orders.push(order(&plan).await);
    }
    assert!(orders.windows(2).all(|w| w[0] == w[1]));
}

/// The ids (the first column) of one epoch, in the order the plan yields them.
async fn order(plan: &Plan) -> Vec<i64> {
    let mut s = plan.execute_epoch(0).await.unwrap();
    let mut ids = Vec::new();
    while let Some(b) = s.next().await {
        let b = b.unwrap();
        let col = b.column(0).as_any().downcast_ref::<Int64Array>().unwrap();
        ids.extend(col.values().iter().copied());
    }
    ids
}

/// The listing counts every file a plan's tables list, once, whatever the shard, and
/// changes with a file added, and with one rewritten in place (same name and size, another
/// modification time): a checkpoint taken over other files is refused on resume.
#[tokio::test]
async fn the_listing_follows_the_files_a_plan_reads() {
    let dir = dataset();
    let listing = |extra: &str| {
        let sql = format!(
            "{extra}CREATE EXTERNAL TABLE src STORED AS PARQUET LOCATION '{}/pq/';
SELECT id FROM src",
            dir.path().display()
        );
        async move {
            Plan::from_sql("p.sql", &sql)
                .await
                .unwrap()
                .listing()
                .await
                .unwrap()
        }
    };
    let before = listing("").await;
    let sizes: u64 = (0..2)
        .map(|part| {
            std::fs::metadata(dir.path().join(format!("pq/part-{part}.parquet")))
                .unwrap()
                .len()
        })
        .sum();
    assert_eq!((before.files, before.bytes), (2, sizes));
    assert_eq!(listing("").await, before);
    // Every shard lists the whole run's files.
    assert_eq!(listing("SET sluice.shard = '1/3';\n").await, before);

    let part = dir.path().join("pq/part-0.parquet");
    let file = File::options().write(true).open(&part).unwrap();
    let later = std::time::SystemTime::now() + std::time::Duration::from_secs(60);
    file.set_modified(later).unwrap();
    let rewritten = listing("").await;
    assert_eq!((rewritten.files, rewritten.bytes), (2, sizes));
    assert_ne!(rewritten.digest, before.digest);

    std::fs::copy(&part, dir.path().join("pq/part-2.parquet")).unwrap();
    let added = listing("").await;
    assert_eq!(added.files, 3);
    assert_ne!(added.digest, rewritten.digest);
}

/// Two nodes of a sharded run that list different files (one sees a file the other does
/// not yet) would cut overlapping shards; with the listing pinned (`sluice.listing`, as
/// `sluice explain` prints it) the node that sees other files refuses to run and names
/// both listings, and the shards of nodes that agree still add up to the whole.
#[tokio::test]
async fn a_shard_over_files_other_than_the_pinned_listing_is_refused() {
    let dir = dataset();
    let plan = |set: &str| {
        let sql = format!(
            "{set}CREATE EXTERNAL TABLE src STORED AS PARQUET LOCATION '{}/pq/';
SELECT id FROM src",
            dir.path().display()
        );
        async move { Plan::from_sql("p.sql", &sql).await }
    };
    let whole = plan("").await.unwrap();
    let listing = whole.listing().await.unwrap();
    let pin = |rank: u32| {
        format!(
            "SET sluice.shard = '{rank}/2';\nSET sluice.listing = '{}';\n",
            listing.digest
        )
    };
    let mut shards = sluice_core::Checksum::default();
    for rank in 0..2 {
        shards.merge(&plan(&pin(rank)).await.unwrap().checksum().await.unwrap());
    }
    assert_eq!(shards, whole.checksum().await.unwrap());

    // This node sees one more file.
    let part = dir.path().join("pq/part-0.parquet");
    std::fs::copy(&part, dir.path().join("pq/part-2.parquet")).unwrap();
    let err = plan(&pin(1)).await.unwrap().checksum().await.unwrap_err();
    let SluiceError::Config(message) = &err else {
        panic!("not a configuration error: {err}");
    };
    assert!(message.contains(&listing.digest), "{message}");
    assert!(message.contains("3 files"), "{message}");
    // Unpinned, it runs (and only says its listing in the log).
    plan("SET sluice.shard = '1/2';\n")
        .await
        .unwrap()
        .checksum()
        .await
        .unwrap();
    let bad = plan("SET sluice.listing = 'abc';\n").await.unwrap_err();
    assert!(bad.to_string().contains("16 hex digits"), "{bad}");
}

/// A file rewritten after the epoch was planned fails it with DataFusion's decoding
/// error (new bytes read with the old footer), which the epoch's error explains by
/// naming the file that changed.
#[tokio::test]
async fn an_epoch_over_a_file_rewritten_since_it_was_listed_names_the_file() {
    let dir = dataset();
    let sql = format!(
        "CREATE EXTERNAL TABLE src STORED AS PARQUET LOCATION '{}/pq/';\nSELECT id FROM src",
        dir.path().display()
    );
    let plan = Plan::from_sql("p.sql", &sql).await.unwrap();
    let mut epoch = plan.execute_epoch(0).await.unwrap();
    let part = dir.path().join("pq/part-1.parquet");
    let len = std::fs::metadata(&part).unwrap().len() as usize;
    std::fs::write(&part, vec![7u8; len + 100]).unwrap();
    let mut failed = None;
    while let Some(b) = epoch.next().await {
        if let Err(e) = b {
            failed = Some(e.to_string());
            break;
        }
    }
    let err = failed.expect("an epoch over a rewritten file read to its end");
    assert!(
        err.contains("part-1.parquet changed after the run listed it"),
        "{err}"
    );
}

/// A pinned listing is checked at every epoch against the files there then, with
/// DataFusion's cache of listings on (its default): a file added while the run is in
/// its first epoch fails the second, naming the listing.
#[tokio::test]
async fn a_file_added_during_a_pinned_run_fails_the_next_epoch() {
    let dir = dataset();
    let sql = |set: &str| {
        format!(
            "{set}CREATE EXTERNAL TABLE src STORED AS PARQUET LOCATION '{}/pq/';
SELECT id FROM src",
            dir.path().display()
        )
    };
    let digest = Plan::from_sql("p.sql", &sql(""))
        .await
        .unwrap()
        .listing()
        .await
        .unwrap()
        .digest;
    let pinned = Plan::from_sql(
        "p.sql",
        &sql(&format!("SET sluice.listing = '{digest}';\n")),
    )
    .await
    .unwrap();
    let mut first = pinned.execute_epoch(0).await.unwrap();
    while let Some(b) = first.next().await {
        b.unwrap();
    }
    let part = dir.path().join("pq/part-0.parquet");
    std::fs::copy(&part, dir.path().join("pq/part-2.parquet")).unwrap();
    let err = match pinned.execute_epoch(1).await {
        Ok(_) => panic!("the second epoch ran over a file the listing does not have"),
        Err(e) => e.to_string(),
    };
    assert!(err.contains(&digest) && err.contains("3 files"), "{err}");
}

/// The same query orders its rows differently with other partitions or another DataFusion
/// batch size (batches are taken round-robin from the partitions), so both are part of
/// the fingerprint that a resumed checkpoint must match, and are named among the
/// settings that order the batches.
#[tokio::test]
async fn settings_that_order_the_rows_are_in_the_fingerprint() {
    let dir = dataset();
    let plan = |partitions: usize, batch: usize| {
        let sql = format!(
            "SET datafusion.execution.target_partitions = {partitions};\n\
             SET datafusion.execution.batch_size = {batch};\n\
             CREATE EXTERNAL TABLE src STORED AS PARQUET LOCATION '{}/pq/';\nSELECT id FROM src",
            dir.path().display()
        );
        async move { Plan::from_sql("p.sql", &sql).await.unwrap() }
    };
    // Below the files' row groups of 77 rows, which end a DataFusion batch anyway.
    let base = plan(2, 10).await;
    let (partitions, batch) = (plan(1, 10).await, plan(2, 30).await);
    // Each change is one that matters: the rows come in another order.
    assert_ne!(order(&base).await, order(&partitions).await);
    assert_ne!(order(&base).await, order(&batch).await);
    assert_eq!(base.fingerprint(), plan(2, 10).await.fingerprint());
    assert_ne!(base.fingerprint(), partitions.fingerprint());
    assert_ne!(base.fingerprint(), batch.fingerprint());

    let settings: std::collections::BTreeMap<_, _> = base.sequence_settings().into_iter().collect();
    assert_eq!(settings["datafusion.execution.target_partitions"], "2");
    assert_eq!(settings["datafusion.execution.batch_size"], "10");
    assert_eq!(settings["sluice.shard"], "0/1");
    // Planning concurrency also follows the cores, and the Parquet writer's `created_by`
    // names DataFusion's version; neither orders anything.
    assert!(!settings.contains_key("datafusion.execution.planning_concurrency"));
    assert!(!settings.contains_key("datafusion.execution.parquet.created_by"));
    assert!(settings.contains_key("datafusion.optimizer.repartition_file_scans"));
}

#[tokio::test]
async fn syntax_errors_name_line_and_column() {
    let (line, col, msg) =
        plan_error(Plan::from_sql("bad.sql", "SET sluice.topic = 'a';\nSELEC 1;").await);
    assert_eq!((line, col), (2, 1));
    assert!(msg.contains("syntax error"), "{msg}");
    let (line, _, msg) =
        plan_error(Plan::from_sql("bad.sql", "\n\nSELECT id FROM t WHERE ;").await);
    assert_eq!(line, 3);
    assert!(msg.contains("Expected"), "{msg}");
}

#[tokio::test]
async fn unknown_options_are_rejected_with_the_valid_ones() {
    let (line, col, msg) =
        plan_error(Plan::from_sql("o.sql", "\n  SET sluice.bach_rows = 5;\nSELECT 1;").await);
    assert_eq!((line, col), (2, 3));
    assert!(
        msg.contains("unknown option 'sluice.bach_rows'") && msg.contains("sluice.batch_rows"),
        "{msg}"
    );
    let (_, _, msg) =
        plan_error(Plan::from_sql("o.sql", "SET sluice.batch_rows = 'lots';\nSELECT 1;").await);
    assert!(msg.contains("sluice.batch_rows"), "{msg}");
}

#[tokio::test]
async fn missing_tables_and_files_are_located() {
    let (line, _, msg) =
        plan_error(Plan::from_sql("m.sql", "SET sluice.epochs = 1;\nSELECT * FROM nowhere;").await);
    assert_eq!(line, 2);
    assert!(msg.contains("nowhere"), "{msg}");
    let (line, _, msg) = plan_error(
        Plan::from_sql(
            "m.sql",
            "CREATE EXTERNAL TABLE t STORED AS PARQUET LOCATION '/definitely/not/here/';\nSELECT * FROM t;",
        )
        .await,
    );
    assert_eq!(line, 1);
    assert!(!msg.is_empty());
}

#[tokio::test]
async fn a_plan_has_exactly_one_final_query() {
    let (line, _, msg) = plan_error(Plan::from_sql("q.sql", "SET sluice.epochs = 2;\n").await);
    assert_eq!(line, 1);
    assert!(msg.contains("expected a final SELECT query"), "{msg}");
    let (line, _, msg) = plan_error(Plan::from_sql("q.sql", "SELECT 1;\nSELECT 2;").await);
    assert_eq!(line, 2);
    assert!(msg.contains("exactly one final query"), "{msg}");
    let (line, _, msg) =
        plan_error(Plan::from_sql("q.sql", "SELECT 1;\nSET sluice.epochs = 2;").await);
    assert_eq!(line, 2);
    assert!(msg.contains("must be the last statement"), "{msg}");
}

#[tokio::test]
async fn other_statements_are_rejected() {
    let (_, _, msg) = plan_error(
        Plan::from_sql(
            "s.sql",
            "CREATE TABLE x AS SELECT 1 AS a;\nDROP TABLE x;\nSELECT 1;",
        )
        .await,
    );
    assert!(msg.contains("unsupported statement"), "{msg}");
}

#[tokio::test]
async fn empty_results_are_an_empty_stream() {
    let dir = dataset();
    let sql = format!(
        "CREATE EXTERNAL TABLE src STORED AS PARQUET LOCATION '{}/pq/';\nSELECT * FROM src WHERE id < 0",
        dir.path().display()
    );
    let plan = Plan::from_sql("e.sql", &sql).await.unwrap();
    assert_eq!(rows(&plan).await, 0);
}

#[tokio::test]
async fn runtime_failures_surface_as_execution_errors() {
    let plan = Plan::from_sql(
        "r.sql",
        "SELECT CAST(s AS INT) AS v FROM (VALUES ('1'), ('x')) AS t(s);",
    )
    .await
    .unwrap();
    let mut s = plan.execute_epoch(0).await.unwrap();
    let mut failed = false;
    while let Some(b) = s.next().await {
        if let Err(e) = b {
            assert!(matches!(e, SluiceError::Execution(_)), "{e}");
            failed = true;
        }
    }
    assert!(failed);
}

/// The value of a secret option is blanked out of a syntax error, which is found before
/// any statement is planned (finding 8 of issue 50: it was quoted, and published to
/// subscribers), whether its key is quoted or a dotted word; a column that is merely
/// named like a key is no option; `Secrets` and `StoreSpecs` never print values.
#[tokio::test]
async fn secret_values_are_blanked_out_of_syntax_errors() {
    for key in ["'aws.secret_access_key'", "aws.secret_access_key"] {
        let sql = format!(
            "CREATE EXTERNAL TABLE t STORED AS PARQUET LOCATION 's3://b/p/' \
             OPTIONS ({key} 'supersecret123' 'supersecret123');\nSELECT * FROM t;"
        );
        let (line, _, message) = plan_error(Plan::from_sql("p.sql", &sql).await);
        assert_eq!(line, 1);
        assert!(
            message.contains("syntax error") && message.contains("***"),
            "{message}"
        );
        assert!(!message.contains("supersecret123"), "{message}");
    }
    let mut secrets = store::Secrets::default();
    secrets.add_literals("SELECT key, password_hash FROM users WHERE name = 'someone_long'");
    secrets.add_literals("OPTIONS ('azure.sas_token' = 'tokenvalue1')");
    assert_eq!(format!("{secrets:?}"), "Secrets(1 values)");
    assert_eq!(
        secrets.redact("x 'tokenvalue1' someone_long"),
        "x '***' someone_long"
    );
    let mut specs = StoreSpecs::default();
    let retry = store::Retry {
        max_retries: 1,
        timeout: std::time::Duration::from_secs(1),
    };
    specs.add(
        "s3://b/",
        &[("aws.secret_access_key".into(), "supersecret123".into())],
        retry,
    );
    assert!(!format!("{specs:?}").contains("supersecret123"));
}

/// A plan's operators get half the memory the process may use unless the plan sets
/// `datafusion.runtime.memory_limit` (finding 8 of issue 50: DataFusion's default is no
/// limit, and a large sort or join ended in the OOM killer).
#[tokio::test]
async fn a_plan_has_a_memory_limit_unless_it_sets_its_own() {
    use datafusion::execution::memory_pool::MemoryLimit;
    let limit = |plan: &Plan| plan.ctx.runtime_env().memory_pool.memory_limit();
    let plan = Plan::from_sql("p.sql", "SELECT 1 AS x").await.unwrap();
    let usable = memory::usable_memory().expect("/proc/meminfo is readable here");
    assert!(
        matches!(limit(&plan), MemoryLimit::Finite(b) if b == usable / 2),
        "not half of {usable} bytes"
    );
    let plan = Plan::from_sql(
        "p.sql",
        "SET datafusion.runtime.memory_limit = '64M';\nSELECT 1 AS x",
    )
    .await
    .unwrap();
    assert!(matches!(limit(&plan), MemoryLimit::Finite(b) if b == 64 << 20));
}

#[tokio::test]
async fn round_settings_come_before_the_tables_and_a_plan_reads_its_feedback() {
    let late =
        "CREATE VIEW v AS SELECT 1 AS id;\nSET sluice.feedback = 'loss, acc';\nSELECT * FROM v";
    let e = Plan::from_sql("r.sql", late).await.unwrap_err().to_string();
    assert!(
        e.contains("r.sql:2:1") && e.contains("before the first table"),
        "{e}"
    );
    // Outside a round the feedback table is there, empty, with the columns named.
    let sql = "SET sluice.feedback = 'loss, acc';\n\
               SELECT key, loss, acc, sluice_round() AS r FROM sluice_feedback";
    let plan = Plan::from_sql("r.sql", sql).await.unwrap();
    let names: Vec<String> = plan
        .schema()
        .fields()
        .iter()
        .map(|f| f.name().clone())
        .collect();
    assert_eq!(names, ["key", "loss", "acc", "r"]);
    let mut stream = plan.execute_epoch(0).await.unwrap();
    assert!(
        stream
            .next()
            .await
            .is_none_or(|b| b.unwrap().num_rows() == 0)
    );
    assert!(
        plan.holds("SELECT count(*) = 0 FROM sluice_feedback")
            .await
            .unwrap()
    );
    assert!(!plan.holds("SELECT false").await.unwrap());
    let e = plan.holds("SELECT 1").await.unwrap_err().to_string();
    assert!(e.contains("one boolean"), "{e}");
    let e = plan
        .holds("DROP VIEW sluice_round")
        .await
        .unwrap_err()
        .to_string();
    assert!(e.contains("trigger query failed"), "{e}");
}

/// Round 1 with its cutoff now, no feedback and no rounds before.
fn round_one_now() -> rounds::RoundInputs {
    rounds::RoundInputs {
        round: 1,
        cutoff: Some(std::time::SystemTime::now()),
        files: None,
        feedback: Vec::new(),
        rounds: Vec::new(),
    }
}

/// A round's plan lists the files it started with: one added since (even with an old
/// modification time) is not read, and one removed fails the next epoch (DataFusion's
/// cache of listings on, as by default: a pinned listing lists again at every epoch).
#[tokio::test]
async fn a_round_reads_the_files_it_started_with_or_fails() {
    let dir = dataset();
    let pq = dir.path().join("pq");
    let sql = format!(
        "SET sluice.rounds = 2;\n\
         CREATE EXTERNAL TABLE t STORED AS PARQUET LOCATION '{}/';\nSELECT id FROM t",
        pq.display()
    );
    let inputs = round_one_now();
    let mut plan = Plan::for_round("r.sql", &sql, &inputs).await.unwrap();
    let listing = plan.listing().await.unwrap();
    assert_eq!(listing.files, 2);
    plan.restrict_listing(&listing.paths);
    plan.options_mut().listing = listing.digest.clone();
    async fn rows(plan: &Plan, epoch: u64) -> Result<usize> {
        let mut n = 0;
        let mut s = plan.execute_epoch(epoch).await?;
        while let Some(b) = s.next().await {
            n += b?.num_rows();
        }
        Ok(n)
    }
    // A copy of a file, its modification time old: not this round's.
    let copy = pq.join("part-9.parquet");
    std::fs::copy(pq.join("part-0.parquet"), &copy).unwrap();
    let old = std::time::SystemTime::now() - std::time::Duration::from_secs(3600);
    File::options()
        .write(true)
        .open(&copy)
        .unwrap()
        .set_modified(old)
        .unwrap();
    assert_eq!(rows(&plan, 1).await.unwrap(), 1000);
    std::fs::remove_file(pq.join("part-1.parquet")).unwrap();
    let e = rows(&plan, 2).await.unwrap_err().to_string();
    assert!(e.contains("listing"), "{e}");
}

/// A look at a round's tables (what a `rows:` trigger counts every 0.5 s) does not run
/// the plan's `CREATE TABLE … AS`: its table stands empty with its schema, so views and
/// the final query over it still plan, while the round itself runs it. The statement
/// here fails when run (a division by zero over the data), which shows which did.
#[tokio::test]
async fn a_look_at_the_tables_does_not_run_a_create_table_as() {
    let dir = dataset();
    let sql = format!(
        "SET sluice.rounds = 2;\n\
         CREATE EXTERNAL TABLE t STORED AS PARQUET LOCATION '{}/';\n\
         CREATE TABLE selected AS SELECT id, 1 / (id - id) AS boom FROM t;\n\
         CREATE VIEW chosen AS SELECT id FROM selected;\n\
         SELECT t.id, t.name FROM t WHERE t.id IN (SELECT id FROM chosen)",
        dir.path().join("pq").display()
    );
    let inputs = round_one_now();
    let look = Plan::tables_for_round("r.sql", &sql, &inputs)
        .await
        .unwrap();
    assert_eq!(look.table_rows().await.unwrap(), 1000);
    assert_eq!(rows(&look).await, 0, "the stand-in table is empty");
    let e = Plan::for_round("r.sql", &sql, &inputs).await.unwrap_err();
    assert!(e.to_string().contains("r.sql:3:"), "{e}");
    assert!(
        e.to_string().to_lowercase().contains("divide by zero"),
        "{e}"
    );
}

/// `ORDER BY … LIMIT k` with k a large share of its input sorts the input whole and takes
/// the first k rows (a TopK heap is many times slower there); a small k keeps the heap.
/// Both give the rows the order and limit say.
#[tokio::test]
async fn a_large_limit_sorts_whole_and_a_small_one_keeps_the_heap() {
    let table = "CREATE TABLE big AS SELECT value AS id, (value * 7919) % 10007 AS k \
                 FROM range(20000);\n";
    let ordered = |limit: &str| format!("{table}SELECT id FROM big ORDER BY k DESC, id{limit}");
    let all = order(&Plan::from_sql("p.sql", &ordered("")).await.unwrap()).await;
    for (k, heap) in [(10_000, false), (100, true)] {
        let plan = Plan::from_sql("p.sql", &ordered(&format!(" LIMIT {k}")))
            .await
            .unwrap();
        let explained = plan.explain().await.unwrap();
        assert_eq!(explained.contains("TopK"), heap, "k = {k}:\n{explained}");
        assert_eq!(order(&plan).await, all[..k], "k = {k}");
    }
}

/// A plan with a syntax error still declares its options, those of every statement that
/// parses; text that is not SQL tokens declares nothing, not even the default topic.
#[tokio::test]
async fn declared_options_survive_a_statement_that_does_not_parse() {
    let sql = "SET sluice.topic = 'mine';\nSELEKT * FROM t;\nSET sluice.epochs = 3;\n\
               CREATE EXTERNAL TABLE t STORED AS PARQUET LOCATION 'x/' garbage here;\n\
               SET sluice.batch_rows = 7";
    let declared = Plan::declared_options(sql).await.unwrap();
    assert_eq!(
        (
            declared.topic.as_str(),
            declared.epochs,
            declared.batch_rows
        ),
        ("mine", 3, 7)
    );
    assert!(
        Plan::declared_options("SET sluice.topic = 'a")
            .await
            .is_none()
    );
    let none = Plan::declared_options(";;").await.unwrap();
    assert_eq!(none.topic, SluiceOptions::default().topic);
}

/// The object a plan over `format` files in `sub` names as bad, and what it says of it:
/// the plan must fail with a storage error naming a file.
async fn bad_file(dir: &tempfile::TempDir, format: &str, sub: &str) -> (String, String) {
    let sql = format!(
        "CREATE EXTERNAL TABLE t STORED AS {format} LOCATION '{}/{sub}/';\nSELECT * FROM t",
        dir.path().display()
    );
    match Plan::from_sql("p.sql", &sql).await {
        Err(SluiceError::Storage { url, message, .. }) => (url, message),
        Err(other) => panic!("expected a storage error naming the file, got {other}"),
        Ok(_) => panic!("a corrupt file planned"),
    }
}

/// A Parquet file whose footer says it has more metadata than the file holds (the
/// reader panicked computing where it starts) fails its table with the file named and
/// what is wrong with it, not a crash.
#[tokio::test]
async fn a_parquet_footer_longer_than_its_file_is_named() {
    let dir = dataset();
    let evil = dir.path().join("pq").join("part-1.parquet");
    let mut bytes = std::fs::read(&evil).unwrap();
    let n = bytes.len();
    bytes[n - 8..n - 4].copy_from_slice(&0x7fff_ffffu32.to_le_bytes());
    std::fs::write(&evil, bytes).unwrap();
    let (url, message) = bad_file(&dir, "PARQUET", "pq").await;
    assert!(url.ends_with("part-1.parquet"), "{url}");
    assert!(
        message.contains("2147483647 bytes of metadata"),
        "{message}"
    );
}

/// An Arrow IPC file cut short fails its table with the file named and what is wrong,
/// not DataFusion's internal error asking for a bug report.
#[tokio::test]
async fn a_truncated_arrow_file_is_named() {
    let dir = dataset();
    let cut = dir.path().join("ipc").join("part-1.arrow");
    let bytes = std::fs::read(&cut).unwrap();
    std::fs::write(&cut, &bytes[..bytes.len() / 2]).unwrap();
    let (url, message) = bad_file(&dir, "ARROW", "ipc").await;
    assert!(url.ends_with("part-1.arrow"), "{url}");
    assert!(
        message.starts_with("a truncated Arrow IPC file"),
        "{message}"
    );
    assert!(!message.contains("issue tracker"), "{message}");
}

/// The error of planning `sql` (as `deep.sql`), on a thread with a planner's stack.
fn plan_error_on_deep_stack(sql: String) -> Option<String> {
    sluice_core::threads::on_deep_stack("test", move || {
        let runtime = tokio::runtime::Builder::new_current_thread()
            .build()
            .unwrap();
        runtime
            .block_on(Plan::from_sql("deep.sql", &sql))
            .err()
            .map(|e| e.to_string())
    })
    .unwrap()
}

/// An expression nested deeper than the planner's recursion allows is a plan error with
/// its location, not a stack overflow that ends the process.
#[test]
fn an_expression_nested_too_deep_is_a_plan_error() {
    let terms: String = (0..3_000).map(|i| format!(" + {i}")).collect();
    let sql = format!("SET sluice.topic = 'deep';\nSELECT 1{terms} AS x;");
    let err = plan_error_on_deep_stack(sql).expect("a plan error");
    assert!(err.contains("nests more than 2500 deep"), "{err}");
    assert!(err.contains("deep.sql:2:1"), "{err}");
    // Inside EXPLAIN, and a chain of UNIONs (planned by recursion too).
    let explain = plan_error_on_deep_stack(format!("EXPLAIN SELECT 1{terms} AS x;"));
    assert!(explain.is_some_and(|e| e.contains("nests more than 2500 deep")));
    let unions: String = (0..3_000)
        .map(|i| format!(" UNION ALL SELECT {i}"))
        .collect();
    let union = plan_error_on_deep_stack(format!("SELECT 0 AS x{unions};"));
    assert!(union.is_some_and(|e| e.contains("nests more than 2500 deep")));
}

/// A plan file that starts with a UTF-8 byte-order mark (as editors on Windows save
/// them) plans, and its options are read (it was a syntax error at the mark).
#[tokio::test]
async fn a_byte_order_mark_before_the_plan_is_ignored() {
    let sql = "\u{feff}SET sluice.topic = 'bom';\nSELECT 1 AS x;\n";
    let plan = Plan::from_sql("bom.sql", sql).await.unwrap();
    assert_eq!(plan.options().topic, "bom");
    let declared = Plan::declared_options(sql).await.unwrap();
    assert_eq!(declared.topic, "bom");
}

/// A LOCATION that is a device is a plan error, not an empty table.
#[tokio::test]
async fn a_device_as_a_location_is_a_plan_error() {
    let sql = "CREATE EXTERNAL TABLE t STORED AS PARQUET LOCATION '/dev/null';\nSELECT * FROM t;";
    let Err(err) = Plan::from_sql("dev.sql", sql).await.map(|_| ()) else {
        panic!("a device was read as a table");
    };
    let err = err.to_string();
    assert!(err.contains("LOCATION '/dev/null' is a device"), "{err}");
    assert!(err.contains("dev.sql:1:1"), "{err}");
}
