#!/usr/bin/env bash
# Coverage-guided fuzzing of Sluice's parsers of untrusted bytes (issue 50).
#
#   scripts/fuzz.sh [SECONDS]     # each target for SECONDS (default 60)
#
# The targets are crates/sluice-fuzz's functions (wire messages, device descriptors,
# Flight tickets and metadata, plan options, checkpoints, status reports); fuzz/ is the
# cargo-fuzz project that wraps them, and fuzz/corpus/<target>/ their seeds and the inputs
# of crashes once fixed, which the test command replays on stable
# (crates/sluice-fuzz/tests/corpus.rs); what a run adds goes to fuzz/work/ (ignored). Needs the nightly
# toolchain and cargo-fuzz (installed into .tools/ on first use); without nightly it says
# so and exits 0. A crash is left in fuzz/artifacts/<target>/ and fails the run: add the
# input to fuzz/corpus/<target>/ as regression-<what> once fixed.
#
# Not part of scripts/test.sh: the first build (the whole dependency tree, DataFusion
# included, with sanitizer instrumentation) took 80 minutes on the 2-core machine (beside
# other work), more than CI's budget; later runs relink only what changed.
set -uo pipefail
cd "$(dirname "$0")/.."
seconds=${1:-60}
if ! rustup run nightly rustc --version > /dev/null 2>&1; then
  echo "fuzz: no nightly toolchain (rustup toolchain install nightly): skipped; the corpora are replayed by the tests"
  exit 0
fi
if [ ! -x .tools/bin/cargo-fuzz ]; then
  cargo install --locked cargo-fuzz --root .tools || exit 1
fi
# The same versions as the workspace's.
[ -f fuzz/Cargo.lock ] || cp Cargo.lock fuzz/Cargo.lock
status=0
mkdir -p fuzz/logs
for target in wire descriptor ticket meta plan checkpoint status; do
  echo "== fuzz $target for ${seconds} s"
  # New inputs go to fuzz/work/ (ignored); fuzz/corpus/ keeps the seeds and the inputs
  # of crashes once fixed (regression-*), which the tests replay.
  mkdir -p "fuzz/work/$target"
  RUSTUP_TOOLCHAIN=nightly .tools/bin/cargo-fuzz fuzz run --fuzz-dir fuzz "$target" \
    "fuzz/work/$target" "fuzz/corpus/$target" -- -max_total_time="$seconds" \
    -rss_limit_mb=4096 -timeout=10 -print_final_stats=1 > "fuzz/logs/$target.log" 2>&1
  rc=$?
  grep -E "^(stat::number_of_executed_units|stat::new_units_added|Done |SUMMARY|==[0-9]+==ERROR)" \
    "fuzz/logs/$target.log"
  if [ $rc -ne 0 ]; then
    echo "fuzz $target: exit $rc (see fuzz/logs/$target.log and fuzz/artifacts/$target/)"
    status=1
  fi
done
exit $status
