//! Test harness: real `sluice` processes in a namespace of the test's own.
//!
//! Every process is watched: one that outlives its time limit is killed and fails the
//! test instead of hanging it. When a harness is dropped it kills what is left, asserts
//! that no shared-memory segment or service file of its namespace remains, and removes
//! the namespace.

#![allow(dead_code)]

use std::io::Read;
use std::path::{Path, PathBuf};
use std::process::{Child, Command, ExitStatus, Stdio};
use std::sync::atomic::{AtomicU32, Ordering};
use std::sync::{Arc, Mutex};
use std::thread::JoinHandle;
use std::time::{Duration, Instant};

use sluice::Namespace;

static NEXT: AtomicU32 = AtomicU32::new(0);

pub struct Harness {
    pub ns: Namespace,
    pub dir: tempfile::TempDir,
    /// Extra environment variables for every process (e.g. object-store credentials).
    pub env: Vec<(String, String)>,
    procs: Vec<Arc<Mutex<Child>>>,
}

/// A running `sluice` process whose output is collected in the background.
pub struct Proc {
    child: Arc<Mutex<Child>>,
    stdout: Arc<Mutex<String>>,
    stderr: Arc<Mutex<String>>,
    readers: Vec<JoinHandle<()>>,
}

pub struct Finished {
    pub status: ExitStatus,
    pub stdout: String,
    pub stderr: String,
}

impl Finished {
    /// The JSON lines a `subscribe --json` printed.
    pub fn json_lines(&self) -> Vec<serde_json::Value> {
        self.stdout
            .lines()
            .map(|l| serde_json::from_str(l).unwrap_or_else(|e| panic!("bad JSON line {l:?}: {e}")))
            .collect()
    }
}

fn collect(mut from: impl Read + Send + 'static, into: Arc<Mutex<String>>) -> JoinHandle<()> {
    std::thread::spawn(move || {
        let mut buf = [0u8; 8192];
        while let Ok(n) = from.read(&mut buf) {
            if n == 0 {
                break;
            }
            into.lock()
                .unwrap()
                .push_str(&String::from_utf8_lossy(&buf[..n]));
        }
    })
}

impl Proc {
    pub fn pid(&self) -> i32 {
        self.child.lock().unwrap().id() as i32
    }

    pub fn stdout_so_far(&self) -> String {
        self.stdout.lock().unwrap().clone()
    }

    pub fn stderr_so_far(&self) -> String {
        self.stderr.lock().unwrap().clone()
    }

    /// Sends SIGKILL.
    pub fn kill9(&self) {
        self.signal(libc::SIGKILL);
    }

    /// Sends a signal.
    pub fn signal(&self, signal: i32) {
        // SAFETY: kill(2) on a child process id we own; no memory is involved.
        unsafe { libc::kill(self.pid(), signal) };
    }

    /// Whether it has not exited yet.
    pub fn running(&self) -> bool {
        self.child.lock().unwrap().try_wait().unwrap().is_none()
    }

    /// Waits for the process to exit; kills it and fails the test after `limit`.
    pub fn wait(self, limit: Duration) -> Finished {
        let start = Instant::now();
        let status = loop {
            if let Some(status) = self.child.lock().unwrap().try_wait().unwrap() {
                break status;
            }
            if start.elapsed() > limit {
                let _ = self.child.lock().unwrap().kill();
                let _ = self.child.lock().unwrap().wait();
                panic!(
                    "process did not finish within {limit:?}; stdout:\n{}\nstderr:\n{}",
                    self.stdout.lock().unwrap(),
                    self.stderr.lock().unwrap()
                );
            }
            std::thread::sleep(Duration::from_millis(10));
        };
        for r in self.readers {
            let _ = r.join();
        }
        Finished {
            status,
            stdout: self.stdout.lock().unwrap().clone(),
            stderr: self.stderr.lock().unwrap().clone(),
        }
    }
}

