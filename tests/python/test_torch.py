"""The PyTorch adapter (only where torch is installed: it is ~3 GB, CI does not install it)."""

from __future__ import annotations

import json
import time
from typing import Any

import pytest

torch = pytest.importorskip(
    "torch", reason="torch is not installed (~3 GB with CUDA); the CPU path is tested with numpy"
)

import sluice  # noqa: E402
import sluice.torch  # noqa: E402


def test_the_dataset_yields_one_epoch_per_pass_as_tensors(plans):
    producer = sluice.Producer(plans.plan(rows=230, batch_rows=50, epochs=2), min_subscribers=1)
    ds = sluice.torch.IterableDataset(plans.topic, batch_size=64, timeout=30,
                                      columns=["id", "vec", "text"])
    loader = torch.utils.data.DataLoader(ds, batch_size=None)
    passes = []
    for _ in range(3):
        ids = []
        for batch in loader:
            assert batch["vec"].shape[1:] == (4,) and batch["vec"].dtype == torch.float32
            assert len(batch["text"]) == len(batch["id"])
            ids += batch["id"].tolist()
        passes.append(sorted(ids))
    assert passes == [list(range(230)), list(range(230)), []]
    assert ds.last_epoch.epoch == 1 and ds.last_epoch.complete
    ds.close()
    producer.wait(timeout=30)


def test_cpu_tensors_are_written_privately_without_a_warning(plans):
    """On a host topic every tensor is safe to write (a write copies the pages it touches),
    so no ``SharedTensorWarning`` comes, whatever ``writable`` says; a writable that is
    not a bool is refused when the dataset is built."""
    import warnings

    with pytest.raises(TypeError, match="writable must be"):
        sluice.torch.IterableDataset(plans.topic, writable="yes")
    producer = sluice.Producer(plans.plan(rows=100, batch_rows=50), min_subscribers=1)
    sluice.torch._warned_shared = False
    with warnings.catch_warnings():
        warnings.simplefilter("error", sluice.torch.SharedTensorWarning)
        for batch in sluice.torch.IterableDataset(plans.topic, timeout=30, columns=["id"]):
            batch["id"].mul_(0)
    producer.wait(timeout=30)


# A trainer script with a DataLoader worker: argv = topic, start method, persistent
# workers (0/1), passes; prints the sorted ids of each pass (or the error).
DATALOADER_TRAINER = """
import json, sys, torch, sluice.torch
topic, method, persistent, passes = sys.argv[1], sys.argv[2], sys.argv[3] == "1", int(sys.argv[4])
workers = int(sys.argv[5]) if len(sys.argv) > 5 else 1
ds = sluice.torch.IterableDataset(topic, timeout=60, columns=["id"])
loader = torch.utils.data.DataLoader(ds, batch_size=None, num_workers=workers,
                                     persistent_workers=persistent,
                                     multiprocessing_context=method)
try:
    for _ in range(passes):
        ids = sorted(i for batch in loader for i in batch["id"].tolist())
        print(json.dumps(ids), flush=True)
except Exception as e:
    print("error", json.dumps(str(e)), flush=True)
"""


@pytest.mark.parametrize("method", ["fork", "spawn", "forkserver"])
def test_a_persistent_dataloader_worker_gets_every_epoch_whole_on_each_pass(
        plans, run_python, method):
    """With ``num_workers=1, persistent_workers=True`` every pass of the loader gets the
    next epoch whole, whatever the start method, and the pass after the end of the stream
    is empty; the worker leaves nothing in /dev/shm when the script ends (the producer
    finished first, so nobody else would reclaim it)."""
    producer = sluice.Producer(plans.plan(rows=300, batch_rows=40, epochs=3),
                               min_subscribers=1)
    child = run_python(DATALOADER_TRAINER, plans.topic, method, "1", "4")
    out, err = child.communicate(timeout=120)
    assert child.returncode == 0, err
    passes = [json.loads(line) for line in out.splitlines()]
    assert passes == [list(range(300))] * 3 + [[]], err
    producer.wait(timeout=30)


