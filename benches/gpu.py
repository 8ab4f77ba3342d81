"""GPU benchmark (issues 5, 15, 16): run on a machine with an NVIDIA GPU, torch and the Sluice wheel.

    python benches/gpu.py --rows 200000 --batch-rows 8192 --out gpu-bench.json

Every figure comes with a baseline measured in the same run. Each part runs under its own
try/except: a part that fails (or that the --budget of seconds no longer allows) is
reported as "unavailable: <why>" and the others still run. The parts, in the JSON:

  raw_pinned_htod_gbps
      torch copying a pinned host tensor of one batch's bytes into device memory
      (cuMemcpyHtoDAsync underneath): the ceiling of any host-to-device path.
  latency
      publish -> usable per batch, p50/p99 in microseconds, with sluice.window = 1 and
      64-row batches: from Subscriber.last_published_ns (CLOCK_MONOTONIC when the producer
      published the batch) to time.monotonic_ns() after the consumer's stream synchronized.
      cuda (torch.from_dlpack of the producer's device slot) and cuda_host
      (Batch.to_device) against the baseline cpu (a host batch moved with .to('cuda')).
      With window 1 the producer publishes the next batch as soon as the consumer takes
      one, so whenever the consumer is the slower side the figure includes the wait in
      its queue. "unavailable" where the subscriber has no last_published_ns.
  first_open
      import time (torch.from_dlpack of every column + stream sync) of cuda batches whose
      slot this subscriber maps for the first time (a device pointer not seen before:
      cuIpcOpenMemHandle and the event handle) against batches in slots it already mapped,
      from the latency run and the N = 1 scaling run; for cuda_host, the first to_device
      (which registers the shared-memory segment as pinned memory) against later ones.
  staging
      with --stage-rate BIN (the stripped `stage_rate` example of sluice-cuda, which
      scripts/gpu-check.sh builds): the producer's staging (pack into pinned memory, one
      cuMemcpyHtoDAsync per batch, over a ring of slots) against a raw pinned copy of the
      same bytes, in GB/s, for batches of 1, 8 and 67 MB.
  scaling
      Input-bound: pipelines/images.sql (decode JPEG, resize, random crop, flip,
      normalize, CHW; --images generated JPEGs, --epochs epochs), so that the CPU work of
      the pipeline, not the copies, limits the trainers.
      N = 1, 2, 4 trainers of the same plan: torch subscribers of one cuda:0 producer;
      torch subscribers of one cuda_host:0 producer, each calling to_device; and the
      baseline, N independent loaders (each runs the plan itself on 'cpu' and moves its
      batches with .to('cuda')). Per run: samples/s (all trainers' rows over the span from
      the first batch any trainer received to the last one it had on the GPU, and per
      trainer), CPU-seconds of every process, the producer included (getrusage in each
      process, from just before it subscribes or starts its producer to its end, so
      interpreter and torch start-up are left out), GPU memory per process (the largest
      of nvidia-smi --query-compute-apps samples taken while the run goes, matched by pid;
      torch.cuda.memory_allocated does not see CUDA IPC mappings), and host-to-device bytes
      (computed from the rows: once per batch for cuda:0, where the producer copies, N
      times for cuda_host and the loaders). A cuda:0 run also gives the producer's
      host-to-device rate (batch bytes over its run time, query included) next to the raw
      pinned copy.

The whole benchmark stays under --budget seconds (default 100; scripts/gpu-check.sh gives
its step 120 s): a run that would start with less than --run-reserve seconds left is
skipped and says so. Child processes are this file run with --child.
"""

from __future__ import annotations

import argparse
import itertools
import json
import os
import resource
import shutil
import statistics
import subprocess
import sys
import tempfile
import threading
import time
from pathlib import Path
from typing import Any

