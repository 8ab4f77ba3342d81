//! `sluice.device` at the command line: CPU plans are unchanged, and a GPU plan on a
//! machine without a CUDA driver fails at `sluice run` with a clear error.

use crate::common::Harness;

fn plan(topic: &str, device: &str) -> String {
    format!(
        "SET sluice.topic = '{topic}';\nSET sluice.batch_rows = 500;\nSET sluice.device = '{device}';\n\
         CREATE EXTERNAL TABLE train STORED AS PARQUET LOCATION 'data/';\n\
         SELECT id, label FROM train;\n"
    )
}

/// A GPU plan fails before publishing anything: "no CUDA driver found" where libcuda.so
/// cannot be loaded (this machine and CI), a non-zero exit either way.
#[test]
fn a_gpu_plan_fails_clearly_without_a_cuda_driver() {
    let mut h = Harness::new();
    h.dataset(2_000);
    h.plan("gpu.sql", &plan("gpuplan", "cuda:0"));
    let out = h.run(&["run", "gpu.sql", "--quiet"]);
    assert!(!out.status.success(), "{}", out.stderr);
    if sluice_cuda_driver_present() {
        assert!(!out.stderr.contains("no CUDA driver"), "{}", out.stderr);
    } else {
        assert!(
            out.stderr
                .contains("no CUDA driver found (libcuda.so not loadable)")
                && out.stderr.contains("sluice.device = 'cpu'"),
            "{}",
            out.stderr
        );
    }
}

/// The same plan on `sluice.device = 'cpu'` runs to completion.
#[test]
fn a_cpu_plan_runs_unchanged() {
    let mut h = Harness::new();
    h.dataset(2_000);
    h.plan("cpu.sql", &plan("cpuplan", "cpu"));
    let out = h.run(&["run", "cpu.sql", "--quiet"]);
    assert!(out.status.success(), "{}", out.stderr);
}

/// A malformed device is a configuration error (exit code 2) naming the valid forms.
#[test]
fn a_malformed_device_is_a_configuration_error() {
    let mut h = Harness::new();
    h.dataset(100);
    h.plan("bad.sql", &plan("badplan", "gpu0"));
    let out = h.run(&["run", "bad.sql", "--quiet"]);
    assert_eq!(out.status.code(), Some(2), "{}", out.stderr);
    assert!(out.stderr.contains("'cuda:N'"), "{}", out.stderr);
}

fn sluice_cuda_driver_present() -> bool {
    ["libcuda.so", "libcuda.so.1"].iter().any(|name| {
        let c = std::ffi::CString::new(*name).unwrap_or_default();
        // SAFETY: dlopen with a valid NUL-terminated name; the handle is closed at once.
        unsafe {
            let h = libc::dlopen(c.as_ptr(), libc::RTLD_LAZY);
            if !h.is_null() {
                libc::dlclose(h);
            }
            !h.is_null()
        }
    })
}

/// A `cuda_host:N` plan is a CPU topic whose producer checks the GPU at start: without a
/// driver it fails before publishing, naming the driver; with one, it runs.
#[test]
fn a_cuda_host_plan_checks_the_gpu_at_start() {
    let mut h = Harness::new();
    h.dataset(2_000);
    h.plan("host.sql", &plan("hostplan", "cuda_host:0"));
    let out = h.run(&["run", "host.sql", "--quiet"]);
    if sluice_cuda_driver_present() {
        assert!(out.status.success(), "{}", out.stderr);
    } else {
        assert!(!out.status.success(), "{}", out.stderr);
        assert!(
            out.stderr
                .contains("no CUDA driver found (libcuda.so not loadable)"),
            "{}",
            out.stderr
        );
    }
}
