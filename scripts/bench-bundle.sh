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
#                   the `profiling` build (release code generation) that the 2-core figures in
#                   docs/benchmarks.md come from, stripped and compressed (28 MB and 2 MB);
#                   the S3 server (comparison 6) sits next to `sluice-bench`, where it
#                   looks for it
#   sluice.xz, sluice-*.whl
#                   only with SLUICE_BUNDLE_WHEEL=path: the `sluice` binary (comparison 8's
#                   producers, 29 MB) and that optimised abi3 wheel (comparison 8's Python
#                   trainers, 26 MB for scripts/gpu-check.sh's); without them comparison 8
#                   is skipped there
#   DejaVuSans.ttf  the plots' font, where the other machine has none
#   commit          the commit the binaries were built from, for the report
#
# Running unpacks into a temporary directory, installs the wheel with
# `pip install --no-deps --target` into the machine's own Python (which has numpy, pyarrow
# and Pillow), and writes the report and plots to $OUT/bench when OUT is set (the device
# tool brings that folder back), else to target/bench-out.
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
    strip -o "$BUNDLE/$bin" "target/profiling/$bin"
    xz -9 -T0 "$BUNDLE/$bin"
  done
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
bin=$(mktemp -d)
trap 'rm -rf "$bin"' EXIT
for f in "$BUNDLE"/*.xz; do
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
"$bin/sluice-bench" --repo "$PWD" --out "$out" --commit "$commit" "$@"