VEC = 256  # float32 values per row in the `vec` column
ROW_BYTES = 8 + VEC * 4  # Arrow data bytes per row: id int64 + vec float32[VEC]
COLUMNS = ("id", "vec")
IMAGE_COLUMNS = ("pixels", "target")
IMAGE_ROW_BYTES = 3 * 64 * 64 * 4 + 10 * 4  # pixels float32[3, 64, 64] + target float32[10]
HERE = Path(__file__).resolve().parent
LATENCY_BATCH_ROWS = 64
LATENCY_ROWS = 64 * 1500
LATENCY_WARMUP = 20  # batches left out of the latency percentiles (slots mapped, caches warm)
TRAINERS = (1, 2, 4)


# --- Small helpers ----------------------------------------------------------------------


def cpu_seconds() -> float:
    """User + system CPU seconds of this whole process (every thread, Sluice's included)."""
    usage = resource.getrusage(resource.RUSAGE_SELF)
    return usage.ru_utime + usage.ru_stime


def percentile(values: list[float], q: float) -> float:
    """The q-th percentile (0..100) by linear interpolation between closest ranks."""
    ordered = sorted(values)
    if len(ordered) == 1:
        return ordered[0]
    k = (len(ordered) - 1) * q / 100
    lo = int(k)
    hi = min(lo + 1, len(ordered) - 1)
    return ordered[lo] + (ordered[hi] - ordered[lo]) * (k - lo)


def summary_us(nanoseconds: list[int]) -> dict[str, Any]:
    """Count, p50, p90, p99 and mean of durations given in nanoseconds, in microseconds."""
    if not nanoseconds:
        return {"count": 0}
    us = [n / 1e3 for n in nanoseconds]
    return {"count": len(us), "p50_us": percentile(us, 50), "p90_us": percentile(us, 90),
            "p99_us": percentile(us, 99), "mean_us": statistics.fmean(us)}


def unavailable(error: BaseException) -> str:
    return f"unavailable: {type(error).__name__}: {error}"


class Budget:
    """The seconds the benchmark may still use; runs that would start too late are skipped."""

    def __init__(self, seconds: float, reserve: float) -> None:
        self.deadline = time.monotonic() + seconds
        self.reserve = reserve

    def left(self) -> float:
        return self.deadline - time.monotonic()

    def check(self, what: str) -> float:
        """Seconds a run may take; raises if fewer than the reserve are left."""
        left = self.left()
        if left < self.reserve:
            raise TimeoutError(f"skipped {what}: {left:.0f} s of the time budget left, "
                               f"a run needs about {self.reserve:.0f} s (raise --budget)")
        return left


# --- Data and plans ---------------------------------------------------------------------


def make_data(directory: Path, rows: int) -> Path:
    """`rows` rows of id (int64) and vec (VEC float32), in row groups of 8192 rows so that
    a plan reading the first rows only (WHERE id < n) skips the others."""
    import numpy as np
    import pyarrow as pa
    import pyarrow.parquet as pq

    data = directory / "data"
    data.mkdir()
    values = np.random.default_rng(0).random(rows * VEC, dtype=np.float32)
    vec = pa.FixedSizeListArray.from_arrays(pa.array(values), VEC)
    table = pa.table({"id": pa.array(np.arange(rows, dtype=np.int64)), "vec": vec})
    pq.write_table(table, data / "part.parquet", row_group_size=8192)
    return data


def make_plan(directory: Path, data: Path, topic: str, *, device: str, batch_rows: int,
              subscribers: int, rows: int | None = None, extra: str = "") -> Path:
    """A plan publishing id and vec on `topic`. `sluice.max_subscribers` is the run's
    trainer count, which keeps the shared-memory segment and the device ring (one slot
    per chunk) as small as the run allows."""
    where = f" WHERE id < {rows}" if rows is not None else ""
    plan = directory / f"{topic}.sql"
    plan.write_text(
        f"SET sluice.topic = '{topic}';\n"
        f"SET sluice.batch_rows = {batch_rows};\n"
        f"SET sluice.device = '{device}';\n"
        f"SET sluice.max_subscribers = {subscribers};\n"
        f"{extra}"
        f"CREATE EXTERNAL TABLE t STORED AS PARQUET LOCATION '{data}/';\n"
        f"SELECT id, vec FROM t{where};\n")
    return plan


