//! Comparison 7: the GPU benchmarks, on a machine with an NVIDIA GPU.
//!
//! Without a CUDA driver (`libcuda.so`) they are skipped and the report says so. With
//! one, this runs `benches/gpu.py`, the script `scripts/gpu-check.sh --run` runs on a
//! GPU machine (host-to-device GB/s of the producer's staging against a raw pinned copy
//! in the same run, publish-to-usable latency, first-open cost, N torch subscribers
//! against N independent loaders on the input-bound image pipeline), which needs a
//! Python with torch and the Sluice wheel, and reports its output.

use std::fmt::Write as _;
use std::path::Path;
use std::process::{Command, Stdio};
use std::time::{Duration, Instant};

use crate::Bench;
use crate::report::Report;

/// What the GPU part found or measured.
pub enum Gpu {
    /// Not run, and why.
    Skipped(String),
    /// The device and the JSON that `benches/gpu.py` wrote.
    Ran { device: String, json: String },
}

/// Runs the GPU comparisons if the machine has a CUDA driver and a GPU.
pub fn run(repo: &Path, quick: bool) -> Gpu {
    if !sluice_cuda::driver_present() {
        return Gpu::Skipped("no CUDA driver: libcuda.so could not be loaded".into());
    }
    let device = match sluice_cuda::require_device(0) {
        Ok(name) => name,
        Err(e) => {
            return Gpu::Skipped(format!(
                "the CUDA driver is present but GPU 0 cannot be opened: {e}"
            ));
        }
    };
    let venv = repo.join(".venv/bin/python");
    let python = if venv.exists() {
        venv
    } else {
        "python3".into()
    };
    let Ok(dir) = tempfile::tempdir() else {
        return Gpu::Skipped("cannot create a temporary directory".into());
    };
    let out = dir.path().join("gpu.json");
    let log = dir.path().join("gpu.log");
    let Ok(log_file) = std::fs::File::create(&log) else {
        return Gpu::Skipped("cannot create a log file".into());
    };
    let mut cmd = Command::new(&python);
    cmd.arg(repo.join("benches/gpu.py")).arg("--out").arg(&out);
    if quick {
        cmd.args(["--rows", "50000", "--images", "3000", "--budget", "50"]);
    } else {
        cmd.args(["--budget", "270", "--run-timeout", "60"]);
    }
    // The staging-rate example of sluice-cuda, when it was built with this binary
    // (`cargo build --release -p sluice-cuda --example stage_rate`): the staging part.
    if let Some(stage_rate) = std::env::current_exe()
        .ok()
        .and_then(|exe| Some(exe.parent()?.join("examples/stage_rate")))
        .filter(|path| path.exists())
    {
        cmd.arg("--stage-rate").arg(stage_rate);
    }
    let child = cmd
        .current_dir(repo)
        .stdout(Stdio::null())
        .stderr(log_file)
        .spawn();
    let mut child = match child {
        Ok(c) => c,
        Err(e) => return Gpu::Skipped(format!("{device}: cannot run {}: {e}", python.display())),
    };
    let deadline = Instant::now() + Duration::from_secs(if quick { 90 } else { 360 });
    loop {
        match child.try_wait() {
            Ok(Some(status)) if status.success() => break,
            Ok(Some(status)) => {
                let err = std::fs::read_to_string(&log).unwrap_or_default();
                let last = err.lines().last().unwrap_or("").to_string();
                return Gpu::Skipped(format!(
                    "{device}: benches/gpu.py failed ({status}): {last} (it needs torch and the Sluice wheel in {})",
                    python.display()
                ));
            }
            Ok(None) if Instant::now() > deadline => {
                let _ = child.kill();
                let _ = child.wait();
                return Gpu::Skipped(format!("{device}: benches/gpu.py did not finish in time"));
            }
            Ok(None) => std::thread::sleep(Duration::from_millis(100)),
            Err(e) => {
                let _ = child.kill();
                let _ = child.wait();
                return Gpu::Skipped(format!("{device}: cannot wait for benches/gpu.py: {e}"));
            }
        }
    }
    match std::fs::read_to_string(&out) {
        Ok(json) => Gpu::Ran { device, json },
        Err(e) => Gpu::Skipped(format!("{device}: benches/gpu.py wrote no results: {e}")),
    }
}

/// Comparison 7: runs it where it can and renders its section.
pub(crate) fn compare(bench: &Bench<'_>, report: &mut Report) {
    bench.step("7. GPU");
    match run(bench.repo, bench.quick) {
        Gpu::Skipped(why) => report.skipped("7. GPU", &why),
        Gpu::Ran { device, json } => report.gpu(&device, &json),
    }
}

impl Report {
    /// Comparison 7's section: the output of `benches/gpu.py`.
    fn gpu(&mut self, device: &str, json: &str) {
        let _ = writeln!(
            self.body,
            "\n## 7. GPU ({device})\n\nOutput of `benches/gpu.py`:\n\n```json\n{}\n```",
            json.trim()
        );
        self.summary
            .push(format!("GPU: ran on {device} (see section 7)"));
    }
}
