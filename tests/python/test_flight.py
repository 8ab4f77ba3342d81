"""Python subscribers of a topic served over Arrow Flight (``flight://HOST:PORT/TOPIC``),
as a trainer on another machine would subscribe: the server is ``sluice serve --flight``
(the CLI of the test build, ``SLUICE_CLI``), the producer runs in this process."""

from __future__ import annotations

import contextlib
import json
import os
import subprocess
import time

import numpy as np
import pyarrow as pa
import pytest

import sluice

CLI = os.environ.get("SLUICE_CLI")
needs_cli = pytest.mark.skipif(
    not CLI or not os.path.exists(CLI),
    reason="SLUICE_CLI (the sluice binary, set by scripts/test-python.sh) is needed for "
    "`sluice serve --flight`; skipped the Flight subscriber tests",
)

TOKEN = "py-test-token"


@contextlib.contextmanager
def serving(ns, tmp_path, *extra):
    """``sluice serve --flight 127.0.0.1:0 EXTRA`` in this test's namespace; yields its
    address."""
    token = tmp_path / "token"
    token.write_text(TOKEN)
    log = tmp_path / "serve.log"
    level = os.environ.get("SLUICE_TEST_LOG", "warn")
    with open(log, "w") as stderr:
        proc = subprocess.Popen(
            [CLI, "serve", "--flight", "127.0.0.1:0", "--token-file", str(token), *extra],
            stdout=subprocess.PIPE,
            stderr=stderr,
            text=True,
            env={**os.environ, "SLUICE_NAMESPACE": ns, "SLUICE_LOG": level},
        )
    try:
        line = proc.stdout.readline()
        assert line.startswith("serving on "), line
        yield line.removeprefix("serving on ").strip()
    finally:
        proc.kill()
        proc.wait(10)
        # Shown by pytest only for a test that failed.
        print(f"--- sluice serve's log ({level}) ---\n{log.read_text()}")


@pytest.fixture
def server(ns, tmp_path):
    """``sluice serve --flight 127.0.0.1:0`` in this test's namespace; yields its address."""
    with serving(ns, tmp_path) as address:
        yield address


@needs_cli
def test_a_remote_subscriber_gets_every_row_in_its_batch_size(plans, server, monkeypatch):
    monkeypatch.setenv("SLUICE_TOKEN", TOKEN)
    producer = sluice.Producer(plans.plan(rows=1000, batch_rows=64, epochs=2), min_subscribers=1)
    ids = []
    sizes = []
    with sluice.subscribe(f"flight://{server}/{plans.topic}", batch_size=100, timeout=60) as sub:
        for epoch in sub.epochs():
            got = []
            for batch in epoch:
                sizes.append(len(batch))
                got.extend(pa.record_batch(batch).column("id").to_pylist())
                assert np.from_dlpack(batch["x"]).shape == (len(batch),)
            assert epoch.complete and epoch.rows == 1000
            ids.append(got)
    assert ids == [list(range(1000))] * 2
    assert sizes == [100] * 20
    producer.wait(timeout=60)


@needs_cli
def test_a_wrong_token_is_refused_naming_what_to_set(plans, server, monkeypatch):
    monkeypatch.setenv("SLUICE_TOKEN", "wrong")
    with pytest.raises(sluice.SluiceError, match="SLUICE_TOKEN"):
        sluice.subscribe(f"flight://{server}/{plans.topic}", timeout=10)


def test_a_malformed_flight_address_is_a_value_error():
    with pytest.raises(ValueError, match="flight://HOST:PORT/TOPIC"):
        sluice.subscribe("flight://no-port/topic", timeout=1)


