#!/bin/bash
# Cross-process fan-out: one `sluice run`, N `sluice subscribe` processes.
S=/work/main/target/release/sluice
cd /work/scratch
mkplan() { # $1 name $2 extra
cat > xp-$1.sql <<P
$2
SET sluice.topic = 'xp$1';
SET sluice.batch_rows = 1024;
SET sluice.epochs = 3;
CREATE EXTERNAL TABLE train STORED AS PARQUET LOCATION '/work/scratch/demo2m/';
SELECT id, label, text, features FROM train;
P
}
mkplan A ""
mkplan B "SET datafusion.execution.batch_size = 32768;"
for rep in 1 2 3; do for cfg in A B; do for n in 1 8; do
  rm -f xo-*.json
  for i in $(seq 1 $n); do $S subscribe xp$cfg --json --no-checksum --timeout 60 > xo-$i.json 2>/dev/null & done
  sleep 0.5
  t0=$(date +%s.%N)
  $S run xp-$cfg.sql --quiet --min-subscribers $n --wait-timeout 30
  wait
  python3 - $cfg $n $rep <<'PY'
import json,sys,glob,statistics
rates=[]
for f in glob.glob("xo-*.json"):
    ls=[json.loads(l) for l in open(f) if l.strip()]
    ep=[l for l in ls if "epoch" in l]
    rows=sum(l["rows"] for l in ep); secs=sum(l["seconds"] for l in ep)
    rates.append(rows/secs)
print(sys.argv[1], "N=%s"%sys.argv[2], "rep", sys.argv[3], "median per-subscriber Mrows/s %.2f"%(statistics.median(rates)/1e6), "n", len(rates))
PY
done; done; done
