"""Fixtures for the Python tests: a namespace and a topic per test, real data, real plans.

Every test runs in a Sluice namespace of its own (``SLUICE_NAMESPACE``, read by the Rust
side when a producer or subscriber is created) and, when it ends, asserts that the
namespace left nothing behind: no shared-memory segment in /dev/shm except iceoryx2's
persistent ``global_mgmt`` counter, and no file under /dev/shm/sluice-<namespace> but
the record of each topic's last generation.
"""

from __future__ import annotations

import gc
import itertools
import os
import shutil
import signal
import subprocess
import sys
import time
from dataclasses import dataclass
from pathlib import Path
from typing import Callable, Iterator

import pyarrow as pa
import pyarrow.parquet as pq
import pytest

import sluice
from helpers import service_root, state_dir

_NEXT = itertools.count()
SHM = Path("/dev/shm")


def _shm_files(ns: str) -> list[Path]:
    prefix = f"iox2_sluice_{ns}_"
    return [p for p in SHM.iterdir() if p.name.startswith(prefix)]


def _leftovers(ns: str) -> list[str]:
    shm = [str(p) for p in _shm_files(ns) if not p.name.endswith("global_mgmt")]
    root = service_root(ns)
    # Each topic's last generation is kept on purpose (see takeover.rs).
    kept = root / "generations"
    files = [str(p) for p in root.rglob("*") if p.is_file() and kept not in p.parents] if root.exists() else []
    return shm + files


def pytest_runtest_logreport(report: pytest.TestReport) -> None:
    """With ``SLUICE_PYTEST_INSTAFAIL=1`` (scripts/gpu-check.sh sets it) a failure is
    written out when it happens, not in the summary at the end: a run stopped by its time
    limit on the GPU machine still shows why the earlier tests failed."""
    if report.failed and os.environ.get("SLUICE_PYTEST_INSTAFAIL"):
        sys.__stderr__.write(f"\n=== FAILED {report.nodeid} ({report.when})\n"
                             f"{report.longreprtext[-6000:]}\n=== end of {report.nodeid}\n")
        sys.__stderr__.flush()


@pytest.fixture
def ns() -> Iterator[str]:
    """A fresh namespace, set in ``os.environ``; checked for leftovers and removed after."""
    name = f"py{os.getpid()}x{next(_NEXT)}"
    previous = os.environ.get("SLUICE_NAMESPACE")
    os.environ["SLUICE_NAMESPACE"] = name
    try:
        yield name
    finally:
        # A failed test may have left its producer running: stop it (it then removes
        # its shared memory), as interpreter exit would.
        sluice._shutdown()
        # Views of shared memory that the test dropped may still wait for a collection.
        gc.collect()
        deadline = time.monotonic() + 5
        left = _leftovers(name)
        while left and time.monotonic() < deadline:
            # A producer thread or child process may still be removing its files.
            time.sleep(0.05)
            gc.collect()
            left = _leftovers(name)
        for p in _shm_files(name):
            p.unlink(missing_ok=True)
        shutil.rmtree(service_root(name), ignore_errors=True)
        # Checkpoints and `sluice status` reports (Namespace::state_dir).
        shutil.rmtree(state_dir(name), ignore_errors=True)
        if previous is None:
            os.environ.pop("SLUICE_NAMESPACE", None)
        else:
            os.environ["SLUICE_NAMESPACE"] = previous
    assert not left, f"namespace {name} left files behind: {left}"


@pytest.fixture
def topic(request: pytest.FixtureRequest) -> str:
    """A topic name of the test's own."""
    return f"t{next(_NEXT)}-{request.node.name[:40]}".replace("[", "_").replace("]", "_")


def make_table(rows: int, *, with_nulls: bool = False) -> pa.Table:
    """Deterministic test data: ids 0..rows-1 and columns derived from them."""
    ids = list(range(rows))
    vec_type = pa.list_(pa.float32(), 4)
    return pa.table(
        {
            "id": pa.array(ids, pa.int64()),
            "x": pa.array([i * 0.5 for i in ids], pa.float64()),
            "vec": pa.array([[i, i + 1, i + 2, i + 3] for i in ids], vec_type),
            "label": pa.array(
                [None if with_nulls and i % 7 == 0 else i % 10 for i in ids], pa.int32()
            ),
            "text": pa.array([f"row{i}" for i in ids], pa.string()),
        }
    )


@dataclass
class PlanFactory:
    """Writes data and plan files into a test's temporary directory."""

    dir: Path
    topic: str

    def data(self, rows: int, *, with_nulls: bool = False, row_group_size: int = 50,
             name: str = "data") -> Path:
        d = self.dir / name
        d.mkdir(exist_ok=True)
        pq.write_table(make_table(rows, with_nulls=with_nulls), d / "part-0.parquet",
                       row_group_size=row_group_size)
        return d

    def plan(self, *, rows: int = 200, batch_rows: int = 50, epochs: int = 1,
             select: str = "SELECT id, x, vec, label, text FROM t", with_nulls: bool = False,
             extra: str = "", name: str = "plan.sql", row_group_size: int = 50) -> Path:
        # Row groups at least as long as several batches make DataFusion batches that the
        # producer sends as messages of several batches (sluice.message_batches).
        data = self.data(rows, with_nulls=with_nulls, row_group_size=row_group_size)
        text = (
            f"SET sluice.topic = '{self.topic}';\n"
            f"SET sluice.batch_rows = {batch_rows};\n"
            f"SET sluice.epochs = {epochs};\n"
            f"{extra}"
            f"CREATE EXTERNAL TABLE t STORED AS PARQUET LOCATION '{data}/';\n"
            f"{select};\n"
        )
        path = self.dir / name
        path.write_text(text)
        return path


@pytest.fixture
def plans(tmp_path: Path, topic: str, ns: str) -> PlanFactory:
    """Writes plans on the test's topic; depends on ``ns`` so the namespace is set first."""
    return PlanFactory(tmp_path, topic)


@pytest.fixture
def run_python(ns: str) -> Iterator[Callable[..., subprocess.Popen[str]]]:
    """Starts Python child processes in the test's namespace; kills leftovers at the end."""
    children: list[subprocess.Popen[str]] = []

    def start(code: str, *args: str) -> subprocess.Popen[str]:
        env = dict(os.environ, SLUICE_NAMESPACE=ns, PYTHONUNBUFFERED="1")
        child = subprocess.Popen(
            [sys.executable, "-c", code, *args],
            env=env,
            stdout=subprocess.PIPE,
            stderr=subprocess.PIPE,
            text=True,
        )
        children.append(child)
        return child

    yield start
    for child in children:
        if child.poll() is None:
            child.send_signal(signal.SIGKILL)
        child.wait(timeout=10)
        for stream in (child.stdout, child.stderr):
            if stream is not None:
                stream.close()
