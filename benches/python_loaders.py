#!/usr/bin/env python3
"""N Python trainers on one Sluice producer against N Python processes that each read
the same Parquet files with pyarrow and apply the same transform.

Usage (a Python with the Sluice wheel, pyarrow and numpy, and a release `sluice`;
`sluice-bench` runs it as comparison 8):

    cargo build --release -p sluice-cli
    .venv/bin/python benches/python_loaders.py [--trainers 1 2 4] [--epochs 2] [--json OUT]

Each trainer, in both set-ups, receives every row of the demo dataset (label not null)
per epoch and computes a normalised feature matrix ``(x - 0.5) / 0.25`` and its sum.
The Sluice producer is a separate process (`sluice run`) and is counted in the CPU time.
Prints a Markdown table: wall seconds and total CPU-seconds (all processes), and the
ratio Sluice / independent loaders, measured in the same run.
"""

from __future__ import annotations

import argparse
import os
import resource
import subprocess
import sys
import tempfile
import time
from pathlib import Path

ROOT = Path(__file__).resolve().parent.parent
SLUICE = ROOT / "target" / "release" / "sluice"

TRAINER_SLUICE = r"""
import sys, numpy as np, sluice
topic, epochs = sys.argv[1], int(sys.argv[2])
total = 0.0
rows = 0
with sluice.subscribe(topic, timeout=120) as sub:
    for epoch in sub.epochs():
        for batch in epoch:
            x = np.from_dlpack(batch["features"])
            total += float(((x - 0.5) / 0.25).sum())
            rows += batch.num_rows
print(rows, total)
"""

TRAINER_PYARROW = r"""
import sys, numpy as np, pyarrow.dataset as ds, pyarrow.compute as pc
path, epochs = sys.argv[1], int(sys.argv[2])
total = 0.0
rows = 0
for _ in range(epochs):
    dataset = ds.dataset(path, format="parquet")
    for batch in dataset.to_batches(columns=["id", "label", "text", "features"],
                                    filter=pc.field("label").is_valid(), batch_size=512):
        feats = batch.column("features")
        x = feats.values.to_numpy(zero_copy_only=False).reshape(len(feats), -1)
        total += float(((x - 0.5) / 0.25).sum())
        rows += batch.num_rows
print(rows, total)
"""


TRAINER_COUNT = r"""
import sys, time, sluice
rows, first = 0, None
with sluice.subscribe(sys.argv[1], timeout=120) as sub:
    for batch in sub:
        first = first or time.perf_counter()
        rows += batch.num_rows
print(rows, rows / (time.perf_counter() - first))
"""


def subscriber_rate(data: Path, workdir: Path, env: dict, python: bool, epochs: int) -> float:
    """rows/s of one subscriber (Python, or the Rust CLI) that only counts rows."""
    topic = f"rate{os.getpid()}{'py' if python else 'rs'}"
    plan = workdir / f"{topic}.sql"
    plan.write_text(
        f"SET sluice.topic = '{topic}'; SET sluice.batch_rows = 1024; SET sluice.epochs = {epochs};\n"
        f"SET sluice.max_subscribers = 1;\n"
        f"CREATE EXTERNAL TABLE train STORED AS PARQUET LOCATION '{data}/';\n"
        "SELECT id, label, text, features FROM train;\n"
    )
    if python:
        cmd = [sys.executable, "-c", TRAINER_COUNT, topic]
    else:
        cmd = [str(SLUICE), "subscribe", topic, "--json", "--no-checksum", "--timeout", "120"]
    sub = subprocess.Popen(cmd, stdout=subprocess.PIPE, text=True, env=env)
    producer = subprocess.Popen([str(SLUICE), "run", str(plan), "--quiet", "--min-subscribers", "1"], env=env)
    out = sub.communicate(timeout=600)[0].strip()
    assert producer.wait(timeout=600) == 0 and sub.returncode == 0, out
    if python:
        return float(out.split()[1])
    import json

    end = json.loads(out.splitlines()[-1])
    return end["rows"] / end["seconds"]


def children_cpu() -> float:
    u = resource.getrusage(resource.RUSAGE_CHILDREN)
    return u.ru_utime + u.ru_stime


def run_sluice(data: Path, n: int, epochs: int, workdir: Path, env: dict) -> tuple[float, float, list[str]]:
    topic = f"pybench{os.getpid()}n{n}"
    plan = workdir / f"{topic}.sql"
    plan.write_text(
        f"SET sluice.topic = '{topic}'; SET sluice.batch_rows = 512; SET sluice.epochs = {epochs};\n"
        f"SET sluice.max_subscribers = {max(n, 1)};\n"
        f"CREATE EXTERNAL TABLE train STORED AS PARQUET LOCATION '{data}/';\n"
        "SELECT id, label, text, features FROM train WHERE label IS NOT NULL;\n"
    )
    cpu0, t0 = children_cpu(), time.perf_counter()
    trainers = [
        subprocess.Popen([sys.executable, "-c", TRAINER_SLUICE, topic, str(epochs)], stdout=subprocess.PIPE, text=True, env=env)
        for _ in range(n)
    ]
    producer = subprocess.Popen(
        [str(SLUICE), "run", str(plan), "--quiet", "--min-subscribers", str(n), "--wait-timeout", "120"], env=env
    )
    outs = [t.communicate(timeout=600)[0].strip() for t in trainers]
    assert producer.wait(timeout=600) == 0, "producer failed"
    assert all(t.returncode == 0 for t in trainers), "a trainer failed"
    return time.perf_counter() - t0, children_cpu() - cpu0, outs


