#!/usr/bin/env bash
# Profiles the Flight server (`sluice serve --flight`) with N remote subscribers: where
# its time goes per batch, and its CPU-seconds for a whole stream. docs/history/benchmarks-2026-11.md
# ("The Flight server forwards what the producer wrote") was written from its output.
#
#   scripts/profile-flight.sh [N] [BATCH_ROWS] [OUT]      # defaults: 4 1024 target/profile-flight
#
# A server on 127.0.0.1, N `sluice subscribe flight://…/TOPIC --no-checksum` processes
# (receive and release, every column) and a producer of the demo plan (`SELECT id,
# label, text, features`, SLUICE_PROFILE_EPOCHS epochs of the 200 000-row demo dataset,
# default 20), in two passes: one to measure CPU-seconds (/proc's counts of the server,
# time(1) of the others), one with the server under perf (cpu-clock, DWARF call graphs).
# OUT gets cpu.txt, server.svg, server.top.txt (self time by symbol) and server.folded.
# SLUICE_PROFILE_PERF=0 measures only. SLUICE_BIN: another `sluice` binary (an A/B of
# two builds). Needs perf (Debian: linux-perf) and inferno (installed into .tools/ on
# first use); the binaries are the `profiling` profile: release code with debug info.
set -euo pipefail
cd "$(dirname "$0")/.."
n=${1:-4}
rows=${2:-1024}
out=${3:-target/profile-flight}
epochs=${SLUICE_PROFILE_EPOCHS:-20}
perf_pass=${SLUICE_PROFILE_PERF:-1}
mkdir -p "$out"
out=$(cd "$out" && pwd)

. scripts/profile-common.sh
if [ "$perf_pass" = 1 ]; then
  profile_tools
fi
profile_binary
profile_namespace flightprof
export SLUICE_LOG=warn
profile_demo_plan

# CPU-seconds (user + system) of a live process, from /proc/PID/stat.
cpu_of() {
  awk -v hz="$(getconf CLK_TCK)" '{ sub(/^.*\) /, ""); printf "%.2f %.2f", $12 / hz, $13 / hz }' \
    "/proc/$1/stat"
}

pass() {
  local perf=$1 topic=$2 i addr=
  sed "s/@TOPIC@/$topic/" "$tmp/plan.sql" > "$tmp/$topic.sql"
  local cmd=("$sluice" serve --flight 127.0.0.1:0)
  if [ "$perf" = 1 ]; then
    cmd=(perf record -q -e cpu-clock -F 999 --call-graph dwarf,32768 -o "$tmp/server.data" -- "${cmd[@]}")
  fi
  "${cmd[@]}" > "$tmp/serve.out" &
  server=$!
  profile_also_kill=$server
  for _ in $(seq 1 600); do
    addr=$(sed -n 's/^serving on //p' "$tmp/serve.out")
    [ -n "$addr" ] && break
    sleep 0.1
  done
  [ -n "$addr" ] || { echo "error: the server did not start" >&2; exit 1; }
  for i in $(seq 1 "$n"); do
    /usr/bin/time -f "subscriber$i %U %S %e" -a -o "$tmp/cpu$perf.txt" \
      "$sluice" subscribe "flight://$addr/$topic" --no-checksum --timeout 120 > /dev/null &
    pids+=($!)
  done
  /usr/bin/time -f "producer %U %S %e" -a -o "$tmp/cpu$perf.txt" "$sluice" run "$tmp/$topic.sql" -q
  wait "${pids[@]}"
  pids=()
  # The server itself (perf's child in the perf pass).
  local pid=$server
  [ "$perf" = 1 ] && pid=$(pgrep -P "$server" -f 'serve --flight')
  echo "server $(cpu_of "$pid") -" >> "$tmp/cpu$perf.txt"
  kill -INT "$pid"
  wait "$server" || true
  profile_also_kill=
}

pass 0 "plain$$"
{
  echo "# CPU-seconds per process without perf: N = $n remote subscribers, $rows-row batches, $epochs epochs"
  echo "# process user-s system-s wall-s"
  cat "$tmp/cpu0.txt"
} > "$out/cpu.txt"
if [ "$perf_pass" != 1 ]; then
  cat "$out/cpu.txt"
  exit 0
fi
pass 1 "perf$$"
profile_flame server "Flight server, N = $n remote subscribers, $rows-row batches"
cat "$out/cpu.txt"
echo "wrote $out/server.svg, server.top.txt, server.folded and cpu.txt"
