//! Comparison 8: Python trainers on one Sluice producer against Python processes that
//! each load the data themselves (`benches/python_loaders.py`: the demo dataset with a
//! numpy transform; `benches/image_pipeline.py`: the image pipeline with Pillow + numpy),
//! and the Python side of comparison 6 (pyarrow's S3 dataset scan).
//!
//! They need a Python with the Sluice wheel (an optimised build: `maturin develop
//! --release`, or the wheel of `scripts/gpu-check.sh`), pyarrow, numpy and Pillow (the
//! test virtualenv `.venv` has all but an optimised wheel), and the `sluice` binary next
//! to this executable (`cargo build --release -p sluice-cli`). Without them the
//! comparison is skipped and the report says why.

use std::path::{Path, PathBuf};
use std::process::{Command, Stdio};
use std::time::{Duration, Instant};

use anyhow::{Context, Result, bail};

/// A Python that has what the Python comparisons import.
pub struct Python {
    pub exe: PathBuf,
}

impl Python {
    /// `.venv/bin/python` of the repository, or `python3`, if it imports `modules`.
    pub fn find(repo: &Path, modules: &str) -> Result<Self, String> {
        let venv = repo.join(".venv/bin/python");
        let exe: PathBuf = if venv.exists() {
            venv
        } else {
            "python3".into()
        };
        let out = Command::new(&exe)
            .args(["-c", &format!("import {modules}")])
            .stdout(Stdio::null())
            .stderr(Stdio::piped())
            .output()
            .map_err(|e| format!("cannot run {}: {e}", exe.display()))?;
        if !out.status.success() {
            let err = String::from_utf8_lossy(&out.stderr);
            return Err(format!(
                "{} cannot import {modules}: {}",
                exe.display(),
                err.lines().last().unwrap_or("").trim()
            ));
        }
        Ok(Self { exe })
    }

    /// Whether the installed Sluice wheel is an optimised build.
    pub fn sluice_optimized(&self) -> Result<(), String> {
        let out = Command::new(&self.exe)
            .args(["-c", "import sluice._sluice as s; print(s._optimized)"])
            .output()
            .map_err(|e| format!("cannot run {}: {e}", self.exe.display()))?;
        match String::from_utf8_lossy(&out.stdout).trim() {
            "True" => Ok(()),
            "False" => Err(format!(
                "the Sluice wheel in {} is a debug build (the test wheel); install an optimised one: \
                 `.venv/bin/maturin develop --release -m crates/sluice-python/Cargo.toml`",
                self.exe.display()
            )),
            _ => Err(format!(
                "the Sluice wheel in {} predates the `_optimized` flag; reinstall it",
                self.exe.display()
            )),
        }
    }

    /// Runs `script args…` with a deadline; returns its standard output.
    pub fn run(&self, repo: &Path, args: &[&str], deadline: Duration) -> Result<String> {
        let dir = tempfile::tempdir()?;
        let log = dir.path().join("stderr");
        let out = dir.path().join("stdout");
        let mut child = Command::new(&self.exe)
            .args(args)
            .current_dir(repo)
            .stdout(std::fs::File::create(&out)?)
            .stderr(std::fs::File::create(&log)?)
            .spawn()
            .with_context(|| format!("cannot run {}", self.exe.display()))?;
        let end = Instant::now() + deadline;
        loop {
            if let Some(status) = child.try_wait()? {
                if !status.success() {
                    let err = std::fs::read_to_string(&log).unwrap_or_default();
                    bail!(
                        "{} {} failed ({status}): {}",
                        self.exe.display(),
                        args.join(" "),
                        err.lines().last().unwrap_or("")
                    );
                }
                return Ok(std::fs::read_to_string(&out)?);
            }
            if Instant::now() > end {
                let _ = child.kill();
                let _ = child.wait();
                bail!("{} did not finish in {deadline:?}", args.join(" "));
            }
            std::thread::sleep(Duration::from_millis(100));
        }
    }
}

