#!/usr/bin/env bash
# Python trainers on one producer: the CPU of each process, and a flat perf profile
# (self time by library and by symbol) of one trainer. docs/benchmarks.md ("Python
# trainers") was written from its output.
#
#   scripts/profile-python.sh [OUT]      # default: target/profile/python
#
# Two runs, each a `sluice run` producer and 4 Python trainers (`sluice.subscribe`, then
# `np.from_dlpack(batch[col]).sum()` for each tensor column): pipelines/images.sql on
# 3000 generated JPEGs (2 epochs, 128-image batches), and the demo plan (20 epochs,
# 1024-row batches, the `features` column). perf samples the first trainer (cpu-clock,
# no call graphs). Needs the `profiling` build of `sluice` and an optimised wheel in
# .venv:
#
#   cargo build --profile profiling -p sluice-cli
#   .venv/bin/maturin build --profile profiling -m crates/sluice-python/Cargo.toml --out target/wheels-prof
#   .venv/bin/python -m pip install --force-reinstall --no-deps target/wheels-prof/*.whl
set -euo pipefail
cd "$(dirname "$0")/.."
out=${1:-target/profile/python}
mkdir -p "$out"
sluice=$PWD/target/profiling/sluice
python=$PWD/.venv/bin/python
export SLUICE_NAMESPACE=pyprofile$$ SLUICE_LOG=warn
tmp=$(mktemp -d)
trap 'rm -rf "$tmp" "/dev/shm/sluice-$SLUICE_NAMESPACE" "${TMPDIR:-/tmp}/sluice-$SLUICE_NAMESPACE.state"; rm -f /dev/shm/iox2_sluice_${SLUICE_NAMESPACE}_*' EXIT

"$sluice" demo --images --prepare-only --rows 3000 --data "$tmp/images" --plan "$tmp/unused.sql" > /dev/null
[ -d data/demo ] || "$sluice" demo --prepare-only > /dev/null
trainer='
import sys, numpy as np, sluice
topic, rows, total = sys.argv[1], 0, 0.0
with sluice.subscribe(topic, timeout=300) as sub:
    for batch in sub:
        for name in sys.argv[2:]:
            total += float(np.from_dlpack(batch[name]).sum())
        rows += batch.num_rows
print(rows, total)
'
run() { # topic plan columns...
  local topic=$1 plan=$2 i
  shift 2
  : > "$out/$topic.cpu"
  for i in 1 2 3 4; do
    local cmd=("$python" -c "$trainer" "$topic" "$@")
    if [ "$i" = 1 ]; then
      cmd=(perf record -q -e cpu-clock -F 4999 -o "$tmp/$topic.data" -- "${cmd[@]}")
    fi
    /usr/bin/time -f "trainer$i %U %S %e" -a -o "$out/$topic.cpu" "${cmd[@]}" > /dev/null &
  done
  /usr/bin/time -f "producer %U %S %e" -a -o "$out/$topic.cpu" \
    "$sluice" run "$plan" -q --min-subscribers 4 --wait-timeout 60
  wait
  for sort in dso dso,symbol; do
    perf report -i "$tmp/$topic.data" --no-children --sort "$sort" --stdio 2> /dev/null |
      grep -E '^ +[0-9]' | sed -E 's/ +$//' > "$tmp/$topic.$sort" || true
    head -40 "$tmp/$topic.$sort" > "$out/$topic.${sort/,/-}.txt"
  done
}
sed "s#'data/images/'#'$tmp/images/'#; s#'images'#'pyimages'#" pipelines/images.sql > "$tmp/images.sql"
run pyimages "$tmp/images.sql" pixels target
cat > "$tmp/demo.sql" <<SQL
SET sluice.topic = 'pydemo';
SET sluice.batch_rows = 1024;
SET sluice.epochs = 20;
CREATE EXTERNAL TABLE train STORED AS PARQUET LOCATION '$PWD/data/demo/';
SELECT id, label, text, features FROM train;
SQL
run pydemo "$tmp/demo.sql" features
echo "wrote $out/{pyimages,pydemo}.{cpu,dso.txt,dso-symbol.txt} (CPU: process user-s system-s wall-s)"
