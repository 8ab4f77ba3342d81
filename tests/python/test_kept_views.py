"""Views a trainer keeps never change, whatever the subscriber does next.

A zero-copy view (a pyarrow array, a numpy array, a DLPack capsule as torch takes it)
points into a chunk of shared memory that the producer loans again once the chunk goes
back. These tests keep views past the point where a trainer lets go of its subscriber
(an early ``break``, leaving the ``with`` block, garbage collection, an error it catches),
let the producer go on publishing into the topic's chunks, and compare every buffer
byte for byte with what it held when the batch arrived: after the producer goes on,
after it finishes, and after another producer runs on the same topic. The failures
they guard against depend on timing, so each runs many rounds. docs/python.md
("Lifetimes") states the promise.
"""

from __future__ import annotations

import ctypes
import gc
import hashlib
import os
import subprocess
import sys
import time

import numpy as np
import polars as pl
import pyarrow as pa
import pytest

import sluice
from helpers import capsule_name, capsule_pointer

ROUNDS = int(os.environ.get("SLUICE_TEST_ROUNDS", "20"))

# Small, explicit sizes: the topic has few chunks (4 x (4 queued + 4 held + 1) + 4 + 2),
# so a producer that went on by a hundred messages has loaned every free one again.
SIZES = (
    "SET sluice.window = 4;\n"
    "SET sluice.max_subscribers = 4;\n"
    "SET sluice.max_held = 4;\n"
    "SET sluice.message_batches = 1;\n"
)

# A producer in a process of its own, stopped by closing its stdin.
PRODUCER = """
import sys, sluice
p = sluice.Producer(sys.argv[1], min_subscribers=1)
print("started", flush=True)
sys.stdin.read()
p.close()
"""

# Another subscriber, reading everything for as long as the producer runs.
READER = """
import sys, sluice
try:
    with sluice.subscribe(sys.argv[1], timeout=60) as sub:
        for batch in sub:
            del batch
except sluice.SluiceError as e:
    print(type(e).__name__, flush=True)
"""


def digest(data: bytes) -> str:
    return hashlib.blake2b(data, digest_size=16).hexdigest()


def array_digest(array: pa.Array) -> list[str]:
    """The digest of every buffer of a pyarrow array, children included."""
    return [digest(b.to_pybytes()) if b is not None else "-" for b in array.buffers()]


class Kept:
    """Views of a batch, as a trainer keeps them, with their bytes' digests at receipt."""

    def __init__(self, batch: sluice.Batch) -> None:
        # The batch object itself, as a trainer keeps it for logging or evaluation.
        self.batch = batch
        self.frame = pl.DataFrame(batch)
        rb = pa.record_batch(batch)
        self.text = rb.column("text")
        self.ids = rb.column("id").to_numpy()
        self.x = np.from_dlpack(batch["x"])
        # What torch takes: the unversioned capsule, whose pointer it reads and writes.
        self.capsule = batch["x"].__dlpack__()
        self.capsule_data = ctypes.c_void_p.from_address(capsule_pointer(self.capsule)).value
        self.rows = len(batch)
        self.before = self.digests()

    def digests(self) -> list[str]:
        assert capsule_name(self.capsule) == "dltensor"
        raw = ctypes.string_at(self.capsule_data, self.rows * 8)
        again = pa.record_batch(self.batch)
        frame = self.frame.to_arrow()
        return [*array_digest(self.text), digest(self.ids.tobytes()), digest(self.x.tobytes()),
                digest(raw), *array_digest(again.column("text")),
                *array_digest(again.column("vec")),
                *(d for name in ("id", "text") for c in frame.column(name).chunks
                  for d in array_digest(c))]

    def check(self, when: str) -> None:
        after = self.digests()
        assert after == self.before, f"a kept view changed {when}"
        # Valid as well as unchanged: the string offsets still describe the values.
        self.text.validate(full=True)
        assert self.text.to_pylist() == [f"row{i}" for i in self.ids]


def keep_three(sub: sluice.Subscriber) -> list[Kept]:
    kept = []
    for batch in sub:
        kept.append(Kept(batch))
        if len(kept) == 3:
            break
    return kept


def let_the_producer_go_on(topic: str, batches: int = 100) -> None:
    """Returns once the producer has published ``batches`` more batches (read by a
    subscriber of this process, which holds none of them)."""
    with sluice.subscribe(topic, timeout=30, on_lag="skip") as witness:
        for i, batch in enumerate(witness):
            del batch
            if i + 1 >= batches:
                break


