# What scripts/profile.sh and scripts/profile-flight.sh share (sourced, from the
# repository root): perf and inferno, the `sluice` binary, a namespace of their own that
# is cleaned up on exit, the demo plan, and a flame graph with its flat profile.

# Fails unless perf is installed; installs inferno into .tools/ on first use.
profile_tools() {
  if ! command -v perf > /dev/null; then
    echo "error: perf is not installed (Debian: apt-get install linux-perf)" >&2
    exit 2
  fi
  if [ ! -x .tools/bin/inferno-flamegraph ]; then
    echo "== installing inferno into .tools/"
    cargo install --locked --quiet --root .tools inferno@0.12.3
  fi
}

# Sets `sluice`: SLUICE_BIN (another build, for an A/B of two) or the `profiling` build
# (release code generation with debug info), built here.
profile_binary() {
  if [ -n "${SLUICE_BIN:-}" ]; then
    sluice=$SLUICE_BIN
  else
    export PYO3_PYTHON=${PYO3_PYTHON:-$PWD/.venv/bin/python}
    cargo build --locked --quiet --profile profiling -p sluice-cli
    sluice=$PWD/target/profiling/sluice
  fi
}

# Sets `tmp`, `ns` (SLUICE_NAMESPACE: PREFIX and this shell's pid) and `pids`; on exit,
# kills the processes in `pids` and `profile_also_kill`, and removes the namespace's
# shared memory and state (see docs/architecture.md) and `tmp`.
profile_namespace() {
  tmp=$(mktemp -d)
  pids=()
  profile_also_kill=
  ns=$1$$
  export SLUICE_NAMESPACE=$ns
  trap profile_cleanup EXIT
}

profile_cleanup() {
  # shellcheck disable=SC2086 # a list of pids, or nothing
  for p in "${pids[@]}" $profile_also_kill; do kill "$p" 2> /dev/null || true; done
  rm -rf "$tmp" "/dev/shm/sluice-$ns" "${TMPDIR:-/tmp}/sluice-$ns.state"
  rm -f /dev/shm/iox2_sluice_"${ns}"_*
}

# Writes $tmp/plan.sql: the demo plan (`SELECT id, label, text, features`) in `rows`-row
# batches, `epochs` epochs, for `n` subscribers, on topic @TOPIC@ (each pass names its
# own); generates the demo dataset into data/demo once.
profile_demo_plan() {
  [ -d data/demo ] || "$sluice" demo --prepare-only > /dev/null
  cat > "$tmp/plan.sql" <<PLAN
SET sluice.topic = '@TOPIC@';
SET sluice.batch_rows = $rows;
SET sluice.epochs = $epochs;
SET sluice.min_subscribers = $n;
CREATE EXTERNAL TABLE train STORED AS PARQUET LOCATION '$PWD/data/demo/';
SELECT id, label, text, features FROM train;
PLAN
}

# `profile_flame NAME TITLE`: from $tmp/NAME.data, $out/NAME.folded, $out/NAME.svg and
# $out/NAME.top.txt (self time by symbol; no call graphs: they take minutes to resolve).
profile_flame() {
  local name=$1 title=$2
  perf script -i "$tmp/$name.data" 2> /dev/null |
    .tools/bin/inferno-collapse-perf > "$out/$name.folded"
  .tools/bin/inferno-flamegraph --title "$title" < "$out/$name.folded" > "$out/$name.svg"
  perf report -i "$tmp/$name.data" --no-children -g none --sort dso,symbol --stdio 2> /dev/null |
    grep -E '^ +[0-9]' | sed -E 's/ +$//' | head -80 > "$out/$name.top.txt" || true
}
