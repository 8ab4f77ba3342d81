#!/usr/bin/env python3
"""A Python image loader shared with `sluice.publish` against the same loader run by
every trainer for itself, and against TensorSocket wrapping it, measured in the same run
(issue 51's comparison).

Usage (a Python with the Sluice wheel, numpy and Pillow; torch is used for a
`DataLoader` with `num_workers=1` yielding tensors where installed, else the loader runs
in the publishing process; TensorSocket 0.0.5 is measured where `tensorsocket` and torch
are installed, else skipped with the reason):

    .venv/bin/python benches/shared_loader.py [--images 3000] [--epochs 1] [--trainers 1 2 4]
        [--json OUT] [--tensorsocket-budget 60] [--device cuda:0]

The loader decodes JPEGs (160 px, made once in memory) with Pillow, takes a random crop,
resizes it to 112 px, flips it at random, normalises it and yields batches of 64
``(images float32 (64, 3, 112, 112), labels int64 (64,))``. Each trainer takes every
batch of every epoch (``--epochs``, one by default) and sums it (a stand-in for a
training step that reads the data; torch runs one intra-op thread per process). Each
process's start-up (``import torch`` costs 2–4
CPU-seconds on 2 vCPUs) is paid once per run, so more epochs show the cost per sample of
a long training run.

* one loader alone: samples/s, the bar every trainer should reach;
* N independent loaders: N processes, each iterating its own loader;
* Sluice: one process runs `sluice.publish(loader, ...)`, N processes read the topic
  through `sluice.structured` (the loader's own tuples, viewing shared memory), or with
  torch `sluice.torch.SharedLoader` (the loader's tensors);
* ``--device cuda:N`` (torch and a GPU): every trainer's tensors on that GPU. Each
  independent loader copies its batches there itself (N host-to-device copies of each
  batch); the Sluice publisher publishes with ``device="cuda:N"`` (one copy into its
  device slots, which the trainers' ``SharedLoader(writable=False)`` views over CUDA
  IPC); TensorSocket's producer moves every batch to the GPU itself where CUDA is
  available. The host-to-device bytes of each set-up are reported (TensorSocket's: not
  counted).
* TensorSocket: one process runs `TensorProducer(loader)` as its README does, N
  processes iterate `TensorConsumer()`; each stops after `--tensorsocket-budget`
  seconds if the epoch has not ended by then (it pickles every batch through ZMQ), and
  reports what it got.

Reported per N: samples/s per trainer (the slowest; every process timed from its first
batch on, whose rows are not counted), its ratio to one loader alone, and the
CPU-seconds of all processes (start-up and making the JPEGs included, in every set-up),
with the ratio Sluice / independent loaders. The publisher sizes its topic for the N
trainers (``max_subscribers=N``).
"""

from __future__ import annotations

import argparse
import json
import os
import subprocess
import sys
import time
from pathlib import Path

