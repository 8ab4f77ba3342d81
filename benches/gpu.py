"""GPU benchmark (issue 5): run on a machine with an NVIDIA GPU, torch and the Sluice wheel.

    python benches/gpu.py --rows 200000 --batch-rows 8192 --out gpu-bench.json

Measures, in one run, each against a baseline taken in the same run:
  1. host-to-device GB/s: Sluice's producer (pinned staging -> device slot) against a raw
     pinned host-to-device copy of the same number of bytes (torch, non_blocking from a
     pinned tensor, which is cuMemcpyHtoDAsync underneath);
  2. publish -> usable latency per batch on a subscriber (p50/p99) -- not measured yet:
     it needs the GPU producer and a publish timestamp per batch;
  3. 4 torch subscribers on one GPU producer against 4 independent loaders (each runs the
     same plan itself with sluice.device = 'cpu' and moves batches with .to('cuda')).
Parts that need the GPU producer report "unavailable: <error>" while the producer does
not publish GPU batches (docs/gpu.md); the raw baselines always run.
"""

from __future__ import annotations

import argparse
import json
import os
import subprocess
import sys
import tempfile
import time
from pathlib import Path


def raw_htod(torch, nbytes: int, reps: int) -> float:
    host = torch.empty(nbytes, dtype=torch.uint8).pin_memory()
    dev = torch.empty(nbytes, dtype=torch.uint8, device="cuda")
    dev.copy_(host, non_blocking=True)
    torch.cuda.synchronize()
    t = time.perf_counter()
    for _ in range(reps):
        dev.copy_(host, non_blocking=True)
    torch.cuda.synchronize()
    return nbytes * reps / (time.perf_counter() - t) / 1e9


def make_plan(directory: Path, topic: str, rows: int, batch_rows: int, device: str) -> Path:
    import numpy as np
    import pyarrow as pa
    import pyarrow.parquet as pq

    data = directory / "data"
    if not data.exists():
        data.mkdir()
        vec = pa.FixedSizeListArray.from_arrays(
            pa.array(np.random.default_rng(0).random(rows * 256, dtype=np.float32)), 256)
        pq.write_table(pa.table({"id": pa.array(np.arange(rows)), "vec": vec}), data / "part.parquet")
    plan = directory / f"{topic}.sql"
    plan.write_text(
        f"SET sluice.topic = '{topic}';\nSET sluice.batch_rows = {batch_rows};\n"
        f"SET sluice.device = '{device}';\n"
        f"CREATE EXTERNAL TABLE t STORED AS PARQUET LOCATION '{data}/';\nSELECT id, vec FROM t;\n")
    return plan


SUBSCRIBER = """
import sys, time, torch, sluice
n = 0
t0 = time.perf_counter()
for b in sluice.subscribe(sys.argv[1], timeout=120):
    t = torch.from_dlpack(b['vec'])
    torch.cuda.current_stream().synchronize()
    n += len(t)
print(n, time.perf_counter() - t0)
"""

LOADER = """
import sys, time, torch, sluice
n = 0
t0 = time.perf_counter()
p = sluice.Producer(sys.argv[2], min_subscribers=1)
for b in sluice.subscribe(sys.argv[1], timeout=120):
    t = torch.from_numpy(b['vec'].to_numpy()).to('cuda', non_blocking=True)
    n += len(t)
torch.cuda.synchronize()
p.wait(timeout=120)
print(n, time.perf_counter() - t0)
"""


def main() -> None:
    ap = argparse.ArgumentParser()
    ap.add_argument("--rows", type=int, default=200_000)
    ap.add_argument("--batch-rows", type=int, default=8192)
    ap.add_argument("--subscribers", type=int, default=4)
    ap.add_argument("--out", default="gpu-bench.json")
    args = ap.parse_args()
    import torch
    import sluice

    result = {"device": torch.cuda.get_device_name(0), "command": " ".join(sys.argv)}
    batch_bytes = args.batch_rows * (256 * 4 + 8)
    result["raw_pinned_htod_gbps"] = raw_htod(torch, batch_bytes, 200)
    with tempfile.TemporaryDirectory() as tmp:
        d = Path(tmp)
        gpu_plan = make_plan(d, "gpubench", args.rows, args.batch_rows, "cuda:0")
        try:
            t = time.perf_counter()
            producer = sluice.Producer(str(gpu_plan), min_subscribers=args.subscribers)
            subs = [subprocess.Popen([sys.executable, "-c", SUBSCRIBER, "gpubench"],
                                     stdout=subprocess.PIPE, text=True)
                    for _ in range(args.subscribers)]
            outs = [s.communicate(timeout=600)[0].split() for s in subs]
            producer.wait(timeout=600)
            elapsed = time.perf_counter() - t
            result["sluice_gpu"] = {"subscribers": args.subscribers, "seconds": elapsed,
                                    "rows_per_subscriber": [int(o[0]) for o in outs],
                                    "htod_gbps": args.rows * (256 * 4 + 8) / elapsed / 1e9}
        except Exception as e:  # noqa: BLE001 - reported, not hidden
            result["sluice_gpu"] = f"unavailable: {e}"
        loaders = []
        for i in range(args.subscribers):
            plan = make_plan(d, f"loader{i}", args.rows, args.batch_rows, "cpu")
            loaders.append(subprocess.Popen([sys.executable, "-c", LOADER, f"loader{i}", str(plan)],
                                            stdout=subprocess.PIPE, text=True,
                                            env=dict(os.environ, SLUICE_NAMESPACE=f"gb{os.getpid()}x{i}")))
        t = time.perf_counter()
        outs = [p.communicate(timeout=600)[0].split() for p in loaders]
        result["independent_loaders"] = {"loaders": args.subscribers,
                                         "seconds": time.perf_counter() - t,
                                         "rows_per_loader": [int(o[0]) if o else None for o in outs]}
    result["publish_to_usable_latency"] = (
        "not measured yet: needs the GPU producer and a publish timestamp per batch (docs/gpu.md)")
    print(json.dumps(result, indent=2))
    Path(args.out).write_text(json.dumps(result, indent=2))


if __name__ == "__main__":
    main()