/// The `sluice` binary next to this executable.
pub fn sluice_binary() -> Result<PathBuf, String> {
    let bin = std::env::current_exe()
        .map_err(|e| format!("cannot locate this executable: {e}"))?
        .with_file_name("sluice");
    if bin.exists() {
        Ok(bin)
    } else {
        Err(format!(
            "{} is not built (`cargo build --release -p sluice-cli` builds it)",
            bin.display()
        ))
    }
}

/// What the two scripts measured (their JSON output).
pub struct Trainers {
    pub loaders: serde_json::Value,
    pub images: serde_json::Value,
}

/// Runs `benches/python_loaders.py` once and `benches/image_pipeline.py` with its
/// N-trainer comparison repeated `reps` times (its goal is judged on the median).
pub fn run(
    repo: &Path,
    python: &Python,
    sluice: &Path,
    quick: bool,
    reps: usize,
) -> Result<Trainers> {
    let dir = tempfile::tempdir()?;
    let loaders = dir.path().join("loaders.json");
    let images = dir.path().join("images.json");
    let sluice = sluice.to_string_lossy();
    let rows = if quick { "50000" } else { "200000" };
    python.run(
        repo,
        &[
            "benches/python_loaders.py",
            "--sluice",
            &sluice,
            "--rows",
            rows,
            "--trainers",
            "1",
            "2",
            "4",
            "--json",
            &loaders.to_string_lossy(),
        ],
        Duration::from_secs(900),
    )?;
    let count = if quick { "600" } else { "3000" };
    let reps = reps.max(1).to_string();
    python.run(
        repo,
        &[
            "benches/image_pipeline.py",
            "--sluice",
            &sluice,
            "--images",
            count,
            "--trainers",
            "4",
            "--reps",
            &reps,
            "--json",
            &images.to_string_lossy(),
        ],
        Duration::from_secs(900),
    )?;
    let read = |p: &Path| -> Result<serde_json::Value> {
        let text =
            std::fs::read_to_string(p).with_context(|| format!("no output in {}", p.display()))?;
        serde_json::from_str(&text).with_context(|| format!("{} is not JSON", p.display()))
    };
    Ok(Trainers {
        loaders: read(&loaders)?,
        images: read(&images)?,
    })
}

/// pyarrow's S3 dataset scan of `paths` (`bucket/key`, comma-separated) on the server at
/// `endpoint` (the same columns and batch size as Sluice's pass); rows/s, timed from the
/// first batch request (after the dataset's discovery, as Sluice's pass is timed after
/// planning).
pub fn pyarrow_s3_pass(
    python: &Python,
    repo: &Path,
    endpoint: &str,
    keys: (&str, &str),
    paths: &str,
    batch_rows: usize,
    expected_rows: u64,
) -> Result<f64> {
    const SCAN: &str = r#"
import sys, time, pyarrow.dataset as ds, pyarrow.fs as fs
endpoint, ak, sk, paths, batch, expected = sys.argv[1:7]
scheme, _, host = endpoint.partition("://")
s3 = fs.S3FileSystem(access_key=ak, secret_key=sk, endpoint_override=host, scheme=scheme, region="us-east-1")
# The files by name: discovering a prefix makes pyarrow HEAD it as an object first,
# which the test server answers with a 500.
dataset = ds.dataset(paths.split(","), format="parquet", filesystem=s3)
start, rows = time.perf_counter(), 0
for b in dataset.to_batches(columns=["id", "label", "text", "features"], batch_size=int(batch)):
    rows += b.num_rows
elapsed = time.perf_counter() - start
assert rows == int(expected), (rows, expected)
print(rows / elapsed)
"#;
    let out = python.run(
        repo,
        &[
            "-c",
            SCAN,
            endpoint,
            keys.0,
            keys.1,
            paths,
            &batch_rows.to_string(),
            &expected_rows.to_string(),
        ],
        Duration::from_secs(300),
    )?;
    out.trim()
        .parse()
        .with_context(|| format!("pyarrow's scan printed {out:?}"))
}