@pytest.mark.parametrize("method, persistent, workers", [
    ("fork", "0", "1"), ("spawn", "0", "1"), ("forkserver", "0", "1"), ("fork", "1", "2"),
])
def test_dataloader_workers_that_would_lose_data_are_refused(
        plans, run_python, method, persistent, workers):
    """Without ``persistent_workers`` torch starts a new worker for every pass, whose new
    subscription would miss what was published in between; with two workers each would
    get every row: both are refused with an error that says what to set, rather than
    passes that silently lose (or repeat) epochs."""
    producer = sluice.Producer(plans.plan(rows=300, batch_rows=40, epochs=3),
                               min_subscribers=1, wait_timeout=60)
    child = run_python(DATALOADER_TRAINER, plans.topic, method, persistent, "2", workers)
    out, err = child.communicate(timeout=120)
    assert child.returncode == 0, err
    assert out.startswith("error") and "persistent_workers=True" in out, out + err
    producer.close()


STOPPED_EARLY = """
import sys, time, torch, sluice.torch
ds = sluice.torch.IterableDataset(sys.argv[1], timeout=None, columns=["id"])
loader = torch.utils.data.DataLoader(ds, batch_size=None, num_workers=1,
                                     persistent_workers=True,
                                     multiprocessing_context=sys.argv[2])
it = iter(loader)
time.sleep(3)
print("started", flush=True)
# The script ends here, its worker waiting for a producer that never comes: torch stops
# it at exit, after a few seconds, with SIGTERM.
"""


@pytest.mark.parametrize("method", ["fork", "spawn"])
def test_a_dataloader_worker_stopped_at_exit_leaves_nothing_behind(plans, run_python, ns,
                                                                   method):
    """A script that ends while its persistent worker waits (here for a producer; no
    Sluice process is left to reclaim what it leaves): torch joins the worker for a few
    seconds and then terminates it (SIGTERM); the worker lets go of what it holds first,
    so nothing of it stays in /dev/shm."""
    from conftest import _leftovers

    child = run_python(STOPPED_EARLY, plans.topic, method)
    out, err = child.communicate(timeout=120)
    assert child.returncode == 0 and out.strip() == "started", err
    time.sleep(1)
    assert _leftovers(ns) == [], "the worker left files behind"


WAITING_WORKER = """
import sys, torch, sluice.torch
ds = sluice.torch.IterableDataset(sys.argv[1], timeout=None, columns=["id"])
loader = torch.utils.data.DataLoader(ds, batch_size=None, num_workers=1,
                                     persistent_workers=True,
                                     multiprocessing_context=sys.argv[2])
print("waiting", flush=True)
for batch in loader:
    pass
"""


@pytest.mark.parametrize("method", ["fork", "spawn"])
def test_ctrl_c_while_a_dataloader_worker_waits_for_its_producer_leaves_nothing(
        plans, ns, method):
    """Ctrl-C (SIGINT to the process group) while the worker waits for a producer that
    does not exist yet: the trainer stops, and nothing of it stays in /dev/shm."""
    import os
    import signal
    import subprocess
    import sys

    from conftest import _leftovers
    env = dict(os.environ, SLUICE_NAMESPACE=ns, PYTHONUNBUFFERED="1")
    child = subprocess.Popen([sys.executable, "-c", WAITING_WORKER, plans.topic, method],
                             env=env, stdout=subprocess.PIPE, stderr=subprocess.PIPE,
                             text=True, start_new_session=True)
    assert child.stdout.readline().strip() == "waiting"
    # Until the worker has declared its interest in the topic.
    from helpers import waiting_subscribers
    deadline = time.monotonic() + 60
    while waiting_subscribers(ns, plans.topic) == 0:
        assert time.monotonic() < deadline and child.poll() is None, child.stderr.read()
        time.sleep(0.05)
    os.killpg(child.pid, signal.SIGINT)
    child.wait(timeout=60)
    child.stdout.close()
    child.stderr.close()
    time.sleep(1)
    assert _leftovers(ns) == []


