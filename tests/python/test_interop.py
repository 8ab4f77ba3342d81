"""Batches reach pyarrow, numpy and polars without a copy: their buffers lie in shared memory."""

from __future__ import annotations

import numpy as np
import polars as pl
import pyarrow as pa
import pyarrow.compute as pc
import pytest

import sluice
from helpers import arrow_buffers, capsule_name, capsule_pointer, in_batch_memory, inside


def first_batch(plans, **plan_args) -> tuple[sluice.Producer, sluice.Subscriber, sluice.Batch]:
    producer = sluice.Producer(plans.plan(**plan_args), min_subscribers=1)
    sub = sluice.subscribe(plans.topic, timeout=30)
    return producer, sub, next(sub)


def finish(producer: sluice.Producer, sub: sluice.Subscriber) -> None:
    sub.close()
    producer.wait(timeout=30)


def test_pyarrow_imports_a_batch_without_copying(plans):
    """pa.record_batch(batch) points into the shared-memory sample the batch came in."""
    producer, sub, batch = first_batch(plans)
    assert batch.shm_range is not None
    rb = pa.record_batch(batch)
    assert rb.num_rows == 50 == len(batch)
    assert rb.schema.names == ["id", "x", "vec", "label", "text"] == batch.column_names
    assert rb.column("id").to_pylist() == list(range(50))
    assert rb.column("text")[3].as_py() == "row3"
    spans = arrow_buffers(rb)
    assert spans and all(inside(s, batch.shm_range) for s in spans)
    del rb, batch
    finish(producer, sub)


def test_arrow_c_array_and_device_array_capsules_follow_the_spec(plans):
    """__arrow_c_array__ gives arrow_schema/arrow_array capsules; __arrow_c_device_array__
    gives a 128-byte ArrowDeviceArray on the CPU device (type 1, id 0, no sync event)."""
    producer, sub, batch = first_batch(plans)
    schema, array = batch.__arrow_c_array__()
    assert (capsule_name(schema), capsule_name(array)) == ("arrow_schema", "arrow_array")
    via_c_array = pa.RecordBatch._import_from_c_capsule(schema, array)

    schema, device = batch.__arrow_c_device_array__()
    assert capsule_name(device) == "arrow_device_array"
    import ctypes

    ptr = capsule_pointer(device)
    assert ctypes.c_int64.from_address(ptr + 80).value == 0  # device_id
    assert ctypes.c_int32.from_address(ptr + 88).value == 1  # ARROW_DEVICE_CPU
    assert ctypes.c_void_p.from_address(ptr + 96).value is None  # sync_event
    assert [ctypes.c_int64.from_address(ptr + 104 + 8 * i).value for i in range(3)] == [0, 0, 0]
    via_device = pa.RecordBatch._import_from_c_device_capsule(schema, device)
    assert via_device.equals(via_c_array)
    assert all(inside(s, batch.shm_range) for s in arrow_buffers(via_device))

    # An unconsumed capsule releases its array when it is collected.
    unused = batch.__arrow_c_device_array__()
    del unused
    with pytest.raises(NotImplementedError):
        batch.__arrow_c_device_array__(None, future_option=True)
    assert batch.__arrow_c_device_array__(None, future_option=None) is not None
    del via_c_array, via_device, batch
    finish(producer, sub)


def test_requested_schema_casts_where_possible(plans):
    producer, sub, batch = first_batch(plans, select="SELECT id, x FROM t")
    wanted = pa.schema([("id", pa.int32()), ("x", pa.float32())])
    rb = pa.record_batch(batch, schema=wanted)
    assert rb.schema == wanted
    assert rb.column("id").to_pylist() == list(range(50))
    del rb, batch
    finish(producer, sub)


def test_columns_import_into_pyarrow_and_know_their_type(plans):
    producer, sub, batch = first_batch(plans)
    col = batch["label"]
    assert (col.name, col.type, len(col), col.null_count) == ("label", "Int32", 50, 0)
    assert batch.column(3).name == "label" and batch[-1].name == "text"
    assert "vec" in batch and "nope" not in batch
    arr = pa.array(col)
    assert arr.to_pylist() == [i % 10 for i in range(50)]
    assert all(inside((b.address, b.size), batch.shm_range) for b in arr.buffers() if b)
    with pytest.raises(KeyError) as missing:
        batch["nope"]
    assert missing.value.args[0].startswith("no column 'nope'; the columns are")
    with pytest.raises(IndexError):
        batch[9]
    with pytest.raises(TypeError):
        batch[1.5]
    del arr, col, batch
    finish(producer, sub)