def make_images(directory: Path, count: int) -> Path:
    """`count` JPEGs of 48-127 pixels a side (noise over a gradient, as `sluice demo
    --images` makes them), with labels 0-9, in one Parquet file of id, label, image."""
    import io

    import numpy as np
    import pyarrow as pa
    import pyarrow.parquet as pq
    from PIL import Image

    rng = np.random.default_rng(1)
    blobs = []
    for i in range(count):
        h, w = (int(v) for v in rng.integers(48, 128, size=2))
        base = np.linspace(0, 255, w, dtype=np.float32)[None, :, None] * rng.random(3)
        pixels = np.clip(base + rng.normal(0, 24, (h, w, 3)), 0, 255).astype(np.uint8)
        out = io.BytesIO()
        Image.fromarray(pixels).save(out, format="JPEG", quality=90)
        blobs.append(out.getvalue())
    data = directory / "images"
    data.mkdir()
    table = pa.table({"id": pa.array(np.arange(count, dtype=np.int64)),
                      "label": pa.array(rng.integers(0, 10, count).astype(np.int32)),
                      "image": pa.array(blobs, pa.binary())})
    pq.write_table(table, data / "part.parquet", row_group_size=1024)
    return data


def images_sql() -> str:
    for candidate in (HERE / "images.sql", HERE.parent / "pipelines" / "images.sql"):
        if candidate.exists():
            return candidate.read_text()
    raise FileNotFoundError("pipelines/images.sql (scripts/gpu-check.sh copies it beside gpu.py)")


def make_images_plan(directory: Path, data: Path, topic: str, *, device: str, subscribers: int,
                     epochs: int) -> Path:
    """pipelines/images.sql on `data`, publishing on `topic` to `device`."""
    text = images_sql()
    text = text.replace("'data/images/'", f"'{data}/'").replace("'images'", f"'{topic}'")
    text = text.replace("SET sluice.epochs = 2;", f"SET sluice.epochs = {epochs};")
    plan = directory / f"{topic}.sql"
    plan.write_text(f"SET sluice.device = '{device}';\n"
                    f"SET sluice.max_subscribers = {subscribers};\n" + text)
    return plan


# --- Child processes (this file run with --child JSON) ----------------------------------


def dlpack_stream(torch: Any) -> int:
    """torch's current stream as a DLPack stream value: the legacy default stream's handle
    is 0, which DLPack spells 1 (as torch.from_dlpack does)."""
    handle = torch.cuda.current_stream().cuda_stream
    return 1 if handle == 0 else handle


def consume(torch: Any, sluice: Any, topic: str, how: str, timeout: float,
            columns: tuple[str, ...] = COLUMNS) -> dict[str, Any]:
    """Receives a topic to the end, making every batch usable on the GPU, as a trainer
    would: `how` is "cuda" (DLPack import of the producer's slot), "cuda_host"
    (Batch.to_device on torch's current stream, then DLPack) or "cpu" (a host batch moved
    with .to('cuda')). Records per batch: the time to make it usable (after the stream
    synchronized), the device pointer of its last column (a new pointer on a cuda topic =
    a slot mapped for the first time), and the publish -> usable latency."""
    stream = torch.cuda.current_stream()
    handle = dlpack_stream(torch)
    records: list[list[int | None]] = []  # [usable_ns, pointer, latency_ns]
    rows = 0
    first_ns = None
    with sluice.subscribe(topic, timeout=timeout) as sub:
        has_published = hasattr(sub, "last_published_ns")
        for batch in sub:
            start = time.monotonic_ns()
            if first_ns is None:
                first_ns = start
            if how == "cuda":
                tensors = [torch.from_dlpack(batch[c]) for c in columns]
            elif how == "cuda_host":
                device = batch.to_device(device=0, stream=handle)
                del batch  # the sample goes back once the copy has completed
                tensors = [torch.from_dlpack(device[c]) for c in columns]
                del device
            else:
                # A pageable host tensor: torch stages it, and the batch may go once
                # .to() returns; it is dropped after the synchronization all the same.
                tensors = [torch.from_dlpack(batch[c].__dlpack__()).to("cuda", non_blocking=True)
                           for c in columns]
            stream.synchronize()
            usable = time.monotonic_ns()
            published = sub.last_published_ns if has_published else None
            records.append([usable - start, tensors[-1].data_ptr(),
                            None if published is None else usable - published])
            rows += len(tensors[0])
            # Nothing of this batch is held into the next receive (the loop variable
            # would otherwise keep it while the subscriber waits).
            del tensors
            batch = None  # noqa: F841
    return {"rows": rows, "first_ns": first_ns, "last_ns": time.monotonic_ns(),
            "records": records,
            "last_published_ns": ("present" if has_published else
                                  "missing: sluice.Subscriber has no last_published_ns")}


