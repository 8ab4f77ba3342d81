"""Epochs and batch sizes: every row once per epoch, in any batch size, with clean ends."""

from __future__ import annotations

import shutil
import threading
import time

import pyarrow as pa
import pytest

import sluice
from helpers import arrow_buffers, inside


def ids_of(batch: sluice.Batch) -> list[int]:
    return pa.array(batch["id"]).to_pylist()


def test_epochs_end_cleanly_with_every_row_once(plans):
    producer = sluice.Producer(plans.plan(rows=230, batch_rows=50, epochs=2), min_subscribers=1)
    seen = []
    with sluice.subscribe(plans.topic, timeout=30) as sub:
        for epoch in sub.epochs():
            assert epoch.complete is None and epoch.rows is None and not epoch.done
            sizes, ids = [], []
            for i, batch in enumerate(epoch):
                assert (batch.epoch, batch.index) == (epoch.epoch, i)
                sizes.append(len(batch))
                ids += ids_of(batch)
            assert sizes == [50, 50, 50, 50, 30]
            assert sorted(ids) == list(range(230))
            assert epoch.done and epoch.complete is True
            assert (epoch.rows, epoch.batches) == (230, 5)
            assert epoch.summary.producer_rows == 230
            assert list(epoch) == []  # exhausted epochs stay exhausted
            seen.append(epoch.epoch)
        assert sub.last_epoch.epoch == 1
        assert next(sub, None) is None
    assert seen == [0, 1]
    stats = producer.wait(timeout=30)
    assert (stats.epochs, stats.rows, stats.batches) == (2, 460, 10)
    # sluice.window = 'auto' counts messages, planned here at 64 of these small batches
    # each (sluice.message_batches = 'auto'): a queue of 4 to 128 of them.
    assert stats.window in (4, 8, 16, 32, 64, 128), stats
    # One batch per message: these small batches (planned at 4 KiB) get the deepest
    # queue, 128, unless /dev/shm is nearly full (the topic keeps to an eighth of it).
    alone = plans.plan(
        rows=230, batch_rows=50, epochs=1, extra="SET sluice.message_batches = 1;\n"
    )
    producer = sluice.Producer(alone, min_subscribers=1)
    with sluice.subscribe(plans.topic, timeout=30) as sub:
        assert [len(b) for b in sub] == [50, 50, 50, 50, 30]
    stats = producer.wait(timeout=30)
    if shutil.disk_usage("/dev/shm").free > 1 << 30:
        assert stats.window == 128, stats
    else:
        assert stats.window in (4, 8, 16, 32, 64, 128), stats


def test_run_stats_say_what_paced_the_producer(plans):
    """A subscriber slower than the pipeline, with a queue of one batch: the producer
    sleeps on its full queue, and its stats say so."""
    plan = plans.plan(rows=400, batch_rows=50, epochs=1, extra="SET sluice.window = 1;\n")
    producer = sluice.Producer(plan, min_subscribers=1)
    rows = 0
    with sluice.subscribe(plans.topic, timeout=30) as sub:
        for batch in sub:
            rows += len(batch)
            time.sleep(0.05)
    assert rows == 400
    stats = producer.wait(timeout=30)
    assert (stats.batches, stats.window) == (8, 1)
    # A window of one message leaves no room for a burst: every message wakes, and so
    # do the epoch's end and the stream's.
    assert 1 <= stats.messages <= stats.batches
    assert stats.wakeups == stats.messages + 2
    assert 0 < stats.waited_for_subscribers <= stats.elapsed
    assert 0 <= stats.waited_for_pipeline <= stats.elapsed


@pytest.mark.parametrize("batch_size", [1, 7, 50, 64, 100, 1000])
def test_each_subscriber_gets_its_own_batch_size(plans, batch_size):
    """Any batch size works; batches inside one producer batch stay zero-copy."""
    rows = 230
    producer = sluice.Producer(plans.plan(rows=rows, batch_rows=50, epochs=2), min_subscribers=1)
    with sluice.subscribe(plans.topic, batch_size=batch_size, timeout=30) as sub:
        assert sub.batch_size == batch_size
        for epoch in sub.epochs():
            sizes, ids = [], []
            for batch in epoch:
                sizes.append(len(batch))
                ids += ids_of(batch)
                if batch.shm_range is not None:
                    spans = arrow_buffers(pa.record_batch(batch))
                    assert all(inside(s, batch.shm_range) for s in spans)
            full, rest = divmod(rows, batch_size)
            assert sizes == [batch_size] * full + ([rest] if rest else [])
            assert sorted(ids) == list(range(rows))
            assert epoch.complete and epoch.rows == rows and epoch.batches == len(sizes)
    producer.wait(timeout=30)