/// Removes what test runs that were killed outright (SIGKILL of the whole run, a
/// machine stopped mid-test) left in their namespaces. Each run's namespaces are its own
/// (`cp<pid>x<n>`) and no later process ever opens them, so nobody else would reclaim
/// them: the first harness of every run does, for runs whose process is gone and whose
/// namespace has no live process left.
fn sweep_namespaces_of_dead_runs() {
    static ONCE: std::sync::Once = std::sync::Once::new();
    ONCE.call_once(|| {
        let mut names = std::collections::BTreeSet::new();
        let shm = std::fs::read_dir("/dev/shm")
            .into_iter()
            .flatten()
            .flatten();
        let tmp = std::fs::read_dir(std::env::temp_dir())
            .into_iter()
            .flatten()
            .flatten();
        for entry in shm.chain(tmp) {
            let file = entry.file_name().to_string_lossy().to_string();
            let rest = file
                .strip_prefix("iox2_sluice_cp")
                .or_else(|| file.strip_prefix("sluice-cp"));
            let Some(rest) = rest else { continue };
            let id: String = rest
                .chars()
                .take_while(|c| c.is_ascii_alphanumeric())
                .collect();
            let Some((pid, _)) = id.split_once('x') else {
                continue;
            };
            let Ok(pid) = pid.parse::<i32>() else {
                continue;
            };
            // SAFETY: kill(2) with signal 0 sends nothing; it checks whether the process
            // exists.
            let gone = unsafe { libc::kill(pid, 0) } != 0
                && std::io::Error::last_os_error().raw_os_error() == Some(libc::ESRCH);
            if gone && pid != std::process::id() as i32 {
                names.insert(format!("cp{id}"));
            }
        }
        for name in names {
            let Ok(ns) = Namespace::new(&name) else {
                continue;
            };
            ns.reclaim_dead();
            if !ns.has_live_nodes() {
                ns.purge();
                // Where the service directory was before it moved to /dev/shm.
                let _ =
                    std::fs::remove_dir_all(std::env::temp_dir().join(format!("sluice-{name}")));
            }
        }
    });
}

/// A namespace of a test's own, for tests that create topics in-process: named like the
/// harness's (so that the sweep above reclaims it after a killed run), checked for
/// leftovers and removed when dropped.
pub struct TestNamespace(pub Namespace);

impl TestNamespace {
    pub fn new() -> Self {
        sweep_namespaces_of_dead_runs();
        let name = format!(
            "cp{}x{}",
            std::process::id(),
            NEXT.fetch_add(1, Ordering::Relaxed)
        );
        Self(Namespace::new(&name).unwrap())
    }
}

impl Drop for TestNamespace {
    fn drop(&mut self) {
        let left = self.0.leftovers();
        self.0.purge();
        if !std::thread::panicking() {
            assert!(left.is_empty(), "left behind: {left:?}");
        }
    }
}

impl Harness {
    pub fn new() -> Self {
        sweep_namespaces_of_dead_runs();
        let name = format!(
            "cp{}x{}",
            std::process::id(),
            NEXT.fetch_add(1, Ordering::Relaxed)
        );
        Self {
            ns: Namespace::new(&name).unwrap(),
            dir: tempfile::tempdir().unwrap(),
            env: Vec::new(),
            procs: Vec::new(),
        }
    }

    pub fn path(&self, rel: &str) -> PathBuf {
        self.dir.path().join(rel)
    }

    pub fn command(&self, args: &[&str]) -> Command {
        let mut cmd = Command::new(env!("CARGO_BIN_EXE_sluice"));
        cmd.args(args)
            .current_dir(self.dir.path())
            .env("SLUICE_NAMESPACE", self.ns.name())
            // `SLUICE_TEST_LOG=debug cargo test …` shows what the children logged in a
            // failing test's messages.
            .env(
                "SLUICE_LOG",
                std::env::var("SLUICE_TEST_LOG").unwrap_or_else(|_| "warn".into()),
            )
            .envs(self.env.iter().map(|(k, v)| (k, v)))
            .stdin(Stdio::null())
            .stdout(Stdio::piped())
            .stderr(Stdio::piped());
        cmd
    }

    pub fn spawn(&mut self, args: &[&str]) -> Proc {
        let mut child = self.command(args).spawn().expect("cannot start sluice");
        let stdout = Arc::new(Mutex::new(String::new()));
        let stderr = Arc::new(Mutex::new(String::new()));
        let readers = vec![
            collect(child.stdout.take().unwrap(), stdout.clone()),
            collect(child.stderr.take().unwrap(), stderr.clone()),
        ];
        let child = Arc::new(Mutex::new(child));
        self.procs.push(child.clone());
        Proc {
            child,
            stdout,
            stderr,
            readers,
        }
    }

