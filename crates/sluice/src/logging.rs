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
        .try_init();
}