def run_pyarrow(data: Path, n: int, epochs: int, env: dict) -> tuple[float, float, list[str]]:
    cpu0, t0 = children_cpu(), time.perf_counter()
    trainers = [
        subprocess.Popen([sys.executable, "-c", TRAINER_PYARROW, str(data), str(epochs)], stdout=subprocess.PIPE, text=True, env=env)
        for _ in range(n)
    ]
    outs = [t.communicate(timeout=600)[0].strip() for t in trainers]
    assert all(t.returncode == 0 for t in trainers), "a loader failed"
    return time.perf_counter() - t0, children_cpu() - cpu0, outs


def main() -> None:
    global SLUICE
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--trainers", type=int, nargs="+", default=[1, 2, 4])
    parser.add_argument("--epochs", type=int, default=2)
    parser.add_argument("--rows", type=int, default=200_000)
    parser.add_argument("--sluice", type=Path, default=SLUICE)
    parser.add_argument("--json", type=Path, help="also write the figures to this JSON file")
    args = parser.parse_args()
    SLUICE = args.sluice
    if not SLUICE.exists():
        sys.exit(f"{SLUICE} is missing: run `cargo build --release -p sluice-cli` first")
    env = dict(os.environ, SLUICE_NAMESPACE=f"pybench{os.getpid()}", SLUICE_LOG="warn")
    with tempfile.TemporaryDirectory() as tmp:
        workdir = Path(tmp)
        data = workdir / "data"
        subprocess.run(
            [str(SLUICE), "demo", "--prepare-only", "--rows", str(args.rows), "--data", str(data), "--plan", str(workdir / "unused.sql")],
            check=True,
            env=env,
        )
        py = sorted(subscriber_rate(data, workdir, env, True, 3) for _ in range(3))[1]
        rs = sorted(subscriber_rate(data, workdir, env, False, 3) for _ in range(3))[1]
        print(f"{args.rows} rows of the demo dataset, 3 epochs, 1024-row batches, one subscriber counting rows, median of 3\n")
        print("| subscriber | rows/s | vs Rust |")
        print("|---|---:|---:|")
        print(f"| Rust (`sluice subscribe --no-checksum`) | {rs:.0f} | 1.00 |")
        print(f"| Python (`for batch in sluice.subscribe(...)`) | {py:.0f} | {py / rs:.2f} |")
        print()
        print(f"{args.rows} rows of the demo dataset, {args.epochs} epochs, transform (x - 0.5) / 0.25 on 16 float32 features\n")
        print("| trainers | Sluice wall s | Sluice CPU-s | pyarrow loaders wall s | pyarrow loaders CPU-s | CPU ratio Sluice / loaders | wall ratio |")
        print("|---:|---:|---:|---:|---:|---:|---:|")
        figures = {"rows": args.rows, "epochs": args.epochs, "python_rows_s": py, "rust_rows_s": rs, "trainers": []}
        for n in args.trainers:
            s_wall, s_cpu, s_out = run_sluice(data, n, args.epochs, workdir, env)
            p_wall, p_cpu, p_out = run_pyarrow(data, n, args.epochs, env)
            # Same rows and the same result (up to float summation order) in both set-ups.
            results = [(int(o.split()[0]), float(o.split()[1])) for o in s_out + p_out]
            assert len({r for r, _ in results}) == 1, results
            assert max(t for _, t in results) - min(t for _, t in results) <= 1e-6 * max(1.0, abs(results[0][1])), results
            print(f"| {n} | {s_wall:.2f} | {s_cpu:.2f} | {p_wall:.2f} | {p_cpu:.2f} | {s_cpu / p_cpu:.2f} | {s_wall / p_wall:.2f} |")
            figures["trainers"].append(
                {"n": n, "sluice": {"wall": s_wall, "cpu": s_cpu}, "loaders": {"wall": p_wall, "cpu": p_cpu}}
            )
        if args.json:
            import json

            args.json.write_text(json.dumps(figures))
    leftovers = [f for f in os.listdir("/dev/shm") if f.startswith(f"iox2_sluice_{env['SLUICE_NAMESPACE']}_") and not f.endswith("global_mgmt")]
    for f in os.listdir("/dev/shm"):
        if f.startswith(f"iox2_sluice_{env['SLUICE_NAMESPACE']}_"):
            os.remove(f"/dev/shm/{f}")
    ns = env["SLUICE_NAMESPACE"]
    subprocess.run(["rm", "-rf", f"/dev/shm/sluice-{ns}", f"{tempfile.gettempdir()}/sluice-{ns}.state"], check=False)
    assert not leftovers, leftovers


if __name__ == "__main__":
    main()
