//! Comparison 6: the same Parquet dataset streamed from a loopback S3 server and from
//! local disk.
//!
//! The server is the one the test command uses: the `SLUICE_TEST_S3_*` variables of
//! `scripts/s3-server.sh` when set, or else `sluice-s3-test-server` (s3s-fs, a member of
//! this workspace) from the directory of this executable, started here on 127.0.0.1 and
//! stopped at the end. Without either the comparison is skipped, and the report says why.

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