def test_numpy_reads_columns_through_dlpack_without_copying(plans):
    """np.from_dlpack gives read-only views of shared memory: 1-D for numbers, 2-D for
    fixed-size lists."""
    producer, sub, batch = first_batch(plans)
    start, end = batch.shm_range
    x = np.from_dlpack(batch["x"])
    assert x.dtype == np.float64 and x.shape == (50,)
    assert np.array_equal(x, np.arange(50) * 0.5)
    assert in_batch_memory(x, (start, end))
    assert not x.flags.writeable

    vec = np.from_dlpack(batch["vec"])
    assert vec.dtype == np.float32 and vec.shape == (50, 4) == tuple(batch["vec"].shape)
    assert np.array_equal(vec[7], [7, 8, 9, 10])
    assert in_batch_memory(vec, (start, end))

    ids = batch["id"].to_numpy()
    assert ids.dtype == np.int64 and np.array_equal(ids, np.arange(50))
    assert batch["id"].__dlpack_device__() == (1, 0)

    copied = np.from_dlpack(batch["x"], copy=True)
    assert copied.flags.writeable and np.array_equal(copied, x)
    assert not in_batch_memory(copied, (start, end))

    view = np.asarray(batch["vec"])  # the array protocol: the same zero-copy view
    assert view.shape == (50, 4) and in_batch_memory(view, (start, end))
    owned = np.array(batch["vec"])  # np.array copies
    assert owned.flags.writeable and not in_batch_memory(owned, (start, end))
    assert np.asarray(batch["id"], dtype=np.float64)[3] == 3.0
    del x, vec, ids, copied, view, owned, batch
    finish(producer, sub)


def test_dlpack_capsules_are_versioned_only_on_request(plans):
    producer, sub, batch = first_batch(plans)
    col = batch["x"]
    assert capsule_name(col.__dlpack__()) == "dltensor"
    assert capsule_name(col.__dlpack__(max_version=(1, 0))) == "dltensor_versioned"
    assert capsule_name(col.__dlpack__(max_version=(0, 8))) == "dltensor"
    with pytest.raises(BufferError, match="host memory"):
        col.__dlpack__(dl_device=(2, 0))
    del col, batch
    finish(producer, sub)


def test_dlpack_refuses_nulls_and_non_numeric_columns_clearly(plans):
    producer, sub, batch = first_batch(plans, with_nulls=True)
    assert batch["label"].null_count > 0
    with pytest.raises(BufferError, match=r"column 'label' has \d+ null value"):
        np.from_dlpack(batch["label"])
    with pytest.raises(BufferError, match="column 'text' has type Utf8"):
        np.from_dlpack(batch["text"])
    assert batch["text"].shape is None
    # The Arrow route still works for both.
    assert pc.fill_null(pa.array(batch["label"]), 0).to_pylist()[0] == 0
    del batch
    finish(producer, sub)


def test_fixed_shape_tensor_columns_keep_their_shape(plans):
    """An arrow.fixed_shape_tensor column (Sluice's tensors) comes out N-D, and a
    permuted one as a strided view."""
    n = 60
    storage = pa.array([[i + k for k in range(6)] for i in range(n)], pa.list_(pa.float32(), 6))
    tensor = pa.ExtensionArray.from_storage(pa.fixed_shape_tensor(pa.float32(), [2, 3]), storage)
    permuted = pa.ExtensionArray.from_storage(
        pa.fixed_shape_tensor(pa.float32(), [2, 3], permutation=[1, 0]),
        pa.array([[i + k for k in range(6)] for i in range(n)], pa.list_(pa.float32(), 6)),
    )
    d = plans.dir / "tensors"
    d.mkdir()
    import pyarrow.parquet as pq

    pq.write_table(pa.table({"t": tensor, "p": permuted}), d / "part-0.parquet")
    plan = plans.dir / "tensors.sql"
    plan.write_text(
        f"SET sluice.topic = '{plans.topic}';\nSET sluice.batch_rows = 20;\n"
        # DataFusion drops Parquet field metadata (and so extension types) by default.
        "SET datafusion.execution.parquet.skip_metadata = false;\n"
        f"CREATE EXTERNAL TABLE t STORED AS PARQUET LOCATION '{d}/';\nSELECT t, p FROM t;\n"
    )
    producer = sluice.Producer(plan, min_subscribers=1)
    with sluice.subscribe(plans.topic, timeout=30) as sub:
        batch = next(sub)
        t = np.from_dlpack(batch["t"])
        assert t.shape == (20, 2, 3)
        assert np.array_equal(t[1], np.arange(1, 7, dtype=np.float32).reshape(2, 3))
        # Stored as the (3, 2) physical layout; logically (2, 3) with permuted strides.
        p = np.from_dlpack(batch["p"])
        assert p.shape == (20, 2, 3)
        assert np.array_equal(p[1], np.arange(1, 7, dtype=np.float32).reshape(3, 2).T)
        del t, p, batch
    producer.wait(timeout=30)


