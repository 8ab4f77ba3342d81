"""One producer, two trainers with different batch sizes, all from Python.

    python examples/python/two_trainers.py [--rows 20000] [--epochs 3] [--torch]

The script writes a small regression dataset (Parquet, deterministic) and a plan file
into a temporary directory, starts a ``sluice.Producer`` on a background thread of this
process that waits for two subscribers, then starts two ``trainer.py`` processes with
batch sizes 32 and 100. Both receive every row of every epoch from the same shared
memory; the producer runs the pipeline once.
"""

from __future__ import annotations

import argparse
import json
import os
import subprocess
import sys
import tempfile
from pathlib import Path

import numpy as np
import pyarrow as pa
import pyarrow.parquet as pq

import sluice

HERE = Path(__file__).resolve().parent
DIM = 8


def write_dataset(directory: Path, rows: int) -> None:
    """features ~ N(0, 1), target = features @ w + noise, fixed seed."""
    rng = np.random.default_rng(7)
    w = np.linspace(-1.0, 1.0, DIM, dtype=np.float32)
    features = rng.standard_normal((rows, DIM), dtype=np.float32)
    target = features @ w + 0.01 * rng.standard_normal(rows, dtype=np.float32)
    table = pa.table(
        {
            "id": pa.array(np.arange(rows, dtype=np.int64)),
            "features": pa.FixedSizeListArray.from_arrays(pa.array(features.reshape(-1)), DIM),
            "target": pa.array(target),
        }
    )
    directory.mkdir(parents=True, exist_ok=True)
    pq.write_table(table, directory / "part-0.parquet", row_group_size=4096)


def main() -> int:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--rows", type=int, default=20_000)
    parser.add_argument("--epochs", type=int, default=3)
    parser.add_argument("--torch", action="store_true", help="the trainers use torch if installed")
    args = parser.parse_args()

    # A topic of our own, so that the example never meets another run's producer.
    topic = f"regression-{os.getpid()}"
    with tempfile.TemporaryDirectory() as tmp:
        data = Path(tmp) / "data"
        write_dataset(data, args.rows)
        plan = Path(tmp) / "regression.sql"
        plan.write_text(
            f"SET sluice.topic = '{topic}';\n"
            "SET sluice.batch_rows = 500;\n"
            f"CREATE EXTERNAL TABLE train STORED AS PARQUET LOCATION '{data}/';\n"
            "SELECT id, features, target FROM train;\n"
        )
        with sluice.Producer(plan, epochs=args.epochs, min_subscribers=2, wait_timeout=60) as producer:
            trainers = [
                subprocess.Popen(
                    [sys.executable, str(HERE / "trainer.py"), "--topic", producer.topic,
                     "--batch-size", str(size), "--name", f"trainer-{size}"]
                    + (["--torch"] if args.torch else []),
                    stdout=subprocess.PIPE,
                    text=True,
                )
                for size in (32, 100)
            ]
            outputs = [t.communicate(timeout=300)[0] for t in trainers]
            stats = producer.wait()
        failed = [t.args for t in trainers if t.returncode != 0]
        if failed:
            print(f"trainers failed: {failed}", file=sys.stderr)
            return 1
    print(f"producer: {stats.rows} rows in {stats.batches} batches over {stats.epochs} epochs, "
          f"{stats.shm_bytes / 2**20:.1f} MiB of shared memory")
    for out in outputs:
        for line in out.splitlines():
            r = json.loads(line)
            print(f"{r['trainer']:>12}  epoch {r['epoch']}  rows {r['rows']}  "
                  f"complete {r['complete']}  mse {r['mse']:.4f}")
    return 0


if __name__ == "__main__":
    sys.exit(main())