def child(config: dict[str, Any]) -> dict[str, Any]:
    import sluice

    role, timeout = config["role"], config["timeout"]
    if role == "producer":
        mark = cpu_seconds()
        producer = sluice.Producer(config["plan"], min_subscribers=config["subscribers"],
                                   wait_timeout=timeout)
        stats = producer.wait(timeout=timeout)
        return {"pid": os.getpid(), "cpu_s": cpu_seconds() - mark, "rows": stats.rows,
                "batches": stats.batches, "bytes": stats.bytes, "elapsed_s": stats.elapsed}
    import torch

    # torch's CUDA context before anything is timed (a trainer has it long before).
    torch.zeros(1, device="cuda")
    torch.cuda.synchronize()
    mark = cpu_seconds()
    if role == "subscriber":
        out = consume(torch, sluice, config["topic"], config["how"], timeout,
                      tuple(config["columns"]))
    elif role == "loader":
        # The baseline: this process runs the whole plan itself, in its own namespace.
        producer = sluice.Producer(config["plan"], min_subscribers=1, wait_timeout=timeout)
        out = consume(torch, sluice, config["topic"], "cpu", timeout, tuple(config["columns"]))
        producer.wait(timeout=timeout)
    else:
        raise ValueError(f"unknown role {role!r}")
    out.update(pid=os.getpid(), cpu_s=cpu_seconds() - mark)
    return out


def child_main(argument: str) -> None:
    config = json.loads(argument)
    result = child(config)
    Path(config["result"]).write_text(json.dumps(result))


# --- GPU memory per process --------------------------------------------------------------


class GpuMemory:
    """Samples `nvidia-smi --query-compute-apps` on a thread while a run goes and keeps the
    largest used_memory (MiB) seen per pid."""

    def __init__(self, interval: float = 0.3) -> None:
        self.interval = interval
        self.peak: dict[int, int] = {}
        self.error: str | None = None
        self._stop = threading.Event()
        self._thread = threading.Thread(target=self._run, daemon=True)

    def __enter__(self) -> GpuMemory:
        if shutil.which("nvidia-smi") is None:
            self.error = "unavailable: nvidia-smi not found"
        else:
            self._thread.start()
        return self

    def __exit__(self, *exc: object) -> None:
        self._stop.set()
        if self._thread.is_alive():
            self._thread.join(10)

    def _run(self) -> None:
        while not self._stop.is_set():
            try:
                out = subprocess.run(
                    ["nvidia-smi", "--query-compute-apps=pid,used_memory",
                     "--format=csv,noheader,nounits"],
                    capture_output=True, text=True, timeout=10, check=True).stdout
                for line in out.splitlines():
                    fields = [f.strip() for f in line.split(",")]
                    if len(fields) == 2 and fields[0].isdigit() and fields[1].isdigit():
                        pid, mib = int(fields[0]), int(fields[1])
                        self.peak[pid] = max(self.peak.get(pid, 0), mib)
            except Exception as error:  # noqa: BLE001 - reported with the run
                self.error = unavailable(error)
                return
            self._stop.wait(self.interval)

    def by_role(self, pids: dict[str, int]) -> dict[str, Any]:
        """Peak MiB per role; nvidia-smi shows pids as the host numbers them, so in a
        container (another PID namespace) nothing matches, which is said rather than
        guessed."""
        if self.error is not None:
            return {"error": self.error}
        found = {role: self.peak[pid] for role, pid in pids.items() if pid in self.peak}
        out: dict[str, Any] = {"peak_mib": found}
        missing = sorted(set(pids) - set(found))
        if missing:
            out["not_listed"] = missing
            out["pids_listed_by_nvidia_smi"] = sorted(self.peak)
            if not found:
                out["note"] = ("no process of the run was listed under its pid (another PID "
                               "namespace?); the listed pids' peaks are in all_peaks_mib")
                out["all_peaks_mib"] = {str(p): m for p, m in sorted(self.peak.items())}
        return out