@pytest.fixture
def long_stream(plans, run_python):
    """A plan of many epochs, its producer in another process and a reader beside it."""
    plan = plans.plan(rows=640, batch_rows=64, epochs=100000, extra=SIZES)
    producer = subprocess.Popen(
        [sys.executable, "-c", PRODUCER, str(plan)], stdin=subprocess.PIPE,
        stdout=subprocess.PIPE, stderr=subprocess.PIPE, text=True,
        env=dict(os.environ, PYTHONUNBUFFERED="1"))
    try:
        assert producer.stdout.readline().strip() == "started", producer.stderr.read()
        # Started only once the producer waits for it, which keeps it going.
        run_python(READER, plans.topic)
        yield plans, producer
    finally:
        if producer.poll() is None:
            producer.stdin.close()
        producer.wait(timeout=30)
        for stream in (producer.stdout, producer.stderr):
            stream.close()


def finish(producer: subprocess.Popen[str]) -> None:
    producer.stdin.close()
    assert producer.wait(timeout=30) == 0, producer.stderr.read()


def rerun(plans) -> None:
    """Another producer on the same topic, run to its end with a subscriber reading it."""
    other = sluice.Producer(plans.plan(rows=640, batch_rows=64, epochs=3, extra=SIZES,
                                       name="again.sql"), min_subscribers=1)
    with sluice.subscribe(plans.topic, timeout=30) as sub:
        for batch in sub:
            del batch
    other.wait(timeout=30)


@pytest.mark.parametrize("leave", ["break", "close", "gc", "exception"])
def test_views_kept_after_leaving_never_change_while_another_process_produces(
        long_stream, leave):
    """A trainer keeps pyarrow, numpy and DLPack views of its first three batches and
    leaves its subscriber (a ``break`` out of the ``with`` block, ``close()``, dropping it
    to the garbage collector, an exception), while the producer, in its own process, goes
    on for another subscriber: the views never change, for many rounds, nor after the
    producer finishes, nor after another producer runs on the same topic."""
    plans, producer = long_stream
    kept: list[Kept] = []
    for _ in range(ROUNDS):
        if leave == "break":
            with sluice.subscribe(plans.topic, timeout=30) as sub:
                views = keep_three(sub)
        elif leave == "close":
            sub = sluice.subscribe(plans.topic, timeout=30)
            views = keep_three(sub)
            sub.close()
        elif leave == "gc":
            sub = sluice.subscribe(plans.topic, timeout=30)
            views = keep_three(sub)
            del sub
            gc.collect()
        else:
            views = []
            with pytest.raises(ZeroDivisionError):
                with sluice.subscribe(plans.topic, timeout=30) as sub:
                    views += keep_three(sub)
                    1 / 0
        let_the_producer_go_on(plans.topic)
        for view in views:
            view.check("while the producer went on")
        # The last round's views stay to the end; the others go, so that the subscribers
        # that left do not hold every place of the topic.
        kept = views
    finish(producer)
    for view in kept:
        view.check("after the producer finished")
    rerun(plans)
    for view in kept:
        view.check("after another producer ran on the same topic")


def test_views_kept_after_leaving_never_change_while_this_process_produces(plans, run_python):
    """The same with ``sluice.Producer`` in the trainer's own process."""
    plan = plans.plan(rows=640, batch_rows=64, epochs=100000, extra=SIZES)
    producer = sluice.Producer(plan, min_subscribers=1)
    reader = run_python(READER, plans.topic)
    try:
        for i in range(ROUNDS):
            with sluice.subscribe(plans.topic, timeout=30) as sub:
                views = keep_three(sub)
            if i % 2:
                del sub
                gc.collect()
            let_the_producer_go_on(plans.topic)
            for view in views:
                view.check("while this process's producer went on")
    finally:
        producer.close()
        reader.wait(timeout=30)
    for view in views:
        view.check("after the producer was closed")


def test_views_kept_through_a_max_held_error_never_change(long_stream):
    """A trainer that asked for errors beyond max_held keeps every batch: it gets the
    error, catches it, and none of the views it already held changes while the producer
    goes on."""
    plans, producer = long_stream
    for _ in range(ROUNDS):
        views: list[Kept] = []
        with pytest.raises(sluice.TransportError, match=r"sluice\.max_held = 4"):
            with sluice.subscribe(plans.topic, timeout=30, on_max_held="error") as sub:
                for batch in sub:
                    views.append(Kept(batch))
        assert len(views) == 4
        let_the_producer_go_on(plans.topic)
        for view in views:
            view.check("after a max_held error")
    finish(producer)


def test_views_kept_through_a_timeout_never_change(long_stream):
    """A trainer whose wait times out (another subscriber of its own process paces the
    stream: it is still referenced but no longer read) keeps its views, and the error
    names that subscriber; the views do not change once the stream goes on."""
    plans, producer = long_stream
    for _ in range(ROUNDS):
        views: list[Kept] = []
        with pytest.raises(sluice.Timeout, match="another subscriber in this process"):
            with sluice.subscribe(plans.topic, timeout=30) as forgotten, \
                    sluice.subscribe(plans.topic, timeout=1) as sub:
                # Both read for a while, then `forgotten` is no longer read.
                for _ in range(4):
                    next(forgotten)
                    views.append(Kept(next(sub)))
                while True:
                    next(sub)
        let_the_producer_go_on(plans.topic)
        for view in views:
            view.check("after a timeout")
    finish(producer)