def test_iterating_a_subscriber_yields_batches_across_epochs(plans):
    producer = sluice.Producer(plans.plan(rows=120, batch_rows=50, epochs=3), min_subscribers=1)
    with sluice.subscribe(plans.topic, timeout=30) as sub:
        epochs = [(b.epoch, len(b)) for b in sub]
        assert sub.last_epoch.epoch == 2 and sub.last_epoch.complete
    assert epochs == [(e, n) for e in range(3) for n in (50, 50, 20)]
    producer.wait(timeout=30)


def test_moving_to_the_next_epoch_skips_the_rest_of_the_current_one(plans):
    producer = sluice.Producer(plans.plan(rows=200, batch_rows=50, epochs=3), min_subscribers=1)
    firsts = []
    with sluice.subscribe(plans.topic, timeout=30) as sub:
        for epoch in sub.epochs():
            batch = next(epoch)
            firsts.append((epoch.epoch, batch.index, ids_of(batch)[0]))
            del batch
    assert firsts == [(0, 0, 0), (1, 0, 0), (2, 0, 0)]
    producer.wait(timeout=30)


def test_an_empty_result_gives_empty_epochs(plans):
    plan = plans.plan(rows=100, epochs=2, select="SELECT id FROM t WHERE id < 0")
    producer = sluice.Producer(plan, min_subscribers=1)
    with sluice.subscribe(plans.topic, timeout=30) as sub:
        epochs = [(e.epoch, list(e), e.rows, e.complete) for e in sub.epochs()]
    assert epochs == [(0, [], 0, True), (1, [], 0, True)]
    producer.wait(timeout=30)


def test_two_subscribers_with_different_batch_sizes_share_one_producer(plans):
    """Two consumers on threads (waiting releases the GIL) read the same stream at once."""
    producer = sluice.Producer(plans.plan(rows=500, batch_rows=50, epochs=2), min_subscribers=2)
    results: dict[int, list] = {}
    errors: list[BaseException] = []

    def consume(batch_size: int) -> None:
        try:
            with sluice.subscribe(plans.topic, batch_size=batch_size, timeout=30) as sub:
                out = []
                for epoch in sub.epochs():
                    ids = [i for b in epoch for i in ids_of(b)]
                    out.append((epoch.epoch, sorted(ids) == list(range(500)), epoch.complete))
                results[batch_size] = out
        except BaseException as e:  # reported below
            errors.append(e)

    threads = [threading.Thread(target=consume, args=(n,)) for n in (32, 100)]
    for t in threads:
        t.start()
    for t in threads:
        t.join(timeout=60)
    assert not errors, errors
    assert results == {32: [(0, True, True), (1, True, True)], 100: [(0, True, True), (1, True, True)]}
    producer.wait(timeout=30)


def test_a_late_subscriber_sees_a_partial_first_epoch(plans):
    """join='now' starts mid-epoch (flagged incomplete); join='next_epoch' waits for a
    whole one."""
    # A short window, so that the paused first subscriber holds the producer in epoch 0
    # (20 batches an epoch) while the late ones attach; 'auto' would let it run ahead.
    producer = sluice.Producer(
        plans.plan(rows=1000, batch_rows=50, epochs=2, extra="SET sluice.window = 4;\n"),
        min_subscribers=1,
    )
    started, joined = threading.Event(), threading.Event()
    first: dict[str, list] = {}

    def early() -> None:
        with sluice.subscribe(plans.topic, timeout=30) as sub:
            rows = []
            for i, batch in enumerate(sub):
                rows.append(len(batch))
                del batch
                if i == 2:
                    started.set()
                    joined.wait(30)
            first["early"] = [sum(rows), sub.last_epoch.complete]

    thread = threading.Thread(target=early)
    thread.start()
    try:
        assert started.wait(30)
        now = sluice.subscribe(plans.topic, join="now", timeout=30)
        later = sluice.subscribe(plans.topic, join="next_epoch", timeout=30)
    finally:
        joined.set()

    def read(sub: sluice.Subscriber, key: str) -> None:
        with sub:
            first[key] = [(e.epoch, sum(len(b) for b in e), e.complete) for e in sub.epochs()]

    readers = [threading.Thread(target=read, args=(s, k)) for s, k in ((now, "now"), (later, "next"))]
    for t in readers:
        t.start()
    for t in readers + [thread]:
        t.join(timeout=60)
    assert first["early"] == [2000, True]
    (e0, rows0, complete0), (e1, rows1, complete1) = first["now"]
    assert (e0, e1) == (0, 1)
    assert 0 < rows0 < 1000 and complete0 is False
    assert (rows1, complete1) == (1000, True)
    assert first["next"] == [(1, 1000, True)]
    producer.wait(timeout=30)


