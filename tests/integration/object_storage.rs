//! Object storage and sharding, with real processes against a real S3-compatible server.
//!
//! The S3 tests need the server that `scripts/s3-server.sh` starts (s3s-fs on
//! 127.0.0.1, which checks request signatures) and finds through `SLUICE_TEST_S3_*`;
//! `scripts/test.sh` always runs them that way. Run alone, they print that they were
//! skipped and why. The sharding tests over local files always run.

use std::path::{Path, PathBuf};
use std::sync::atomic::{AtomicU32, Ordering};
use std::time::Duration;

use crate::common::{Finished, Harness, assert_exactly_once};
use object_store::ObjectStoreExt;
use object_store::aws::AmazonS3Builder;

const LIMIT: Duration = Duration::from_secs(120);
const QUERY: &str = "SELECT id, label, text, features FROM train WHERE label IS NOT NULL";

static NEXT_BUCKET: AtomicU32 = AtomicU32::new(0);

/// The S3 server started by `scripts/s3-server.sh`.
struct S3 {
    endpoint: String,
    access_key: String,
    secret_key: String,
    root: PathBuf,
}

impl S3 {
    /// The server, or `None` (and a line saying the test is skipped) without one.
    fn server(test: &str) -> Option<Self> {
        let var = |k: &str| std::env::var(k).ok().filter(|v| !v.is_empty());
        match (
            var("SLUICE_TEST_S3_ENDPOINT"),
            var("SLUICE_TEST_S3_ACCESS_KEY"),
            var("SLUICE_TEST_S3_SECRET_KEY"),
            var("SLUICE_TEST_S3_ROOT"),
        ) {
            (Some(endpoint), Some(access_key), Some(secret_key), Some(root)) => Some(Self {
                endpoint,
                access_key,
                secret_key,
                root: root.into(),
            }),
            _ => {
                eprintln!(
                    "SKIPPED {test}: no S3 server (SLUICE_TEST_S3_ENDPOINT is not set). \
                     Run it through `scripts/s3-server.sh cargo test --test integration object_storage::` \
                     (scripts/test.sh does)."
                );
                None
            }
        }
    }

    /// A new, empty bucket of this test's own.
    fn bucket(&self) -> String {
        let name = format!(
            "sluice-{}-{}",
            std::process::id(),
            NEXT_BUCKET.fetch_add(1, Ordering::Relaxed)
        );
        // s3s-fs keeps a bucket as a directory of its data directory.
        std::fs::create_dir(self.root.join(&name)).unwrap();
        name
    }

    /// Uploads `files` (path in the bucket, bytes) over S3.
    fn put(&self, bucket: &str, files: &[(String, Vec<u8>)]) {
        let store = self.client(bucket);
        let rt = tokio::runtime::Runtime::new().unwrap();
        for (path, bytes) in files {
            rt.block_on(store.put(&path.as_str().into(), bytes.clone().into()))
                .unwrap_or_else(|e| panic!("cannot upload {path}: {e}"));
        }
    }

    /// A client for `bucket` with the server's credentials.
    fn client(&self, bucket: &str) -> object_store::aws::AmazonS3 {
        AmazonS3Builder::new()
            .with_endpoint(&self.endpoint)
            .with_allow_http(true)
            .with_region("us-east-1")
            .with_bucket_name(bucket)
            .with_access_key_id(&self.access_key)
            .with_secret_access_key(&self.secret_key)
            .build()
            .unwrap()
    }

    /// Deletes an object over S3.
    fn delete(&self, bucket: &str, path: &str) {
        let rt = tokio::runtime::Runtime::new().unwrap();
        rt.block_on(self.client(bucket).delete(&path.into()))
            .unwrap_or_else(|e| panic!("cannot delete {path}: {e}"));
    }

