//! Comparison 8: Python trainers on one Sluice producer against Python processes that
//! each load the data themselves (`benches/python_loaders.py`: the demo dataset with a
//! numpy transform; `benches/image_pipeline.py`: the image pipeline with Pillow + numpy;
//! `benches/shared_loader.py`: a Python image loader shared with `sluice.publish`),
//! and the Python side of comparison 6 (pyarrow's S3 dataset scan).
//!
//! They need a Python with the Sluice wheel (an optimised build: `maturin develop
//! --release`, or the wheel of `scripts/gpu-check.sh`), pyarrow, numpy and Pillow (the
//! test virtualenv `.venv` has all but an optimised wheel), and the `sluice` binary next
//! to this executable (`cargo build --release -p sluice-cli`). Without them the
//! comparison is skipped and the report says why. Comparison 8's section of the report is
//! rendered here.

use std::fmt::Write as _;
use std::path::{Path, PathBuf};
use std::process::{Command, Stdio};
use std::time::{Duration, Instant};

use anyhow::{Context, Result, bail};

use crate::Bench;
use crate::report::Report;
use crate::stats::{self, Summary};

/// A Python that has what the Python comparisons import.
pub struct Python {
    pub exe: PathBuf,
}

impl Python {
    /// `SLUICE_BENCH_PYTHON` (a virtualenv with torch and TensorSocket, say), else
    /// `.venv/bin/python` of the repository, else `python3`, if it imports `modules`.
    pub fn find(repo: &Path, modules: &str) -> Result<Self, String> {
        let venv = repo.join(".venv/bin/python");
        let exe: PathBuf = match std::env::var_os("SLUICE_BENCH_PYTHON") {
            Some(exe) => exe.into(),
            None if venv.exists() => venv,
            None => "python3".into(),
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

/// What the three scripts measured (their JSON output).
pub struct Trainers {
    pub loaders: serde_json::Value,
    pub images: serde_json::Value,
    pub shared: serde_json::Value,
}

/// Runs `benches/python_loaders.py` once, `benches/image_pipeline.py` with its
/// N-trainer comparison repeated `reps` times (its goal is judged on the median), and
/// `benches/shared_loader.py` once.
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
    let shared = dir.path().join("shared.json");
    python.run(
        repo,
        &[
            "benches/shared_loader.py",
            "--images",
            count,
            "--trainers",
            "1",
            "2",
            "4",
            "--json",
            &shared.to_string_lossy(),
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
        shared: read(&shared)?,
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

pub(crate) const IMAGE_GOAL: &str =
    "image pipeline, 4 Python trainers against 4 independent Python loaders, CPU-seconds";
pub(crate) const SHARED_RATE_GOAL: &str = "a Python loader shared with sluice.publish, N = 4: samples/s per trainer against one loader alone";
pub(crate) const SHARED_CPU_GOAL: &str =
    "a Python loader shared with sluice.publish, N = 4: CPU-seconds against 4 independent loaders";

/// Comparison 8: measures it and renders its section.
pub(crate) fn compare(bench: &Bench<'_>, report: &mut Report) -> Result<()> {
    let repo = bench.repo;
    bench.step("8. Python trainers against Python loaders");
    let found = Python::find(repo, "sluice, numpy, pyarrow, PIL").and_then(|py| {
        py.sluice_optimized()?;
        let sluice = sluice_binary()?;
        run(repo, &py, &sluice, bench.quick, bench.scale.reps).map_err(|e| format!("{e:#}"))
    });
    match found {
        Ok(trainers) => report.python(&trainers)?,
        Err(why) => {
            report.skipped("8. Python trainers against Python loaders", &why);
            report.goal(IMAGE_GOAL.into(), "skipped".into(), "≤ 0.35", None);
            report.goal(SHARED_RATE_GOAL.into(), "skipped".into(), "≥ 0.90", None);
            report.goal(SHARED_CPU_GOAL.into(), "skipped".into(), "≤ 0.35", None);
        }
    }
    Ok(())
}

impl Report {
    /// Comparison 8's section.
    fn python(&mut self, t: &Trainers) -> Result<()> {
        let b = &mut self.body;
        writeln!(b, "\n## 8. Python trainers against Python loaders\n")?;
        loaders_table(b, &t.loaders)?;
        let ratio = images_table(b, &t.images)?;
        self.goals.push((
            IMAGE_GOAL.into(),
            ratio.show_against(0.35, 2),
            "≤ 0.35",
            Some(ratio.median <= 0.35),
        ));
        let (rate, cpu) = shared_table(&mut self.body, &t.shared)?;
        self.goals.push((
            SHARED_RATE_GOAL.into(),
            format!("{rate:.2}"),
            "≥ 0.90",
            Some(rate >= 0.9),
        ));
        self.goals.push((
            SHARED_CPU_GOAL.into(),
            format!("{cpu:.2}"),
            "≤ 0.35",
            Some(cpu <= 0.35),
        ));
        Ok(())
    }
}

/// `benches/shared_loader.py`'s paragraph and table. Returns, at the largest N, the
/// trainers' samples/s against one loader alone and the CPU against the loaders.
fn shared_table(b: &mut String, shared: &serde_json::Value) -> Result<(f64, f64)> {
    let alone = number(shared, &["alone"]);
    writeln!(
        b,
        "\n`benches/shared_loader.py`, one run: {} JPEGs, {} epoch(s), a Python image loader \
         ({}; decode, random crop, resize to 112, flip, normalise, batches of 64) shared with \
         `sluice.publish` against each trainer running its own; one loader alone: {:.0} \
         samples/s. Samples/s of the slowest trainer; CPU-seconds of all processes, \
         start-up included.\n",
        shared["images"],
        shared["epochs"].as_u64().unwrap_or(1),
        shared["loader"].as_str().unwrap_or("?"),
        alone
    )?;
    writeln!(
        b,
        "TensorSocket 0.0.5 wrapping the same loader: {} (each consumer stops after {} s).\n",
        shared["tensorsocket"].as_str().unwrap_or("not measured"),
        shared["tensorsocket_budget_s"]
    )?;
    writeln!(
        b,
        "| N | loaders: samples/s each | CPU-s | Sluice: samples/s each | against one alone | CPU-s | CPU Sluice / loaders | TensorSocket: samples/s each (samples) | CPU-s |"
    )?;
    writeln!(b, "|---:|---:|---:|---:|---:|---:|---:|---:|---:|")?;
    let mut last = (f64::NAN, f64::NAN);
    for run in shared["runs"].as_array().into_iter().flatten() {
        let (ind, ind_cpu) = (
            number(run, &["independent"]),
            number(run, &["independent_cpu"]),
        );
        let (sl, sl_cpu) = (number(run, &["sluice"]), number(run, &["sluice_cpu"]));
        let ts = match run.get("tensorsocket") {
            Some(_) => format!(
                "{:.0} ({}) | {:.1}",
                number(run, &["tensorsocket"]),
                run["tensorsocket_samples"],
                number(run, &["tensorsocket_cpu"])
            ),
            None if run.get("tensorsocket_error").is_some() => "failed | —".into(),
            None => "— | —".into(),
        };
        last = (sl / alone, sl_cpu / ind_cpu);
        writeln!(
            b,
            "| {} | {ind:.0} | {ind_cpu:.1} | {sl:.0} | **{:.2}** | {sl_cpu:.1} | **{:.2}** | {ts} |",
            run["n"], last.0, last.1
        )?;
    }
    Ok(last)
}

/// A number of the scripts' JSON output at `path` (NaN where there is none).
fn number(v: &serde_json::Value, path: &[&str]) -> f64 {
    path.iter()
        .fold(v, |v, k| &v[*k])
        .as_f64()
        .unwrap_or(f64::NAN)
}

/// `benches/python_loaders.py`'s paragraph and table: N Python trainers on Sluice
/// against N Python loaders.
fn loaders_table(b: &mut String, loaders: &serde_json::Value) -> Result<()> {
    writeln!(
        b,
        "Separate processes, CPU-seconds of all of them (their rusage). \
         `benches/python_loaders.py`, one run: {} rows of the demo dataset, {} epochs; each trainer sums \
         `(x - 0.5) / 0.25` over the 16 float32 features of every row; Sluice: `sluice run` and N \
         Python subscribers (`np.from_dlpack`), loaders: N Python processes reading the Parquet \
         files with pyarrow. One subscriber that only counts rows: Python {} rows/s, Rust {} \
         rows/s ({:.2} of Rust).\n",
        loaders["rows"],
        loaders["epochs"],
        stats::metric(number(loaders, &["python_rows_s"])),
        stats::metric(number(loaders, &["rust_rows_s"])),
        number(loaders, &["python_rows_s"]) / number(loaders, &["rust_rows_s"]),
    )?;
    writeln!(
        b,
        "| trainers | Sluice CPU-s | loaders CPU-s | CPU Sluice / loaders | Sluice wall s | loaders wall s |"
    )?;
    writeln!(b, "|---:|---:|---:|---:|---:|---:|")?;
    for row in loaders["trainers"].as_array().into_iter().flatten() {
        let (sc, lc) = (
            number(row, &["sluice", "cpu"]),
            number(row, &["loaders", "cpu"]),
        );
        writeln!(
            b,
            "| {} | {sc:.2} | {lc:.2} | **{:.2}** | {:.2} | {:.2} |",
            row["n"],
            sc / lc,
            number(row, &["sluice", "wall"]),
            number(row, &["loaders", "wall"])
        )?;
    }
    Ok(())
}

/// `benches/image_pipeline.py`'s paragraph and table, one row per repetition. Returns
/// the CPU ratio against the loaders over the repetitions.
fn images_table(b: &mut String, i: &serde_json::Value) -> Result<Summary> {
    let runs: Vec<&serde_json::Value> = i["runs"].as_array().into_iter().flatten().collect();
    if runs.is_empty() {
        anyhow::bail!("benches/image_pipeline.py reported no repetitions (\"runs\")");
    }
    writeln!(
        b,
        "\n`benches/image_pipeline.py`: pipelines/images.sql on {} generated JPEGs, {} epochs, {} \
         trainers. Sluice: `sluice run` and Python trainers that sum every pixel and target \
         (`np.from_dlpack`); loaders: Python processes doing the same augmentation with Pillow + \
         numpy. One core, one pass: Sluice {:.2} CPU-s, Pillow + numpy {:.2} CPU-s. {} \
         repetitions, Sluice and the loaders alternated (one run's producer has taken from 1.3 \
         to 1.8 CPU-s for the same work on 2 vCPUs); the goal is judged on the median.\n",
        i["images"],
        i["epochs"],
        i["trainers"],
        number(i, &["per_core", "sluice_cpu"]),
        number(i, &["per_core", "pillow_cpu"]),
        runs.len(),
    )?;
    writeln!(
        b,
        "| repetition | loaders CPU-s | loaders wall s | Sluice CPU-s | of which the producer | Sluice wall s | CPU vs loaders |"
    )?;
    writeln!(b, "|---:|---:|---:|---:|---:|---:|---:|")?;
    for (k, r) in runs.iter().enumerate() {
        writeln!(
            b,
            "| {} | {:.2} | {:.2} | {:.2} | {:.2} | {:.2} | {:.2} |",
            k + 1,
            number(r, &["loaders", "cpu"]),
            number(r, &["loaders", "wall"]),
            number(r, &["sluice", "cpu"]),
            number(r, &["sluice", "producer_cpu"]),
            number(r, &["sluice", "wall"]),
            number(r, &["cpu_ratio"]),
        )?;
    }
    let ratio = Summary::of(
        &runs
            .iter()
            .map(|r| number(r, &["cpu_ratio"]))
            .collect::<Vec<_>>(),
    );
    let steady = Summary::of(
        &runs
            .iter()
            .map(|r| number(r, &["cpu_ratio_without_startup"]))
            .collect::<Vec<_>>(),
    );
    // The top level holds the median repetition's figures.
    let list = |key: &str| -> Vec<f64> {
        i["sluice"][key]
            .as_array()
            .into_iter()
            .flatten()
            .filter_map(serde_json::Value::as_f64)
            .collect()
    };
    let (trainers, startup) = (list("trainer_cpu"), list("trainer_startup_cpu"));
    writeln!(
        b,
        "\nCPU vs loaders: **{}**. In the median repetition, of Sluice's CPU-s: the producer \
         {:.2}, the trainers {:.2} in all, of which {:.2} is their Python start-up (CPU to the \
         end of their imports: the interpreter and numpy, whose OpenBLAS starts a thread per \
         core); the loaders' start-up: {:.2}. Without the Python processes' start-up on both \
         sides (a long run amortises it): **{}**.",
        ratio.show(2),
        number(i, &["sluice", "producer_cpu"]),
        trainers.iter().sum::<f64>(),
        startup.iter().sum::<f64>(),
        number(i, &["loaders", "startup_cpu"]),
        steady.show(2),
    )?;
    Ok(ratio)
}
