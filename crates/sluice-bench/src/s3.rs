//! Comparison 6: the same Parquet dataset streamed from a loopback S3 server and from
//! local disk.
//!
//! The server is the one the test command uses: the `SLUICE_TEST_S3_*` variables of
//! `scripts/s3-server.sh` when set, or else `sluice-s3-test-server` (s3s-fs, a member of
//! this workspace) from the directory of this executable, started here on 127.0.0.1 and
//! stopped at the end. Without either the comparison is skipped, and the report says why.
//!
//! Comparisons 6b and 6c (against pyarrow's scan of the same files, without and with
//! latency) run on the same servers, and the sections of all three are rendered here.

use std::fmt::Write as _;
use std::io::BufRead;
use std::path::{Path, PathBuf};
use std::process::{Child, Command, Stdio};
use std::time::Instant;

use anyhow::{Context, Result, bail};
use futures::StreamExt;
use object_store::ObjectStoreExt;
use object_store::aws::AmazonS3Builder;
use sluice::core::Shaper;
use sluice::prelude::*;

use crate::data::{Dataset, plan_sql};
use crate::plot;
use crate::python;
use crate::report::{Report, ratio_summary};
use crate::stats::Summary;
use crate::{BATCH_ROWS, Bench};

/// An S3-compatible server to read from.
pub struct S3Server {
    endpoint: String,
    access_key: String,
    secret_key: String,
    root: PathBuf,
    /// What it is, for the report.
    pub description: String,
    child: Option<Child>,
    /// The server's `--request-log` (only a server started here has one).
    log: Option<PathBuf>,
    _dir: Option<tempfile::TempDir>,
}

/// What a client asked the server for during one pass (planning or discovery included).
#[derive(Debug, Clone, Copy, Default)]
pub struct Requests {
    pub gets: u64,
    pub heads: u64,
    pub lists: u64,
    /// Response bytes (`Content-Length`), of every request.
    pub bytes: u64,
    /// The most requests being answered at the same moment (up to their headers).
    pub most_at_once: u64,
}

impl S3Server {
    /// The server of `scripts/s3-server.sh`, or one started from the
    /// `sluice-s3-test-server` built next to this executable; `Err` says why there is
    /// none.
    pub fn find() -> Result<Self, String> {
        let var = |k: &str| std::env::var(k).ok().filter(|v| !v.is_empty());
        if let (Some(endpoint), Some(access_key), Some(secret_key), Some(root)) = (
            var("SLUICE_TEST_S3_ENDPOINT"),
            var("SLUICE_TEST_S3_ACCESS_KEY"),
            var("SLUICE_TEST_S3_SECRET_KEY"),
            var("SLUICE_TEST_S3_ROOT"),
        ) {
            return Ok(Self {
                description: format!("the server of scripts/s3-server.sh at {endpoint}"),
                endpoint,
                access_key,
                secret_key,
                root: root.into(),
                child: None,
                log: None,
                _dir: None,
            });
        }
        Self::started(0)
    }

    /// A server started here from `sluice-s3-test-server` that delays every
    /// response by `latency_ms`; `Err` says why there is none.
    pub fn started(latency_ms: u64) -> Result<Self, String> {
        let bin = std::env::current_exe()
            .map_err(|e| format!("cannot locate this executable: {e}"))?
            .with_file_name("sluice-s3-test-server");
        if !bin.exists() {
            return Err(format!(
                "no S3 server: {} is not built (`cargo build --release -p sluice-s3-test-server` \
                 builds it) and SLUICE_TEST_S3_ENDPOINT is not set",
                bin.display()
            ));
        }
        Self::spawn(&bin, latency_ms)
            .map_err(|e| format!("the S3 test server did not start: {e:#}"))
    }