    /// A harness with a local dataset of `rows` rows, uploaded under `train/` of a new
    /// bucket (returned with the harness); the local copy is in the harness's `data/`.
    fn harness_with_train(&self, rows: usize) -> (Harness, String) {
        let mut h = Harness::new();
        let data = h.dataset(rows);
        let bucket = self.bucket();
        self.upload_dir(&bucket, &data, "train");
        (h, bucket)
    }

    /// Uploads every file of the local directory `dir` under `prefix/`.
    fn upload_dir(&self, bucket: &str, dir: &Path, prefix: &str) {
        let mut files = Vec::new();
        for entry in std::fs::read_dir(dir).unwrap() {
            let path = entry.unwrap().path();
            if path.is_file() {
                let name = path.file_name().unwrap().to_str().unwrap().to_string();
                files.push((format!("{prefix}/{name}"), std::fs::read(&path).unwrap()));
            }
        }
        assert!(!files.is_empty());
        self.put(bucket, &files);
    }

    /// The standard AWS variables for this server, with `secret` as the secret key.
    fn env(&self, secret: &str) -> Vec<(String, String)> {
        [
            ("AWS_ACCESS_KEY_ID", self.access_key.as_str()),
            ("AWS_SECRET_ACCESS_KEY", secret),
            ("AWS_ENDPOINT_URL", self.endpoint.as_str()),
            ("AWS_ALLOW_HTTP", "true"),
            ("AWS_REGION", "us-east-1"),
        ]
        .into_iter()
        .map(|(k, v)| (k.to_string(), v.to_string()))
        .collect()
    }
}

fn plan_sql(topic: &str, extra: &str, location: &str, options: &str) -> String {
    format!(
        "SET sluice.topic = '{topic}';\nSET sluice.batch_rows = 1000;\n{extra}\n\
         CREATE EXTERNAL TABLE train STORED AS PARQUET LOCATION '{location}'{options};\n{QUERY};\n"
    )
}

/// `sluice checksum` over `plan` (with `args`): (rows, checksum as a number).
fn checksum(h: &mut Harness, plan: &str, args: &[&str]) -> (u64, u128) {
    let mut all = vec!["checksum", plan, "--json"];
    all.extend_from_slice(args);
    let out = h.run(&all);
    assert!(out.status.success(), "{all:?}: {}", out.stderr);
    let v = &out.json_lines()[0];
    let hex = v["checksum"].as_str().unwrap();
    (
        v["rows"].as_u64().unwrap(),
        u128::from_str_radix(hex, 16).unwrap(),
    )
}

fn all_output(out: &Finished) -> String {
    format!("{}\n{}", out.stdout, out.stderr)
}

/// Rows streamed from S3 reach three subscriber processes exactly once per epoch, with
/// the same checksum as DataFusion computes over the same files on local disk.
#[test]
fn rows_streamed_from_s3_arrive_exactly_once() {
    let Some(s3) = S3::server("rows_streamed_from_s3_arrive_exactly_once") else {
        return;
    };
    let (mut h, bucket) = s3.harness_with_train(30_000);
    h.env = s3.env(&s3.secret_key);
    let local = h.plan("local.sql", &plan_sql("s3-local", "", "data/", ""));
    let remote = h.plan(
        "p.sql",
        &plan_sql(
            "s3-once",
            "SET sluice.epochs = 2;",
            &format!("s3://{bucket}/train/"),
            "",
        ),
    );
    let (rows, sum) = h.source_checksum(&local);
    assert_eq!(h.source_checksum(&remote), (rows, sum.clone()));
    // Read-ahead off, and one row group per window (every window fetched in the
    // background while the previous one is decoded), read the same rows.
    for read_ahead in ["0", "1"] {
        let plan = h.plan(
            &format!("ra{read_ahead}.sql"),
            &plan_sql(
                "s3-ra",
                &format!("SET sluice.read_ahead = '{read_ahead}';"),
                &format!("s3://{bucket}/train/"),
                "",
            ),
        );
        assert_eq!(
            h.source_checksum(&plan),
            (rows, sum.clone()),
            "read_ahead {read_ahead}"
        );
    }
    assert!(rows > 29_000 && rows % 1000 != 0, "{rows}");
    let subs: Vec<_> = (0..3)
        .map(|_| h.spawn(&["subscribe", "s3-once", "--json", "--timeout", "60"]))
        .collect();
    let producer = h.spawn_producer(3, &[]);
    for sub in subs {
        assert_exactly_once(&sub.wait(LIMIT), 2, rows, &sum);
    }
    let out = producer.wait(LIMIT);
    assert!(out.status.success(), "{}", out.stderr);
}