COMMON = r"""
import io, sys, time
import numpy as np
from PIL import Image

BATCH, SIZE, CROP = 64, 112, 128
MEAN = np.array([0.485, 0.456, 0.406], np.float32)[:, None, None]
STD = np.array([0.229, 0.224, 0.225], np.float32)[:, None, None]

def jpegs(count):
    rng = np.random.default_rng(0)
    out = []
    for i in range(count):
        pixels = rng.integers(0, 255, (160, 160, 3), dtype=np.uint8)
        buf = io.BytesIO()
        Image.fromarray(pixels).save(buf, format="JPEG", quality=85)
        out.append((buf.getvalue(), i % 10))
    return out

class Images:
    def __init__(self, blobs, seed):
        self.blobs, self.seed, self.epoch = blobs, seed, 0
    def __len__(self):
        return len(self.blobs)
    def __getitem__(self, i):
        blob, label = self.blobs[i]
        rng = np.random.default_rng((self.seed, i))
        img = Image.open(io.BytesIO(blob)).convert("RGB")
        t, l = rng.integers(0, 160 - CROP, size=2)
        img = img.crop((l, t, l + CROP, t + CROP)).resize((SIZE, SIZE), Image.Resampling.BILINEAR)
        a = np.asarray(img, dtype=np.float32).transpose(2, 0, 1) / 255.0
        if rng.random() < 0.5:
            a = a[:, :, ::-1]
        return np.ascontiguousarray((a - MEAN) / STD), label

class Batches:
    # Without torch: the same batches, made in this process.
    def __init__(self, dataset):
        self.dataset = dataset
    def __iter__(self):
        for start in range(0, len(self.dataset), BATCH):
            items = [self.dataset[i] for i in range(start, min(start + BATCH, len(self.dataset)))]
            yield np.stack([x for x, _ in items]), np.array([y for _, y in items], np.int64)

def loader(count, use_torch):
    dataset = Images(jpegs(count), seed=7)
    if use_torch:
        import torch
        import torch.utils.data as tud
        # A torchvision-style loader: tensors, decoded in one worker process.
        collate = lambda items: (torch.from_numpy(np.stack([x for x, _ in items])),
                                 torch.from_numpy(np.array([y for _, y in items], np.int64)))
        return tud.DataLoader(dataset, batch_size=BATCH, num_workers=1, persistent_workers=True,
                              collate_fn=collate)
    return Batches(dataset)

def step(images, labels):
    return float(images.sum()) + float(labels.sum())

# Steps through (images, labels) batches; prints the rows and seconds from the first
# batch on (its rows not counted), as every set-up here is timed, and the bytes this
# process copied to a GPU.
def timed(batches, copied=lambda: 0):
    rows, t0 = 0, None
    for images, labels in batches:
        step(images, labels)
        if t0 is None:
            t0 = time.perf_counter()
        else:
            rows += len(labels)
        del images, labels
    print(rows, time.perf_counter() - t0, copied())

# A loader's batches on `device` (each batch copied there by this process), counting
# the bytes.
def on_device(batches, device):
    moved = [0]
    def each():
        for images, labels in batches:
            moved[0] += images.nbytes + labels.nbytes
            yield images.to(device), labels.to(device)
    return each(), lambda: moved[0]

if "torch" in sys.argv:
    import torch
    # One intra-op thread in every process, as in DataLoader workers: with two, OpenMP's
    # threads spin after every step (a third of a trainer's CPU on 2 busy vCPUs).
    torch.set_num_threads(1)
"""

INDEPENDENT = COMMON + r"""
count, use_torch, epochs, device = int(sys.argv[1]), sys.argv[2] == "torch", int(sys.argv[3]), sys.argv[4]
data = loader(count, use_torch)
batches = (batch for _ in range(epochs) for batch in data)
if device == "cpu":
    timed(batches)
else:
    timed(*on_device(batches, device))
"""

PUBLISHER = COMMON + r"""
import sluice
count, use_torch, topic, trainers = int(sys.argv[1]), sys.argv[2] == "torch", sys.argv[3], int(sys.argv[4])
epochs, device = int(sys.argv[5]), sys.argv[6]
# Room for these trainers (the topic's shared memory is taken when it is created).
stats = sluice.publish(loader(count, use_torch), topic, epochs=epochs, min_subscribers=trainers,
                       max_subscribers=trainers, wait_timeout=300, linger=60, device=device)
# On a GPU topic every published byte was copied to the device once.
print(stats.rows, stats.elapsed, 0 if device == "cpu" else stats.bytes)
"""

TRAINER = COMMON + r"""
import sluice
topic, use_torch, epochs = sys.argv[1], sys.argv[2] == "torch", int(sys.argv[3])
if use_torch:
    import sluice.torch
    # The loader's tensors, as a training script that swapped its DataLoader gets them
    # (on a GPU topic: views of the producer's device slots, which nothing here writes).
    shared = sluice.torch.SharedLoader(topic, timeout=300, writable=False)
    timed(batch for _ in range(epochs) for batch in shared)
else:
    with sluice.subscribe(topic, timeout=300) as sub:
        timed(sluice.structured(batch) for batch in sub)
"""