def test_a_python_producer_runs_its_query_on_standalone_ballista(plans):
    """`sluice.engine = 'ballista:standalone'` from a Python producer: the query (an
    aggregate joined back to its table) runs on an in-process Ballista scheduler and
    executor; every row arrives once per epoch, with the values DataFusion computes
    locally, and both epochs come in the same (sorted) order."""
    select = (
        "SELECT t.id, t.label, c.n FROM t JOIN "
        "(SELECT label, COUNT(*) AS n FROM t GROUP BY label) c ON t.label = c.label"
    )
    plan = plans.plan(rows=330, batch_rows=40, epochs=2, select=select,
                      extra="SET sluice.engine = 'ballista:standalone';\n")
    producer = sluice.Producer(plan, min_subscribers=1)
    orders = []
    with sluice.subscribe(plans.topic, timeout=60) as sub:
        for epoch in sub.epochs():
            rows = []
            for batch in epoch:
                rb = pa.record_batch(batch)
                rows += list(zip(rb["id"].to_pylist(), rb["label"].to_pylist(),
                                 rb["n"].to_pylist()))
            assert epoch.complete is True
            orders.append([r[0] for r in rows])
            assert sorted(r[0] for r in rows) == list(range(330))
            counts = {}
            for _, label, _ in rows:
                counts[label] = counts.get(label, 0) + 1
            assert all(n == counts[label] for _, label, n in rows)
    assert orders[0] == orders[1]
    stats = producer.wait(timeout=60)
    assert (stats.epochs, stats.rows) == (2, 660)


def test_subscribers_receive_the_columns_they_name(plans):
    """``columns=`` gives those columns, in that order, zero-copy, in any batch size; a
    subscriber without it gets them all; a name the topic lacks raises ``PlanError`` that
    lists the topic's columns; a lone string, a set and an empty list are refused before
    connecting."""
    with pytest.raises(TypeError, match="list of column names"):
        sluice.Subscriber(plans.topic, columns="vec", timeout=1)
    with pytest.raises(TypeError, match="column names"):
        sluice.Subscriber(plans.topic, columns=[1], timeout=1)
    with pytest.raises(TypeError, match="list or tuple"):
        sluice.Subscriber(plans.topic, columns={"id", "vec"}, timeout=1)
    with pytest.raises(ValueError, match="at least one"):
        sluice.Subscriber(plans.topic, columns=[], timeout=1)
    producer = sluice.Producer(plans.plan(rows=230, batch_rows=50, epochs=1), min_subscribers=4)
    everything = sluice.subscribe(plans.topic, timeout=30)
    named = sluice.subscribe(plans.topic, columns=["vec", "id"], timeout=30)
    rebatched = sluice.subscribe(plans.topic, columns=("id",), batch_size=7, timeout=30)
    wrong = sluice.subscribe(plans.topic, columns=["id", "pixels"], timeout=30)
    assert (everything.columns, named.columns, rebatched.columns) == (None, ["vec", "id"], ["id"])
    with pytest.raises(sluice.PlanError, match=r"no column 'pixels'.*id, x, vec, label, text"):
        next(wrong)
    # It left the topic: the others, read one after another below, are not held back by
    # its full queue.
    whole, picked, few = [], [], []
    for batch in everything:
        assert batch.column_names == ["id", "x", "vec", "label", "text"]
        whole.append(pa.record_batch(batch.copy()))
    for batch in named:
        assert batch.column_names == ["vec", "id"]
        assert batch.shm_range is not None
        assert all(inside(span, batch.shm_range) for span in arrow_buffers(pa.record_batch(batch)))
        picked.append(pa.record_batch(batch.copy()))
    for batch in rebatched:
        assert batch.column_names == ["id"]
        few += ids_of(batch)
    assert pa.Table.from_batches(picked).equals(pa.Table.from_batches(whole).select(["vec", "id"]))
    assert few == pa.Table.from_batches(whole).column("id").to_pylist()
    assert sorted(few) == list(range(230))
    producer.wait(timeout=30)
    for sub in (everything, named, rebatched, wrong):
        sub.close()


def test_a_producer_made_on_a_shallow_thread_plans_a_deep_expression(plans):
    """A plan is loaded on a thread with a deep stack, not the caller's: a sum of 500
    terms (DataFusion recurses once per term) made on a Python thread of 1 MiB ended
    the process with a stack overflow."""
    terms = 500
    select = "SELECT id, id" + "".join(f" + {i}" for i in range(terms)) + " AS s FROM t"
    made: list[object] = []

    def make() -> None:
        try:
            made.append(sluice.Producer(plans.plan(rows=100, select=select), min_subscribers=1))
        except BaseException as e:  # reported to the test's thread
            made.append(e)

    previous = threading.stack_size(1 << 20)
    try:
        thread = threading.Thread(target=make)
        thread.start()
    finally:
        threading.stack_size(previous)
    thread.join(timeout=120)
    assert made and isinstance(made[0], sluice.Producer), made
    with sluice.subscribe(plans.topic, timeout=60) as sub:
        rows = [(i, s) for b in sub for i, s in zip(ids_of(b), pa.array(b["s"]).to_pylist())]
    assert sorted(rows) == [(i, i + terms * (terms - 1) // 2) for i in range(100)]
    made[0].wait(timeout=30)
