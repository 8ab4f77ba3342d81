"""Python subscribers of a topic served over Arrow Flight (``flight://HOST:PORT/TOPIC``),
as a trainer on another machine would subscribe: the server is ``sluice serve --flight``
(the CLI of the test build, ``SLUICE_CLI``), the producer runs in this process."""

from __future__ import annotations

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


@pytest.fixture
def server(ns, tmp_path):
    """``sluice serve --flight 127.0.0.1:0`` in this test's namespace; yields its address."""
    token = tmp_path / "token"
    token.write_text(TOKEN)
    proc = subprocess.Popen(
        [CLI, "serve", "--flight", "127.0.0.1:0", "--token-file", str(token)],
        stdout=subprocess.PIPE,
        stderr=subprocess.DEVNULL,
        text=True,
        env={**os.environ, "SLUICE_NAMESPACE": ns, "SLUICE_LOG": "warn"},
    )
    try:
        line = proc.stdout.readline()
        assert line.startswith("serving on "), line
        yield line.removeprefix("serving on ").strip()
    finally:
        proc.kill()
        proc.wait(10)


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
