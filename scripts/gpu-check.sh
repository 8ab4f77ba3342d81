#!/usr/bin/env bash
# The GPU check of issues 15 and 16, in two halves.
#
#   scripts/gpu-check.sh                 # here (Rust toolchain, no GPU): build the bundle
#   scripts/gpu-check.sh --run [BUNDLE]  # on the GPU machine (no toolchain, no network)
#
# Building puts everything the GPU machine needs into one ignored folder,
# target/gpu-bundle (under the 64 MiB a device call carries with the working tree: 31 MB
# with the dist wheel, 58 MB with the profiling one):
#   gpu_ipc.xz       the Rust two-process CUDA IPC tests (sluice-cuda), stripped and
#                    compressed (5.5 MB to 1.4: room for the larger wheel of the profiling
#                    profile beside the working tree)
#   gpu_decode.xz    nvJPEG against the CPU decoder (sluice-cuda), and jpeg/ its images
#   sluice-*.whl     the stripped abi3 wheel of profile.dist (must stay under 40 MB), or
#                    of profile.profiling with SLUICE_GPU_PROFILE=profiling (below)
#   python/          tests/python (test_gpu.py and its fixtures)
#   stage_rate       sluice-cuda's staging-rate example (the wheel's profile), stripped
#   gpu.py           the benchmark (benches/gpu.py), and images.sql (its input-bound plan)
#   shared_loader.py issue 51's loader benchmark, run with SLUICE_GPU_LOADER_BENCH=1
#   gpu-probe.py     the CUDA IPC probe (ctypes on libcuda)
#   gpu-check.sh     this script
#
# Running executes each step under its own time limit (about 9.5 minutes in all without
# the torch tests, 12 with them; on the H200 of 2026-11-28 the steps before the benchmark
# took 70 s); a failing step does not stop the others, and the results go to one JSON
# file, results.json, in $OUT when set (the device tool brings that folder back), else in
# the bundle, with the JUnit files of the tests and the logs in logs.tar.gz. The wheel is installed with
# `pip install --no-deps --target` and PYTHONPATH into the machine's own Python, which
# already has torch, CuPy, JAX, numpy, pyarrow and pytest.
#
# Through the device tool, from the repository root:
#   scripts/gpu-check.sh && run(command="bash scripts/gpu-check.sh --run", carry=["target/gpu-bundle"])
set -uo pipefail
cd "$(dirname "$0")/.."

