#!/usr/bin/env bash
# Runs every test of Sluice: the Rust workspace (unit, in-process and cross-process
# tests, against a real S3-compatible server) and the Python package (an abi3 wheel in a
# local virtualenv). Installs what it needs; idempotent. CI runs exactly this.
#
# Everything is compiled once: tools/workspace-hack gives every member one feature set,
# the lints run as the compiler of the test build, and the S3 server and the Python wheel
# reuse that build (see docs/building.md).
#
# Environment: SLUICE_SKIP_HAKARI_CHECK=1 skips the workspace-hack check (it installs
# cargo-hakari into .tools/ on first use).
set -euo pipefail
cd "$(dirname "$0")/.."

# Tests spawn real processes and share /dev/shm; keep them bounded and tidy.
export RUST_BACKTRACE=${RUST_BACKTRACE:-1}
export CARGO_TERM_COLOR=${CARGO_TERM_COLOR:-never}
# A fresh clone compiles the workspace's crates once: incremental compilation's
# bookkeeping only costs there (the workspace's own crates: 220 s → 197 s on 2 cores).
export CARGO_INCREMENTAL=${CARGO_INCREMENTAL:-0}

started=$SECONDS
step_started=$SECONDS
step() {
  if [ -n "${step_name:-}" ]; then
    echo "== done: $step_name in $((SECONDS - step_started)) s"
  fi
  step_name=$1
  step_started=$SECONDS
  echo "== $step_name"
}

step "setup: Python virtualenv and cargo-hakari, in the background"
# Neither is needed before the build below ends, and the build has idle moments on 2
# cores (its long serial chain of DataFusion crates, then the links): both run beside it
# at the lowest priority, so that they take only time the build leaves idle (pip alone
# takes 41 CPU-seconds).
# The virtualenv itself is made now: pyo3's build script asks its interpreter for its
# configuration, and must see the same one in every step or pyo3 and everything above it
# would be compiled again.
mkdir -p .tools
if [ ! -x .venv/bin/python ]; then
  "${PYTHON:-python3}" -m venv .venv
fi
export PYO3_PYTHON="$PWD/.venv/bin/python"
nice -n 19 scripts/python-env.sh > .tools/python-env.log 2>&1 &
venv_pid=$!
venv_started=$SECONDS

HAKARI_VERSION=0.9.39
hakari_pid=
if [ "${SLUICE_SKIP_HAKARI_CHECK:-0}" != 1 ] &&
  ! .tools/bin/cargo-hakari --version 2>/dev/null | grep -q " $HAKARI_VERSION\$"; then
  # Its own target directory, removed afterwards: it shares nothing with the workspace.
  # Unoptimized (--debug): it compiles in 72 s instead of 178 s on 2 cores and still
  # checks this workspace in 4 s.
  (
    CARGO_TARGET_DIR="$PWD/.tools/build" nice -n 19 cargo install --debug --locked --quiet \
      --root .tools "cargo-hakari@$HAKARI_VERSION" && rm -rf .tools/build
  ) > .tools/cargo-hakari-install.log 2>&1 &
  hakari_pid=$!
fi
hakari_started=$SECONDS

# A failing step stops the script; the background jobs stop with it.
trap 'kill $(jobs -p) 2>/dev/null || true' EXIT

# Waits for a background job; on failure prints its log and stops.
wait_for() {
  local pid=$1 what=$2 log=$3 started=$4
  if ! wait "$pid"; then
    echo "$what failed:" >&2
    cat "$log" >&2
    exit 1
  fi
  echo "== $what finished $((SECONDS - started)) s after it started"
}

step "Rust: format"
cargo fmt --all -- --check

step "Rust: lints and test build (every member but the Python extension)"
# `cargo clippy` is `cargo check` with clippy-driver as the compiler of the workspace's own
# crates (RUSTC_WORKSPACE_WRAPPER, lint flags in CLIPPY_ARGS). Made the compiler of the
# test build instead, it lints every member while compiling it, with the same lints and
# the same `-D warnings`, and the dependencies are compiled once, for the tests, instead
# of once more in check mode (7 of CI's minutes). Every later cargo call of this script
# (the tests, the S3 server, maturin) keeps the same compiler, so nothing is rebuilt.
RUSTC_WORKSPACE_WRAPPER="$(rustup which clippy-driver 2>/dev/null || command -v clippy-driver)"
export RUSTC_WORKSPACE_WRAPPER
export CLIPPY_ARGS="-D__CLIPPY_HACKERY__warnings__CLIPPY_HACKERY__"
# The Python extension is left to maturin below, which compiles pyo3 with settings of its
# own (PYO3_BUILD_EXTENSION_MODULE, an abi3 config file): built here as well, pyo3 and the
# extension were compiled twice. maturin's cargo keeps this compiler, so its build is the
# extension's lint (it has no test targets).
cargo build --workspace --exclude sluice-python --all-targets --locked

if [ "${SLUICE_SKIP_HAKARI_CHECK:-0}" != 1 ]; then
  step "Rust: one feature set (cargo hakari)"
  if [ -n "$hakari_pid" ]; then
    wait_for "$hakari_pid" "cargo-hakari install" .tools/cargo-hakari-install.log "$hakari_started"
  fi
  # Fails when a dependency or feature changed and the workspace-hack was not
  # regenerated (`cargo hakari generate && cargo hakari manage-deps`).
  .tools/bin/cargo-hakari hakari generate --diff --color never
  .tools/bin/cargo-hakari hakari manage-deps --dry-run --color never
fi

step "Rust: tests (with a real S3-compatible server on 127.0.0.1)"
# Every member but the Python extension (tested from Python below): sluice-bench's own
# unit tests too, whose targets the build above compiled.
# Four test threads where the cores are two: the cross-process tests mostly wait on their
# child processes (integration binary: 97 s with two, 70 s with four, 74 s with six).
export RUST_TEST_THREADS=${RUST_TEST_THREADS:-4}
scripts/s3-server.sh cargo test --locked --workspace --exclude sluice-python

step "Python: wheel and tests"
wait_for "$venv_pid" "Python virtualenv" .tools/python-env.log "$venv_started"
SLUICE_PY_SKIP_CLIPPY=1 scripts/test-python.sh

step "finished"
echo "== all tests passed in $((SECONDS - started)) s"
