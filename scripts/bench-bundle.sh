#!/usr/bin/env bash
# sluice-bench on a machine without a Rust toolchain (the 16-core GPU machine of the device
# tool: no toolchain, no network), in two halves.
#
#   scripts/bench-bundle.sh                  # here: build the bundle, target/bench-bundle
#   scripts/bench-bundle.sh --run [ARGS...]  # there, from the repository root: unpack the
#                                            # bundle and run `sluice-bench ARGS...`
#
# The bundle (the 64 MiB a device call carries holds the first two, 30 MB, and not all
# three binaries with the wheel):
#   sluice-bench.xz, sluice-s3-test-server.xz
#                   the `profiling` build (release code generation, with symbols for
#                   perf), stripped and compressed (28 MB and 2 MB);
#                   the S3 server (comparison 6) sits next to `sluice-bench`, where it
#                   looks for it
#   sluice.xz, sluice-*.whl
#                   only with SLUICE_BUNDLE_WHEEL=path: the `sluice` binary (comparison 8's
#                   producers, 29 MB) and that optimised abi3 wheel (comparison 8's Python
#                   trainers, 26 MB for scripts/gpu-check.sh's); without them comparison 8
#                   is skipped there
#   perf.tar.xz     only with SLUICE_BUNDLE_PERF=1: this machine's `perf` with every library
#                   it links, its own loader included (the GPU machine has no perf; 9 MB),
#                   and `sluice-bench` keeps its symbol table (stripped of debug info only)
#                   so that the profile names its functions
#   DejaVuSans.ttf  the plots' font, where the other machine has none
#   commit          the commit the binaries were built from, for the report
#
# Running unpacks into a temporary directory, installs the wheel with
# `pip install --no-deps --target` into the machine's own Python (which has numpy, pyarrow
# and Pillow), and writes the report and plots to $OUT/bench when OUT is set (the device
# tool brings that folder back), else to target/bench-out.
#
# With a perf bundle, `--run --perf ARGS` runs `sluice-bench ARGS` under `perf record` (a
# flat profile: cpu-clock samples, no call graphs) and writes two reports next to the
# benchmark's: perf-threads.txt (CPU share per thread: the benchmark names its threads by
# role and N, see crates/sluice-bench/src/fanout.rs) and perf-symbols.txt (per thread,
# per function).
#
# Through the device tool, from the repository root:
#   scripts/bench-bundle.sh && run(command="bash scripts/bench-bundle.sh --run --skip gpu", carry=["target/bench-bundle"])
set -euo pipefail
cd "$(dirname "$0")/.."
BUNDLE=target/bench-bundle

if [ "${1:-}" != "--run" ]; then
  cargo build --locked --profile profiling -p sluice-bench -p sluice-cli -p sluice-s3-test-server
  rm -rf "$BUNDLE"
  mkdir -p "$BUNDLE"
  bins="sluice-bench sluice-s3-test-server"
  if [ -n "${SLUICE_BUNDLE_WHEEL:-}" ]; then
    cp "$SLUICE_BUNDLE_WHEEL" "$BUNDLE/"
    bins="$bins sluice"
  else
    echo "no wheel (SLUICE_BUNDLE_WHEEL): comparison 8 will be skipped there"
  fi
  for bin in $bins; do
    if [ -n "${SLUICE_BUNDLE_PERF:-}" ] && [ "$bin" = sluice-bench ]; then
      strip --strip-debug -o "$BUNDLE/$bin" "target/profiling/$bin"
    else
      strip -o "$BUNDLE/$bin" "target/profiling/$bin"
    fi
    xz -9 -T0 "$BUNDLE/$bin"
  done
  if [ -n "${SLUICE_BUNDLE_PERF:-}" ]; then
    # The ELF binary itself (Ubuntu's /usr/bin/perf is a shell script that picks one).
    perf=$(readlink -f "$(command -v perf || true)")
    if [ ! -x "$perf" ] || ! ldd "$perf" > /dev/null 2>&1; then
      echo "SLUICE_BUNDLE_PERF: no dynamically linked perf binary found (apt-get install linux-perf)" >&2
      exit 1
    fi
    staging=$(mktemp -d)
    mkdir "$staging/perf"
    cp -L "$perf" "$staging/perf/perf"
    # Every library perf links (libc and the loader included, so that it runs on
    # another distribution's C library).
    ldd "$perf" | awk '/=>/ { if ($3 ~ /^\//) print $3; next } /ld-linux/ { print $1 }' | while read -r lib; do
      cp -L "$lib" "$staging/perf/"
    done
    tar -C "$staging" -cJf "$BUNDLE/perf.tar.xz" perf
    rm -rf "$staging"
  fi
  for font in /usr/share/fonts/truetype/dejavu/DejaVuSans.ttf /usr/share/fonts/TTF/DejaVuSans.ttf; do
    if [ -f "$font" ]; then
      cp "$font" "$BUNDLE/"
      break
    fi
  done
  # The commit the binaries were built from, for the report (the copy on the other machine
  # may carry no git history, or another one).
  commit=$(git rev-parse --short HEAD 2> /dev/null || echo unknown)
  if [ -n "$(git status --porcelain -- crates tools Cargo.toml Cargo.lock 2> /dev/null)" ]; then
    commit="$commit (with uncommitted changes)"
  fi
  echo "$commit" > "$BUNDLE/commit"
  echo "== bundle: $(du -sh "$BUNDLE" | cut -f1) in $BUNDLE"
  ls -l "$BUNDLE"
  exit 0
