#!/usr/bin/env python3
"""The image pipeline (pipelines/images.sql: decode JPEG, resize 72x72, random crop 64x64,
random flip, normalize, CHW, one-hot label) in Sluice against Pillow + numpy doing the
same work, measured in the same run.

Usage (needs a `sluice` binary and a Python with the Sluice wheel, pyarrow, numpy and
Pillow; `sluice-bench` runs it as comparison 8):

    cargo build --release -p sluice-cli
    .venv/bin/python benches/image_pipeline.py [--images 3000] [--trainers 4] [--epochs 2] [--reps 1] [--json OUT]

1. Images/s per core: `sluice checksum` runs the plan once with one DataFusion partition
   (its CPU-seconds include reading Parquet); one Python process does the same with
   pyarrow + Pillow + numpy. Ratio: Sluice / Pillow.
2. N Python trainers: one `sluice run` producer feeding N Python processes
   (`sluice.subscribe`, each sums every pixel and target of every batch through
   `np.from_dlpack`) against N independent Python loaders that decode and augment for
   themselves and sum the same arrays. Wall seconds and CPU-seconds of all processes.
   `--reps R` repeats this comparison R times, Sluice and the loaders alternated, and
   reports each repetition and the median of the ratio: on the 2-vCPU development machine
   one run's producer took from 1.3 to 1.8 CPU-s for the same work.
"""

from __future__ import annotations

import argparse
import io
import json
import os
import subprocess
import sys
import tempfile
import threading
import time
from pathlib import Path

ROOT = Path(__file__).resolve().parent.parent

LOADER = r"""
import io, sys, time, numpy as np, pyarrow.parquet as pq, pyarrow.dataset as ds
from PIL import Image
started = time.process_time()
path, epochs, seed = sys.argv[1], int(sys.argv[2]), 7
mean = np.array([0.485, 0.456, 0.406], np.float32); std = np.array([0.229, 0.224, 0.225], np.float32)
rows, total = 0, 0.0
for epoch in range(epochs):
    rng = np.random.default_rng(seed * 1000 + epoch)
    for batch in ds.dataset(path, format="parquet").to_batches(columns=["id", "label", "image"], batch_size=128):
        images = batch.column("image").to_pylist()
        labels = batch.column("label").to_numpy()
        out = np.empty((len(images), 3, 64, 64), np.float32)
        for i, blob in enumerate(images):
            img = Image.open(io.BytesIO(blob)).convert("RGB").resize((72, 72), Image.Resampling.BILINEAR)
            a = np.asarray(img)
            t, l = rng.integers(0, 9, size=2)
            a = a[t:t + 64, l:l + 64]
            if rng.random() < 0.5:
                a = a[:, ::-1]
            out[i] = ((a.astype(np.float32) / 255.0 - mean) / std).transpose(2, 0, 1)
        target = np.eye(10, dtype=np.float32)[labels]
        total += float(out.sum()) + float(target.sum())
        rows += len(images)
print(rows, total, started)
"""


# Also prints the process's CPU-seconds at the end of its imports, so that the report can
# tell Python's and numpy's start-up from the work per batch.
TRAINER = r"""
import sys, time, numpy as np, sluice
started = time.process_time()
topic, rows, total = sys.argv[1], 0, 0.0
with sluice.subscribe(topic, timeout=300) as sub:
    for batch in sub:
        total += float(np.from_dlpack(batch["pixels"]).sum()) + float(np.from_dlpack(batch["target"]).sum())
        rows += batch.num_rows
print(rows, total, started)
"""