    /// Runs `sluice ARGS` to completion (at most 120 s).
    pub fn run(&mut self, args: &[&str]) -> Finished {
        self.spawn(args).wait(Duration::from_secs(120))
    }

    /// Generates the deterministic demo dataset with `rows` rows under `data/`.
    pub fn dataset(&mut self, rows: usize) -> PathBuf {
        let rows_arg = rows.to_string();
        let out = self.run(&[
            "demo",
            "--prepare-only",
            "--rows",
            &rows_arg,
            "--data",
            "data",
            "--plan",
            "unused-demo.sql",
        ]);
        assert!(out.status.success(), "{}", out.stderr);
        self.path("data")
    }

    /// Writes a plan file over the test dataset.
    pub fn plan(&self, name: &str, sql: &str) -> PathBuf {
        let path = self.path(name);
        std::fs::write(&path, sql).unwrap();
        path
    }

    /// `sluice checksum PLAN --json`: (rows, checksum).
    pub fn source_checksum(&mut self, plan: &Path) -> (u64, String) {
        let out = self.run(&["checksum", plan.to_str().unwrap(), "--json"]);
        assert!(out.status.success(), "{}", out.stderr);
        let v = &out.json_lines()[0];
        (
            v["rows"].as_u64().unwrap(),
            v["checksum"].as_str().unwrap().to_string(),
        )
    }

    /// `sluice run p.sql --quiet --min-subscribers N --wait-timeout 60`, then `extra`: the
    /// producer of most tests, started before or after its subscribers.
    pub fn spawn_producer(&mut self, min_subscribers: usize, extra: &[&str]) -> Proc {
        let n = min_subscribers.to_string();
        let mut args = vec![
            "run",
            "p.sql",
            "--quiet",
            "--min-subscribers",
            n.as_str(),
            "--wait-timeout",
            "60",
        ];
        args.extend_from_slice(extra);
        self.spawn(&args)
    }

    /// Waits until the topic's data segment exists (the producer created the topic).
    /// Waits until `n` subscribers wait for `topic` (have declared their interest).
    pub fn wait_for_interest(&self, topic: &str, n: usize, limit: Duration) {
        let topic = sluice::core::TopicName::new(topic.to_string()).unwrap();
        let start = Instant::now();
        loop {
            let pending = sluice::shm::pending_interest(&self.ns, &topic);
            if pending >= n {
                return;
            }
            assert!(
                start.elapsed() < limit,
                "only {pending} of {n} subscribers are waiting for topic '{topic}'"
            );
            std::thread::sleep(Duration::from_millis(20));
        }
    }

    pub fn wait_for_topic(&self, limit: Duration) {
        let start = Instant::now();
        while self
            .ns
            .leftovers()
            .iter()
            // A segment: a file directly in /dev/shm (the service directory, where
            // waiting subscribers' node files are, is in /dev/shm too).
            .all(|p| p.parent() != Some(std::path::Path::new("/dev/shm")))
        {
            assert!(
                start.elapsed() < limit,
                "the producer did not create its topic"
            );
            std::thread::sleep(Duration::from_millis(20));
        }
    }
}

impl Drop for Harness {
    fn drop(&mut self) {
        for p in &self.procs {
            let mut child = p.lock().unwrap();
            if let Ok(None) = child.try_wait() {
                let _ = child.kill();
                let _ = child.wait();
            }
        }
        let mut left = self.ns.leftovers();
        // Some remains of a process killed at a bad moment can only be told from a node
        // being created once iceoryx2's creation timeout (1 s) has passed; the next Sluice
        // process in the namespace reclaims them then. Do what it would do, for up to 10 s:
        // on a loaded 2-core machine 3 s was once not enough (a SIGKILLed producer's node
        // was still there; fresh-clone run of 2026-11-25).
        let deadline = Instant::now() + Duration::from_secs(10);
        while !left.is_empty() && Instant::now() < deadline {
            std::thread::sleep(Duration::from_millis(200));
            self.ns.reclaim_dead();
            left = self.ns.leftovers();
        }
        let loose = self.ns.loose_permissions();
        self.ns.purge();
        if !std::thread::panicking() {
            assert!(
                left.is_empty(),
                "left behind in namespace {}: {left:?}",
                self.ns.name()
            );
            assert!(loose.is_empty(), "writable by others: {loose:?}");
        }
    }
}

