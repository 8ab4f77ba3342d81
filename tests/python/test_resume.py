"""A trainer killed and restarted from the state it last saved resumes exactly where it
stopped, while the producer and the other trainers go on."""

from __future__ import annotations

import json
import os
import random
import signal
import threading
import time

import numpy as np
import pytest

import sluice
from helpers import waiting_subscribers

ROWS, EPOCHS, BATCH_ROWS = 3000, 4, 50

# A training loop that saves its loader's state with its "model" (here: the ids it
# trained on, per epoch) every 5 batches, atomically, and resumes from the last save.
_TRAINER = r'''
import json, os, sys, time
import pyarrow as pa
import sluice

topic, save = sys.argv[1], sys.argv[2]
saved = {"state": {}, "epochs": [[] for _ in range(int(sys.argv[3]))]}
if os.path.exists(save):
    with open(save) as f:
        saved = json.load(f)

def commit():
    with open(save + ".tmp", "w") as f:
        json.dump(saved, f)
    os.replace(save + ".tmp", save)

with sluice.subscribe(topic, batch_size=32, timeout=60, join="catch_up",
                     state=saved["state"]) as sub:
    for n, batch in enumerate(sub, 1):
        saved["epochs"][batch.epoch] += pa.record_batch(batch).column("id").to_pylist()
        if n % 5 == 0:
            saved["state"] = sub.state_dict()
            commit()
        time.sleep(0.005)
    saved["state"] = sub.state_dict()
saved["done"] = True
commit()
'''

# A trainer that never stops, slower than the restarted one: it sets the stream's pace.
_OTHER = r'''
import json, sys, time
import pyarrow as pa
import sluice

epochs = [[] for _ in range(int(sys.argv[2]))]
whole = []
with sluice.subscribe(sys.argv[1], timeout=60) as sub:
    for epoch in sub.epochs():
        for batch in epoch:
            epochs[batch.epoch] += pa.record_batch(batch).column("id").to_pylist()
            time.sleep(0.08)
        whole.append(epoch.complete)
print(json.dumps({"epochs": epochs, "whole": whole}), flush=True)
'''


def _plan(plans):
    return plans.plan(
        rows=ROWS, batch_rows=BATCH_ROWS, epochs=EPOCHS,
        extra="SET sluice.shuffle_seed = 7; SET sluice.shuffle_buffer = 500;\n"
              "SET sluice.window = 4; SET sluice.message_batches = 1;\n",
        select="SELECT id FROM t")


def test_a_trainer_killed_at_random_moments_resumes_exactly_from_its_saved_state(
        plans, run_python, tmp_path, ns):
    """The trainer is SIGKILLed 20 times at random moments (while it subscribes, catches
    up, trains or saves) and restarted from its last save; over the run it trains on every
    row of every epoch exactly once (the oracle: the ids 0..ROWS-1, not Sluice's
    checksum), in the order the trainers that never stopped saw, and they are unaffected."""
    save = str(tmp_path / "trainer.json")
    others = [run_python(_OTHER, plans.topic, str(EPOCHS)) for _ in range(2)]
    # The first trainer too waits before the producer starts, and saves once before the
    # kills start: one that started late or was killed before its first save (a loaded
    # machine starts Python slowly) would join the stream after the first epoch.
    first = run_python(_TRAINER, plans.topic, save, str(EPOCHS))
    # All three wait before the producer starts, so all three see every epoch whole.
    deadline = time.monotonic() + 30
    while waiting_subscribers(ns, plans.topic) < 3:
        assert time.monotonic() < deadline, "the trainers did not start waiting"
        time.sleep(0.01)
    rng = random.Random(20261129)
    with sluice.Producer(_plan(plans), min_subscribers=2, wait_timeout=60):
        deadline = time.monotonic() + 60
        while not os.path.exists(save):
            assert time.monotonic() < deadline and first.poll() is None, "no first save"
            time.sleep(0.01)
        first.send_signal(signal.SIGKILL)
        first.wait(10)
        kills = 0
        while kills < 20:
            trainer = run_python(_TRAINER, plans.topic, save, str(EPOCHS))
            time.sleep(rng.uniform(0.2, 0.9))
            if trainer.poll() is not None:
                break
            trainer.send_signal(signal.SIGKILL)
            trainer.wait(10)
            kills += 1
        last = run_python(_TRAINER, plans.topic, save, str(EPOCHS))
        _, err = last.communicate(timeout=120)
        assert last.returncode == 0, err
        reference = [json.loads(o.communicate(timeout=120)[0]) for o in others]
    assert kills == 20, f"the run ended after {kills} kills: make it longer"
    with open(save) as f:
        trained = json.load(f)
    assert trained.get("done"), trained["state"]
    for other in reference:
        assert other["whole"] == [True] * EPOCHS
        assert other["epochs"] == reference[0]["epochs"]
    for e, ids in enumerate(trained["epochs"]):
        assert sorted(ids) == list(range(ROWS)), f"epoch {e}: every row exactly once"
        assert ids == reference[0]["epochs"][e], f"epoch {e}: in the stream's order"