@needs_cli
def test_named_columns_are_the_only_ones_the_server_sends(plans, server, monkeypatch):
    """A ticket's ``columns`` makes the server decode and send only those, to any Flight
    client (here pyarrow's); a Sluice subscriber's ``columns=`` asks for them so, and a
    column the topic lacks fails it with ``PlanError`` naming the topic's columns."""
    import pyarrow.flight as flight

    monkeypatch.setenv("SLUICE_TOKEN", TOKEN)
    producer = sluice.Producer(plans.plan(rows=300, batch_rows=64, epochs=1), min_subscribers=3)
    client = flight.FlightClient(f"grpc://{server}")
    # A deadline, so that a stream that never starts fails the test instead of hanging it.
    options = flight.FlightCallOptions(
        timeout=60, headers=[(b"authorization", f"Bearer {TOKEN}".encode())]
    )
    ticket = flight.Ticket(json.dumps({"topic": plans.topic, "columns": ["x", "id"]}).encode())
    with sluice.subscribe(
        f"flight://{server}/{plans.topic}", columns=["id"], batch_size=100, timeout=60
    ) as sub, sluice.subscribe(
        f"flight://{server}/{plans.topic}", columns=["id", "pixels"], timeout=60
    ) as wrong:
        # pyarrow's do_get waits for the schema: the producer starts once all three attach.
        reader = client.do_get(ticket, options)
        assert reader.schema.names == ["x", "id"]
        # Batches, and Sluice's control messages (the end of the epoch, of the stream) as
        # chunks of metadata alone.
        batches, metadata_only = [], 0
        for chunk in reader:
            if chunk.data is None:
                assert chunk.app_metadata is not None
                metadata_only += 1
            else:
                assert chunk.data.schema.names == ["x", "id"]
                batches.append(chunk.data)
        assert pa.Table.from_batches(batches).column("id").to_pylist() == list(range(300))
        assert metadata_only >= 2
        ids = []
        for batch in sub:
            assert batch.column_names == ["id"]
            ids += pa.record_batch(batch).column("id").to_pylist()
        assert ids == list(range(300))
        with pytest.raises(sluice.PlanError, match=r"no column 'pixels'.*id, x, vec, label, text") as e:
            next(wrong)
        assert "invalid configuration: invalid configuration" not in str(e.value)
    producer.wait(timeout=60)


@needs_cli
def test_any_flight_client_of_every_column_reads_the_producers_messages_as_they_are(
    plans, server, monkeypatch
):
    """A ticket without ``columns`` gets the producer's IPC messages forwarded as they
    are (not encoded again by the server, which validates them first for a client that
    does not say it validates what it reads, as pyarrow's does not): pyarrow's Flight
    client (Arrow C++) reads them, dictionary and string view columns included, with the
    schema sent once for the whole stream, and a Sluice subscriber (whose messages the
    server does not decode at all) reads the same rows."""
    import pyarrow.flight as flight

    monkeypatch.setenv("SLUICE_TOKEN", TOKEN)
    select = ("SELECT id, arrow_cast(text, 'Dictionary(Int32, Utf8)') AS d, "
              "arrow_cast(text, 'Utf8View') AS v, vec FROM t")
    producer = sluice.Producer(
        plans.plan(rows=1_001, batch_rows=64, epochs=2, select=select), min_subscribers=2
    )
    client = flight.FlightClient(f"grpc://{server}")
    # A deadline, so that a stream that never starts fails the test instead of hanging it.
    options = flight.FlightCallOptions(
        timeout=60, headers=[(b"authorization", f"Bearer {TOKEN}".encode())]
    )
    ticket = flight.Ticket(json.dumps({"topic": plans.topic}).encode())
    with sluice.subscribe(f"flight://{server}/{plans.topic}", timeout=60) as sub:
        reader = client.do_get(ticket, options)
        assert reader.schema.names == ["id", "d", "v", "vec"]
        assert pa.types.is_dictionary(reader.schema.field("d").type)
        assert reader.schema.field("v").type == pa.string_view()
        batches = [chunk.data for chunk in reader if chunk.data is not None]
        local = [pa.record_batch(b) for b in sub]
    for got in (batches, local):
        table = pa.Table.from_batches(got)
        assert table.num_rows == 2 * 1_001
        assert sorted(table.column("id").to_pylist()) == sorted(list(range(1_001)) * 2)
        d = table.column("d").cast(pa.string()).to_pylist()
        assert d == table.column("v").cast(pa.string()).to_pylist()
        assert sorted(d) == sorted([f"row{i}" for i in range(1_001)] * 2)
        # Each row's vector is [id, id + 1, id + 2, id + 3]: no row was mixed up.
        for i, v in zip(table.column("id").to_pylist(), table.column("vec").to_pylist()):
            assert v == [i, i + 1, i + 2, i + 3]
    assert pa.Table.from_batches(batches).equals(pa.Table.from_batches(local))
    producer.wait(timeout=60)


