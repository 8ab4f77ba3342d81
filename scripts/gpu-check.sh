#!/usr/bin/env bash
# Runs the GPU tests and benchmark of issue 5 on a machine with an NVIDIA GPU, CUDA,
# PyTorch and CuPy but no Rust toolchain and no network. Build the inputs on the
# development machine (x86-64) and carry this directory over:
#
#   # on the development machine
#   export CARGO_TARGET_DIR=/work/target-gpu
#   cargo test -p sluice-cuda --test gpu_ipc --no-run --message-format=json \
#     | python3 -c 'import sys,json;[print(m["executable"]) for m in map(json.loads,sys.stdin) if m.get("executable")]'
#   # -> copy that binary to gpu-bundle/gpu_ipc
#   cargo build -p sluice-cli && cp $CARGO_TARGET_DIR/debug/sluice gpu-bundle/
#   maturin build -m crates/sluice-python/Cargo.toml --out gpu-bundle/   # the abi3 wheel
#   cp -r tests/python benches/gpu.py scripts/gpu-check.sh gpu-bundle/
#
#   # on the GPU machine
#   bash gpu-bundle/gpu-check.sh gpu-bundle
#
# Needs pyarrow, numpy and pytest in the GPU machine's Python (torch and cupy are there).
set -euo pipefail
BUNDLE=${1:-gpu-bundle}
cd "$BUNDLE"
echo "== GPU: driver and device"
nvidia-smi --query-gpu=name,driver_version,memory.total --format=csv || true
python3 -c 'import torch; print("torch", torch.__version__, torch.cuda.get_device_name(0))'

echo "== GPU: Rust two-process CUDA IPC tests (prebuilt)"
./gpu_ipc --nocapture 2>&1 | tee gpu_ipc.log
if grep -q SKIPPED gpu_ipc.log; then
  echo "the GPU tests were skipped: libcuda.so was not found" >&2
  exit 1
fi

echo "== GPU: sluice CLI with sluice.device = 'cuda:0'"
export PATH=$PWD:$PATH

echo "== GPU: Python tests"
python3 -m venv --system-site-packages .venv-gpu
.venv-gpu/bin/python -m pip install --no-index --no-deps --force-reinstall sluice-*-abi3-*.whl
SLUICE_GPU_IPC_TEST=$PWD/gpu_ipc .venv-gpu/bin/python -m pytest python/test_gpu.py -v -rs

echo "== GPU: benchmark"
.venv-gpu/bin/python gpu.py --out gpu-bench.json
echo "record gpu-bench.json, the device name and this command in docs/benchmarks.md"