if [ "${1:-}" != "--run" ]; then
  set -e
  BUNDLE=target/gpu-bundle
  rm -rf "$BUNDLE"
  mkdir -p "$BUNDLE"
  if [ ! -x .venv/bin/python ]; then
    "${PYTHON:-python3}" -m venv .venv
  fi
  export PYO3_PYTHON="$PWD/.venv/bin/python"
  scripts/python-env.sh > /dev/null

  # The test binary comes from the test build of scripts/test.sh (same compiler and
  # flags, so nothing is compiled again when the tests ran before).
  RUSTC_WORKSPACE_WRAPPER="$(rustup which clippy-driver 2>/dev/null || command -v clippy-driver)"
  export RUSTC_WORKSPACE_WRAPPER
  export CLIPPY_ARGS="-D__CLIPPY_HACKERY__warnings__CLIPPY_HACKERY__"
  for test in gpu_ipc gpu_decode; do
    binary=$(cargo test --locked -p sluice-cuda --test "$test" --no-run --message-format=json 2>/dev/null |
      .venv/bin/python -c 'import sys, json
for line in sys.stdin:
    m = json.loads(line)
    if m.get("executable"):
        print(m["executable"])')
    strip -o "$BUNDLE/$test" "$binary"
    xz -9 "$BUNDLE/$test"
  done
  # The JPEGs that gpu_decode decodes on the device (the `jpeg` fuzz target's seeds).
  cp -r fuzz/corpus/jpeg "$BUNDLE/jpeg"
  # The wheel people carry (profile.dist: fat LTO, DataFusion optimised for size,
  # stripped), in a target directory of its own so that the test build's artifacts stay.
  # SLUICE_GPU_PROFILE=profiling builds the wheel and `stage_rate` with the profile of
  # scripts/bench-bundle.sh instead (release code generation, no LTO), in target/ beside
  # that build: minutes instead of the dist build's long single-threaded link when the
  # benchmark bundle was built first; its wheel is larger.
  # SLUICE_GPU_PROFILE=dev builds the wheel from the test build (target/debug, opt-level
  # 1: a relink when the tests ran before) for the tests alone: no `stage_rate`, and the
  # run skips the benchmark, whose figures would not be a release build's.
  profile=${SLUICE_GPU_PROFILE:-dist}
  case "$profile" in
    dist) target_dir=${SLUICE_DIST_TARGET:-target/dist-build} ;;
    profiling | dev) target_dir=target ;;
    *) echo "SLUICE_GPU_PROFILE: dist, profiling or dev, not $profile" >&2; exit 1 ;;
  esac
  # The test build's compiler wrapper, kept for the dev wheel so nothing is compiled again.
  [ "$profile" = dev ] || unset RUSTC_WORKSPACE_WRAPPER CLIPPY_ARGS
  CARGO_TARGET_DIR="$target_dir" .venv/bin/maturin build \
    --locked --profile "$profile" --strip --compression-level 9 \
    -m crates/sluice-python/Cargo.toml --out "$BUNDLE" --interpreter "$PYO3_PYTHON"
  # The staging-rate benchmark, built as the wheel is (same target directory and profile,
  # so the dependencies it shares with the wheel are not compiled again).
  if [ "$profile" != dev ]; then
    CARGO_TARGET_DIR="$target_dir" cargo build --locked --profile "$profile" \
      -p sluice-cuda --example stage_rate
    cp "$target_dir/$profile/examples/stage_rate" "$BUNDLE/stage_rate"
    strip "$BUNDLE/stage_rate"
    cp benches/gpu.py pipelines/images.sql "$BUNDLE/"
  fi
  cp benches/shared_loader.py "$BUNDLE/"
  cp -r tests/python "$BUNDLE/python"
  rm -rf "$BUNDLE/python/__pycache__"
  cp scripts/gpu-probe.py scripts/gpu-check.sh "$BUNDLE/"

  wheel=$(ls "$BUNDLE"/sluice-*.whl)
  wheel_bytes=$(stat -c %s "$wheel")
  echo "== bundle: $(du -sh "$BUNDLE" | cut -f1) in $BUNDLE"
  ls -l "$BUNDLE"
  echo "== wheel: $wheel_bytes bytes ($((wheel_bytes / 1000000)) MB)"
  if [ "$profile" = dist ] && [ "$wheel_bytes" -ge 40000000 ]; then
    echo "the wheel is over 40 MB: it must stay under that to travel with room to spare" >&2
    exit 1
  fi
  bundle_bytes=$(du -sb "$BUNDLE" | cut -f1)
  if [ "$bundle_bytes" -ge 60000000 ]; then
    echo "the bundle is over 60 MB: a device call carries 64 MiB with the working tree" >&2
    exit 1
  fi
  exit 0
fi

BUNDLE=$(cd "${2:-target/gpu-bundle}" && pwd)
RESULTS=${OUT:-$BUNDLE}
mkdir -p "$RESULTS"
cd "$BUNDLE"
PY=${PYTHON:-python3}
steps=()

# step NAME SECONDS COMMAND...: runs under `timeout`, logs to RESULTS/NAME.log.
step() {
  local name=$1 limit=$2
  shift 2
  echo "== $name (limit ${limit} s)"
  local started=$SECONDS
  timeout --kill-after=5 "$limit" "$@" > "$RESULTS/$name.log" 2>&1
  local rc=$?
  local took=$((SECONDS - started))
  tail -n 40 "$RESULTS/$name.log"
  echo "== $name: exit $rc in $took s"
  steps+=("$name $rc $took")
}

# The machine may have no xz.
for test in gpu_ipc gpu_decode; do
  "$PY" -c 'import lzma, shutil, sys; shutil.copyfileobj(lzma.open(sys.argv[1]), open(sys.argv[2], "wb"))' \
    "$test.xz" "$test" && chmod +x "$test"