    fn spawn(bin: &Path, latency_ms: u64) -> Result<Self> {
        let dir = tempfile::tempdir()?;
        let mut random = [0u8; 16];
        std::fs::File::open("/dev/urandom")
            .and_then(|mut f| std::io::Read::read_exact(&mut f, &mut random))
            .context("cannot read /dev/urandom")?;
        let hex: String = random.iter().map(|b| format!("{b:02x}")).collect();
        let access_key = format!("sluice-bench-{}", &hex[..8]);
        let secret_key = format!("sluice-bench-secret-{hex}");
        // The server picks a free port and prints it; its standard input is a pipe that
        // closes when this process exits, so it cannot outlive the benchmark.
        let log = dir.path().join("requests.log");
        let data = dir.path().join("data");
        std::fs::create_dir(&data)?;
        let mut child = Command::new(bin)
            .args(["--host", "127.0.0.1", "--port", "0", "--exit-on-stdin-eof"])
            .arg("--request-log")
            .arg(&log)
            .args(["--latency-ms", &latency_ms.to_string()])
            .args(["--access-key", &access_key, "--secret-key", &secret_key])
            .arg(&data)
            .stdin(Stdio::piped())
            .stdout(Stdio::piped())
            .stderr(Stdio::null())
            .spawn()
            .with_context(|| format!("cannot run {}", bin.display()))?;
        let stdout = child.stdout.take().context("the server's stdout")?;
        let mut line = String::new();
        std::io::BufReader::new(stdout)
            .read_line(&mut line)
            .context("reading the server's address")?;
        let Some(endpoint) = line.trim().strip_prefix("listening on ") else {
            let _ = child.kill();
            let _ = child.wait();
            bail!("it printed {line:?} instead of its address");
        };
        Ok(Self {
            endpoint: endpoint.to_string(),
            access_key,
            secret_key,
            root: data,
            log: Some(log),
            description: format!(
                "s3s-fs ({}) on {endpoint}, started by the benchmark{}",
                bin.display(),
                if latency_ms > 0 {
                    format!(", with {latency_ms} ms added to every response")
                } else {
                    String::new()
                }
            ),
            child: Some(child),
            _dir: Some(dir),
        })
    }

    /// Uploads the dataset's files under `bucket/prefix/`; returns the table location
    /// and its `OPTIONS` clause.
    pub fn upload(&self, data: &Dataset, prefix: &str) -> Result<(String, String)> {
        let bucket = "bench";
        let bucket_dir = self.root.join(bucket);
        std::fs::create_dir_all(&bucket_dir)
            .with_context(|| format!("cannot create the bucket {}", bucket_dir.display()))?;
        let store = AmazonS3Builder::new()
            .with_endpoint(&self.endpoint)
            .with_allow_http(true)
            .with_region("us-east-1")
            .with_bucket_name(bucket)
            .with_access_key_id(&self.access_key)
            .with_secret_access_key(&self.secret_key)
            .build()
            .context("S3 client")?;
        let rt = tokio::runtime::Runtime::new()?;
        for f in &data.files {
            let name = f
                .file_name()
                .and_then(|n| n.to_str())
                .context("file name")?;
            let bytes = std::fs::read(f)?;
            rt.block_on(store.put(&format!("{prefix}/{name}").as_str().into(), bytes.into()))
                .with_context(|| format!("cannot upload {name}"))?;
        }
        let options = format!(
            " OPTIONS ('aws.endpoint' '{}', 'aws.allow_http' 'true', 'aws.region' 'us-east-1', \
             'aws.access_key_id' '{}', 'aws.secret_access_key' '{}')",
            self.endpoint, self.access_key, self.secret_key
        );
        Ok((format!("s3://{bucket}/{prefix}/"), options))
    }
}

impl S3Server {
    /// pyarrow's scan of what [`S3Server::upload`] put under `prefix` (rows/s).
    pub fn pyarrow_pass(
        &self,
        python: &crate::python::Python,
        repo: &Path,
        data: &Dataset,
        prefix: &str,
        batch_rows: usize,
    ) -> Result<f64> {
        let paths = data
            .files
            .iter()
            .filter_map(|f| f.file_name()?.to_str())
            .map(|name| format!("bench/{prefix}/{name}"))
            .collect::<Vec<_>>()
            .join(",");
        crate::python::pyarrow_s3_pass(
            python,
            repo,
            &self.endpoint,
            (&self.access_key, &self.secret_key),
            &paths,
            batch_rows,
            data.rows,
        )
    }
}

impl S3Server {
    /// Where the request log ends now: what [`S3Server::requests`] counts from.
    pub fn log_mark(&self) -> u64 {
        self.log
            .as_ref()
            .and_then(|l| std::fs::metadata(l).ok())
            .map_or(0, |m| m.len())
    }

