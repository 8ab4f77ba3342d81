#!/usr/bin/env bash
# Profiles the Flight server (`sluice serve --flight`) with N remote subscribers: where
# its time goes per batch, and its CPU-seconds for a whole stream. docs/benchmarks.md
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

if [ "$perf_pass" = 1 ]; then
  if ! command -v perf > /dev/null; then
    echo "error: perf is not installed (Debian: apt-get install linux-perf)" >&2
    exit 2
  fi
  if [ ! -x .tools/bin/inferno-flamegraph ]; then
    echo "== installing inferno into .tools/"
    cargo install --locked --quiet --root .tools inferno@0.12.3
  fi
fi
if [ -n "${SLUICE_BIN:-}" ]; then
  sluice=$SLUICE_BIN
else
  export PYO3_PYTHON=${PYO3_PYTHON:-$PWD/.venv/bin/python}
  cargo build --locked --quiet --profile profiling -p sluice-cli
  sluice=$PWD/target/profiling/sluice
fi

tmp=$(mktemp -d)
pids=()
server=
cleanup() {
  for p in "${pids[@]}" $server; do kill "$p" 2> /dev/null || true; done
  rm -rf "$tmp" "/dev/shm/sluice-$ns" "${TMPDIR:-/tmp}/sluice-$ns.state"
  rm -f /dev/shm/iox2_sluice_"${ns}"_*
}
trap cleanup EXIT
ns=flightprof$$
export SLUICE_NAMESPACE=$ns SLUICE_LOG=warn

[ -d data/demo ] || "$sluice" demo --prepare-only > /dev/null
cat > "$tmp/plan.sql" <<EOF
SET sluice.topic = '@TOPIC@';
SET sluice.batch_rows = $rows;
SET sluice.epochs = $epochs;
SET sluice.min_subscribers = $n;
CREATE EXTERNAL TABLE train STORED AS PARQUET LOCATION '$PWD/data/demo/';
SELECT id, label, text, features FROM train;
EOF

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
  server=
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
perf script -i "$tmp/server.data" 2> /dev/null | .tools/bin/inferno-collapse-perf > "$out/server.folded"
.tools/bin/inferno-flamegraph --title "Flight server, N = $n remote subscribers, $rows-row batches" \
  < "$out/server.folded" > "$out/server.svg"
perf report -i "$tmp/server.data" --no-children -g none --sort dso,symbol --stdio 2> /dev/null |
  grep -E '^ +[0-9]' | sed -E 's/ +$//' | head -80 > "$out/server.top.txt" || true
cat "$out/cpu.txt"
echo "wrote $out/server.svg, server.top.txt, server.folded and cpu.txt"