TS_PRODUCER = COMMON + r"""
from tensorsocket import TensorProducer
producer = TensorProducer(loader(int(sys.argv[1]), True))
for _ in producer:  # one epoch, as its README's loop
    pass
producer.join()
print(0, 1)
"""

TS_TRAINER = COMMON + r"""
import os, threading
from tensorsocket import TensorConsumer
budget = float(sys.argv[1])
got = {"rows": 0, "t0": None}
start = time.perf_counter()
lock = threading.Lock()

def report():
    with lock:
        end = time.perf_counter()
        print(got["rows"], end - (got["t0"] or start), flush=True)
        os._exit(0)  # its receiving threads would keep the process

# The budget holds even where no batch comes (TensorSocket sends nothing of an epoch
# shorter than its producer_batch_size of 8 loader batches).
threading.Timer(budget, report).start()
for images, labels in TensorConsumer():
    step(images, labels)
    if got["t0"] is None:
        got["t0"] = time.perf_counter()
    else:
        got["rows"] += len(labels)
report()
"""


def run_all(cmds: list[list[str]], env: dict, timeout: float = 1800) -> tuple[list[str], float]:
    """Runs `cmds` at once; their outputs and the CPU-seconds of all of them."""
    procs = [subprocess.Popen(c, stdout=subprocess.PIPE, stderr=subprocess.PIPE, text=True, env=env) for c in cmds]
    outs, cpu = [], 0.0
    try:
        for p in procs:
            out, err = p.communicate(timeout=timeout)
            if p.returncode != 0:
                raise RuntimeError(f"{p.args[3:]} failed (exit status {p.returncode}): {err[-2000:]}")
            outs.append(out.strip().splitlines()[-1])
    except BaseException:
        # None left running (or unwaited) to spend CPU in a later measurement.
        for q in procs:
            q.kill()
            q.wait()
        raise
    # Children of this script only, all waited for: their user + system time.
    usage = os.times()
    cpu = usage.children_user + usage.children_system
    return outs, cpu


def run_tensorsocket(cmds: list[list[str]], producer: list[str], env: dict, budget: float) -> list[str]:
    """Runs TensorSocket's producer and its consumers; the consumers stop by themselves
    (the epoch's end or their budget); the producer is stopped once they have."""
    # Nothing reads the producer's output: a pipe it filled would stall it.
    prod = subprocess.Popen(producer, stdout=subprocess.DEVNULL, stderr=subprocess.DEVNULL, env=env)
    try:
        outs, _ = run_all(cmds, env, timeout=budget + 120)
    finally:
        try:
            prod.wait(timeout=10)
        except subprocess.TimeoutExpired:
            prod.kill()
            prod.wait()
    return outs


def tensorsocket_missing() -> str | None:
    """Why TensorSocket is not measured, or None."""
    try:
        import tensorsocket  # noqa: F401
        import torch  # noqa: F401
    except ImportError as e:
        return f"not measured: {e} (pip install tensorsocket==0.0.5 torch)"
    return None


