//! The examples run: `examples/producer.rs` publishes a plan and `examples/subscriber.rs`,
//! another process, receives every row of every epoch in its own batch size. (`cargo test
//! -p sluice` builds the examples before this test.)

use std::path::PathBuf;
use std::process::{Command, Stdio};
use std::time::{Duration, Instant};

use sluice::Namespace;

/// 100,000 rows computed by DataFusion: no data files needed.
const QUERY: &str = "SELECT value AS id, value % 10 AS label, CAST(value AS DOUBLE) / 7 AS feature \
                     FROM generate_series(0, 99999)";

fn example(name: &str) -> PathBuf {
    let exe = std::env::current_exe().unwrap();
    let dir = exe.parent().and_then(|deps| deps.parent()).unwrap();
    let path = dir.join("examples").join(name);
    assert!(
        path.exists(),
        "{} is missing: build it with `cargo build -p sluice --examples`",
        path.display()
    );
    path
}

/// Waits for `child` for at most two minutes; its stdout.
fn finish(child: std::process::Child, what: &str) -> String {
    let start = Instant::now();
    let mut child = child;
    loop {
        if let Some(status) = child.try_wait().unwrap() {
            let out = child.wait_with_output().unwrap();
            let stdout = String::from_utf8_lossy(&out.stdout).into_owned();
            assert!(
                status.success(),
                "{what} failed: {stdout}{}",
                String::from_utf8_lossy(&out.stderr)
            );
            return stdout;
        }
        if start.elapsed() > Duration::from_secs(120) {
            let _ = child.kill();
            panic!("{what} did not finish within two minutes");
        }
        std::thread::sleep(Duration::from_millis(50));
    }
}

#[test]
fn the_example_subscriber_receives_what_the_example_producer_publishes() {
    let name = format!("ex{}", std::process::id());
    let ns = Namespace::new(&name).unwrap();
    let dir = tempfile::tempdir().unwrap();
    let plan = dir.path().join("numbers.sql");
    std::fs::write(
        &plan,
        format!(
            "SET sluice.topic = 'numbers';\nSET sluice.epochs = 2;\nSET sluice.batch_rows = 4096;\n\
             SET sluice.min_subscribers = 1;\n{QUERY};\n"
        ),
    )
    .unwrap();
    let spawn = |example_name: &str, args: &[&str]| {
        Command::new(example(example_name))
            .args(args)
            .env("SLUICE_NAMESPACE", &name)
            .stdout(Stdio::piped())
            .stderr(Stdio::piped())
            .spawn()
            .unwrap()
    };
    let subscriber = spawn("subscriber", &["numbers", "1000"]);
    let producer = spawn("producer", &[plan.to_str().unwrap()]);
    let received = finish(subscriber, "the example subscriber");
    let published = finish(producer, "the example producer");
    assert!(
        published.contains("published 200000 rows over 2 epoch(s)"),
        "{published}"
    );
    let epochs: Vec<&str> = received.lines().collect();
    assert_eq!(
        epochs,
        [
            "epoch 0: 100000 rows, complete: true",
            "epoch 1: 100000 rows, complete: true"
        ],
        "{received}"
    );
    ns.purge();
}