/// Held by tests that load the machine on purpose and by tests that assert liveness
/// bounds, so that one never runs beside the other in this binary's parallel test threads.
pub fn exclusive() -> std::sync::MutexGuard<'static, ()> {
    static LOCK: Mutex<()> = Mutex::new(());
    // A test that failed while holding it poisons it; the next one may still run.
    LOCK.lock()
        .unwrap_or_else(std::sync::PoisonError::into_inner)
}

/// Busy processes that keep every CPU of the machine saturated until dropped, as training
/// processes do: launch-order and liveness guarantees must hold under load.
pub struct CpuHogs(Vec<Child>);

impl CpuHogs {
    pub fn saturate() -> Self {
        let cpus = std::thread::available_parallelism().map_or(2, |n| n.get());
        Self(
            (0..cpus)
                .map(|_| {
                    Command::new("sh")
                        .args(["-c", "while :; do :; done"])
                        .stdin(Stdio::null())
                        .spawn()
                        .expect("cannot start a busy process")
                })
                .collect(),
        )
    }
}

impl Drop for CpuHogs {
    fn drop(&mut self) {
        for child in &mut self.0 {
            let _ = child.kill();
            let _ = child.wait();
        }
    }
}

/// An oracle that shares nothing with the producer's path (no plan file, no DataFusion,
/// no partitions, no re-batching): the rows of the demo dataset's Parquet files under
/// `dir` whose `label` is not null, read with the plain Parquet reader and projected to
/// `id, label, text, features`. Returns (rows, order-independent checksum).
pub fn parquet_oracle(dir: &Path) -> (u64, String) {
    use arrow::compute::{filter_record_batch, is_not_null};
    use parquet::arrow::arrow_reader::ParquetRecordBatchReaderBuilder;

    let mut files: Vec<PathBuf> = std::fs::read_dir(dir)
        .unwrap()
        .map(|e| e.unwrap().path())
        .filter(|p| p.extension().is_some_and(|e| e == "parquet"))
        .collect();
    files.sort();
    assert!(!files.is_empty(), "no Parquet files in {}", dir.display());
    let mut sum = sluice::Checksum::default();
    for file in files {
        let reader = ParquetRecordBatchReaderBuilder::try_new(std::fs::File::open(&file).unwrap())
            .unwrap()
            .build()
            .unwrap();
        for batch in reader {
            let batch = batch.unwrap();
            let keep = is_not_null(batch.column_by_name("label").unwrap()).unwrap();
            let batch = filter_record_batch(&batch, &keep).unwrap();
            let schema = batch.schema();
            let columns: Vec<usize> = ["id", "label", "text", "features"]
                .iter()
                .map(|c| schema.index_of(c).unwrap())
                .collect();
            sum.update(&batch.project(&columns).unwrap()).unwrap();
        }
    }
    (sum.rows(), sum.hex())
}

/// Checks that a subscriber received every epoch whole, with the source's checksum.
pub fn assert_exactly_once(out: &Finished, epochs: u64, rows: u64, checksum: &str) {
    assert!(out.status.success(), "subscriber failed: {}", out.stderr);
    let lines = out.json_lines();
    let per_epoch: Vec<_> = lines.iter().filter(|v| v.get("epoch").is_some()).collect();
    assert_eq!(per_epoch.len() as u64, epochs, "{}", out.stdout);
    for (i, v) in per_epoch.iter().enumerate() {
        assert_eq!(v["epoch"].as_u64(), Some(i as u64));
        assert_eq!(v["rows"].as_u64(), Some(rows), "epoch {i}: {v}");
        assert_eq!(v["checksum"].as_str(), Some(checksum), "epoch {i}: {v}");
        assert_eq!(v["complete"].as_bool(), Some(true), "epoch {i}: {v}");
    }
    let end = lines.last().unwrap();
    assert_eq!(end["end"].as_bool(), Some(true));
    assert_eq!(end["rows"].as_u64(), Some(rows * epochs));
}