done
# nvJPEG is not part of the driver: the CUDA toolkit, or a wheel (nvidia-nvjpeg-cu12,
# torchvision's bundled copy) may have it.
if [ -z "${SLUICE_NVJPEG:-}" ]; then
  SLUICE_NVJPEG=$( (ls /usr/local/cuda*/lib64/libnvjpeg.so* 2>/dev/null
    "$PY" -c 'import site, glob
for d in site.getsitepackages():
    for p in ("nvidia/*/lib/libnvjpeg.so*", "torchvision.libs/libnvjpeg*.so*"):
        print(*glob.glob(f"{d}/{p}"), sep="\n")' 2>/dev/null) | grep . | head -n 1)
  [ -n "$SLUICE_NVJPEG" ] && export SLUICE_NVJPEG
fi
export XLA_PYTHON_CLIENT_PREALLOCATE=false PYTHONUNBUFFERED=1 SLUICE_PYTEST_INSTAFAIL=1
step device 20 bash -c 'nvidia-smi --query-gpu=name,driver_version,memory.total,uuid --format=csv
  "$0" -c "import torch, cupy, jax; print(\"torch\", torch.__version__, \"cuda\", torch.version.cuda, \"cupy\", cupy.__version__, \"jax\", jax.__version__)"
  nproc; uname -r' "$PY"
step probe 40 "$PY" gpu-probe.py --out "$RESULTS/probe.json"
step rust_gpu_ipc 60 bash -c 'set -o pipefail
  ./gpu_ipc --nocapture --test-threads=1 2>&1 | tee gpu_ipc.out
  rc=$?
  if grep -q SKIPPED gpu_ipc.out; then echo "the Rust GPU tests were skipped: no driver"; exit 3; fi
  exit $rc'
# Exit 3: no driver; 4: a driver but no nvJPEG (nothing decoded).
step rust_gpu_decode 60 bash -c 'set -o pipefail
  echo "SLUICE_NVJPEG=${SLUICE_NVJPEG:-}"
  SLUICE_JPEG_FIXTURES="$PWD/jpeg" ./gpu_decode --nocapture --test-threads=1 2>&1 | tee gpu_decode.out
  rc=$?
  if grep -q SKIPPED gpu_decode.out; then exit 3; fi
  if grep -q "NOT RUN" gpu_decode.out; then exit 4; fi
  exit $rc'
step install 30 "$PY" -m pip install --no-index --no-deps --target "$BUNDLE/site" --upgrade sluice-*.whl
export PYTHONPATH="$BUNDLE/site${PYTHONPATH:+:$PYTHONPATH}"
export SLUICE_GPU_IPC_TEST="$BUNDLE/gpu_ipc"
# Four workers (pytest-xdist, on the machine): each test has its own namespace, and
# the tests' processes are mostly waiting.
step python_gpu_tests 200 "$PY" -m pytest python/test_gpu.py -v -rs -p no:cacheprovider \
  -n 4 --timeout 150 --junitxml="$RESULTS/python_gpu_tests.xml"
# The torch adapter's tests (tests/python/test_torch.py), which CI skips: it has no torch.
step python_torch_tests 150 "$PY" -m pytest python/test_torch.py -v -rs -p no:cacheprovider \
  -n 4 --timeout 120 --junitxml="$RESULTS/python_torch_tests.xml"
# Issue 51 on the GPU (SLUICE_GPU_LOADER_BENCH=1: about 3 minutes; needs Pillow): a
# Python image loader shared with publish(device="cuda:0") against N loaders each
# copying its batches to the GPU (and TensorSocket where installed).
[ -n "${SLUICE_GPU_LOADER_BENCH:-}" ] && step loader_bench 200 "$PY" shared_loader.py --device cuda:0 \
  --images 1500 --trainers 1 2 4 --json "$RESULTS/loader-bench.json"
[ -x stage_rate ] && step bench 230 "$PY" gpu.py --out "$RESULTS/gpu-bench.json" --budget 215 --run-timeout 60 \
  --stage-rate ./stage_rate

printf '%s\n' "${steps[@]}" | RESULTS="$RESULTS" "$PY" -c '
import json, sys, os
results = os.environ["RESULTS"]
steps = {}
for line in sys.stdin:
    name, rc, took = line.split()
    log = open(os.path.join(results, name + ".log"), errors="replace").read()
    steps[name] = {"exit": int(rc), "seconds": int(took), "timed_out": rc in ("124", "137"),
                   "log_tail": log[-4000:]}
out = {"steps": steps}
for name in ("probe.json", "gpu-bench.json", "loader-bench.json"):
    path = os.path.join(results, name)
    if os.path.exists(path):
        out[name] = json.load(open(path))
json.dump(out, open(os.path.join(results, "results.json"), "w"), indent=2)
print("== results:", os.path.join(results, "results.json"))
print(json.dumps({k: v["exit"] for k, v in steps.items()}))
'
# The device tool brings back at most 8 files: the logs travel as one archive.
(cd "$RESULTS" && tar -czf logs.tar.gz ./*.log && rm -f ./*.log)