def test_an_in_place_add_on_an_assembled_batch_changes_no_other_view(plans):
    """``torch.from_dlpack(col).add_(1000)`` on a batch assembled from two producer
    batches (process memory) changes that tensor only."""
    import numpy as np
    import pyarrow as pa

    producer = sluice.Producer(plans.plan(rows=400, batch_rows=100), min_subscribers=1)
    with sluice.subscribe(plans.topic, batch_size=64, timeout=30) as sub:
        next(sub)
        batch = next(sub)
        assert batch.shm_range is None
        before = pa.record_batch(batch).column("x").to_pylist()
        tensor = torch.from_dlpack(batch["x"])
        tensor.add_(1000)
        assert tensor[0].item() == before[0] + 1000
        assert np.asarray(batch["x"]).tolist() == before
        assert pa.record_batch(batch).column("x").to_pylist() == before
        assert torch.from_dlpack(batch["x"]).tolist() == before
        del tensor, batch
        for rest in sub:
            del rest
    producer.wait(timeout=30)


def test_tensors_kept_after_breaking_out_of_a_loader_never_change(plans):
    """A training loop that keeps tensors and ``break``s out of the loader: they do not
    change while the producer goes on (and the next pass gets the next epoch)."""
    producer = sluice.Producer(plans.plan(rows=640, batch_rows=64, epochs=200),
                               min_subscribers=1)
    ds = sluice.torch.IterableDataset(plans.topic, timeout=30, columns=["id", "x"])
    loader = torch.utils.data.DataLoader(ds, batch_size=None)
    kept = []
    for i, batch in enumerate(loader):
        kept.append((batch["x"], batch["x"].clone()))
        if i == 2:
            break
    for _ in range(3):
        for batch in loader:
            del batch
    for tensor, copy in kept:
        assert torch.equal(tensor, copy)
    ds.close()
    producer.close()


def test_len_of_a_shared_loader_is_its_loader_s_and_what_it_yields(topic: str, run_python: Any) -> None:
    """``len()`` of a ``SharedLoader``, as a schedule or progress bar asks before the first
    batch: the ``DataLoader``'s own length, or its rows in this trainer's batches; each
    pass yields that many."""
    producer = run_python(
        "import sys, torch, sluice\n"
        "data = torch.utils.data.TensorDataset(torch.arange(100), torch.arange(100) % 10)\n"
        "loader = torch.utils.data.DataLoader(data, batch_size=16, drop_last=True)\n"
        "sluice.publish(loader, sys.argv[1], epochs=2, min_subscribers=2, wait_timeout=60)\n",
        topic,
    )
    own = run_python(
        "import sys, torch, sluice.torch\n"
        "shared = sluice.torch.SharedLoader(sys.argv[1], batch_size=32, timeout=60)\n"
        "lengths = [len(shared), len(torch.utils.data.DataLoader(shared, batch_size=None))]\n"
        "print(lengths, [sum(1 for _ in shared) for _ in range(2)])\n",
        topic,
    )
    shared = sluice.torch.SharedLoader(topic, timeout=60)
    assert len(shared) == 6
    assert [sum(1 for _ in shared) for _ in range(2)] == [6, 6]
    shared.close()
    out, err = own.communicate(timeout=120)
    assert out.strip() == "[3, 3] [3, 3]", err  # 96 rows: drop_last counted
    _, err = producer.communicate(timeout=120)
    assert producer.returncode == 0, err


def test_len_of_a_shared_loader_without_a_producer_is_a_type_error_and_its_truth_waits_for_none(
    topic: str, ns: str
) -> None:
    """``tqdm`` catches a ``TypeError`` from ``len()`` and shows no total; ``if loader:``
    and ``loader or default`` must not wait for a producer."""
    shared = sluice.torch.SharedLoader(topic, timeout=0.3)
    started = time.monotonic()
    assert shared and time.monotonic() - started < 0.1
    with pytest.raises(TypeError, match="no producer of topic"):
        len(shared)
    loader = [torch.zeros(4, 2)]  # a producer that says nothing of its rows
    producer = sluice.Producer(loader, topic=topic, epochs=1, min_subscribers=1)
    assert sluice.epoch_size(topic, timeout=30) == (1, None)
    assert len(shared) == 1
    with pytest.raises(TypeError, match="does not know its rows"):
        len(sluice.torch.SharedLoader(topic, batch_size=2, timeout=5))
    assert [b.shape for b in shared] == [(4, 2)]
    shared.close()
    producer.wait(timeout=30)
    # The producer is gone: the size it told stands.
    assert len(shared) == 1