def test_polars_imports_batches_and_columns(plans):
    producer, sub, batch = first_batch(plans)
    df = pl.DataFrame(batch)  # Arrow PyCapsule protocol
    assert df.shape == (50, 5) and df["id"].to_list() == list(range(50))
    via_pyarrow = pl.from_arrow(pa.record_batch(batch))
    assert via_pyarrow.equals(df)
    s = pl.Series(batch["x"])
    assert s.to_list() == [i * 0.5 for i in range(50)]
    info = getattr(s, "_get_buffer_info", None)
    if info is not None:  # polars keeps primitive buffers where they are
        address, offset, length = info()
        assert inside((address, length * 8), batch.shm_range)
    del df, via_pyarrow, s, batch
    finish(producer, sub)


def test_a_subscriber_is_an_arrow_stream(plans):
    """pyarrow.RecordBatchReader.from_stream(sub) reads every batch of every epoch."""
    producer = sluice.Producer(plans.plan(rows=200, epochs=2), min_subscribers=1)
    with sluice.subscribe(plans.topic, timeout=30) as sub:
        reader = pa.RecordBatchReader.from_stream(sub)
        assert reader.schema.names == ["id", "x", "vec", "label", "text"]
        table = reader.read_all()
        del reader
    assert table.num_rows == 400
    assert sorted(table.column("id").to_pylist()) == sorted(list(range(200)) * 2)
    del table
    producer.wait(timeout=30)


@pytest.mark.parametrize("consumer", ["pyarrow", "polars", "copy"])
def test_copies_of_dictionary_and_view_columns_leave_shared_memory(plans, consumer):
    """A whole stream read with ``pa.table(sub)`` or ``pl.from_arrow(sub)``, or batches
    kept with ``Batch.copy()``, hold no shared memory, also with dictionary and string
    view columns (issue 13: the copies kept their dictionary values in the sample and
    failed with "holds too many batches" after ``max_held`` batches)."""
    select = ("SELECT id, arrow_cast(text, 'Dictionary(Int32, Utf8)') AS d, "
              "arrow_cast(text, 'Utf8View') AS v FROM t")
    producer = sluice.Producer(plans.plan(rows=10_007, batch_rows=500, select=select),
                               min_subscribers=1)
    with sluice.subscribe(plans.topic, timeout=30) as sub:
        if consumer == "pyarrow":
            table = pa.table(sub)
        elif consumer == "polars":
            frame = pl.from_arrow(sub)
            # polars reads a C stream as a struct Series; its fields are the columns.
            if isinstance(frame, pl.Series):
                frame = frame.struct.unnest()
            table = frame.to_arrow()
        else:
            kept = []
            for b in sub:
                shm = b.shm_range
                c = b.copy()
                del b
                for column in pa.record_batch(c).columns:
                    for span in _all_buffers(column):
                        assert shm is None or not overlaps(span, shm), \
                            f"a copy of {column.type} points into shared memory"
                kept.append(c)
            table = pa.Table.from_batches([pa.record_batch(b) for b in kept])
    assert table.num_rows == 10_007
    assert sorted(table.column("id").to_pylist()) == list(range(10_007))
    d = table.column("d").cast(pa.string()).to_pylist()
    assert d == table.column("v").cast(pa.string()).to_pylist()
    assert sorted(d) == sorted(f"row{i}" for i in range(10_007))
    del table
    producer.wait(timeout=30)


def _all_buffers(array: pa.Array) -> list[tuple[int, int]]:
    """(address, size) of every buffer of ``array``, its children and its dictionary."""
    out = [(b.address, b.size) for b in array.buffers() if b is not None and b.size > 0]
    if pa.types.is_dictionary(array.type):
        out += _all_buffers(array.dictionary)
    return out


def overlaps(span: tuple[int, int], shm_range: tuple[int, int]) -> bool:
    """Whether the (address, size) span shares a byte with the [start, end) range."""
    address, size = span
    start, end = shm_range
    return address < end and start < address + size
