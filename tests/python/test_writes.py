"""No consumer can write into the shared memory every subscriber reads (issue 13).

A write through a zero-copy view either raises a clear Python error or goes to a private
copy; it never kills the trainer with SIGSEGV and never changes what another view or
another subscriber sees. docs/python.md lists what each consumer does.
"""

from __future__ import annotations

import numpy as np
import pyarrow as pa
import pytest

import sluice

# torch has no read-only tensors and ignores DLPack's read-only flag: `x.mul_(2)` on
# `torch.from_dlpack(batch["x"])` stores through the capsule's data pointer. This does
# exactly that, with ctypes, in a child process (a regression would be a SIGSEGV).
WRITE_THROUGH_DLPACK = """
import ctypes, sys
import pyarrow as pa
import sluice

plan, topic = sys.argv[1], sys.argv[2]
producer = sluice.Producer(plan, min_subscribers=2)
a = sluice.subscribe(topic, timeout=30)
b = sluice.subscribe(topic, timeout=30)
# Skip batches to reach one cut from a message of several batches (the first message
# of a run is always one batch alone).
for _ in range(int(sys.argv[3])):
    next(a), next(b)
batch_a, batch_b = next(a), next(b)
assert batch_a.shm_range is not None, "the batch must be zero-copy for this test"
# The next batch of the same message shares its sample; a write to batch_a's values must
# not show in it either.
neighbour = next(a)
if int(sys.argv[3]):
    assert neighbour.shm_range == batch_a.shm_range, "not cut from one message"
neighbour_before = pa.record_batch(neighbour).column("x").to_pylist()
api = ctypes.pythonapi
api.PyCapsule_GetPointer.restype = ctypes.c_void_p
api.PyCapsule_GetPointer.argtypes = [ctypes.py_object, ctypes.c_char_p]
for legacy in (True, False):
    capsule = (batch_a["x"].__dlpack__() if legacy
               else batch_a["x"].__dlpack__(max_version=(1, 0)))
    name = b"dltensor" if legacy else b"dltensor_versioned"
    managed = api.PyCapsule_GetPointer(capsule, name)
    # DLManagedTensor starts with DLTensor (data first); the versioned struct has its
    # version, manager_ctx, deleter and flags (32 bytes) before it.
    data = ctypes.c_void_p.from_address(managed + (0 if legacy else 32)).value
    values = (ctypes.c_double * len(batch_a)).from_address(data)
    before = list(values)
    for i in range(len(batch_a)):
        values[i] = -1.0
    assert list(values) == [-1.0] * len(batch_a), "the writer sees its own write"
    assert pa.record_batch(batch_a).column("x").to_pylist() == before, "its other views do not"
    assert pa.record_batch(batch_b).column("x").to_pylist() == before, "other subscribers do not"
    assert pa.record_batch(neighbour).column("x").to_pylist() == neighbour_before, "nor its neighbour"
    del values, capsule
print("ok", flush=True)
del batch_a, batch_b, neighbour
a.close()
b.close()
producer.close()
"""


@pytest.mark.parametrize("row_group_size, skip", [(50, 0), (400, 1)],
                         ids=["one-batch-messages", "cut-from-a-message"])
def test_a_write_through_a_dlpack_pointer_changes_a_private_copy_only(
        plans, run_python, row_group_size, skip):
    plan = plans.plan(rows=400, batch_rows=100, row_group_size=row_group_size)
    child = run_python(WRITE_THROUGH_DLPACK, str(plan), plans.topic, str(skip))
    out, err = child.communicate(timeout=60)
    assert child.returncode == 0, f"exit {child.returncode} (-11 is SIGSEGV): {err}"
    assert out.strip() == "ok", err


def test_numpy_views_are_read_only_and_a_write_raises(plans):
    producer = sluice.Producer(plans.plan(rows=200), min_subscribers=1)
    with sluice.subscribe(plans.topic, timeout=30) as sub:
        batch = next(sub)
        for x in (np.from_dlpack(batch["x"]), np.asarray(batch["x"]), batch["x"].to_numpy()):
            assert not x.flags.writeable
            with pytest.raises(ValueError, match="read-only"):
                x *= 2
            with pytest.raises(ValueError):
                x.flags.writeable = True
        copy = np.array(batch["x"])  # a private, writable copy
        copy *= 2
        assert pa.record_batch(batch).column("x").to_pylist() == [i * 0.5 for i in range(50)]
        del batch, x, copy
    producer.wait(timeout=30)


def test_pyarrow_and_polars_views_cannot_be_written(plans):
    """pyarrow arrays are immutable; polars copies on write (checked where polars is
    installed: the GPU machine's Python has no polars)."""
    try:
        import polars as pl
    except ImportError:
        pl = None

    producer = sluice.Producer(plans.plan(rows=200), min_subscribers=1)
    with sluice.subscribe(plans.topic, timeout=30) as sub:
        batch = next(sub)
        rb = pa.record_batch(batch)
        with pytest.raises(TypeError):
            rb.column("x")[0] = 1.0  # type: ignore[index]
        if pl is not None:
            df = pl.DataFrame(batch)
            df[0, "x"] = 123.0  # copy on write: the frame's own copy
            assert df["x"][0] == 123.0
            del df
        assert rb.column("x")[0].as_py() == 0.0
        del batch, rb
    producer.wait(timeout=30)


