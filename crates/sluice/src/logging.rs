//! Sluice's log output, shared by the `sluice` binary and the Python module.

/// Sends Sluice's `tracing` events to stderr, filtered by `SLUICE_LOG` or else by
/// `default_filter` (an `EnvFilter` directive such as `"warn"`), without timestamps or
/// targets, in colour only on a terminal. A Rust program that installed its own
/// subscriber first keeps it.
pub fn log_to_stderr(default_filter: &str) {
    let _ = tracing_subscriber::fmt()
        .with_env_filter(
            tracing_subscriber::EnvFilter::try_from_env("SLUICE_LOG")
                .unwrap_or_else(|_| default_filter.into()),
        )
        .with_writer(std::io::stderr)
        .with_target(false)
        .without_time()
        .with_ansi(std::io::IsTerminal::is_terminal(&std::io::stderr()))
        // Its report of a failed write is an `eprintln!`, which panics where stderr is a
        // closed pipe (a killed parent, `2>&1 | head`): a producer's thread died of it.
        .log_internal_errors(false)
        .try_init();
}