def timed(cmds: list[list[str]], env: dict, deadline: float = 1200) -> tuple[float, float, list[str], list[float]]:
    """Runs `cmds` at once; wall seconds, CPU-seconds of all of them, their outputs, and
    each one's CPU-seconds (user + system, its own children included). Kills them all
    after `deadline` seconds, and the rest once one that is waited for has failed (they
    are waited for in order, so a failure is noticed when its turn comes)."""
    t0 = time.perf_counter()
    procs = [subprocess.Popen(c, stdout=subprocess.PIPE, text=True, env=env) for c in cmds]

    def kill_all() -> None:
        for p in procs:
            if p.returncode is None:
                p.kill()

    expired = threading.Event()

    def expire() -> None:
        expired.set()
        kill_all()

    timer = threading.Timer(deadline, expire)
    timer.start()
    outs, cpus = [], []
    try:
        for p in procs:
            # Each prints one line at its end: reading it to EOF cannot fill the pipe.
            outs.append(p.stdout.read())
            p.stdout.close()
            # wait4 (not Popen.wait) gives this one process's rusage.
            _, status, usage = os.wait4(p.pid, 0)
            p.returncode = os.waitstatus_to_exitcode(status)
            cpus.append(usage.ru_utime + usage.ru_stime)
    finally:
        timer.cancel()
        kill_all()
        for p in procs:
            if p.returncode is None:
                p.wait()
    if expired.is_set():
        raise RuntimeError(f"{cmds} did not finish in {deadline} s")
    assert all(p.returncode == 0 for p in procs), outs
    return time.perf_counter() - t0, sum(cpus), outs, cpus