WORKER_STATE = """
import sys, torch, sluice.torch
ds = sluice.torch.IterableDataset(sys.argv[1], timeout=60, columns=["id"])
print("before:", ds.state_dict(), flush=True)
loader = torch.utils.data.DataLoader(ds, batch_size=None, num_workers=1,
                                     persistent_workers=True, multiprocessing_context="spawn")
for i, batch in enumerate(loader):
    if i == 2:
        break
try:
    ds.state_dict()
    print("no error", flush=True)
except RuntimeError as e:
    print("error:", e, flush=True)
"""


def test_the_state_of_a_dataset_a_dataloader_worker_iterates_is_refused_where_it_is_not(plans, run_python):
    """A DataLoader worker iterates a copy of the dataset, ahead of the batches the
    trainer received: the trainer's ``state_dict()`` would be empty (or the state it was
    loaded with), and a resume from it would repeat or skip rows. It is a RuntimeError
    that says what resumes (num_workers=0, StatefulDataLoader); before the loader runs,
    the (empty) state is as ever."""
    producer = sluice.Producer(plans.plan(rows=2000, batch_rows=100, epochs=1), min_subscribers=1)
    child = run_python(WORKER_STATE, plans.topic)
    out, err = child.communicate(timeout=120)
    assert child.returncode == 0, err
    lines = out.splitlines()
    assert lines[0] == "before: {}", out
    assert lines[1].startswith("error:") and "num_workers=0" in lines[1], out + err
    producer.close()


ORPHANED_WORKER = """
import sys, time, torch, sluice.torch
ds = sluice.torch.IterableDataset(sys.argv[1], timeout=60, columns=["id"])
loader = torch.utils.data.DataLoader(ds, batch_size=None, num_workers=1,
                                     persistent_workers=True, multiprocessing_context="spawn")
for batch in loader:
    time.sleep(0.01)
"""


def test_a_dataloader_worker_whose_trainer_was_killed_as_it_started_lets_go(plans, run_python, ns):
    """A trainer SIGKILLed while its spawned worker still starts: torch's own check then
    takes pid 1 for the worker's parent and never stops it, and the worker's subscription
    held the producer and every other trainer for good. The worker notices its parent's
    death (the pipe multiprocessing gives it) and leaves: a trainer started afterwards
    gets the rest of the stream."""
    import os
    import signal
    import subprocess

    # Epochs enough that the producer is still running whenever the next trainer comes.
    producer = sluice.Producer(plans.plan(rows=2000, batch_rows=100, epochs=1_000_000), min_subscribers=1)
    trainer = run_python(ORPHANED_WORKER, plans.topic)
    worker = None
    deadline = time.monotonic() + 60
    while worker is None:
        assert time.monotonic() < deadline, "no worker started"
        children = subprocess.run(["pgrep", "-P", str(trainer.pid)], capture_output=True, text=True)
        for pid in children.stdout.split():
            try:
                if b"spawn_main" in open(f"/proc/{pid}/cmdline", "rb").read():
                    worker = int(pid)
            except OSError:
                pass
        time.sleep(0.01)
    trainer.send_signal(signal.SIGKILL)
    trainer.wait(timeout=30)
    deadline = time.monotonic() + 60
    try:
        while os.path.exists(f"/proc/{worker}") and open(f"/proc/{worker}/stat").read().split()[2] != "Z":
            assert time.monotonic() < deadline, "the orphaned worker is still there after 60 s"
            time.sleep(0.1)
    finally:
        try:
            os.kill(worker, signal.SIGKILL)
        except ProcessLookupError:
            pass
    with sluice.subscribe(plans.topic, timeout=60) as sub:
        assert len(next(sub)) > 0
    producer.close()
