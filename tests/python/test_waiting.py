"""Waiting releases the GIL and Ctrl-C interrupts it promptly; producers run in the
background of the calling process."""

from __future__ import annotations

import os
import signal
import subprocess
import threading
import time

import pyarrow as pa
import pytest

import sluice
from helpers import waiting_subscribers

BLOCKED_IN_NEXT = """
import sys, sluice
sub = sluice.subscribe(sys.argv[1], timeout=120)
print("ready", flush=True)
try:
    next(iter(sub))
except KeyboardInterrupt:
    print("interrupted", flush=True)
    sub.close()
    sys.exit(3)
"""

BLOCKED_IN_SUBSCRIBE = """
import sys, sluice
print("ready", flush=True)
try:
    sluice.subscribe(sys.argv[1] + "-absent", timeout=120)
except KeyboardInterrupt:
    print("interrupted", flush=True)
    sys.exit(3)
"""


BLOCKED_IN_STREAM = """
import sys, time, numpy as np, pyarrow as pa, sluice
class Stalling:  # one batch, then nothing for two minutes
    def __iter__(self):
        yield {"id": np.arange(10)}
        time.sleep(120)
        yield {"id": np.arange(10)}
topic = sys.argv[1] + "-stream"
producer = sluice.Producer(Stalling(), topic=topic, epochs=1, min_subscribers=1)
sub = sluice.subscribe(topic, timeout=120)
print("ready", flush=True)
def read():
    try:
        pa.table(sub)
    except Exception as e:  # the stream's error, then KeyboardInterrupt once it returned
        if "interrupted" not in str(e):
            raise
try:
    read()
    print("read", flush=True)
except KeyboardInterrupt:
    pass
print("interrupted", flush=True)
sub.close()
sys.exit(3)
"""


@pytest.mark.parametrize(
    "code",
    [BLOCKED_IN_NEXT, BLOCKED_IN_SUBSCRIBE, BLOCKED_IN_STREAM],
    ids=["next", "subscribe", "arrow-stream"],
)
def test_ctrl_c_interrupts_a_blocked_wait_promptly(plans, run_python, code):
    """A process blocked waiting for a batch (or for a producer) gets KeyboardInterrupt
    within seconds of SIGINT, not at the end of its 120 s wait (the bound is generous:
    the suite's workers share two cores)."""
    # The producer waits for a second subscriber that never comes: nothing is published.
    producer = sluice.Producer(plans.plan(rows=100), min_subscribers=2)
    child = run_python(code, plans.topic)
    assert child.stdout.readline().strip() == "ready"
    time.sleep(0.5)  # let it block
    assert child.poll() is None
    sent = time.monotonic()
    child.send_signal(signal.SIGINT)
    returncode = child.wait(timeout=30)
    elapsed = time.monotonic() - sent
    out, err = child.stdout.read(), child.stderr.read()
    assert returncode == 3, (out, err)
    assert "interrupted" in out
    assert elapsed < 10.0, f"KeyboardInterrupt took {elapsed:.2f}s"
    producer.close()


def test_waiting_releases_the_gil(plans):
    producer = sluice.Producer(plans.plan(rows=100), min_subscribers=2)
    sub = sluice.subscribe(plans.topic, timeout=0.5)
    counter = [0]
    stop = threading.Event()

    def spin() -> None:
        while not stop.is_set():
            counter[0] += 1

    thread = threading.Thread(target=spin)
    thread.start()
    try:
        with pytest.raises(sluice.Timeout):
            next(sub)
    finally:
        stop.set()
        thread.join()
    # A thread that held no GIL for 0.5 s would have counted to (nearly) nothing.
    assert counter[0] > 10_000
    sub.close()
    producer.close()


def test_a_producer_runs_in_the_background_and_reports_progress(plans):
    producer = sluice.Producer(plans.plan(rows=300, batch_rows=100, epochs=2),
                               min_subscribers=1, topic=plans.topic + "-renamed")
    assert producer.topic == plans.topic + "-renamed" and producer.epochs == 2
    assert producer.running
    with producer, sluice.subscribe(producer.topic, timeout=30) as sub:
        rows = sum(len(b) for b in sub)
    assert rows == 600 and not producer.running
    assert producer.progress == {"epoch": 1, "batches": 6, "rows": 600,
                                 "bytes": producer.progress["bytes"], "subscribers": 1}
    stats = producer.wait()
    assert (stats.epochs, stats.batches, stats.rows) == (2, 6, 600)
    assert stats.shm_bytes > 0 and stats.elapsed >= 0
    producer.close()  # idempotent after the end


def test_closing_a_producer_stops_its_subscribers(plans):
    # A short window keeps the producer mid-stream behind this subscriber; 'auto' would
    # queue all 100 batches at once and the run could be over before close().
    plan = plans.plan(rows=5000, batch_rows=50, extra="SET sluice.window = 4;\n")
    producer = sluice.Producer(plan, min_subscribers=1)
    with sluice.subscribe(plans.topic, timeout=30) as sub:
        batch = next(sub)
        del batch
        producer.close()
        assert not producer.running
        # Told it stopped, or (its queue full when the producer stopped, so the message
        # had no room and a stopping producer waits for no one) finds the producer gone.
        with pytest.raises((sluice.ProducerFailed, sluice.ProducerLost), match="stopped|is gone"):
            for batch in sub:
                del batch


def test_an_exception_in_a_producer_block_stops_the_run(plans):
    with pytest.raises(RuntimeError, match="trainer crashed"):
        with sluice.Producer(plans.plan(rows=100), min_subscribers=5) as producer:
            raise RuntimeError("trainer crashed")
    assert not producer.running