/// Credentials, endpoint and `allow_http` given as table OPTIONS work without any AWS
/// variable; the secret key never appears in `sluice explain`, in error messages, or
/// in debug logs, whether it came from OPTIONS or from the environment.
#[test]
fn credentials_from_table_options_work_and_secrets_never_show() {
    let Some(s3) = S3::server("credentials_from_table_options_work_and_secrets_never_show") else {
        return;
    };
    let (mut h, bucket) = s3.harness_with_train(5_000);
    let options = |secret: &str| {
        format!(
            " OPTIONS ('aws.access_key_id' '{}', 'aws.secret_access_key' '{secret}', \
             'aws.endpoint' '{}', 'aws.allow_http' 'true', 'aws.region' 'us-east-1')",
            s3.access_key, s3.endpoint
        )
    };
    let location = format!("s3://{bucket}/train/");
    h.plan("local.sql", &plan_sql("opt", "", "data/", ""));
    h.plan(
        "good.sql",
        &plan_sql("opt", "", &location, &options(&s3.secret_key)),
    );
    let wrong = "wrong-secret-Zq8vX3kP9sL2";
    h.plan("bad.sql", &plan_sql("opt", "", &location, &options(wrong)));
    h.env = vec![("SLUICE_LOG".into(), "debug".into())];

    let out = h.run(&["explain", "good.sql"]);
    assert!(out.status.success(), "{}", out.stderr);
    assert!(
        out.stdout.contains("train/part-00.parquet"),
        "{}",
        out.stdout
    );
    assert!(
        !all_output(&out).contains(&s3.secret_key),
        "{}",
        all_output(&out)
    );
    let want = checksum(&mut h, "local.sql", &[]);
    assert_eq!(checksum(&mut h, "good.sql", &[]), want);

    for args in [
        vec!["explain", "bad.sql"],
        vec!["checksum", "bad.sql"],
        vec!["run", "bad.sql", "--quiet", "--linger", "0.1"],
    ] {
        let out = h.run(&args);
        assert_ne!(out.status.code(), Some(0), "{args:?}");
        let text = all_output(&out);
        assert!(text.contains("access denied"), "{args:?}: {text}");
        assert!(!text.contains(wrong), "{args:?} printed the secret: {text}");
    }

    // The same, with the wrong secret in the environment.
    h.env = s3.env(wrong);
    h.env.push(("SLUICE_LOG".into(), "debug".into()));
    h.plan("env.sql", &plan_sql("opt", "", &location, ""));
    let out = h.run(&["checksum", "env.sql"]);
    assert_ne!(out.status.code(), Some(0));
    let text = all_output(&out);
    assert!(
        text.contains("access denied") && text.contains(&location),
        "{text}"
    );
    assert!(text.contains("AWS_SECRET_ACCESS_KEY"), "{text}");
    assert!(!text.contains(wrong), "printed the secret: {text}");
}

