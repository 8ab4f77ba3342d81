#!/usr/bin/env bash
# One producer of the demo plan and N subscriber processes, each under /usr/bin/time:
# the CPU-seconds of the subscribers and of the producer, for A/B comparisons of two
# binaries or two subscriber options run alternately. docs/history/benchmarks-2026-11.md's process-level
# A/B figures ("Fewer `released` notifications", "Subscribers that name their columns")
# come from it.
#
#   scripts/ab-subscribers.sh cli N [ARGS]      # N `sluice subscribe TOPIC --no-checksum ARGS`
#   scripts/ab-subscribers.sh python N [COLS]   # N Python trainers: sluice.subscribe(columns=COLS),
#                                               # np.from_dlpack(batch["features"]).sum()
#
#   e.g. for i in 1 2 3; do
#          scripts/ab-subscribers.sh cli 8
#          scripts/ab-subscribers.sh cli 8 "--columns id,label,features"
#        done
#
# The plan: the demo dataset (`sluice demo --prepare-only` makes it), SELECT id, label,
# text, features, 1024-row batches, 40 epochs for `cli` and 20 for `python`, the
# producer waiting for all N. COLS is a Python literal (default None: every column).
# Environment: SLUICE_BIN (default target/profiling/sluice: `cargo build --profile
# profiling -p sluice-cli`), PYTHON (default .venv/bin/python, with an optimised wheel:
# `.venv/bin/maturin develop --profile profiling -m crates/sluice-python/Cargo.toml`).
# Prints one line: what every subscriber received (count × rows), then the CPU-seconds.
set -euo pipefail
cd "$(dirname "$0")/.."
mode=${1:?usage: ab-subscribers.sh cli|python N [ARGS]}
n=${2:?usage: ab-subscribers.sh cli|python N [ARGS]}
extra=${3:-}
sluice=${SLUICE_BIN:-$PWD/target/profiling/sluice}
python=${PYTHON:-$PWD/.venv/bin/python}
export SLUICE_NAMESPACE=ab$$ SLUICE_LOG=warn OPENBLAS_NUM_THREADS=1
tmp=$(mktemp -d)
trap 'rm -rf "$tmp" "/dev/shm/sluice-$SLUICE_NAMESPACE" "${TMPDIR:-/tmp}/sluice-$SLUICE_NAMESPACE.state"; rm -f /dev/shm/iox2_sluice_${SLUICE_NAMESPACE}_*' EXIT
[ -d data/demo ] || "$sluice" demo --prepare-only > /dev/null
case $mode in
  cli) epochs=40 ;;
  python) epochs=20 ;;
  *) echo "mode must be cli or python, not $mode" >&2; exit 2 ;;
esac
cat > "$tmp/p.sql" <<SQL
SET sluice.topic = 'ab';
SET sluice.batch_rows = 1024;
SET sluice.epochs = $epochs;
SET sluice.min_subscribers = $n;
CREATE EXTERNAL TABLE train STORED AS PARQUET LOCATION '$PWD/data/demo/';
SELECT id, label, text, features FROM train;
SQL
cat > "$tmp/trainer.py" <<PY
import numpy as np, sluice
rows = 0
with sluice.subscribe("ab", timeout=120, columns=${extra:-None}) as sub:
    for batch in sub:
        rows += len(batch)
        np.from_dlpack(batch["features"]).sum()
print("end of stream:", rows)
PY
for i in $(seq 1 "$n"); do
  if [ "$mode" = cli ]; then
    # shellcheck disable=SC2086 # ARGS are the subscriber's options, split on purpose
    /usr/bin/time -f "sub %U %S %e" -a -o "$tmp/cpu.txt" \
      "$sluice" subscribe ab --no-checksum --timeout 120 $extra > "$tmp/s$i.out" 2>&1 &
  else
    /usr/bin/time -f "sub %U %S %e" -a -o "$tmp/cpu.txt" \
      "$python" "$tmp/trainer.py" > "$tmp/s$i.out" 2>&1 &
  fi
done
/usr/bin/time -f "producer %U %S %e" -a -o "$tmp/cpu.txt" \
  "$sluice" run "$tmp/p.sql" -q --wait-timeout 60 > /dev/null
wait
received=$(grep -h "end of stream" "$tmp"/s*.out | sed -E 's/.*end of stream:? ([0-9]+).*/\1/' | sort | uniq -c | awk '{printf "%s x %s rows ", $1, $2}')
awk -v mode="$mode" -v n="$n" -v extra="$extra" -v got="$received" '
  /^sub/ {s += $2 + $3; k++}
  /^producer/ {p = $2 + $3; wall = $4}
  END {printf "%s N=%d [%s]: received %s| subscribers %.2f CPU-s (each %.3f), producer %.2f, total %.2f, wall %.2f s\n",
       mode, n, extra, got, s, s / k, p, s + p, wall}' "$tmp/cpu.txt"