# --- Runs ---------------------------------------------------------------------------------


class Bench:
    def __init__(self, args: argparse.Namespace, directory: Path, data: Path,
                 budget: Budget, images: Path | None = None) -> None:
        self.args = args
        self.dir = directory
        self.data = data
        self.images = images
        self.budget = budget
        self._names = itertools.count()

    def run(self, label: str, how: str, trainers: int, *, batch_rows: int,
            rows: int | None = None, extra: str = "", images: bool = False) -> dict[str, Any]:
        """One run: `trainers` consumers of kind `how` ("cuda", "cuda_host", "cpu": one
        producer process and its subscribers; "loaders": independent loaders), every
        process reporting into a JSON file. Returns the raw per-process results, by role."""
        timeout = min(self.budget.check(label), self.args.run_timeout)
        run = next(self._names)
        namespace = f"gb{os.getpid()}r{run}"
        columns = list(IMAGE_COLUMNS if images else COLUMNS)

        def plan_for(topic: str, device: str, subscribers: int) -> Path:
            if images:
                assert self.images is not None
                return make_images_plan(self.dir, self.images, topic, device=device,
                                        subscribers=subscribers, epochs=self.args.epochs)
            return make_plan(self.dir, self.data, topic, device=device, batch_rows=batch_rows,
                             subscribers=subscribers, rows=rows, extra=extra)
        jobs: list[tuple[str, dict[str, Any], str]] = []  # (role name, config, namespace)
        if how == "loaders":
            for i in range(trainers):
                topic = f"bench{run}l{i}"
                plan = plan_for(topic, "cpu", 1)
                jobs.append((f"loader{i}", {"role": "loader", "plan": str(plan), "topic": topic,
                                            "columns": columns}, f"{namespace}x{i}"))
        else:
            device = {"cuda": "cuda:0", "cuda_host": "cuda_host:0", "cpu": "cpu"}[how]
            topic = f"bench{run}"
            plan = plan_for(topic, device, trainers)
            # The producer first: its ring or segment is made while torch starts in the
            # subscribers; it waits for all of them before its first batch.
            jobs.append(("producer", {"role": "producer", "plan": str(plan),
                                      "subscribers": trainers}, namespace))
            for i in range(trainers):
                jobs.append((f"subscriber{i}", {"role": "subscriber", "topic": topic, "how": how,
                                                "columns": columns}, namespace))
        procs: list[tuple[str, subprocess.Popen[bytes], Path, Path]] = []
        with GpuMemory() as memory:
            try:
                for role, config, ns in jobs:
                    result = self.dir / f"run{run}-{role}.json"
                    log = self.dir / f"run{run}-{role}.log"
                    config = dict(config, result=str(result), timeout=timeout)
                    # Output goes to files, never pipes: a child blocked on a full pipe
                    # would stall the producer, which waits for its slowest subscriber.
                    with open(log, "wb") as log_file:
                        proc = subprocess.Popen(
                            [sys.executable, os.path.abspath(__file__), "--child",
                             json.dumps(config)],
                            stdout=log_file, stderr=subprocess.STDOUT,
                            env=dict(os.environ, SLUICE_NAMESPACE=ns))
                    procs.append((role, proc, result, log))
                # Poll them all: a process that fails ends the run at once (its producer
                # or peers would otherwise wait for it until their own timeouts).
                deadline = time.monotonic() + timeout
                while True:
                    codes = [(role, proc.poll(), log) for role, proc, _, log in procs]
                    for role, code, log in codes:
                        if code not in (None, 0):
                            raise RuntimeError(f"{label}: {role} exited with {code}: {tail(log)}")
                    if all(code == 0 for _, code, _ in codes):
                        break
                    if time.monotonic() > deadline:
                        waiting = [role for role, code, _ in codes if code is None]
                        raise TimeoutError(f"{label}: {waiting} still running after "
                                           f"{timeout:.0f} s; the first one's log ends: "
                                           f"{tail(dict((r, l) for r, _, l in codes)[waiting[0]])}")
                    time.sleep(0.02)
            finally:
                for _, proc, _, _ in procs:
                    if proc.poll() is None:
                        proc.kill()
                        proc.wait(10)
        results: dict[str, dict[str, Any]] = {}
        for role, proc, result, log in procs:
            if proc.returncode != 0 or not result.exists():
                raise RuntimeError(f"{label}: {role} exited with {proc.returncode}: {tail(log)}")
            results[role] = json.loads(result.read_text())
        pids = {role: r["pid"] for role, r in results.items()}
        return {"results": results, "gpu_memory": memory.by_role(pids)}