/// A missing bucket, a missing object, wrong credentials and a corrupt object each make
/// the producer exit non-zero with an error that names the object, and the subscribers
/// waiting for its topic receive that error instead of hanging.
#[test]
fn store_failures_name_the_object_and_reach_subscribers() {
    let Some(s3) = S3::server("store_failures_name_the_object_and_reach_subscribers") else {
        return;
    };
    let (mut h, bucket) = s3.harness_with_train(3_000);
    s3.upload_dir(&bucket, &h.path("data"), "mixed");
    s3.put(
        &bucket,
        &[(
            "mixed/part-99.parquet".into(),
            b"PAR1 this is not parquet at all".to_vec(),
        )],
    );
    // DataFusion reads every object under a remote prefix: the one that is not Parquet
    // is named, not the empty one it passes over.
    s3.upload_dir(&bucket, &h.path("data"), "notes");
    s3.put(
        &bucket,
        &[
            ("notes/README.txt".into(), b"what this dataset is".to_vec()),
            ("notes/empty.parquet".into(), Vec::new()),
        ],
    );
    let missing_bucket = format!("{bucket}-missing");
    let cases = [
        (
            "no-bucket",
            format!("s3://{missing_bucket}/train/"),
            s3.secret_key.clone(),
            vec![missing_bucket.clone(), "not found".into()],
        ),
        (
            "no-object",
            format!("s3://{bucket}/train/part-77.parquet"),
            s3.secret_key.clone(),
            vec![
                format!("s3://{bucket}/train/part-77.parquet"),
                "no such object".into(),
            ],
        ),
        (
            "credentials",
            format!("s3://{bucket}/train/"),
            "wrong-secret-Zq8vX3kP9sL2".into(),
            vec![format!("s3://{bucket}/train/"), "access denied".into()],
        ),
        (
            "corrupt",
            format!("s3://{bucket}/mixed/"),
            s3.secret_key.clone(),
            vec![
                format!("s3://{bucket}/mixed/part-99.parquet"),
                "not a Parquet file".into(),
            ],
        ),
        (
            "glob",
            format!("s3://{bucket}/train/part-*.parquet"),
            s3.secret_key.clone(),
            vec!["a glob is read only in a local path".into()],
        ),
        (
            "other-files",
            format!("s3://{bucket}/notes/"),
            s3.secret_key.clone(),
            vec![
                format!("s3://{bucket}/notes/README.txt"),
                "not a Parquet file".into(),
            ],
        ),
    ];
    for (topic, location, secret, needles) in cases {
        h.env = s3.env(&secret);
        h.plan("p.sql", &plan_sql(topic, "", &location, ""));
        let subs: Vec<_> = (0..2)
            .map(|_| h.spawn(&["subscribe", topic, "--json", "--timeout", "60"]))
            .collect();
        let out = h.spawn_producer(2, &[]).wait(LIMIT);
        assert_ne!(out.status.code(), Some(0), "{topic}: {}", out.stderr);
        assert!(out.stderr.contains("p.sql:4:1"), "{topic}: {}", out.stderr);
        for needle in &needles {
            assert!(
                out.stderr.contains(needle.as_str()),
                "{topic}: producer error lacks {needle:?}: {}",
                out.stderr
            );
        }
        for sub in subs {
            let got = sub.wait(LIMIT);
            assert_eq!(got.status.code(), Some(3), "{topic}: {}", got.stderr);
            assert!(
                got.stderr.contains("producer failed"),
                "{topic}: {}",
                got.stderr
            );
            for needle in &needles {
                assert!(
                    got.stderr.contains(needle.as_str()),
                    "{topic}: subscriber error lacks {needle:?}: {}",
                    got.stderr
                );
            }
            assert!(!got.stderr.contains(&secret), "{topic}: {}", got.stderr);
        }
    }
    // A plain-HTTP endpoint without AWS_ALLOW_HTTP says which setting allows it.
    h.env = s3.env(&s3.secret_key);
    h.env.retain(|(k, _)| k != "AWS_ALLOW_HTTP");
    h.plan(
        "p.sql",
        &plan_sql("http", "", &format!("s3://{bucket}/train/"), ""),
    );
    let out = h.spawn(&["checksum", "p.sql"]).wait(LIMIT);
    assert_ne!(out.status.code(), Some(0), "{}", out.stderr);
    assert!(out.stderr.contains("AWS_ALLOW_HTTP=true"), "{}", out.stderr);
    // Allowed as object_store allows it (1, on, yes, …), it runs.
    h.env.push(("AWS_ALLOW_HTTP".into(), "yes".into()));
    let out = h.spawn(&["checksum", "p.sql"]).wait(LIMIT);
    assert!(out.status.success(), "{}", out.stderr);
}