def test_torch_in_place_ops_change_a_private_copy_only(plans):
    torch = pytest.importorskip("torch", reason="torch is not installed (~3 GB); "
                                "test_a_write_through_a_dlpack_pointer_… covers its writes")
    import sluice.torch

    producer = sluice.Producer(plans.plan(rows=200), min_subscribers=2)
    a = sluice.subscribe(plans.topic, timeout=30)
    b = sluice.subscribe(plans.topic, timeout=30)
    batch_a, batch_b = next(a), next(b)
    x = torch.from_dlpack(batch_a["x"])
    x.mul_(2)
    y = sluice.torch.batch_to_tensors(batch_a)["x"]
    y.sub_(1)
    expected = [i * 0.5 for i in range(50)]
    assert x.tolist() == [v * 2 for v in expected]
    assert pa.record_batch(batch_a).column("x").to_pylist() == expected
    assert pa.record_batch(batch_b).column("x").to_pylist() == expected
    del x, y, batch_a, batch_b
    a.close()
    b.close()
    producer.wait(timeout=30)


def test_jax_arrays_from_dlpack_are_immutable(plans):
    jax = pytest.importorskip("jax", reason="jax is not installed")

    producer = sluice.Producer(plans.plan(rows=200), min_subscribers=1)
    with sluice.subscribe(plans.topic, timeout=30) as sub:
        batch = next(sub)
        x = jax.dlpack.from_dlpack(batch["x"])
        expected = [i * 0.5 for i in range(50)]
        assert x.tolist() == expected
        with pytest.raises(TypeError):
            x[0] = 1.0  # JAX arrays are immutable
        y = x.at[0].set(5.0)  # a new array
        assert float(y[0]) == 5.0 and x.tolist() == expected
        assert pa.record_batch(batch).column("x").to_pylist() == expected
        del batch, x, y
    producer.wait(timeout=30)


def test_writes_to_named_columns_raise_or_change_a_private_copy_only(plans):
    """A subscriber that names its columns gets the same zero-copy views of shared memory
    (decoded in place from the sample): numpy refuses writes, torch and JAX write a
    private copy, and neither the writer's other views nor another subscriber, which
    receives every column, see anything change."""
    producer = sluice.Producer(plans.plan(rows=200), min_subscribers=2)
    named = sluice.subscribe(plans.topic, columns=["x", "id"], timeout=30)
    whole = sluice.subscribe(plans.topic, timeout=30)
    batch, other = next(named), next(whole)
    assert batch.column_names == ["x", "id"] and batch.shm_range is not None
    expected = [i * 0.5 for i in range(50)]
    x = np.from_dlpack(batch["x"])
    assert not x.flags.writeable
    with pytest.raises(ValueError, match="read-only"):
        x *= 2
    try:
        import torch
    except ImportError:
        torch = None
    if torch is not None:
        t = torch.from_dlpack(batch["x"])
        t.mul_(2)
        assert t.tolist() == [v * 2 for v in expected]
        del t
    try:
        import jax
    except ImportError:
        jax = None
    if jax is not None:
        j = jax.dlpack.from_dlpack(batch["x"])
        with pytest.raises(TypeError):
            j[0] = 1.0  # JAX arrays are immutable
        assert j.at[0].set(5.0).tolist()[0] == 5.0 and j.tolist() == expected
        del j
    assert pa.record_batch(batch).column("x").to_pylist() == expected
    assert pa.record_batch(other).column("x").to_pylist() == expected
    del x, batch, other
    named.close()
    whole.close()
    producer.wait(timeout=30)


def test_copy_false_is_refused_where_a_copy_is_needed(plans):
    """DLPack's ``copy=False`` gets the shared values or a ``BufferError``: a batch put
    together from two producer batches lives in this process's memory, shared with its
    other views, and is exported only as a copy (which ``copy=False`` got silently)."""
    producer = sluice.Producer(plans.plan(rows=400, batch_rows=100), min_subscribers=1)
    with sluice.subscribe(plans.topic, timeout=30, batch_size=150) as sub:
        whole = next(sub)  # rows 0..150: cut from two producer batches
        assert whole.shm_range is None
        with pytest.raises(BufferError, match="without a copy"):
            np.from_dlpack(whole["x"], copy=False)
        assert np.from_dlpack(whole["x"]).tolist() == [i * 0.5 for i in range(150)]
        del whole
    producer.wait(timeout=30)
    producer = sluice.Producer(plans.plan(rows=100, batch_rows=100), min_subscribers=1)
    with sluice.subscribe(plans.topic, timeout=30) as sub:
        zero_copy = next(sub)
        assert zero_copy.shm_range is not None
        assert not np.from_dlpack(zero_copy["x"], copy=False).flags.writeable
        del zero_copy
    producer.wait(timeout=30)