def tail(log: Path, chars: int = 1500) -> str:
    try:
        return log.read_text(errors="replace")[-chars:]
    except OSError as error:
        return f"(no log: {error})"


def trainer_results(run: dict[str, Any]) -> list[dict[str, Any]]:
    return [r for role, r in sorted(run["results"].items()) if role != "producer"]


def scaling_row(run: dict[str, Any], how: str, trainers: int, expected_rows: int,
                raw_gbps: float | None, row_bytes: int = ROW_BYTES) -> dict[str, Any]:
    """What a scaling run measured, from its processes' reports."""
    trainers_out = trainer_results(run)
    start = min(r["first_ns"] for r in trainers_out if r["first_ns"] is not None)
    end = max(r["last_ns"] for r in trainers_out)
    rows = [r["rows"] for r in trainers_out]
    cpu = {role: r["cpu_s"] for role, r in sorted(run["results"].items())}
    per_trainer = [
        r["rows"] / max((r["last_ns"] - r["first_ns"]) / 1e9, 1e-9)
        for r in trainers_out if r["first_ns"] is not None
    ]
    # Host-to-device bytes: the cuda:0 producer copies each batch once for everyone;
    # every cuda_host subscriber and every loader copies it itself.
    copies = 1 if how == "cuda" else trainers
    row: dict[str, Any] = {
        "trainers": trainers,
        "rows_per_trainer": rows,
        "complete": all(r == expected_rows for r in rows),
        "samples_per_s": sum(rows) / max((end - start) / 1e9, 1e-9),
        "samples_per_s_per_trainer": per_trainer,
        "span_s": (end - start) / 1e9,
        "cpu_s": cpu,
        "cpu_s_total": sum(cpu.values()),
        "gpu_memory": run["gpu_memory"],
        "htod_bytes": copies * expected_rows * row_bytes,
        "htod_copies_per_batch": copies,
    }
    producer = run["results"].get("producer")
    if how == "cuda" and producer is not None and producer.get("elapsed_s"):
        gbps = expected_rows * row_bytes / producer["elapsed_s"] / 1e9
        row["producer_htod_gbps"] = gbps
        if raw_gbps:
            row["producer_htod_vs_raw_pinned"] = gbps / raw_gbps
    return row


def first_open(records: list[list[int | None]]) -> dict[str, Any]:
    """Import times of cuda batches in slots mapped for the first time (a device pointer
    this subscriber had not seen) against batches in slots already mapped. The very first
    batch also pays Sluice's first driver calls in this process: reported on its own."""
    seen: set[int | None] = set()
    new, mapped = [], []
    for usable_ns, pointer, _ in records[1:]:
        (mapped if pointer in seen else new).append(usable_ns)
        seen.add(pointer)
    out: dict[str, Any] = {
        "batches": len(records),
        "first_batch_us": records[0][0] / 1e3 if records else None,
        "new_slot": summary_us(new),
        "mapped_slot": summary_us(mapped),
        "distinct_pointers": len({r[1] for r in records}),
    }
    if new and mapped:
        out["new_over_mapped_p50"] = percentile(new, 50) / percentile(mapped, 50)
    return out