def test_producer_wait_times_out_while_the_run_goes_on(plans):
    producer = sluice.Producer(plans.plan(rows=100), min_subscribers=1)
    with pytest.raises(sluice.Timeout, match="to finish"):
        producer.wait(timeout=0.2)
    assert producer.running
    producer.close()


@pytest.mark.parametrize("row_group_size", [50, 20_011], ids=["one-batch-messages", "messages"])
def test_subscribers_waiting_in_threads_get_a_producer_started_after_them_whole(
        plans, ns, row_group_size):
    """Three threads wait in ``sluice.subscribe`` before a ``Producer`` of the same
    process starts, with no ``min_subscribers``: each gets every row (issue 13: the run
    used to finish before any of them attached)."""
    rows = 20_011
    plan = plans.plan(rows=rows, batch_rows=500, row_group_size=row_group_size)
    received: dict[int, list[int]] = {}
    errors: list[BaseException] = []

    def consume(i: int) -> None:
        try:
            with sluice.subscribe(plans.topic, timeout=20) as sub:
                received[i] = [v for b in sub for v in pa.record_batch(b).column("id").to_pylist()]
        except BaseException as e:  # noqa: BLE001 - reported by the main thread
            errors.append(e)

    threads = [threading.Thread(target=consume, args=(i,)) for i in range(3)]
    for t in threads:
        t.start()
    deadline = time.monotonic() + 20
    while waiting_subscribers(ns, plans.topic) < 3:
        assert time.monotonic() < deadline, "the subscribers did not start waiting"
        time.sleep(0.01)
    producer = sluice.Producer(plan)
    stats = producer.wait()
    producer.close()
    for t in threads:
        t.join(30)
        assert not t.is_alive()
    assert not errors, errors
    assert stats.rows == rows
    for i in range(3):
        assert sorted(received[i]) == list(range(rows)), f"subscriber {i}"


EPOCH_ROWS = """
import sys, sluice
with sluice.subscribe(sys.argv[1], timeout=120) as sub:
    print("ready", flush=True)
    for epoch in sub.epochs():
        rows = sum(b.num_rows for b in epoch)
        s = epoch.summary
        print(epoch.epoch, rows, s.complete, s.producer_rows, flush=True)
"""

RUN_PLAN = """
import sys, sluice
with sluice.Producer(sys.argv[1]) as p:
    pass
print("done", flush=True)
"""


@pytest.mark.parametrize("row_group_size", [50, 30_011], ids=["one-batch-messages", "messages"])
@pytest.mark.parametrize("producer", ["python", "cli"])
def test_subscriber_processes_started_before_a_producer_process_get_every_epoch_whole(
        plans, ns, run_python, producer, row_group_size):
    """Two Python processes wait in ``sluice.subscribe`` (it waits in slices, to answer
    Ctrl-C) before a producer process starts (``sluice.Producer``, or ``sluice run``),
    with no ``min_subscribers``: both get every row of every epoch, the first included
    (their declared interest must last through the slices, or the producer starts
    without them)."""
    cli = os.environ.get("SLUICE_CLI")
    if producer == "cli" and not cli:
        pytest.skip("SLUICE_CLI (the sluice binary, set by scripts/test-python.sh) is needed")
    rows = 30_011
    plan = plans.plan(rows=rows, batch_rows=101, epochs=2, row_group_size=row_group_size)
    subs = [run_python(EPOCH_ROWS, plans.topic) for _ in range(2)]
    deadline = time.monotonic() + 20
    while waiting_subscribers(ns, plans.topic) < 2:
        assert time.monotonic() < deadline, "the subscribers did not start waiting"
        time.sleep(0.01)
    # Several of their slices pass before the producer comes.
    time.sleep(0.5)
    if producer == "cli":
        env = dict(os.environ, SLUICE_NAMESPACE=ns, SLUICE_LOG="warn")
        run = subprocess.run([cli, "run", str(plan), "--quiet"], env=env,
                             capture_output=True, text=True, timeout=120)
        assert run.returncode == 0, run.stderr
    else:
        run = run_python(RUN_PLAN, str(plan))
        out, err = run.communicate(timeout=120)
        assert run.returncode == 0, err
    for sub in subs:
        out, err = sub.communicate(timeout=60)
        assert sub.returncode == 0, err
        lines = [line.split() for line in out.splitlines() if line != "ready"]
        assert lines == [[str(e), str(rows), "True", str(rows)] for e in range(2)], (out, err)


def test_an_arrow_stream_closed_part_way_is_an_error_not_a_short_table(plans):
    """A subscription closed by another thread while ``pa.table(sub)`` reads it makes
    the read fail: it returned the rows read so far as if they were all of them."""
    import numpy as np

    gate = threading.Event()

    class Stalling:  # three batches, then nothing until the test is done
        def __iter__(self):
            for i in range(3):
                yield {"id": np.arange(i * 10, (i + 1) * 10)}
            gate.wait(60)
            yield {"id": np.arange(30, 40)}

    producer = sluice.Producer(Stalling(), topic=plans.topic, epochs=1, min_subscribers=1)
    sub = sluice.subscribe(plans.topic, timeout=60)
    result: list[object] = []

    def read() -> None:
        try:
            result.append(pa.table(sub))
        except Exception as e:  # noqa: BLE001 - the test looks at what it is
            result.append(e)

    reader = threading.Thread(target=read)
    reader.start()
    time.sleep(0.5)  # the reader has the three batches and waits for the fourth
    sub.close()
    reader.join(timeout=30)
    gate.set()
    producer.close()
    assert result, "the reader did not end"
    assert not isinstance(result[0], pa.Table), f"a short table of {result[0].num_rows} rows"
    assert "closed before its stream ended" in str(result[0]), result[0]
