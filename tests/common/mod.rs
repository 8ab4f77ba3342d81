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

    /// Sends SIGKILL.
    pub fn kill9(&self) {
        self.signal(libc::SIGKILL);
    }

    /// Sends a signal.
    pub fn signal(&self, signal: i32) {
        // SAFETY: kill(2) on a child process id we own; no memory is involved.
        unsafe { libc::kill(self.pid(), signal) };
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

impl Harness {
    pub fn new() -> Self {
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
            .env("SLUICE_LOG", "warn")
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
    pub fn wait_for_topic(&self, limit: Duration) {
        let start = Instant::now();
        while self
            .ns
            .leftovers()
            .iter()
            .all(|p| !p.starts_with("/dev/shm"))
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
        let left = self.ns.leftovers();
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