@needs_cli
def test_named_columns_bring_their_dictionaries_with_every_batch(plans, server, monkeypatch):
    """A ticket of named columns that include a dictionary column: the server encodes
    each batch again with its own dictionaries (it keeps none from batch to batch, since
    they point into the batches' shared memory), and pyarrow's client and a Sluice
    subscriber read the same values, row by row, over two epochs."""
    import pyarrow.flight as flight

    monkeypatch.setenv("SLUICE_TOKEN", TOKEN)
    select = "SELECT id, arrow_cast(text, 'Dictionary(Int32, Utf8)') AS d, vec FROM t"
    producer = sluice.Producer(
        plans.plan(rows=700, batch_rows=64, epochs=2, select=select), min_subscribers=2
    )
    client = flight.FlightClient(f"grpc://{server}")
    # A deadline, so that a stream that never starts fails the test instead of hanging it.
    options = flight.FlightCallOptions(
        timeout=60, headers=[(b"authorization", f"Bearer {TOKEN}".encode())]
    )
    ticket = flight.Ticket(json.dumps({"topic": plans.topic, "columns": ["d", "id"]}).encode())
    with sluice.subscribe(
        f"flight://{server}/{plans.topic}", columns=["d", "id"], batch_size=100, timeout=60
    ) as sub:
        reader = client.do_get(ticket, options)
        assert pa.types.is_dictionary(reader.schema.field("d").type)
        batches = [chunk.data for chunk in reader if chunk.data is not None]
        local = [pa.record_batch(b) for b in sub]
    for got in (batches, local):
        table = pa.Table.from_batches(got)
        assert table.column_names == ["d", "id"]
        assert table.num_rows == 2 * 700
        ids = table.column("id").to_pylist()
        assert sorted(ids) == sorted(list(range(700)) * 2)
        values = table.column("d").cast(pa.string()).to_pylist()
        assert values == [f"row{i}" for i in ids]
    producer.wait(timeout=60)


def _auth():
    from pyarrow import flight

    return flight.FlightCallOptions(headers=[(b"authorization", f"Bearer {TOKEN}".encode())])


@needs_cli
def test_a_request_of_reports_that_sends_nothing_takes_no_subscribers_place(
    plans, ns, tmp_path, monkeypatch
):
    """An idle ``do_put`` (a client that opens one and sends nothing more) holds none of
    the places of ``--max-streams``: with one place, a subscriber still gets its rows
    (it was refused with RESOURCE_EXHAUSTED for as long as the client stayed)."""
    from pyarrow import flight

    monkeypatch.setenv("SLUICE_TOKEN", TOKEN)
    with serving(ns, tmp_path, "--max-streams", "1") as address:
        client = flight.FlightClient(f"grpc://{address}")
        schema = pa.schema([("key", pa.int64())])
        descriptor = flight.FlightDescriptor.for_path("feedback", plans.topic, "idle")
        writer, _ = client.do_put(descriptor, schema, options=_auth())
        time.sleep(0.5)  # the server has the request by now
        producer = sluice.Producer(plans.plan(rows=200, batch_rows=50, epochs=1), min_subscribers=1)
        with sluice.subscribe(f"flight://{address}/{plans.topic}", timeout=60) as sub:
            rows = sum(len(b) for epoch in sub.epochs() for b in epoch)
        assert rows == 200
        producer.wait(timeout=60)
        client.close()


@needs_cli
def test_compressed_reports_are_refused_before_they_are_decoded(plans, server):
    """A compressed ``do_put`` is refused: a buffer's decompressed size is the sender's
    word, which the decoder would allocate (a few MB of zstd decode to tens of GB)."""
    from pyarrow import flight

    client = flight.FlightClient(f"grpc://{server}")
    batch = pa.record_batch({"key": pa.array(np.zeros(100_000, dtype=np.int64))})
    options = flight.FlightCallOptions(
        headers=[(b"authorization", f"Bearer {TOKEN}".encode())],
        write_options=pa.ipc.IpcWriteOptions(compression="zstd"),
    )
    descriptor = flight.FlightDescriptor.for_path("feedback", plans.topic, "x")
    writer, _ = client.do_put(descriptor, batch.schema, options=options)
    with pytest.raises(pa.ArrowInvalid, match="without IPC compression"):
        writer.write_batch(batch)
        writer.close()
    client.close()
