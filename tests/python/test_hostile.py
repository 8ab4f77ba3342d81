"""Hostile input never crashes a trainer: sizes from the data are checked, numbers from
the caller are bounded (issue 50, findings 4 and 8)."""

from __future__ import annotations

import json
import os
import subprocess

import numpy as np
import pyarrow as pa
import pyarrow.parquet as pq
import pytest

import sluice


def tensor_plan(plans, shape: list[int]):
    """A Parquet file whose `t` column claims to be an `arrow.fixed_shape_tensor` of
    `shape` over fixed-size lists of 4 floats, and a plan that publishes it."""
    meta = {
        b"ARROW:extension:name": b"arrow.fixed_shape_tensor",
        b"ARROW:extension:metadata": json.dumps({"shape": shape}).encode(),
    }
    field = pa.field("t", pa.list_(pa.float32(), 4), metadata=meta)
    table = pa.table({"t": pa.array([[1, 2, 3, 4]] * 16, pa.list_(pa.float32(), 4))},
                     schema=pa.schema([field]))
    data = plans.dir / "tensors"
    data.mkdir()
    pq.write_table(table, data / "part-0.parquet")
    plan = plans.dir / "tensors.sql"
    plan.write_text(f"SET sluice.topic = '{plans.topic}';\nSET sluice.batch_rows = 16;\n"
                    f"CREATE EXTERNAL TABLE t STORED AS PARQUET LOCATION '{data}/';\n"
                    "SELECT t FROM t;\n")
    return plan


@pytest.mark.parametrize("shape", [
    [4611686018427387905, 4],      # the product wraps to 4 in 64 bits
    [2**62, 2**62],                # overflows
    [2, 2, 2**61],                 # overflows in the strides
])
def test_a_tensor_shape_that_overflows_is_refused_not_a_crash(plans, shape):
    """A tensor column whose metadata claims a shape whose size overflows is refused with
    a BufferError; no consumer gets a pointer with strides past the buffer, and no
    Rust panic reaches Python."""
    producer = sluice.Producer(tensor_plan(plans, shape), min_subscribers=1)
    with sluice.subscribe(plans.topic, timeout=30) as sub:
        batch = next(sub)
        for export in (lambda: np.from_dlpack(batch["t"]),
                       lambda: batch["t"].__dlpack__(),
                       lambda: batch["t"].__dlpack__(max_version=(1, 0))):
            with pytest.raises(BufferError, match="does not (fit|match)"):
                export()
        # pyarrow knows the extension type and refuses the shape by its own check.
        with pytest.raises(pa.ArrowInvalid, match="would not fit"):
            pa.record_batch(batch)
        del batch
        for rest in sub:
            del rest
    producer.wait(timeout=30)


def test_timeouts_past_what_a_clock_holds_mean_as_long_as_it_takes(plans):
    """A timeout or reconnection of 1e300 seconds (or infinity) waits, as None does,
    rather than panicking on an overflow."""
    producer = sluice.Producer(plans.plan(rows=100), min_subscribers=1)
    with sluice.subscribe(plans.topic, timeout=1e300, reconnect=float("inf")) as sub:
        assert sum(len(b) for b in sub) == 100
    producer.wait(timeout=1e300)
    with sluice.Producer(plans.plan(rows=100, name="again.sql"), min_subscribers=1,
                         linger=1e300) as again:
        with sluice.subscribe(plans.topic, timeout=float("inf")) as sub:
            assert sum(len(b) for b in sub) == 100
    assert again.wait().rows == 100


@pytest.mark.parametrize("flag", ["--linger", "--wait-timeout"])
def test_a_negative_number_of_seconds_is_a_clear_error_of_the_cli(plans, ns, flag):
    cli = os.environ.get("SLUICE_CLI")
    if not cli:
        pytest.skip("SLUICE_CLI (the sluice binary, set by scripts/test-python.sh) is needed")
    run = subprocess.run([cli, "run", str(plans.plan(rows=10)), f"{flag}=-1", "-q"],
                         env=dict(os.environ, SLUICE_NAMESPACE=ns), capture_output=True,
                         text=True, timeout=60)
    assert run.returncode == 2, run.stderr
    assert f"{flag} must be a number of seconds >= 0" in run.stderr
    assert "panicked" not in run.stderr