    /// The requests logged since `mark`; `None` without a log.
    pub fn requests(&self, mark: u64) -> Option<Requests> {
        let text = std::fs::read(self.log.as_ref()?).ok()?;
        let text = String::from_utf8_lossy(text.get(mark as usize..)?).into_owned();
        let mut r = Requests::default();
        let mut edges = Vec::new();
        for line in text.lines() {
            let f: Vec<&str> = line.split_whitespace().collect();
            let [start, end, _method, kind, bytes] = f[..] else {
                continue;
            };
            let (Ok(start), Ok(end), Ok(bytes)) = (
                start.parse::<u64>(),
                end.parse::<u64>(),
                bytes.parse::<u64>(),
            ) else {
                continue;
            };
            match kind {
                "get" => r.gets += 1,
                "head" => r.heads += 1,
                "list" => r.lists += 1,
                _ => {}
            }
            r.bytes += bytes;
            // Ends sort before starts at the same instant: back-to-back is not at once.
            edges.push((start, 1i64));
            edges.push((end, -1i64));
        }
        edges.sort();
        let mut now = 0i64;
        for (_, d) in edges {
            now += d;
            r.most_at_once = r.most_at_once.max(now.max(0) as u64);
        }
        Some(r)
    }
}

impl Drop for S3Server {
    fn drop(&mut self) {
        if let Some(child) = &mut self.child {
            let _ = child.kill();
            let _ = child.wait();
        }
    }
}

/// Streams one epoch of the table at `location` through the producer's pipeline without
/// shared memory (plan, DataFusion scan, re-batching); returns rows/s of the scan.
/// `settings` are `SET` statements put before the plan's own.
pub fn pass(
    location: &str,
    options: &str,
    settings: &str,
    batch_rows: usize,
    expected_rows: u64,
) -> Result<f64> {
    let rt = tokio::runtime::Runtime::new()?;
    rt.block_on(async {
        let sql = format!(
            "{settings}{}",
            plan_sql("unused", location, options, batch_rows, 1)
        );
        let plan = Plan::from_sql("bench.sql", &sql).await?;
        let opts = plan.options().clone();
        let start = Instant::now();
        let mut shaper = Shaper::new(opts.batch_rows, 0, opts.shuffle())?;
        let mut stream = plan.execute_epoch(0).await?;
        let mut rows = 0u64;
        while let Some(batch) = stream.next().await {
            for b in shaper.push(batch?)? {
                rows += b.num_rows() as u64;
            }
        }
        for b in shaper.finish()? {
            rows += b.num_rows() as u64;
        }
        if rows != expected_rows {
            bail!("read {rows} rows from {location}, not {expected_rows}");
        }
        Ok::<_, anyhow::Error>(rows as f64 / start.elapsed().as_secs_f64())
    })
}

/// The goal of comparison 6b, in the report's table of goals.
const S3_GOAL: &str =
    "loopback S3 scan: Sluice against pyarrow's S3 dataset scan of the same files, same server";

/// Comparisons 6, 6b and 6c: S3 against local files and against pyarrow.
pub(crate) fn compare(bench: &Bench<'_>, report: &mut Report) -> Result<()> {
    let (repo, data, scale) = (bench.repo, bench.data, bench.scale);
    eprintln!("6. S3 against local files");
    match S3Server::find() {
        Ok(server) => {
            let (location, options) = server.upload(data, "data")?;
            let local = format!("{}/", data.dir.display());
            let mut python = python::Python::find(repo, "pyarrow.dataset, pyarrow.fs");
            let (runs, pyarrow, requests) = passes(
                &server,
                (&location, &options),
                Some(&local),
                &mut python,
                repo,
                data,
                scale.reps,
            )?;
            report.s3(&server.description, &runs, bench.img, bench.plots)?;
            match &python {
                Ok(_) => report.s3_pyarrow(None, &pyarrow, &requests, data.files.len())?,
                Err(why) => {
                    report.skipped("6b. S3: Sluice against pyarrow", why);
                    report.goal(S3_GOAL.into(), "skipped".into(), "≥ 1.0", None);
                }
            }
        }
        Err(why) => {
            report.skipped("6. S3 against local files", &why);
            report.goal(S3_GOAL.into(), "skipped".into(), "≥ 1.0", None);
        }
    }
    // A real store answers in tens of milliseconds, not in the loopback server's fraction
    // of one: what read-ahead is for.
    match (
        S3Server::started(S3_LATENCY_MS),
        python::Python::find(repo, "pyarrow.dataset, pyarrow.fs"),
    ) {
        (Ok(server), Ok(py)) => {
            let (location, options) = server.upload(data, "data")?;
            let mut python = Ok(py);
            let (_, pyarrow, requests) = passes(
                &server,
                (&location, &options),
                None,
                &mut python,
                repo,
                data,
                scale.reps,
            )?;
            match python {
                Ok(_) => {
                    report.s3_pyarrow(Some(S3_LATENCY_MS), &pyarrow, &requests, data.files.len())?
                }
                Err(why) => report.skipped("6c. S3 with latency", &why),
            }
        }
        (Err(why), _) | (_, Err(why)) => report.skipped("6c. S3 with latency", &why),
    }

    Ok(())
}