def plan_file(workdir: Path, data: Path, topic: str, epochs: int, partitions: int | None, subscribers: int) -> Path:
    text = (ROOT / "pipelines" / "images.sql").read_text()
    text = text.replace("'data/images/'", f"'{data}/'").replace("'images'", f"'{topic}'")
    text = text.replace("SET sluice.epochs = 2;", f"SET sluice.epochs = {epochs};")
    extra = f"SET sluice.max_subscribers = {max(subscribers, 1)};\n"
    if partitions:
        extra += f"SET datafusion.execution.target_partitions = {partitions};\n"
    path = workdir / f"{topic}.sql"
    path.write_text(extra + text)
    return path


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--sluice", type=Path, default=ROOT / "target" / "release" / "sluice")
    parser.add_argument("--images", type=int, default=3000)
    parser.add_argument("--trainers", type=int, default=4)
    parser.add_argument("--epochs", type=int, default=2)
    parser.add_argument("--reps", type=int, default=1,
                        help="repetitions of the N-trainer comparison, Sluice and the loaders alternated")
    parser.add_argument("--json", type=Path, help="also write the figures to this JSON file")
    parser.add_argument("--producer-partitions", type=int,
                        help="DataFusion partitions of the N-trainer producer (default: DataFusion's, one per core)")
    args = parser.parse_args()
    if args.reps < 1:
        parser.error("--reps must be at least 1")
    sluice = str(args.sluice)
    if not args.sluice.exists():
        sys.exit(f"{sluice} is missing: run `cargo build --release -p sluice-cli` first")
    ns = f"imgbench{os.getpid()}"
    env = dict(os.environ, SLUICE_NAMESPACE=ns, SLUICE_LOG="warn")
    # A failed run (an assertion, a trainer that died) leaves no shared memory behind either.
    try:
        with tempfile.TemporaryDirectory() as tmp:
            workdir = Path(tmp)
            data = workdir / "images"
            subprocess.run(
                [sluice, "demo", "--images", "--prepare-only", "--rows", str(args.images), "--data", str(data),
                 "--plan", str(workdir / "unused.sql")],
                check=True, env=env,
            )
            # 1. Per core.
            plan = plan_file(workdir, data, "percore", 1, 1, 1)
            s_wall, s_cpu, _, _ = timed([[sluice, "checksum", str(plan)]], env)
            p_wall, p_cpu, _, _ = timed([[sys.executable, "-c", LOADER, str(data), "1"]], env)
            s_rate, p_rate = args.images / s_cpu, args.images / p_cpu
            print(f"{args.images} JPEGs (48-127 px a side), decode, resize 72x72, random crop 64x64, flip, normalize, CHW\n")
            print("| one core | CPU-s | images/s per core | vs Pillow + numpy |")
            print("|---|---:|---:|---:|")
            print(f"| Pillow + numpy (one Python process) | {p_cpu:.2f} | {p_rate:.0f} | 1.00 |")
            print(f"| Sluice (`sluice checksum`, 1 partition) | {s_cpu:.2f} | {s_rate:.0f} | {s_rate / p_rate:.2f} |")
            print()
            # 2. N trainers, `reps` times, alternated.
            n, epochs = args.trainers, args.epochs
            plan = plan_file(workdir, data, "fanout", epochs, args.producer_partitions, n)
            trainers = [[sys.executable, "-c", TRAINER, "fanout"] for _ in range(n)]
            producer = [sluice, "run", str(plan), "--quiet", "--min-subscribers", str(n), "--wait-timeout", "300"]
            runs = []
            for _ in range(args.reps):
                f_wall, f_cpu, outs, f_cpus = timed(trainers + [producer], env)
                assert {int(o.split()[0]) for o in outs[:n]} == {args.images * epochs}, outs
                l_wall, l_cpu, louts, _ = timed([[sys.executable, "-c", LOADER, str(data), str(epochs)] for _ in range(n)], env)
                assert {int(o.split()[0]) for o in louts} == {args.images * epochs}, louts
                # Every Python process pays its interpreter's and numpy's start-up once, whatever
                # it then does (with OpenBLAS, one spinning thread per core: most of a trainer's
                # CPU on 16 cores); a run of hours amortises it. The same ratio without it, on
                # both sides:
                loader_startup = sum(float(o.split()[2]) for o in louts)
                startup = [float(o.split()[2]) for o in outs[:n]]
                runs.append({
                    "sluice": {"wall": f_wall, "cpu": f_cpu, "producer_cpu": f_cpus[n], "trainer_cpu": f_cpus[:n],
                               "trainer_startup_cpu": startup},
                    "loaders": {"wall": l_wall, "cpu": l_cpu, "startup_cpu": loader_startup},
                    "cpu_ratio": f_cpu / l_cpu,
                    "cpu_ratio_without_startup": (f_cpu - sum(startup)) / (l_cpu - loader_startup),
                })
            print(f"{n} Python trainers, {epochs} epochs of {args.images} images each, {args.reps} repetition(s), "
                  f"{os.cpu_count()} cores\n")
            print("| repetition | loaders wall s | loaders CPU-s | Sluice wall s | Sluice CPU-s (all processes) "
                  "| of which the producer | CPU vs loaders |")
            print("|---:|---:|---:|---:|---:|---:|---:|")
            for i, r in enumerate(runs, 1):
                print(f"| {i} | {r['loaders']['wall']:.2f} | {r['loaders']['cpu']:.2f} | {r['sluice']['wall']:.2f} | "
                      f"{r['sluice']['cpu']:.2f} | {r['sluice']['producer_cpu']:.2f} | {r['cpu_ratio']:.2f} |")
            # The median repetition by the ratio (the lower middle one of an even count).
            mid = sorted(runs, key=lambda r: r["cpu_ratio"])[(len(runs) - 1) // 2]
            print(f"\nMedian repetition: the trainers {' '.join(f'{c:.2f}' for c in mid['sluice']['trainer_cpu'])} "
                  f"CPU-s, of which Python's start-up (to the end of its imports) "
                  f"{' '.join(f'{c:.2f}' for c in mid['sluice']['trainer_startup_cpu'])}; the loaders' start-up "
                  f"{mid['loaders']['startup_cpu']:.2f} in all. CPU vs loaders without the Python processes' "
                  f"start-up, on both sides: {mid['cpu_ratio_without_startup']:.2f}")
            if args.json:
                # The median repetition's figures at the top level (as before repetitions), every
                # repetition's under "runs".
                args.json.write_text(json.dumps({
                    "images": args.images,
                    "epochs": epochs,
                    "trainers": n,
                    "per_core": {"sluice_cpu": s_cpu, "pillow_cpu": p_cpu},
                    "sluice": mid["sluice"],
                    "loaders": mid["loaders"],
                    "cpu_ratio_without_startup": mid["cpu_ratio_without_startup"],
                    "runs": runs,
                }))
    finally:
        for f in os.listdir("/dev/shm"):
            if f.startswith(f"iox2_sluice_{ns}_"):
                os.remove(f"/dev/shm/{f}")
        subprocess.run(["rm", "-rf", f"/dev/shm/sluice-{ns}", f"{tempfile.gettempdir()}/sluice-{ns}.state"], check=False)


if __name__ == "__main__":
    main()