/// An object that disappears while it is being streamed fails the run with an error
/// naming it, and the subscribers receive that error instead of a short epoch.
#[test]
fn an_object_lost_mid_stream_fails_the_subscribers_with_its_name() {
    let Some(s3) = S3::server("an_object_lost_mid_stream_fails_the_subscribers_with_its_name")
    else {
        return;
    };
    let (mut h, bucket) = s3.harness_with_train(200_000);
    h.env = s3.env(&s3.secret_key);
    // Two partitions, [part-00, part-01] and [part-02, part-03]; the producer runs at most
    // a window ahead of a slow subscriber, so part-03 is still unread when it is deleted.
    // Read-ahead of one row group at a time: the default 8 MiB would fetch all of
    // part-03 (2.4 MB) while part-02 is read, before the deletion, and the run would
    // rightly succeed. Here its later row groups are fetched in the background after it,
    // and the failed fetch must still reach the subscribers as an error naming it.
    h.plan(
        "p.sql",
        &plan_sql(
            "lost",
            "SET datafusion.execution.target_partitions = 2; SET sluice.window = 2; \
             SET sluice.read_ahead = '1';",
            &format!("s3://{bucket}/train/"),
            "",
        ),
    );
    let subs: Vec<_> = (0..2)
        .map(|_| {
            h.spawn(&[
                "subscribe",
                "lost",
                "--json",
                "--timeout",
                "60",
                "--delay-ms",
                "5",
            ])
        })
        .collect();
    let producer = h.spawn_producer(2, &[]);
    h.wait_for_topic(LIMIT);
    s3.delete(&bucket, "train/part-03.parquet");
    let out = producer.wait(LIMIT);
    assert_eq!(out.status.code(), Some(1), "{}", out.stderr);
    assert!(out.stderr.contains("part-03.parquet"), "{}", out.stderr);
    for sub in subs {
        let got = sub.wait(LIMIT);
        assert_eq!(got.status.code(), Some(3), "{}", got.stderr);
        assert!(
            got.stderr.contains("producer failed") && got.stderr.contains("part-03.parquet"),
            "{}",
            got.stderr
        );
    }
}

/// Checks, for several world sizes, that `checksum --shard RANK/WORLD` over `plan`
/// gives shards that are disjoint and together complete: their row counts add up to
/// the whole and their (additive) checksums to the whole's checksum, so a row read
/// twice or not at all would show. Returns the whole.
fn assert_shards_tile(h: &mut Harness, plan: &str) -> (u64, u128) {
    let whole = checksum(h, plan, &[]);
    for world in [1u64, 2, 3, 5] {
        let (mut rows, mut sum) = (0u64, 0u128);
        let mut nonempty = 0;
        for rank in 0..world {
            let shard = format!("{rank}/{world}");
            let (r, s) = checksum(h, plan, &["--shard", &shard]);
            rows += r;
            sum = sum.wrapping_add(s);
            nonempty += usize::from(r > 0);
        }
        assert_eq!((rows, sum), whole, "world {world}");
        // Enough row groups that every shard gets some.
        assert_eq!(nonempty as u64, world, "world {world}");
    }
    whole
}