/// Comparison 6b's request counts (from the server's log, when it has one).
#[derive(Debug, Default)]
struct S3Requests {
    sluice: Option<Requests>,
    no_read_ahead: Option<Requests>,
    pyarrow: Option<Requests>,
}

/// Milliseconds comparison 6c's server adds to every response.
const S3_LATENCY_MS: u64 = 20;

/// Comparison 6's passes over `server`, `reps` times: (local rows/s, Sluice rows/s) when
/// `local` is given, (Sluice, pyarrow, Sluice without read-ahead) rows/s while `python`
/// works (it becomes the reason when pyarrow fails), and the last repetition's requests.
#[allow(clippy::type_complexity)]
fn passes(
    server: &S3Server,
    (location, options): (&str, &str),
    local: Option<&str>,
    python: &mut Result<python::Python, String>,
    repo: &Path,
    data: &Dataset,
    reps: usize,
) -> Result<(Vec<(f64, f64)>, Vec<(f64, f64, f64)>, S3Requests)> {
    let mut runs = Vec::new();
    let mut pyarrow = Vec::new();
    let mut requests = S3Requests::default();
    for _ in 0..reps {
        let l = match local {
            Some(local) => Some(pass(local, "", "", BATCH_ROWS, data.rows)?),
            None => None,
        };
        let mark = server.log_mark();
        let s = pass(location, options, "", BATCH_ROWS, data.rows)?;
        requests.sluice = server.requests(mark);
        if let Some(l) = l {
            runs.push((l, s));
        }
        if let Ok(py) = &*python {
            // The same pass without read-ahead: what `sluice.read_ahead` gains.
            let mark = server.log_mark();
            let off = pass(
                location,
                options,
                "SET sluice.read_ahead = '0';\n",
                BATCH_ROWS,
                data.rows,
            )?;
            requests.no_read_ahead = server.requests(mark);
            let mark = server.log_mark();
            match server.pyarrow_pass(py, repo, data, "data", BATCH_ROWS) {
                Ok(p) => {
                    requests.pyarrow = server.requests(mark);
                    pyarrow.push((s, p, off));
                }
                Err(e) => *python = Err(format!("pyarrow's scan failed: {e:#}")),
            }
        }
    }
    Ok((runs, pyarrow, requests))
}

impl Report {
    /// Comparison 6's section and its plot.
    fn s3(&mut self, server: &str, runs: &[(f64, f64)], img: &Path, plots: bool) -> Result<()> {
        let b = &mut self.body;
        writeln!(b, "\n## 6. S3 against local files\n")?;
        writeln!(
            b,
            "The dataset streamed once per pass through the producer's pipeline without shared memory (plan, \
             DataFusion scan, re-batching), from local disk and from {server} (the same files, uploaded). \
             Baseline: local disk in the same repetition. More detail (requests, bytes, memory): \
             `cargo bench -p sluice-cli --bench object_store`.\n"
        )?;
        let l = Summary::of(&runs.iter().map(|r| r.0).collect::<Vec<_>>());
        let s = Summary::of(&runs.iter().map(|r| r.1).collect::<Vec<_>>());
        let ratio = ratio_summary(runs.iter().map(|r| (r.1, r.0)));
        writeln!(b, "| source | rows/s | vs local |")?;
        writeln!(b, "|---|---:|---:|")?;
        writeln!(b, "| local disk | {} | 1.00 |", l.show_count())?;
        writeln!(
            b,
            "| S3 (loopback) | {} | **{}** |",
            s.show_count(),
            ratio.show(2)
        )?;
        self.summary.push(format!(
            "S3 (loopback) streams at {:.2} of local disk",
            ratio.median
        ));
        let mb = |v: Summary| Summary {
            median: v.median / 1e6,
            min: v.min / 1e6,
            max: v.max / 1e6,
            n: v.n,
        };
        self.image(plots, img, "bench-s3.png", "S3 against local files", |p| {
            plot::bars(
                p,
                "Scan rate: S3 (loopback) against local disk",
                "million rows/s",
                &[
                    ("local disk".into(), mb(l)),
                    ("S3 (loopback)".into(), mb(s)),
                ],
            )
        })
    }

