#!/usr/bin/env bash
# What waiting costs: N `sluice subscribe` processes attached to a live producer that has
# not started publishing (it waits for one subscriber more than there are), and the
# CPU-seconds they and the producer take over a window of S seconds, read from
# /proc/PID/stat at its start and end. Trainers wait like this whenever they start before
# the data does, and between epochs of a slow pipeline. docs/history/benchmarks-2026-11.md's "Node states
# from their monitors" figures come from it, run alternately on two binaries:
#
#   scripts/idle-cpu.sh [N] [S]        # default 16 subscribers, 10 seconds
#
#   e.g. for i in 1 2; do
#          SLUICE_BIN=/tmp/sluice-a scripts/idle-cpu.sh 16 10
#          SLUICE_BIN=/tmp/sluice-b scripts/idle-cpu.sh 16 10
#        done
#
# The plan: pipelines/demo.sql on the demo dataset (`sluice demo --prepare-only` makes it).
# The subscribers get 5 seconds to attach before the window opens.
# Environment: SLUICE_BIN (default target/profiling/sluice: `cargo build --profile
# profiling -p sluice-cli`). Prints one line: the binary, N, the window, then the
# CPU-seconds of the subscribers (all of them) and of the producer.
set -euo pipefail
cd "$(dirname "$0")/.."
n=${1:-16}
window=${2:-10}
[ "$n" -ge 1 ] 2> /dev/null || { echo "N: a number of subscribers, 1 or more (not '$n')" >&2; exit 1; }
sluice=${SLUICE_BIN:-$PWD/target/profiling/sluice}
[ -x "$sluice" ] || { echo "no $sluice: cargo build --profile profiling -p sluice-cli" >&2; exit 1; }
[ -d data/demo ] || "$sluice" demo --prepare-only > /dev/null

export SLUICE_NAMESPACE="idle$$"
pids=()
cleanup() {
  kill "${pids[@]}" 2> /dev/null || true
  wait 2> /dev/null || true
  rm -rf "/dev/shm/sluice-$SLUICE_NAMESPACE" "${TMPDIR:-/tmp}/sluice-$SLUICE_NAMESPACE.state"
  rm -f /dev/shm/iox2_sluice_"${SLUICE_NAMESPACE}"_*
}
trap cleanup EXIT

"$sluice" run pipelines/demo.sql --min-subscribers $((n + 1)) --wait-timeout $((window + 60)) \
  -q > /dev/null 2>&1 &
producer=$!
pids+=("$producer")
sleep 1
subscribers=()
for _ in $(seq "$n"); do
  "$sluice" subscribe demo --timeout $((window + 60)) --no-checksum > /dev/null 2>&1 &
  subscribers+=($!)
  pids+=($!)
done
sleep 5

# utime + stime, in clock ticks (fields 14 and 15 after the parenthesised name, which
# holds no space here).
ticks() {
  [ -r "/proc/$1/stat" ] || { echo "process $1 exited during the window" >&2; exit 1; }
  awk '{ print $14 + $15 }' "/proc/$1/stat"
}
sum() { local t=0 p; for p in "$@"; do t=$((t + $(ticks "$p"))); done; echo "$t"; }
for p in "${pids[@]}"; do
  kill -0 "$p" 2> /dev/null || { echo "process $p exited before the window" >&2; exit 1; }
done
sub_before=$(sum "${subscribers[@]}")
prod_before=$(ticks "$producer")
sleep "$window"
sub_after=$(sum "${subscribers[@]}")
prod_after=$(ticks "$producer")
hz=$(getconf CLK_TCK)
awk -v s=$((sub_after - sub_before)) -v p=$((prod_after - prod_before)) -v hz="$hz" \
  -v bin="$sluice" -v n="$n" -v w="$window" \
  'BEGIN { printf "%s: N = %d, %d s: subscribers %.2f CPU-s, producer %.2f CPU-s\n", bin, n, w, s / hz, p / hz }'
