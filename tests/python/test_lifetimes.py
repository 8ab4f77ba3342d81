"""Shared memory lives exactly as long as the last Python view of it."""

from __future__ import annotations

import gc
import json
import os
import signal
import subprocess
import time

import numpy as np
import pyarrow as pa
import pytest

import sluice
from conftest import _leftovers
from helpers import shm_backing, waiting_subscribers


def test_views_outlive_their_batch_subscriber_and_producer(plans, ns):
    """pyarrow and numpy views stay valid after the batch, the subscriber and the producer
    are gone; the shared memory is released when the last view is dropped."""
    producer = sluice.Producer(plans.plan(rows=200, batch_rows=50), min_subscribers=1)
    with sluice.subscribe(plans.topic, timeout=30) as sub:
        batch = next(sub)
        shm = batch.shm_range
        segment = shm_backing(shm[0])
        table = pa.record_batch(batch)
        x = np.from_dlpack(batch["x"])
        vec = pa.array(batch["vec"])
        del batch
        for rest in sub:
            del rest
    producer.wait(timeout=30)
    del producer, sub
    gc.collect()

    # Everything else is gone; the views still read the sample they point into.
    # The numpy view reads the sample's segment (through a private mapping of it).
    assert segment is not None and shm_backing(x.ctypes.data)[0] == segment[0]
    assert table.column("id").to_pylist() == list(range(50))
    assert np.array_equal(x, np.arange(50) * 0.5)
    assert vec[49].as_py() == [49.0, 50.0, 51.0, 52.0]
    assert _leftovers(ns), "the sample's segment should still be mapped and present"

    del table, vec
    gc.collect()
    assert _leftovers(ns), "the numpy view alone should keep the sample"
    assert x.sum() == np.arange(50).sum() * 0.5
    del x
    gc.collect()
    assert _leftovers(ns) == []


def test_a_subscriber_holds_at_most_max_held_batches_and_loses_nothing(plans):
    """With ``on_max_held="error"``, keeping zero-copy batches beyond sluice.max_held
    raises TransportError without losing the next batch; copies hold no shared memory."""
    plan = plans.plan(rows=500, batch_rows=50, extra="SET sluice.max_held = 3;\n")
    producer = sluice.Producer(plan, min_subscribers=1)
    ids: list[int] = []
    with sluice.subscribe(plans.topic, timeout=30, on_max_held="error") as sub:
        held = []
        with pytest.raises(sluice.TransportError, match=r"holds 3 batches .*max_held = 3"):
            for batch in sub:
                held.append(batch)
        assert 1 <= len(held) <= 3
        ids += [i for b in held for i in pa.array(b["id"]).to_pylist()]
        copies = [b.copy() for b in held]
        assert all(c.shm_range is None for c in copies)
        del held, batch
        for batch in sub:
            copies.append(batch.copy())
            ids += pa.array(batch["id"]).to_pylist()
        del batch
    assert sorted(ids) == list(range(500))
    assert sum(len(c) for c in copies) == 500
    assert pa.record_batch(copies[-1]).column("id")[0].as_py() == 450
    producer.wait(timeout=30)


# A trainer loop as trainers write it: `for batch in sub` keeps the previous batch while
# it asks for the next one, so when the producer dies the trainer holds one of the dead
# producer's batches all the while it waits for the restarted producer.
_HOLDING_TRAINER = r'''
import collections, json, sys, time
import pyarrow as pa
import sluice

ids = []
with sluice.subscribe(sys.argv[1], timeout=60, reconnect=60) as sub:
    for batch in sub:
        ids += pa.record_batch(batch).column("id").to_pylist()
        if len(ids) >= 1000 and len(ids) - len(pa.record_batch(batch)) < 1000:
            print("reading", flush=True)
        time.sleep(0.002)
counts = collections.Counter(ids)
print(json.dumps({"rows": len(ids), "distinct": len(counts),
                  "each_twice": set(counts.values()) == {2}}), flush=True)
'''