    /// Comparison 6b's section (6c's with `latency_ms`): Sluice against pyarrow on the same
    /// server.
    fn s3_pyarrow(
        &mut self,
        latency_ms: Option<u64>,
        runs: &[(f64, f64, f64)],
        requests: &S3Requests,
        files: usize,
    ) -> Result<()> {
        let b = &mut self.body;
        if let Some(ms) = latency_ms {
            writeln!(
                b,
                "\n### 6c. S3 with {ms} ms of latency: Sluice against pyarrow\n"
            )?;
            writeln!(
                b,
                "As 6b, on a second server started with `--latency-ms {ms}`: every response \
                 waits {ms} ms, a loopback stand-in for the first-byte latency of a real object \
                 store, where every request round trip counts.\n"
            )?;
        } else {
            writeln!(b, "\n### 6b. S3: Sluice against pyarrow\n")?;
        }
        writeln!(
            b,
            "The same files on the same server, in the same repetition: pyarrow's S3 dataset scan \
             (`pyarrow.dataset` over `pyarrow.fs.S3FileSystem`, the same four columns, {BATCH_ROWS}-row \
             batches, one Python process) against Sluice's pass above, and the same pass with \
             `sluice.read_ahead = '0'`. All are timed after planning (Sluice) or dataset discovery \
             (pyarrow). Requests, bytes and concurrency come from the server's request log, for the \
             whole pass of the last repetition, planning or discovery included ({files} files).\n"
        )?;
        let s = Summary::of(&runs.iter().map(|r| r.0).collect::<Vec<_>>());
        let p = Summary::of(&runs.iter().map(|r| r.1).collect::<Vec<_>>());
        let o = Summary::of(&runs.iter().map(|r| r.2).collect::<Vec<_>>());
        let ratio = ratio_summary(runs.iter().map(|r| (r.0, r.1)));
        let off_ratio = ratio_summary(runs.iter().map(|r| (r.2, r.1)));
        let show = |r: Option<Requests>| match r {
            Some(r) => format!(
                "{} | {} | {} | {:.1} MiB | {}",
                r.gets,
                r.heads,
                r.lists,
                r.bytes as f64 / (1 << 20) as f64,
                r.most_at_once
            ),
            None => "– | – | – | – | –".into(),
        };
        writeln!(
            b,
            "| reader | rows/s | vs pyarrow | GETs | HEADs | LISTs | bytes | most requests at once |"
        )?;
        writeln!(b, "|---|---:|---:|---:|---:|---:|---:|---:|")?;
        writeln!(
            b,
            "| pyarrow S3 dataset scan | {} | 1.00 | {} |",
            p.show_count(),
            show(requests.pyarrow)
        )?;
        writeln!(
            b,
            "| Sluice (DataFusion + object_store, read-ahead) | {} | **{}** | {} |",
            s.show_count(),
            ratio.show(2),
            show(requests.sluice)
        )?;
        writeln!(
            b,
            "| Sluice without read-ahead | {} | {} | {} |",
            o.show_count(),
            off_ratio.show(2),
            show(requests.no_read_ahead)
        )?;
        if latency_ms.is_none() {
            self.goals.push((
                S3_GOAL.into(),
                format!("{}×", ratio.show_against(1.0, 2)),
                "≥ 1.0",
                Some(ratio.median >= 1.0),
            ));
        }
        Ok(())
    }
}