def test_views_kept_through_lagged_never_change(plans, run_python):
    """Under a lag limit a trainer that falls behind gets ``Lagged``; the views it kept
    stay unchanged while the producer goes on for the others."""
    extra = SIZES.replace("SET sluice.window = 4;\n", "SET sluice.lag_limit = 4;\n")
    plan = plans.plan(rows=640, batch_rows=64, epochs=100000, extra=extra)
    producer = sluice.Producer(plan, min_subscribers=1)
    reader = run_python(READER, plans.topic)
    try:
        for _ in range(ROUNDS):
            views: list[Kept] = []
            with pytest.raises(sluice.Lagged):
                with sluice.subscribe(plans.topic, timeout=30) as sub:
                    for batch in sub:
                        views.append(Kept(batch))
                        del batch
                        if len(views) <= 2:
                            time.sleep(0.15)
            let_the_producer_go_on(plans.topic, 50)
            for view in views:
                view.check("after Lagged")
    finally:
        producer.close()
        reader.wait(timeout=30)


def test_views_kept_through_producer_failed_and_lost_never_change(plans, run_python):
    """A trainer keeps views through ``ProducerFailed`` (the query fails part-way) and
    through ``ProducerLost`` (the producer is killed); a later producer on the topic
    changes none of them."""
    select = ("SELECT id, x, vec, text, "
              "CAST(CASE WHEN id < 400 THEN '1' ELSE 'oops' END AS INT) AS v FROM t")
    failing = sluice.Producer(plans.plan(rows=640, batch_rows=64, select=select, extra=SIZES),
                              min_subscribers=1)
    views: list[Kept] = []
    with pytest.raises(sluice.ProducerFailed, match="oops"):
        with sluice.subscribe(plans.topic, timeout=30) as sub:
            for batch in sub:
                views.append(Kept(batch))
    with pytest.raises(sluice.SluiceError):
        failing.wait(timeout=30)
    plan = plans.plan(rows=640, batch_rows=64, epochs=100000, extra=SIZES, name="long.sql")
    victim = subprocess.Popen([sys.executable, "-c", PRODUCER, str(plan)],
                              stdin=subprocess.PIPE, stdout=subprocess.PIPE, text=True,
                              env=dict(os.environ, PYTHONUNBUFFERED="1"))
    assert victim.stdout.readline().strip() == "started"
    with pytest.raises(sluice.ProducerLost):
        with sluice.subscribe(plans.topic, timeout=30) as sub:
            for batch in sub:
                views.append(Kept(batch))
                if len(views) == 8:
                    victim.kill()
    victim.wait(timeout=30)
    rerun(plans)
    for view in views:
        view.check("after the producer failed, was killed, and another ran")


KEEP_EVERY_ID = """
import sys, sluice, pyarrow as pa
ids = []
with sluice.subscribe(sys.argv[1], timeout=30) as sub:
    for batch in sub:
        ids.append((pa.record_batch(batch).column("id").to_numpy(), batch.shm_range))
rows = sorted(int(i) for a, _ in ids for i in a)
print(len(rows), rows == sorted(list(range(640)) * 2), sum(r is None for _, r in ids), flush=True)
"""


def test_a_trainer_that_keeps_more_than_max_held_keeps_working(plans, run_python):
    """By default, a trainer that keeps a view of every batch (collecting ids) goes on
    past max_held: the batches beyond it are private copies, with one warning that says
    how many it holds and how to avoid the copies; every row arrives."""
    producer = sluice.Producer(plans.plan(rows=640, batch_rows=64, epochs=2, extra=SIZES),
                               min_subscribers=1)
    child = run_python(KEEP_EVERY_ID, plans.topic)
    out, err = child.communicate(timeout=60)
    producer.wait(timeout=30)
    assert child.returncode == 0, err
    rows, in_order, copies = out.split()
    assert (int(rows), in_order) == (1280, "True")
    assert int(copies) == 20 - 4, "all but max_held batches should be copies"
    warnings = [line for line in err.splitlines() if "sluice.max_held = 4" in line]
    assert len(warnings) == 1, err
    assert "holds 4 batches" in warnings[0] and "copy what you keep" in warnings[0]