def main() -> int:
    parser = argparse.ArgumentParser()
    parser.add_argument("--images", type=int, default=3000)
    parser.add_argument("--trainers", type=int, nargs="+", default=[1, 2, 4])
    parser.add_argument("--epochs", type=int, default=1,
                        help="epochs every loader and trainer runs (TensorSocket: measured with 1 only)")
    parser.add_argument("--json")
    parser.add_argument("--tensorsocket-budget", type=float, default=60.0)
    parser.add_argument("--device", default="cpu", help="cpu, or cuda:N: the trainers' tensors on that GPU")
    args = parser.parse_args()
    try:
        import torch  # noqa: F401

        kind = "torch"
    except ImportError:
        kind = "plain"
    if args.device != "cpu" and kind != "torch":
        parser.error(f"--device {args.device} needs torch")
    env = dict(os.environ, PYTHONUNBUFFERED="1", SLUICE_NAMESPACE=f"bench{os.getpid()}")
    py = sys.executable
    count, epochs, device = str(args.images), str(args.epochs), args.device
    cpu_before = 0.0

    def measured(cmds: list[list[str]]) -> tuple[list[str], float]:
        nonlocal cpu_before
        outs, cpu = run_all(cmds, env)
        spent, cpu_before = cpu - cpu_before, cpu
        return outs, spent

    def rate(line: str) -> float:
        rows, seconds = line.split()[:2]
        return int(rows) / float(seconds)

    def copied(lines: list[str]) -> int:
        """Bytes the processes that printed ``lines`` copied to a GPU."""
        return sum(int(line.split()[2]) for line in lines)

    alone_out, _ = measured([[py, "-c", INDEPENDENT, count, kind, epochs, device]])
    alone = rate(alone_out[0])
    ts_missing = tensorsocket_missing() if args.epochs == 1 else "not measured with --epochs above 1"
    results = {"images": args.images, "epochs": args.epochs, "loader": kind, "alone": alone, "runs": [],
               "device": device,
               "tensorsocket": ts_missing or "0.0.5", "tensorsocket_budget_s": args.tensorsocket_budget}
    print(f"one loader alone ({kind}): {alone:.0f} samples/s; TensorSocket: {ts_missing or 'measured'}")
    print("| N | independent: samples/s each | CPU-s | Sluice: samples/s each | vs alone | CPU-s | CPU Sluice / independent | TensorSocket: samples/s each | CPU-s |")
    print("|---|---|---|---|---|---|---|---|---|")
    for n in args.trainers:
        outs, ind_cpu = measured([[py, "-c", INDEPENDENT, count, kind, epochs, device] for _ in range(n)])
        ind, ind_h2d = min(rate(o) for o in outs), copied(outs)
        topic = f"shared{n}"
        cmds = [[py, "-c", TRAINER, topic, kind, epochs] for _ in range(n)]
        cmds.append([py, "-c", PUBLISHER, count, kind, topic, str(n), epochs, device])
        outs, sl_cpu = measured(cmds)
        shared, sl_h2d = min(rate(o) for o in outs[:n]), copied(outs)
        run = {"n": n, "independent": ind, "independent_cpu": ind_cpu, "sluice": shared, "sluice_cpu": sl_cpu,
               "independent_h2d_bytes": ind_h2d, "sluice_h2d_bytes": sl_h2d}
        ts = "—"
        if ts_missing is None:
            budget = str(args.tensorsocket_budget)
            try:
                outs = run_tensorsocket([[py, "-c", TS_TRAINER, budget] for _ in range(n)],
                                        [py, "-c", TS_PRODUCER, count], env, args.tensorsocket_budget)
            except (RuntimeError, subprocess.TimeoutExpired) as e:
                # Its consumers die now and then (no message): say so, measure the rest.
                measured([])
                run["tensorsocket_error"] = str(e).splitlines()[0][-200:]
                ts = "failed | —"
            else:
                _, ts_cpu = measured([])
                got = [int(o.split()[0]) for o in outs]
                run.update(tensorsocket=min(rate(o) for o in outs), tensorsocket_cpu=ts_cpu,
                           tensorsocket_samples=min(got))
                ts = f"{run['tensorsocket']:.0f} ({min(got)} samples) | {ts_cpu:.1f}"
        results["runs"].append(run)
        if device != "cpu":
            print(f"|   | host-to-device: {ind_h2d / 1e6:.0f} MB | | {sl_h2d / 1e6:.0f} MB "
                  f"({sl_h2d / max(ind_h2d, 1):.2f}×) | | | | | |")
        print(
            f"| {n} | {ind:.0f} | {ind_cpu:.1f} | {shared:.0f} | {shared / alone:.2f}× | {sl_cpu:.1f} | {sl_cpu / ind_cpu:.2f} | {ts} |"
        )
    if args.json:
        Path(args.json).write_text(json.dumps(results, indent=1))
    return 0


if __name__ == "__main__":
    sys.exit(main())
