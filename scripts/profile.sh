#!/usr/bin/env bash
# Profiles one producer and its subscribers with perf and writes flame graphs: where the
# time of each side goes, per message. docs/benchmarks.md ("Where the time goes") was
# written from its output.
#
#   scripts/profile.sh [N] [BATCH_ROWS] [OUT]      # defaults: 1 1024 target/profile
#
# It takes a few minutes: most of it is perf resolving DWARF call graphs.
# SLUICE_PROFILE_PERF=0 only measures (cpu.txt), without perf.
#
# N subscriber processes (`sluice subscribe --no-checksum`: receive and release) and a
# producer running the demo plan (`SELECT id, label, text, features`, 40 epochs of the
# 200 000-row demo dataset; SLUICE_PROFILE_EPOCHS sets them) in BATCH_ROWS-row batches.
# perf samples the producer and the
# first subscriber (cpu-clock, DWARF call graphs) in a second pass; OUT gets
# producer.svg, subscriber.svg, for each the flat profile (`*.top.txt`: self time by
# symbol) and the folded stacks (`*.folded`, for inferno), and the CPU-seconds of every process in the first pass, without perf
# (`cpu.txt`).
#
# Needs perf (Debian: linux-perf) and inferno (installed into .tools/ on first use). The
# binaries are the `profiling` profile: release code generation with debug info.
set -euo pipefail
cd "$(dirname "$0")/.."
n=${1:-1}
rows=${2:-1024}
out=${3:-target/profile}
epochs=${SLUICE_PROFILE_EPOCHS:-40}
mkdir -p "$out"
out=$(cd "$out" && pwd)

. scripts/profile-common.sh
if [ "${SLUICE_PROFILE_PERF:-1}" = 1 ]; then
  profile_tools
fi
profile_binary
profile_namespace profile
profile_demo_plan

# One pass: N subscribers, then the producer; with `perf`, the producer and the first
# subscriber are sampled (cpu-clock, DWARF call graphs).
pass() {
  local perf=$1 topic=$2 i
  sed "s/@TOPIC@/$topic/" "$tmp/plan.sql" > "$tmp/$topic.sql"
  for i in $(seq 1 "$n"); do
    local cmd=("$sluice" subscribe "$topic" --no-checksum --timeout 120)
    if [ "$perf" = 1 ] && [ "$i" = 1 ]; then
      # A subscriber uses a tenth of the producer's CPU: sample it 5 times as often.
      cmd=(perf record -q -e cpu-clock -F 4999 --call-graph dwarf,32768 -o "$tmp/subscriber.data" -- "${cmd[@]}")
    fi
    /usr/bin/time -f "subscriber$i %U %S %e" -a -o "$tmp/cpu$perf.txt" "${cmd[@]}" > /dev/null &
    pids+=($!)
  done
  local cmd=("$sluice" run "$tmp/$topic.sql" -q)
  if [ "$perf" = 1 ]; then
    cmd=(perf record -q -e cpu-clock -F 999 --call-graph dwarf,32768 -o "$tmp/producer.data" -- "${cmd[@]}")
  fi
  /usr/bin/time -f "producer %U %S %e" -a -o "$tmp/cpu$perf.txt" "${cmd[@]}"
  wait "${pids[@]}"
  pids=()
}

# CPU-seconds without perf (its sampling and unwinding would count), then the profile.
pass 0 "plain$$"
if [ "${SLUICE_PROFILE_PERF:-1}" = 1 ]; then
  pass 1 "perf$$"
fi
{
  echo "# CPU-seconds per process without perf: N = $n, $rows-row batches, $epochs epochs"
  echo "# process user-s system-s wall-s"
  cat "$tmp/cpu0.txt"
} > "$out/cpu.txt"

if [ "${SLUICE_PROFILE_PERF:-1}" != 1 ]; then
  cat "$out/cpu.txt"
  exit 0
fi
for name in producer subscriber; do
  profile_flame "$name" "$name, N = $n, $rows-row batches"
done
echo "wrote $out/{producer,subscriber}.svg, *.top.txt and cpu.txt"
