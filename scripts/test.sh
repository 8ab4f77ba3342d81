#!/usr/bin/env bash
# Runs every test of Sluice: the Rust workspace (unit, in-process and cross-process
# tests) and the Python package (built into a local virtualenv). Installs what it needs.
set -euo pipefail
cd "$(dirname "$0")/.."

# The default workspace members are the Rust crates; the Python extension is built
# and linted by scripts/test-python.sh.
# Tests spawn real processes and share /dev/shm; keep them bounded and tidy.
export RUST_BACKTRACE=${RUST_BACKTRACE:-1}
export CARGO_TERM_COLOR=${CARGO_TERM_COLOR:-never}

echo "== Rust: format and lints"
cargo fmt --all -- --check
cargo clippy --all-targets --locked -- -D warnings

echo "== Rust: tests (with a real S3-compatible server on 127.0.0.1)"
scripts/s3-server.sh cargo test --locked

if [ -x scripts/test-python.sh ]; then
  echo "== Python: tests"
  scripts/test-python.sh
fi