def test_a_trainer_holding_a_dead_producers_batch_continues_onto_its_successor(
        plans, run_python, ns):
    """The batch a trainer holds keeps the dead producer's topic in place: the restarted
    producer publishes under another generation of the topic's services, and the trainer,
    reconnecting, gets every row of both epochs exactly once (the restarted producer used
    to give up after 5 s, "still held by subscribers of a producer that is gone")."""
    cli = os.environ.get("SLUICE_CLI")
    if not cli:
        pytest.skip("SLUICE_CLI (the sluice binary, set by scripts/test-python.sh) is needed")
    plan = plans.plan(rows=6000, batch_rows=50, epochs=2, extra="SET sluice.window = 4;\n")
    trainer = run_python(_HOLDING_TRAINER, plans.topic)
    deadline = time.monotonic() + 20
    while waiting_subscribers(ns, plans.topic) < 1:
        assert time.monotonic() < deadline, "the trainer did not start waiting"
        time.sleep(0.01)
    env = dict(os.environ, SLUICE_NAMESPACE=ns, SLUICE_LOG="warn")
    first = subprocess.Popen([cli, "run", str(plan), "--quiet"], env=env,
                             stdout=subprocess.DEVNULL, stderr=subprocess.DEVNULL)
    try:
        assert trainer.stdout.readline().strip() == "reading", trainer.stderr.read()
    finally:
        first.send_signal(signal.SIGKILL)
        first.wait(10)
    second = subprocess.run([cli, "run", str(plan), "--quiet", "--resume"], env=env,
                            capture_output=True, text=True, timeout=120)
    assert second.returncode == 0, second.stderr
    out, err = trainer.communicate(timeout=120)
    assert trainer.returncode == 0, err
    assert json.loads(out.strip().splitlines()[-1]) == {
        "rows": 12_000, "distinct": 6_000, "each_twice": True}


# A producer's process that forked a worker (`multiprocessing`'s default start method on
# Linux before Python 3.14) after its first batch, so after it claimed the topic.
_FORKING_PRODUCER = r'''
import multiprocessing, sys, time
import sluice

producer = sluice.Producer(sys.argv[1], min_subscribers=1)
sub = sluice.subscribe(sys.argv[2], timeout=30)
batch = next(sub)
worker = multiprocessing.get_context("fork").Process(target=time.sleep, args=(120,))
worker.start()
print(worker.pid, flush=True)
producer.wait()
'''


def test_a_worker_forked_by_a_killed_producer_does_not_keep_its_topic(plans, run_python):
    """The producer's claim on its topic is its process's alone: a worker it forked lives
    on after it is killed, and a restarted producer serves the topic meanwhile (with
    `flock` the worker held the claim, and the restart failed with "already has a
    producer" for as long as the worker lived)."""
    plan = plans.plan(rows=2000, batch_rows=50, extra="SET sluice.window = 4;\n")
    first = run_python(_FORKING_PRODUCER, str(plan), plans.topic)
    line = first.stdout.readline()
    assert line.strip().isdigit(), first.stderr.read()
    worker = int(line)
    try:
        first.send_signal(signal.SIGKILL)
        first.wait(10)
        os.kill(worker, 0)  # the forked worker lives on
        producer = sluice.Producer(plan, min_subscribers=1)
        ids: list[int] = []
        with sluice.subscribe(plans.topic, timeout=30) as sub:
            for batch in sub:
                ids += pa.record_batch(batch).column("id").to_pylist()
            del batch
        producer.wait(timeout=30)
        assert sorted(ids) == list(range(2000))
    finally:
        os.kill(worker, signal.SIGKILL)


# A trainer that forks a child (`os.fork()`) holding its subscription, a batch, and the
# producer it runs: the child tries the subscription, then drops its copies and exits
# normally, running every destructor.
_FORKING_TRAINER = r'''
import gc, json, os, sys
import pyarrow as pa
import sluice

producer = sluice.Producer(sys.argv[1], min_subscribers=1)
sub = sluice.subscribe(sys.argv[2], timeout=30)
held = next(sub)
ids = pa.record_batch(held).column("id").to_pylist()
before = list(ids)
child = os.fork()
if child == 0:
    try:
        next(sub)
        said = "took a batch"
    except sluice.TransportError as e:
        said = str(e)
    print(json.dumps({"child": said}), flush=True)
    del sub, held, producer
    gc.collect()
    sys.exit(0)
_, status = os.waitpid(child, 0)
for batch in sub:
    ids += pa.record_batch(batch).column("id").to_pylist()
del batch
producer.wait(timeout=30)
print(json.dumps({"status": status, "rows": len(ids), "distinct": len(set(ids)),
                  "held_unchanged": pa.record_batch(held).column("id").to_pylist() == before}),
      flush=True)
'''


def test_a_forked_child_neither_uses_nor_lets_go_of_its_parents_subscription(
        plans, run_python):
    """A child forked by a trainer gets a copy of its subscription, batches and producer:
    using the subscription there raises `TransportError` (it used to take messages from
    the parent's queue, which then failed with `Lagged`), and the child's exit drops
    nothing of the parent's (it used to detach the parent's port, so the parent lost
    messages, and to panic joining the producer's thread, which a fork does not copy)."""
    plan = plans.plan(rows=2000, batch_rows=50, extra="SET sluice.window = 4;\n")
    trainer = run_python(_FORKING_TRAINER, str(plan), plans.topic)
    out, err = trainer.communicate(timeout=90)
    assert trainer.returncode == 0, err
    lines = [json.loads(line) for line in out.strip().splitlines()]
    assert "forked child" in lines[0]["child"], lines[0]
    assert lines[1] == {"status": 0, "rows": 2000, "distinct": 2000, "held_unchanged": True}
    assert "panicked" not in err, err