fi

shift
profile=
if [ "${1:-}" = "--perf" ]; then
  profile=1
  shift
fi
bin=$(mktemp -d)
trap 'rm -rf "$bin"' EXIT
for f in "$BUNDLE"/*.xz; do
  case "$f" in *.tar.xz) continue ;; esac # perf's, unpacked below with --perf
  name=$(basename "$f" .xz)
  if command -v xz > /dev/null; then
    xz -dc "$f" > "$bin/$name"
  else
    python3 -c 'import lzma, shutil, sys; shutil.copyfileobj(lzma.open(sys.argv[1]), open(sys.argv[2], "wb"))' "$f" "$bin/$name"
  fi
  chmod +x "$bin/$name"
done
wheel=$(ls "$BUNDLE"/sluice-*.whl 2> /dev/null | head -n 1 || true)
if [ -n "$wheel" ]; then
  python3 -m pip install -q --no-deps --no-compile --target "$bin/python" "$wheel"
  export PYTHONPATH="$bin/python${PYTHONPATH:+:$PYTHONPATH}"
fi
# plot.rs looks for DejaVu Sans where Debian keeps it.
if [ -f "$BUNDLE/DejaVuSans.ttf" ] && [ ! -f /usr/share/fonts/truetype/dejavu/DejaVuSans.ttf ]; then
  mkdir -p /usr/share/fonts/truetype/dejavu 2> /dev/null &&
    cp "$BUNDLE/DejaVuSans.ttf" /usr/share/fonts/truetype/dejavu/ 2> /dev/null ||
    echo "cannot install the plots' font: plots will be skipped"
fi
out=${OUT:-target/bench-out}/bench
mkdir -p "$out"
commit=$(cat "$BUNDLE/commit" 2> /dev/null || echo "unknown (a bundle without its commit)")
if [ -z "$profile" ]; then
  "$bin/sluice-bench" --repo "$PWD" --out "$out" --commit "$commit" "$@"
  exit 0
fi
if [ ! -f "$BUNDLE/perf.tar.xz" ]; then
  echo "--perf: this bundle has no perf (build it with SLUICE_BUNDLE_PERF=1)" >&2
  exit 1
fi
python3 -c 'import sys, tarfile; tarfile.open(sys.argv[1]).extractall(sys.argv[2])' "$BUNDLE/perf.tar.xz" "$bin"
perf() {
  "$bin/perf/ld-linux-x86-64.so.2" --library-path "$bin/perf" "$bin/perf/perf" "$@"
}
# -N: no copy of the (large) binaries into ~/.debug.
perf record -N -F 997 -o "$bin/perf.data" -- \
  "$bin/sluice-bench" --repo "$PWD" --out "$out" --commit "$commit" "$@"
# perf record exits with the benchmark's status: a failed run stops here, under set -e.
perf report -i "$bin/perf.data" --stdio --no-children --sort comm > "$out/perf-threads.txt"
# Per role at N = 1 and N = 8 with the default batch (1024 rows): the publishing thread,
# DataFusion's workers, and all subscribers together. (perf's own `--comms` filter picked
# the wrong samples for threads renamed after they start; grouping the `comm,dso,sym`
# rows by their comm column does not.)
perf report -i "$bin/perf.data" --stdio --no-children --sort comm,dso,sym -n \
  --percent-limit 0 > "$bin/report.txt"
grep -v -e '^#' -e '^$' "$bin/report.txt" > "$bin/rows.txt" || true
: > "$out/perf-symbols.txt"
for group in pub1/1024 df1/1024 'sub1\.[0-9]*/1024' pub8/1024 df8/1024 'sub8\.[0-9]*/1024'; do
  awk -v re="^$group\$" '
    $3 ~ re {
      key = $4; for (k = 5; k <= NF; k++) key = key " " $k
      # Addresses without a symbol (the internal functions of a distribution libc, whose
      # symbol table is stripped: memcpy, the allocator): one row per library.
      if ($6 ~ /^0x/) key = $4 " " $5 " (no symbol table)"
      n[key] += $2; total += $2; threads[$3] = 1
    }
    END {
      if (total == 0) exit
      list = ""; for (t in threads) list = list " " t
      # Sorted by the first field, which the header outnumbers; cut drops it.
      printf "%d\t=== %d samples, threads:%s\n", total + 1, total, list
      for (k in n) printf "%d\t%7.2f%%  %7d  %s\n", n[k], 100 * n[k] / total, n[k], k
    }' "$bin/rows.txt" | sort -t "$(printf '\t')" -k1,1 -rn | awk 'NR <= 41' | cut -f2- >> "$out/perf-symbols.txt"
done
echo "== profile: $out/perf-threads.txt, $out/perf-symbols.txt"