/// Shards of local Parquet files are disjoint and complete for world sizes 1, 2, 3 and
/// 5; the plan option `sluice.shard` selects the same rows as `--shard`; and `sluice run
/// --shard` publishes exactly its shard.
#[test]
fn shards_of_local_files_are_disjoint_and_complete() {
    let mut h = Harness::new();
    h.dataset(120_000);
    h.plan("p.sql", &plan_sql("shard-local", "", "data/", ""));
    assert_shards_tile(&mut h, "p.sql");

    h.plan(
        "s.sql",
        &plan_sql("shard-local", "SET sluice.shard = '1/3';", "data/", ""),
    );
    let by_option = checksum(&mut h, "s.sql", &[]);
    assert_eq!(by_option, checksum(&mut h, "p.sql", &["--shard", "1/3"]));
    let (rows, sum) = by_option;

    let sub = h.spawn(&["subscribe", "shard-local", "--json", "--timeout", "60"]);
    let producer = h.spawn(&[
        "run",
        "p.sql",
        "--quiet",
        "--shard",
        "1/3",
        "--min-subscribers",
        "1",
        "--wait-timeout",
        "60",
    ]);
    assert_exactly_once(&sub.wait(LIMIT), 1, rows, &format!("{sum:032x}"));
    assert!(producer.wait(LIMIT).status.success());

    let out = h.run(&["checksum", "p.sql", "--shard", "3/3"]);
    assert_eq!(out.status.code(), Some(2), "{}", out.stderr);
    assert!(out.stderr.contains("RANK/WORLD"), "{}", out.stderr);
}

/// Shards read from S3 are disjoint and complete for world sizes 1, 2, 3 and 5, and
/// match the local shards' total.
#[test]
fn shards_over_s3_are_disjoint_and_complete() {
    let Some(s3) = S3::server("shards_over_s3_are_disjoint_and_complete") else {
        return;
    };
    let (mut h, bucket) = s3.harness_with_train(120_000);
    h.env = s3.env(&s3.secret_key);
    h.plan("local.sql", &plan_sql("x", "", "data/", ""));
    h.plan(
        "p.sql",
        &plan_sql("x", "", &format!("s3://{bucket}/train/"), ""),
    );
    let whole = assert_shards_tile(&mut h, "p.sql");
    assert_eq!(whole, checksum(&mut h, "local.sql", &[]));
}

/// A remote Ballista cluster (`sluice ballista scheduler` and `executor` processes, with
/// no S3 credentials in their environment) reads a table from S3 with the credentials the
/// plan declares: they travel with the job, and the checksum matches the local files'.
/// The secret shows in nothing the producer prints.
#[test]
fn a_remote_ballista_cluster_reads_s3_with_the_plans_credentials() {
    let Some(s3) = S3::server("a_remote_ballista_cluster_reads_s3_with_the_plans_credentials")
    else {
        return;
    };
    let (mut h, bucket) = s3.harness_with_train(4_000);
    let scheduler = crate::ballista::start_cluster(&mut h);
    let options = format!(
        " OPTIONS ('aws.access_key_id' '{}', 'aws.secret_access_key' '{}', \
         'aws.endpoint' '{}', 'aws.allow_http' 'true', 'aws.region' 'us-east-1')",
        s3.access_key, s3.secret_key, s3.endpoint
    );
    h.plan("local.sql", &plan_sql("bs3", "", "data/", ""));
    h.plan(
        "remote.sql",
        &plan_sql(
            "bs3",
            &format!("SET sluice.engine = 'ballista://127.0.0.1:{scheduler}';"),
            &format!("s3://{bucket}/train/"),
            &options,
        ),
    );
    let want = checksum(&mut h, "local.sql", &[]);
    let out = h.run(&["checksum", "remote.sql", "--json"]);
    assert!(out.status.success(), "{}", out.stderr);
    assert!(!all_output(&out).contains(&s3.secret_key));
    let v = &out.json_lines()[0];
    let got = (
        v["rows"].as_u64().unwrap(),
        u128::from_str_radix(v["checksum"].as_str().unwrap(), 16).unwrap(),
    );
    assert_eq!(got, want);
}
