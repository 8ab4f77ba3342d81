"""Files of apache/parquet-testing (tests/data/parquet-testing) reach a Python trainer as
pyarrow reads them: nested lists, maps and structs, decimals, dictionaries, variants,
through the Arrow C data interface and, re-batched, in slices of 7 rows."""

from __future__ import annotations

from pathlib import Path

import numpy as np
import pyarrow as pa
import pyarrow.parquet as pq
import pytest

import sluice

DATA = Path(__file__).resolve().parents[1] / "data" / "parquet-testing"

# Files whose schema DataFusion reads as pyarrow does, so the tables compare equal.
SAME_AS_PYARROW = [
    "data/nested_lists.snappy.parquet",
    "data/nested_maps.snappy.parquet",
    "data/list_columns.parquet",
    "data/nullable.impala.parquet",
    "data/nonnullable.impala.parquet",
    "data/map_no_value.parquet",
    "data/nulls.snappy.parquet",
    "data/int64_decimal.parquet",
    "data/fixed_length_decimal.parquet",
    "data/alltypes_dictionary.parquet",
    "data/delta_length_byte_array.parquet",
    "shredded_variant/case-001.parquet",
]


def write_plan(tmp_path: Path, topic: str, file: Path) -> Path:
    plan = tmp_path / "p.sql"
    plan.write_text(
        f"SET sluice.topic = '{topic}';\nSET sluice.epochs = 1;\n"
        f"CREATE EXTERNAL TABLE t STORED AS PARQUET LOCATION '{file}';\nSELECT * FROM t;\n"
    )
    return plan


@pytest.mark.parametrize("name", SAME_AS_PYARROW)
@pytest.mark.parametrize("batch_size", [None, 7])
def test_a_parquet_testing_file_arrives_as_pyarrow_reads_it(tmp_path, topic, ns, name, batch_size):
    file = DATA / name
    producer = sluice.Producer(write_plan(tmp_path, topic, file), min_subscribers=1)
    received = []
    with sluice.subscribe(topic, timeout=30, batch_size=batch_size) as sub:
        for batch in sub:
            rb = pa.record_batch(batch)
            rb.validate(full=True)
            if batch_size is not None:
                assert rb.num_rows <= batch_size
            # A column numpy can take is read-only; every other one is refused clearly.
            for column in batch.column_names:
                try:
                    values = np.from_dlpack(batch[column])
                except BufferError as e:
                    assert column in str(e)
                else:
                    if values.size:
                        with pytest.raises(ValueError):
                            values.flat[0] = values.flat[0]
            received.append(batch.copy().to_pyarrow())
            del rb, batch
    producer.wait(timeout=30)
    expected = pq.read_table(file)
    table = pa.Table.from_batches(received, schema=received[0].schema if received else None)
    assert table.schema == expected.schema
    assert table.equals(expected), name