def latency(run: dict[str, Any]) -> dict[str, Any] | str:
    (trainer,) = trainer_results(run)
    if trainer["last_published_ns"] != "present":
        return f"unavailable: {trainer['last_published_ns']}"
    values = [r[2] for r in trainer["records"][LATENCY_WARMUP:] if r[2] is not None]
    if not values:
        return "unavailable: no batch after the warm-up carried a publish time"
    out = summary_us(values)
    out["usable_after_receive"] = summary_us([r[0] for r in trainer["records"][LATENCY_WARMUP:]])
    return out


# --- Main ---------------------------------------------------------------------------------


def raw_htod(torch: Any, nbytes: int, reps: int, pinned: bool = True) -> float:
    """Host-to-device GB/s of `reps` copies of `nbytes` from one host tensor: pinned (DMA
    straight from it) or pageable (the driver stages through its own pinned buffers)."""
    host = torch.empty(nbytes, dtype=torch.uint8)
    host = host.pin_memory() if pinned else host
    dev = torch.empty(nbytes, dtype=torch.uint8, device="cuda")
    dev.copy_(host, non_blocking=True)
    torch.cuda.synchronize()
    t = time.perf_counter()
    for _ in range(reps):
        dev.copy_(host, non_blocking=True)
    torch.cuda.synchronize()
    return nbytes * reps / (time.perf_counter() - t) / 1e9


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    ap.add_argument("--rows", type=int, default=200_000)
    ap.add_argument("--batch-rows", type=int, default=8192)
    ap.add_argument("--out", default="gpu-bench.json")
    ap.add_argument("--budget", type=float, default=100.0,
                    help="seconds the whole benchmark may take (default 100)")
    ap.add_argument("--run-reserve", type=float, default=12.0,
                    help="a run starts only with this many seconds of the budget left")
    ap.add_argument("--run-timeout", type=float, default=45.0,
                    help="seconds one run (a producer and its trainers) may take")
    ap.add_argument("--images", type=int, default=12_000,
                    help="JPEGs of the input-bound scaling runs (default 12000)")
    ap.add_argument("--epochs", type=int, default=2,
                    help="epochs of the input-bound scaling runs (default 2)")
    ap.add_argument("--stage-rate", type=Path,
                    help="sluice-cuda's stage_rate example binary (the staging part)")
    ap.add_argument("--child", help=argparse.SUPPRESS)
    args = ap.parse_args()
    if args.child is not None:
        child_main(args.child)
        return

    budget = Budget(args.budget, args.run_reserve)
    result: dict[str, Any] = {"command": " ".join(sys.argv), "rows": args.rows,
                              "batch_rows": args.batch_rows, "row_bytes": ROW_BYTES}
    raw_gbps = None
    try:
        import torch

        result["device"] = torch.cuda.get_device_name(0)
        raw_gbps = raw_htod(torch, args.batch_rows * ROW_BYTES, 200)
        result["raw_pinned_htod_gbps"] = raw_gbps
        result["raw_pageable_htod_gbps"] = raw_htod(torch, args.batch_rows * ROW_BYTES, 50,
                                                    pinned=False)
    except Exception as error:  # noqa: BLE001 - reported, not hidden
        result["raw_pinned_htod_gbps"] = unavailable(error)
    if args.stage_rate is None:
        result["staging"] = "unavailable: no --stage-rate binary given"
    else:
        try:
            out = subprocess.run([str(args.stage_rate.resolve())], capture_output=True,
                                 text=True, timeout=60)
            if out.returncode != 0:
                raise RuntimeError(f"exit {out.returncode}: {out.stderr[-1500:]}")
            result["staging"] = json.loads(out.stdout)
        except Exception as error:  # noqa: BLE001 - reported, not hidden
            result["staging"] = unavailable(error)

    with tempfile.TemporaryDirectory() as tmp:
        directory = Path(tmp)
        data = make_data(directory, args.rows)
        bench = Bench(args, directory, data, budget)
        expected = args.rows

        # Latency: window 1, small batches; the cpu run (host batch + .to('cuda')) is the
        # baseline. The cuda run's records also give the first-open cost.
        result["latency"] = {
            "settings": {"window": 1, "batch_rows": LATENCY_BATCH_ROWS,
                         "rows": min(LATENCY_ROWS, args.rows), "warmup_batches": LATENCY_WARMUP},
        }
        result["first_open"] = {}
        for how in ("cuda", "cuda_host", "cpu"):
            name = "cpu_to_cuda_baseline" if how == "cpu" else how
            try:
                run = bench.run(f"latency {how}", how, 1, batch_rows=LATENCY_BATCH_ROWS,
                                rows=min(LATENCY_ROWS, args.rows),
                                extra="SET sluice.window = 1;\n")
                result["latency"][name] = latency(run)
                (trainer,) = trainer_results(run)
                if how == "cuda":
                    result["first_open"]["cuda_latency_run"] = first_open(trainer["records"])
                elif how == "cuda_host":
                    records = trainer["records"]
                    result["first_open"]["cuda_host_latency_run"] = {
                        "first_to_device_us": records[0][0] / 1e3 if records else None,
                        "later": summary_us([r[0] for r in records[1:]]),
                    }
            except Exception as error:  # noqa: BLE001 - reported, not hidden
                result["latency"][name] = unavailable(error)

        # Scaling, input-bound (the image pipeline): N trainers on one cuda:0 producer, on
        # one cuda_host:0 producer, and N independent loaders (the baseline).
        scaling: dict[str, Any] = {"cuda": {}, "cuda_host": {}, "independent_loaders": {}}
        try:
            started = time.monotonic()
            bench.images = make_images(directory, args.images)
            scaling["pipeline"] = {"plan": "pipelines/images.sql", "images": args.images,
                                   "epochs": args.epochs, "row_bytes": IMAGE_ROW_BYTES,
                                   "generated_in_s": time.monotonic() - started}
        except Exception as error:  # noqa: BLE001 - reported, not hidden
            scaling["pipeline"] = unavailable(error)
        expected_images = args.images * args.epochs
        for n in TRAINERS:
            for how, key in (("cuda", "cuda"), ("loaders", "independent_loaders"),
                             ("cuda_host", "cuda_host")):
                try:
                    if bench.images is None:
                        raise RuntimeError("no image data")
                    run = bench.run(f"scaling {key} N={n}", how, n, batch_rows=128, images=True)
                    scaling[key][str(n)] = scaling_row(run, how, n, expected_images, raw_gbps,
                                                       IMAGE_ROW_BYTES)
                    if how == "cuda" and n == 1:
                        (trainer,) = trainer_results(run)
                        result["first_open"]["cuda_scaling_run_n1"] = first_open(trainer["records"])
                except Exception as error:  # noqa: BLE001 - reported, not hidden
                    scaling[key][str(n)] = unavailable(error)
        # Ratios against the baseline of the same N, where both runs worked.
        ratios: dict[str, Any] = {}
        for n in map(str, TRAINERS):
            base = scaling["independent_loaders"].get(n)
            for key in ("cuda", "cuda_host"):
                row = scaling[key].get(n)
                if isinstance(row, dict) and isinstance(base, dict):
                    ratios[f"{key}_vs_loaders_N{n}"] = {
                        "samples_per_s": row["samples_per_s"] / base["samples_per_s"],
                        "cpu_s_total": row["cpu_s_total"] / base["cpu_s_total"],
                        "htod_bytes": row["htod_bytes"] / base["htod_bytes"],
                    }
        scaling["ratios_vs_loaders"] = ratios
        result["scaling"] = scaling
    result["budget_left_s"] = budget.left()
    text = json.dumps(result, indent=2)
    print(text)
    Path(args.out).write_text(text)


if __name__ == "__main__":
    main()