def test_state_dict_round_trips_and_bad_state_is_refused(plans):
    """``state_dict()`` is ``{}`` before the first batch and a plain dict after (what
    ``torch.save`` keeps); a state of another topic, or not a state, is refused."""
    with sluice.Producer(_plan(plans), min_subscribers=1, wait_timeout=60):
        with sluice.subscribe(plans.topic, batch_size=7, timeout=60) as sub:
            assert sub.state_dict() == {}
            batch = next(iter(sub))
            state = sub.state_dict()
            assert (state["epoch"], state["batch"], state["row"]) == (0, 0, 7)
            assert state["batch_size"] == 7 and state["shuffle_seed"] == 7
            assert json.loads(json.dumps(state)) == state
            assert batch.num_rows == 7
        assert sub.state_dict() == state, "a closed subscriber keeps its state"
        with pytest.raises(ValueError, match="cursor"):
            sluice.subscribe(plans.topic, state={"epoch": "x"})
        with pytest.raises(sluice.SluiceError, match="taken on topic"):
            sluice.subscribe(plans.topic + "x", state=dict(state, topic=plans.topic), timeout=5)


def test_a_loader_fed_topic_refuses_a_cursor_it_no_longer_holds(ns, topic):
    """A topic fed by ``sluice.publish`` cannot compute its past again: a cursor behind
    what it holds is refused with a clear error, not answered with a partial epoch. The
    record a crashed run of a resumable loader left on the topic is not used: it names
    another loader."""
    from helpers import state_dir

    state = state_dir(ns)
    state.mkdir(mode=0o700, exist_ok=True)
    stale = {"version": 1, "topic": topic, "factory": "no_such_module:make", "cwd": "/", "epochs": 1}
    (state / f"{topic}.loader.json").write_text(json.dumps(stale))
    class Loader:
        """200 batches, 5 ms each: the stream outlasts the test's steps."""

        def __iter__(self):
            for i in range(200):
                time.sleep(0.005)
                yield np.arange(i * 10, i * 10 + 10, dtype=np.int64)

    def run():
        sluice.publish(Loader(), topic=topic, epochs=1, window=2, min_subscribers=1)

    publisher = threading.Thread(target=run)
    publisher.start()
    with sluice.subscribe(topic, timeout=60) as pace:
        it = iter(pace)
        next(it)
        state = pace.state_dict()
        for _ in range(20):
            next(it)
        # Read on meanwhile: the history reaches a new subscriber only when the producer
        # sends again (docs/protocol.md, "Joining").
        reader = threading.Thread(target=lambda: sum(1 for _ in it))
        reader.start()
        with pytest.raises(sluice.SluiceError, match="no plan"):
            sluice.subscribe(topic, state=state, timeout=30)
        reader.join(60)
    publisher.join(60)


def test_a_resumable_loader_s_topic_catches_a_trainer_up_by_making_the_loader_again(ns, topic):
    """A topic fed by ``python -m sluice publish helpers:make_epoch_loader --resumable``
    (another process): a trainer restarted from a state the topic no longer holds makes
    the loader again in its own process, from the state's batch, until the shared stream
    reaches back; it gets every row after the state exactly once, in the loader's order
    (the oracle: the loader iterated here, not Sluice's checksum)."""
    import subprocess
    import sys
    from pathlib import Path

    import helpers

    def oracle(epoch):
        loader = helpers.make_epoch_loader()
        loader.set_epoch(epoch)
        return [int(i) for batch in loader for i in batch]

    here = Path(__file__).parent
    publisher = subprocess.Popen(
        [sys.executable, "-m", "sluice", "publish", "helpers:make_epoch_loader", "--topic", topic,
         "--epochs", "2", "--window", "2", "--min-subscribers", "2", "--resumable"],
        cwd=here, stdout=subprocess.PIPE, stderr=subprocess.PIPE, text=True)
    try:
        first = sluice.subscribe(topic, timeout=60)
        pace = sluice.subscribe(topic, timeout=60)
        seen = [[], []]

        def paced():
            # 15 ms a batch: slower than the loader made again, which meets the stream.
            for b in pace:
                seen[b.epoch].extend(int(i) for i in sluice.structured(b))
                time.sleep(0.015)

        reader = threading.Thread(target=paced)
        reader.start()
        before = []
        it = iter(first)
        for _ in range(3):
            before.extend(int(i) for i in sluice.structured(next(it)))
        state = first.state_dict()
        first.close()
        while len(seen[0]) < 400:  # 40 batches on: far out of a history of two
            time.sleep(0.01)
        after = [[], []]
        with sluice.subscribe(topic, state=state, timeout=60) as again:
            for b in again:
                after[b.epoch].extend(int(i) for i in sluice.structured(b))
        reader.join(60)
        pace.close()
        assert before + after[0] == oracle(0)
        assert after[1] == oracle(1)
        assert seen == [oracle(0), oracle(1)]
    finally:
        out, err = publisher.communicate(timeout=60)
    assert publisher.returncode == 0, err


def test_a_torch_dataset_resumes_from_its_state_dict(plans):
    """``sluice.torch.IterableDataset``'s ``state_dict()`` / ``load_state_dict()``
    (torchdata's ``StatefulDataLoader`` protocol): a new dataset loaded with the state
    yields exactly the batches the first one would have yielded next."""
    pytest.importorskip("torch")
    import sluice.torch as st

    with sluice.Producer(_plan(plans), min_subscribers=2, wait_timeout=60):
        # Holds the stream (reads nothing until the end), so the topic stays.
        with sluice.subscribe(plans.topic, timeout=60) as pace:
            first = st.IterableDataset(plans.topic, batch_size=7, timeout=60)
            batches = iter(first)
            for _ in range(5):
                next(batches)
            state = first.state_dict()
            expected = [next(batches)["id"].tolist() for _ in range(3)]
            first.close()
            again = st.IterableDataset(plans.topic, batch_size=7, timeout=60)
            again.load_state_dict(state)
            resumed = iter(again)
            assert [next(resumed)["id"].tolist() for _ in range(3)] == expected
            again.close()
            for _ in pace:
                pass