def test_a_write_through_an_assembled_batch_changes_no_other_view(plans):
    """A batch assembled from two producer batches (batch_size=64 over 100-row batches) is
    this process's memory: an in-place write through its DLPack pointer (what torch's
    ``add_`` does) changes that tensor only, not the pyarrow or numpy views of the batch,
    nor a later export."""
    producer = sluice.Producer(plans.plan(rows=400, batch_rows=100), min_subscribers=1)
    with sluice.subscribe(plans.topic, batch_size=64, timeout=30) as sub:
        next(sub)
        batch = next(sub)  # rows 64..127: spans the first two producer batches
        assert batch.shm_range is None
        column = pa.record_batch(batch).column("x")
        array = np.asarray(batch["x"])
        before = column.to_pylist()
        capsule = batch["x"].__dlpack__()
        data = ctypes.c_void_p.from_address(capsule_pointer(capsule)).value
        values = (ctypes.c_double * len(batch)).from_address(data)
        for i in range(len(batch)):
            values[i] += 1000.0
        assert values[0] == before[0] + 1000.0
        assert column.to_pylist() == before
        assert array.tolist() == before
        assert np.from_dlpack(batch["x"]).tolist() == before
        del values, capsule, column, array, batch
        for rest in sub:
            del rest
    producer.wait(timeout=30)


def test_a_subscriber_arriving_while_the_producer_lingers_gets_the_end(plans):
    """With a subscriber that has read every batch but not yet the end, the producer
    lingers; a subscriber that attaches then gets the end of the stream at once (``now``:
    nothing; ``replay``: what the producer still holds, then the end), never a false
    ``ProducerLost``."""
    for _ in range(5):
        producer = sluice.Producer(plans.plan(rows=200, batch_rows=50, extra=SIZES),
                                   min_subscribers=1, linger=30)
        first = sluice.subscribe(plans.topic, timeout=30)
        got = [next(first) for _ in range(4)]
        assert sum(len(b) for b in got) == 200
        del got
        t0 = time.monotonic()
        with sluice.subscribe(plans.topic, timeout=30) as late:
            assert list(late) == []
        with sluice.subscribe(plans.topic, join="replay", timeout=30) as late:
            replayed = sorted(i for b in late for i in pa.record_batch(b).column("id").to_pylist())
        with sluice.subscribe(plans.topic, join="next_epoch", timeout=30) as late:
            assert list(late) == []
        assert time.monotonic() - t0 < 20, "the late subscribers waited for the linger"
        assert replayed == list(range(200))[-len(replayed):] and replayed
        assert list(first) == []
        first.close()
        producer.wait(timeout=30)


def status(ns: str) -> dict:
    cli = os.environ.get("SLUICE_CLI")
    if not cli:
        pytest.skip("SLUICE_CLI (the sluice binary, set by scripts/test-python.sh) is needed")
    out = subprocess.run([cli, "status", "--json"], env=dict(os.environ, SLUICE_NAMESPACE=ns),
                         capture_output=True, text=True, timeout=60, check=True).stdout
    import json
    return json.loads(out)


def test_status_names_the_subscriber_that_paces_the_stream_and_those_that_left(plans, ns):
    """A subscriber kept but no longer read paces the producer: ``sluice status`` says so
    (its lag is its full queue, not what it last reported), names it as the one the
    producer waits for, and the other subscriber's timeout names it too. One that left
    with batches kept shows as such, with how many it holds."""
    producer = sluice.Producer(plans.plan(rows=640, batch_rows=64, epochs=1000, extra=SIZES),
                               min_subscribers=1)
    left = sluice.subscribe(plans.topic, timeout=30)
    kept = [next(left), next(left)]
    left.close()
    forgotten = sluice.subscribe(plans.topic, timeout=30)
    active = sluice.subscribe(plans.topic, timeout=2)
    # `forgotten` may have filled its queue before `active` attached, with the producer
    # already sending the next message, which `active` then never gets (it joined after):
    # the message after that waits for `forgotten` to take one more. So `forgotten` goes
    # one ahead (a loaded machine lost the race, and `active` timed out here).
    next(forgotten)
    for _ in range(3):
        next(forgotten), next(active)
    with pytest.raises(sluice.Timeout, match=r"another subscriber in this process \(port"):
        while True:
            next(active)
    topic = next(t for t in status(ns)["topics"] if t["topic"] == plans.topic)
    paced_by = topic["paced_by"]
    assert paced_by["pid"] == os.getpid() and paced_by["waited_s"] >= 1, topic
    pacing = [s for s in topic["subscribers"] if s["pacing"]]
    assert len(pacing) == 1 and pacing[0]["port"] == paced_by["port"], topic
    assert pacing[0]["lag"] == 4, "the pacing subscriber's lag is its full queue"
    assert [(d["pid"], d["held"]) for d in topic["departed"]] == [(os.getpid(), 2)], topic
    del kept
    gc.collect()
    forgotten.close()
    active.close()
    producer.close()
