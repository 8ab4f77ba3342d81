"""Any Python loader shared unchanged: ``sluice.publish`` iterates it once per epoch,
subscriber processes receive its batches in the loader's own structure
(``sluice.structured``), in their own batch sizes, checked against iterating the loader
directly. A loader's exception and a change of structure reach every subscriber."""

from __future__ import annotations

import collections
import json
import os
import pickle
import sys
import time
from pathlib import Path
from typing import Any, Callable

import numpy as np
import pyarrow as pa
import pytest

import sluice
from helpers import cuda_driver_present, waiting_subscribers

EPOCHS = 2

# A subscriber process: receives every epoch in the loader's structure, copied out of
# shared memory as it goes, and pickles them (structure and values) for the test.
SUBSCRIBER = r"""
import pickle, sys
import numpy as np, pyarrow as pa, sluice

def copy(obj):
    if isinstance(obj, dict):
        return {k: copy(v) for k, v in obj.items()}
    if isinstance(obj, (tuple, list)) and not (obj and isinstance(obj[0], (str, int, float))):
        return type(obj)(copy(v) for v in obj)
    if isinstance(obj, np.ndarray):
        return np.array(obj)
    if isinstance(obj, pa.RecordBatch):
        return ("arrow", obj.schema.to_string(show_schema_metadata=False), obj.to_pydict())
    return obj

topic, size, out = sys.argv[1], sys.argv[2], sys.argv[3]
size = None if size == "none" else int(size)
epochs = []
with sluice.subscribe(topic, batch_size=size, timeout=60) as sub:
    print("subscribed", flush=True)
    for epoch in sub.epochs():
        epochs.append([copy(sluice.structured(batch)) for batch in epoch])
with open(out, "wb") as f:
    pickle.dump(epochs, f)
"""


class Loader:
    """Iterated again for every epoch, as a DataLoader is."""

    def __init__(self, make: Callable[[int], Any], batches: int, rows: int = 16, last: int = 5):
        self.make, self.batches, self.rows, self.last = make, batches, rows, last

    def __iter__(self) -> Any:
        for i in range(self.batches):
            yield self.make_batch(i)

    def make_batch(self, i: int) -> Any:
        n = self.last if i == self.batches - 1 else self.rows
        return self.make(i, n)


def images(i: int, n: int) -> Any:
    rng = np.random.default_rng(i)
    return rng.random((n, 3, 8, 8), dtype=np.float32), rng.integers(0, 10, n)


def tokens(i: int, n: int) -> Any:
    rng = np.random.default_rng(100 + i)
    ids = rng.integers(0, 30_000, (n, 12), dtype=np.int32)
    return {
        "input_ids": ids,
        "mask": ids % 3 == 0,
        "text": [f"sentence {i}.{j}" for j in range(n)],
        "meta": {"id": np.arange(n, dtype=np.int64) + 100 * i, "score": rng.random(n).astype(np.float16)},
    }


def arrow(i: int, n: int) -> Any:
    ids = pa.array(range(100 * i, 100 * i + n), pa.int64())
    names = pa.array([f"row {100 * i + j}" for j in range(n)])
    vectors = pa.FixedSizeListArray.from_arrays(pa.array(np.arange(n * 4, dtype=np.float32)), 4)
    return pa.RecordBatch.from_arrays([ids, names, vectors], names=["id", "name", "vector"])


def _copied(obj: Any) -> Any:
    """What the subscriber process pickles for ``obj``."""
    if isinstance(obj, pa.RecordBatch):
        return ("arrow", obj.schema.to_string(show_schema_metadata=False), obj.to_pydict())
    return obj


def assert_same(got: Any, want: Any, where: str = "batch") -> None:
    want = _copied(want)
    assert type(got) is type(want), f"{where}: {type(got).__name__} instead of {type(want).__name__}"
    if isinstance(want, dict):
        assert list(got) == list(want), f"{where}: keys {list(got)} instead of {list(want)}"
        for key in want:
            assert_same(got[key], want[key], f"{where}[{key!r}]")
    elif isinstance(want, np.ndarray):
        assert got.dtype == want.dtype, f"{where}: {got.dtype} instead of {want.dtype}"
        assert got.shape == want.shape, f"{where}: {got.shape} instead of {want.shape}"
        np.testing.assert_array_equal(got, want, err_msg=where)
    elif isinstance(want, (tuple, list)) and want and not isinstance(want[0], (str, int, float)):
        assert len(got) == len(want), where
        for k, (g, w) in enumerate(zip(got, want)):
            assert_same(g, w, f"{where}[{k}]")
    else:
        assert got == want, f"{where}: {got!r} instead of {want!r}"


def _is_arrow_copy(obj: Any) -> bool:
    return isinstance(obj, tuple) and len(obj) == 3 and isinstance(obj[0], str) and obj[0] == "arrow"


def concat(batches: list[Any]) -> Any:
    """The rows of ``batches`` as one batch of the same structure."""
    first = batches[0]
    if isinstance(first, dict):
        return {k: concat([b[k] for b in batches]) for k in first}
    if isinstance(first, np.ndarray):
        return np.concatenate(batches)
    if _is_arrow_copy(first):
        merged = {k: sum((b[2][k] for b in batches), []) for k in first[2]}
        return ("arrow", first[1], merged)
    if isinstance(first, pa.RecordBatch):
        return concat([_copied(b) for b in batches])
    if isinstance(first, (tuple, list)) and first and not isinstance(first[0], (str, int, float)):
        return type(first)(concat([b[k] for b in batches]) for k in range(len(first)))
    return sum(batches, [])


def rows_of(batch: Any) -> int:
    if isinstance(batch, dict):
        return rows_of(next(iter(batch.values())))
    if _is_arrow_copy(batch):
        return len(next(iter(batch[2].values())))
    if isinstance(batch, (tuple, list)) and batch and not isinstance(batch[0], (str, int, float)):
        return rows_of(batch[0])
    return len(batch)


def shared_to(
    loader: Any, sizes: list[str], topic: str, tmp_path: Path, run_python: Any, epochs: int = 1
) -> tuple[Any, dict[str, Any]]:
    """Publishes ``loader`` to one subscriber process per batch size (``SUBSCRIBER``):
    the run's stats, and the epochs each subscriber received, by size."""
    outs = [tmp_path / f"sub-{size}.pickle" for size in sizes]
    subs = [run_python(SUBSCRIBER, topic, size, str(out)) for size, out in zip(sizes, outs)]
    stats = sluice.publish(loader, topic, epochs=epochs, min_subscribers=len(sizes), wait_timeout=60)
    for sub in subs:
        _, err = sub.communicate(timeout=120)
        assert sub.returncode == 0, err
    return stats, {size: pickle.loads(out.read_bytes()) for size, out in zip(sizes, outs)}


@pytest.mark.parametrize("make", [images, tokens, arrow], ids=["tuple", "dict", "pyarrow"])
def test_a_loaders_batches_reach_three_subscriber_processes_in_its_own_structure(
    make: Callable[[int, int], Any], topic: str, tmp_path: Path, run_python: Any
) -> None:
    loader = Loader(make, batches=7)
    sizes = ["none", "5", "64"]
    stats, received = shared_to(loader, sizes, topic, tmp_path, run_python, epochs=EPOCHS)
    assert (stats.epochs, stats.batches, stats.rows) == (EPOCHS, 7 * EPOCHS, (6 * 16 + 5) * EPOCHS)
    expected = list(loader)
    whole = concat([_copied(b) for b in expected])
    for size, epochs in received.items():
        assert len(epochs) == EPOCHS, size
        for e, batches in enumerate(epochs):
            if size == "none":
                # Exactly the loader's batches.
                assert len(batches) == len(expected), size
                for k, (got, want) in enumerate(zip(batches, expected)):
                    assert_same(got, want, f"epoch {e} batch {k}")
            else:
                n = int(size)
                assert [rows_of(b) for b in batches[:-1]] == [n] * (len(batches) - 1), size
                assert_same(concat(batches), whole, f"size {size} epoch {e}")


class Failing:
    def __iter__(self) -> Any:
        yield images(0, 16)
        raise KeyError("no such image: 17.jpg")


def test_a_loaders_exception_reaches_every_subscriber(topic: str, tmp_path: Path, run_python: Any) -> None:
    out = tmp_path / "sub.pickle"
    sub = run_python(SUBSCRIBER, topic, "none", str(out))
    with pytest.raises(KeyError, match="17.jpg"):
        sluice.publish(Failing(), topic, epochs=1, min_subscribers=1, wait_timeout=60)
    _, err = sub.communicate(timeout=120)
    assert sub.returncode != 0
    assert "ProducerFailed" in err and "KeyError" in err and "17.jpg" in err, err


class Changing:
    """Images of another size next (multi-scale training: one structure), then of another
    dtype (another structure)."""

    def __iter__(self) -> Any:
        yield images(0, 16)
        yield np.zeros((16, 3, 4, 4), dtype=np.float32), np.arange(16)
        yield np.zeros((16, 3, 4, 4), dtype=np.float64), np.arange(16)


def test_a_batch_of_another_structure_is_refused_naming_both(topic: str, tmp_path: Path, run_python: Any) -> None:
    out = tmp_path / "sub.pickle"
    sub = run_python(SUBSCRIBER, topic, "none", str(out))
    with pytest.raises(ValueError, match="another structure") as raised:
        sluice.publish(Changing(), topic, epochs=1, min_subscribers=1, wait_timeout=60)
    assert '"<f8"' in str(raised.value) and '"<f4"' in str(raised.value)
    _, err = sub.communicate(timeout=120)
    assert sub.returncode != 0 and "another structure" in err, err


def test_what_cannot_be_a_batch_is_refused_clearly(ns: str) -> None:
    with pytest.raises(TypeError, match="cannot publish a object"):
        sluice.loader.flatten((np.zeros(3), object()))
    with pytest.raises(ValueError, match="as many rows"):
        sluice.loader.flatten({"a": np.zeros(3), "b": np.zeros(4)})
    with pytest.raises(ValueError, match="scalar"):
        sluice.loader.flatten({"a": np.float32(1.0)})
    with pytest.raises(ValueError, match="no loader structure"):
        sluice.structured(pa.record_batch({"x": [1, 2]}))
    # A structure that would view numbers as Python objects is refused, not followed.
    forged = pa.record_batch({"x": pa.array([1, 2], pa.int64())}).replace_schema_metadata(
        {sluice.loader.STRUCTURE_KEY: b'{"col": "x", "lib": "numpy", "dtype": "|O", "shape": []}'}
    )
    with pytest.raises(ValueError, match="not a number"):
        sluice.structured(forged)


def test_the_torch_shared_loader_yields_what_the_loader_yielded(topic: str, run_python: Any) -> None:
    torch = pytest.importorskip("torch")
    import sluice.torch as st

    def batch(i: int, n: int) -> Any:
        g = torch.Generator().manual_seed(i)
        return torch.rand((n, 3, 4, 4), generator=g), torch.randint(0, 10, (n,), generator=g)

    loader = Loader(batch, batches=4)
    producer = run_python(
        "import sys, torch, sluice\n"
        "def batch(i, n):\n"
        "    g = torch.Generator().manual_seed(i)\n"
        "    return torch.rand((n, 3, 4, 4), generator=g), torch.randint(0, 10, (n,), generator=g)\n"
        "class L:\n"
        "    def __iter__(self):\n"
        "        for i in range(4):\n"
        "            yield batch(i, 5 if i == 3 else 16)\n"
        "sluice.publish(L(), sys.argv[1], epochs=2, min_subscribers=1, wait_timeout=60)\n",
        topic,
    )
    shared = st.SharedLoader(topic, timeout=60)
    for _ in range(2):
        got = list(shared)
        assert len(got) == 4
        for (x, y), (wx, wy) in zip(got, loader):
            assert isinstance(x, torch.Tensor) and x.dtype == wx.dtype and x.shape == wx.shape
            assert torch.equal(x, wx) and torch.equal(y, wy)
        del got
    shared.close()
    _, err = producer.communicate(timeout=120)
    assert producer.returncode == 0, err


def test_a_torch_namedtuple_of_bfloat16_reaches_a_shared_loader_as_it_was(topic: str, run_python: Any) -> None:
    """Torch dtypes numpy lacks travel as their bits and come back as themselves; a
    namedtuple comes back with its fields, through ``device=`` too."""
    torch = pytest.importorskip("torch")
    import sluice.torch as st

    make = (
        "import collections, torch\n"
        "B = collections.namedtuple('B', ['x', 'rows', 'y'])\n"
        "def batch(i):\n"
        "    g = torch.Generator().manual_seed(i)\n"
        "    x = torch.rand((8, 2, 3), generator=g).to(torch.bfloat16)\n"
        "    rows = [torch.rand((k % 3 + 1,), generator=g).to(torch.bfloat16) for k in range(8)]\n"
        "    return B(x, rows, torch.randint(0, 10, (8,), generator=g))\n"
    )
    producer = run_python(
        "import sys, sluice\n" + make
        + "class L:\n    def __iter__(self):\n        return (batch(i) for i in range(3))\n"
        "sluice.publish(L(), sys.argv[1], epochs=1, min_subscribers=1, wait_timeout=60)\n",
        topic,
    )
    space: dict[str, Any] = {}
    exec(make, space)
    shared = st.SharedLoader(topic, timeout=60, device="cpu")
    got = list(shared)
    assert len(got) == 3
    for i, b in enumerate(got):
        want = space["batch"](i)
        assert (type(b).__name__, b._fields) == ("B", ("x", "rows", "y"))
        assert b.x.dtype == torch.bfloat16 and torch.equal(b.x, want.x)
        assert [r.dtype for r in b.rows] == [torch.bfloat16] * 8
        assert all(torch.equal(r, w) for r, w in zip(b.rows, want.rows))
        assert torch.equal(b.y, want.y)
    shared.close()
    _, err = producer.communicate(timeout=120)
    assert producer.returncode == 0, err
    record, _ = sluice.loader.flatten(space["batch"](0))
    ml_dtypes = pytest.importorskip("ml_dtypes")
    numpy_x = sluice.structured(record).x
    assert numpy_x.dtype == ml_dtypes.bfloat16
    np.testing.assert_array_equal(numpy_x.astype(np.float32), space["batch"](0).x.float().numpy())


def test_python_m_sluice_publish_runs_a_loader_that_ctrl_c_stops_cleanly(topic: str, tmp_path: Path, ns: str) -> None:
    import os
    import signal
    import subprocess
    import sys
    import time

    (tmp_path / "my_loaders.py").write_text(
        "import numpy as np\n"
        "class Endless:\n"
        "    def __iter__(self):\n"
        "        for i in range(10**9):\n"
        "            yield {'x': np.full((8, 4), i, dtype=np.int32), 'tag': [str(i)] * 8}\n"
        "def make():\n"
        "    return Endless()\n"
    )
    child = subprocess.Popen(
        [sys.executable, "-m", "sluice", "publish", "my_loaders:make", "--topic", topic, "--epochs", "2"],
        cwd=tmp_path,
        env=dict(os.environ, SLUICE_NAMESPACE=ns),
        stdout=subprocess.PIPE,
        stderr=subprocess.PIPE,
        text=True,
        # A test run started in the background (`cmd &`) ignores SIGINT, and so would
        # the child, as POSIX has it; Ctrl-C in a terminal is what this test is about.
        preexec_fn=lambda: signal.signal(signal.SIGINT, signal.SIG_DFL),
    )
    try:
        with sluice.subscribe(topic, timeout=60) as sub:
            epoch = next(sub.epochs())
            seen = []
            for batch in epoch:
                got = sluice.structured(batch)
                assert got["x"].shape == (8, 4) and got["tag"] == [str(got["x"][0, 0])] * 8
                seen.append(int(got["x"][0, 0]))
                del got, batch
                if len(seen) == 3:
                    child.send_signal(signal.SIGINT)
                    interrupted = time.monotonic()
                # A liveness bound in time, not in batches: tiny batches come by the
                # thousand per second while a loaded machine schedules the child late.
                if len(seen) > 3 and time.monotonic() - interrupted > 60:
                    pytest.fail("the publisher did not stop within 60 s of SIGINT")
    except (sluice.ProducerFailed, sluice.ProducerLost) as e:
        assert "stop" in str(e) or isinstance(e, sluice.ProducerLost), e
    except BaseException:
        child.kill()  # a failed test leaves no publisher running
        raise
    else:
        pytest.fail("the epoch ended although the publisher was stopped")
    assert seen == list(range(seen[0], seen[0] + len(seen)))
    _, err = child.communicate(timeout=60)
    assert child.returncode == 130, err


# A subscriber process that reports each epoch: (epoch, complete, rows, first id of each batch).
REPORTER = r"""
import json, sys, time, sluice
topic, join, delay = sys.argv[1], sys.argv[2], float(sys.argv[3])
with sluice.subscribe(topic, join=join, timeout=60) as sub:
    for epoch in sub.epochs():
        firsts = []
        for batch in epoch:
            firsts.append(int(sluice.structured(batch)["id"][0]))
            del batch
            time.sleep(delay)
        print(json.dumps([epoch.epoch, epoch.complete, epoch.rows, firsts]), flush=True)
"""


class Numbered:
    """10 batches of 8 rows an epoch, ids 0..79, optionally slowly."""

    def __init__(self, delay: float = 0.0) -> None:
        self.delay = delay

    def __iter__(self) -> Any:
        import time

        for i in range(10):
            time.sleep(self.delay)
            yield {"id": np.arange(8 * i, 8 * i + 8, dtype=np.int64)}


def _reports(child: Any) -> list[Any]:
    import json

    out, err = child.communicate(timeout=120)
    assert child.returncode == 0, err
    return [json.loads(line) for line in out.splitlines() if line.startswith("[")]


def _publish_command(tmp_path: Path, ns: str, loaders: str, flags: list[str]) -> Any:
    """``python -m sluice publish my_loaders:make FLAGS`` run to its end, with
    ``loaders`` as ``my_loaders.py``."""
    import os
    import subprocess
    import sys

    (tmp_path / "my_loaders.py").write_text(loaders)
    return subprocess.run(
        [sys.executable, "-m", "sluice", "publish", "my_loaders:make", *flags],
        cwd=tmp_path,
        env=dict(os.environ, SLUICE_NAMESPACE=ns),
        capture_output=True,
        text=True,
        timeout=120,
    )


@pytest.mark.parametrize(
    ("flags", "named"),
    [
        (["--topic", "no/slashes"], "topic"),
        (["--topic", "ok", "--linger", "-1"], "linger"),
        (["--topic", "ok", "--epochs", "-2"], "epochs"),
        (["--topic", "ok", "--device", "gpu"], "cuda:N"),
        (["--topic", "ok", "--max-held", "0"], "max_held"),
    ],
)
def test_python_m_sluice_publish_refuses_bad_settings_with_an_error_not_a_traceback(
    flags: list[str], named: str, tmp_path: Path, ns: str
) -> None:
    done = _publish_command(tmp_path, ns, "def make():\n    return [[1, 2, 3]]\n", flags)
    assert done.returncode == 2, done.stderr
    assert done.stderr.startswith("error: ") and named in done.stderr, done.stderr
    assert "Traceback" not in done.stderr


@pytest.mark.parametrize(
    ("made", "named"),
    [("None", "NoneType, which cannot be iterated"), ("(b for b in [[1, 2]])", "iterator, which runs once")],
)
def test_python_m_sluice_publish_refuses_what_cannot_be_a_loader_with_an_error(
    made: str, named: str, tmp_path: Path, ns: str
) -> None:
    done = _publish_command(tmp_path, ns, f"def make():\n    return {made}\n", ["--topic", "t", "--epochs", "2"])
    assert done.returncode == 2, done.stderr
    assert done.stderr.startswith("error: my_loaders:make() returned") and named in done.stderr, done.stderr
    assert "Traceback" not in done.stderr


def test_python_m_sluice_publish_shows_a_loaders_own_value_error_with_its_traceback(
    tmp_path: Path, ns: str
) -> None:
    loaders = "def make():\n    raise ValueError('the dataset path is wrong')\n"
    done = _publish_command(tmp_path, ns, loaders, ["--topic", "ok"])
    assert done.returncode == 1, done.stderr
    assert "Traceback" in done.stderr and "the dataset path is wrong" in done.stderr


def test_a_trainer_killed_mid_epoch_holds_nobody_back(topic: str, run_python: Any) -> None:
    import signal

    steady = run_python(REPORTER, topic, "now", "0")
    doomed = run_python(REPORTER, topic, "now", "0.2")
    import threading

    def kill_soon() -> None:
        import time

        time.sleep(0.5)
        doomed.send_signal(signal.SIGKILL)

    threading.Thread(target=kill_soon).start()
    stats = sluice.publish(Numbered(), topic, epochs=3, min_subscribers=2, wait_timeout=60, window=2)
    assert (stats.epochs, stats.batches, stats.rows) == (3, 30, 240)
    reports = _reports(steady)
    assert reports == [[e, True, 80, list(range(0, 80, 8))] for e in range(3)]


def test_a_trainer_that_joins_late_gets_the_rest_of_the_epoch_flagged_then_whole_epochs(
    topic: str, run_python: Any
) -> None:
    early = run_python(REPORTER, topic, "now", "0")
    late: list[Any] = []

    def join_late() -> None:
        import time

        time.sleep(1.0)  # the first epoch takes 2 s (0.2 s a batch)
        late.append(run_python(REPORTER, topic, "now", "0"))

    import threading

    joiner = threading.Thread(target=join_late)
    joiner.start()
    sluice.publish(Numbered(delay=0.2), topic, epochs=2, min_subscribers=1, wait_timeout=60)
    joiner.join()
    assert _reports(early) == [[e, True, 80, list(range(0, 80, 8))] for e in range(2)]
    first, second = _reports(late[0])
    assert first[0] == 0 and first[1] is False and 0 < first[2] < 80, first
    assert first[3] == list(range(80 - first[2], 80, 8)), first
    assert second == [1, True, 80, list(range(0, 80, 8))]


def boxes(i: int, n: int) -> Any:
    """Rows of variable shape: each image's boxes, ``(k, 4)`` with ``k`` from 0 to 5."""
    rng = np.random.default_rng(200 + i)
    return {
        "boxes": [rng.random((int(rng.integers(0, 6)), 4), dtype=np.float32) for _ in range(n)],
        "label": rng.integers(0, 10, n),
    }


def test_rows_of_variable_shape_round_trip_as_list_columns(
    topic: str, tmp_path: Path, run_python: Any
) -> None:
    """A list of arrays whose shapes differ (boxes per image) is one row each: every row
    reaches subscribers of the loader's batches and of their own batch size with its own
    shape, dtype and values."""
    loader = Loader(boxes, batches=5)
    sizes = ["none", "5"]
    _, received = shared_to(loader, sizes, topic, tmp_path, run_python)
    expected = list(loader)
    want = [(b, label) for batch in expected for b, label in zip(batch["boxes"], batch["label"])]
    for size, (batches,) in received.items():
        if size == "none":
            assert [len(b["boxes"]) for b in batches] == [len(b["boxes"]) for b in expected]
        got = [(b, label) for batch in batches for b, label in zip(batch["boxes"], batch["label"])]
        assert len(got) == len(want), size
        for k, ((g, gl), (w, wl)) in enumerate(zip(got, want)):
            assert g.dtype == w.dtype and g.shape == w.shape, f"{size} row {k}: {g.shape}"
            np.testing.assert_array_equal(g, w, err_msg=f"{size} row {k}")
            assert gl == wl


Batch = collections.namedtuple("Batch", ["images", "labels"])

# A subscriber process that has not imported the loader's module: it gets a namedtuple of
# the same name and fields, and records what it got (its own class cannot be pickled).
NAMEDTUPLE_SUBSCRIBER = r"""
import pickle, sys
import numpy as np, sluice

topic, out = sys.argv[1], sys.argv[2]
got = []
with sluice.subscribe(topic, timeout=60) as sub:
    print("subscribed", flush=True)
    for batch in sub:
        b = sluice.structured(batch)
        got.append((type(b).__name__, b._fields, np.array(b.images), np.array(b.labels)))
with open(out, "wb") as f:
    pickle.dump(got, f)
"""


def named(i: int, n: int) -> Any:
    rng = np.random.default_rng(300 + i)
    return Batch(rng.random((n, 2, 3), dtype=np.float32), rng.integers(0, 10, n))


def test_a_namedtuple_batch_comes_back_with_its_fields(topic: str, tmp_path: Path, run_python: Any) -> None:
    """A loader's namedtuple: its fields name the columns; a trainer that has imported its
    class gets that class, one that has not a namedtuple of the same name and fields."""
    record, structure = sluice.loader.flatten(named(0, 4))
    assert record.schema.names == ["images", "labels"]
    back = sluice.structured(record)
    assert type(back) is Batch
    np.testing.assert_array_equal(back.images, named(0, 4).images)
    loader = Loader(named, batches=3)
    out = tmp_path / "named.pickle"
    sub = run_python(NAMEDTUPLE_SUBSCRIBER, topic, str(out))
    sluice.publish(loader, topic, epochs=1, min_subscribers=1, wait_timeout=60)
    _, err = sub.communicate(timeout=120)
    assert sub.returncode == 0, err
    got = pickle.loads(out.read_bytes())
    assert len(got) == 3
    for (name, fields, images, labels), want in zip(got, loader):
        assert (name, fields) == ("Batch", ("images", "labels"))
        np.testing.assert_array_equal(images, want.images)
        np.testing.assert_array_equal(labels, want.labels)


@pytest.mark.parametrize("spec", [
    ["m", "Batch", ["images"]],           # one field for two values
    ["m", "Batch", ["images", "1x"]],     # not an identifier
    ["m", "Batch", "images labels"],      # not a list of names
    "Batch",
])
def test_a_malformed_namedtuple_in_a_batch_s_structure_is_a_clear_error(spec: Any) -> None:
    """A structure is data from the topic: a namedtuple it names wrongly is a
    ``ValueError`` saying so, and nothing is imported on its word."""
    record, structure = sluice.loader.flatten(named(0, 4))
    structure["namedtuple"] = spec
    metadata = {sluice.loader.STRUCTURE_KEY: json.dumps(structure).encode()}
    with pytest.raises(ValueError, match="namedtuple"):
        sluice.structured(record.replace_schema_metadata(metadata))


def detection(i: int, n: int) -> Any:
    """torchvision's detection batches (`collate_fn=lambda b: tuple(zip(*b))`): a tuple of
    images of their own sizes and a tuple of target dicts, one of each per row."""
    rng = np.random.default_rng(400 + i)
    images = tuple(
        rng.random((3, int(rng.integers(4, 9)), int(rng.integers(4, 9))), dtype=np.float32)
        for _ in range(n)
    )
    targets = tuple(
        {
            "boxes": rng.random((int(k), 4), dtype=np.float32),
            "labels": rng.integers(0, 5, int(k)),
            "image_id": 100 * i + j,
            "area": np.array(float(k)),
        }
        for j, k in enumerate(rng.integers(0, 4, n))
    )
    return images, targets


def test_a_batch_of_one_item_per_row_round_trips_whole_and_in_other_batch_sizes(
    topic: str, tmp_path: Path, run_python: Any
) -> None:
    """A tuple of per-row items (images of their own sizes, target dicts with a number
    each) is one item per row: a subscriber of the loader's batches gets them exactly, one
    of its own batch size the same rows in order."""
    loader = Loader(detection, batches=4, rows=6, last=2)
    _, structure = sluice.loader.flatten(loader.make_batch(0))
    assert [child["kind"] for child in structure["tuple"]] == ["tuple", "tuple"]
    sizes = ["none", "4"]
    _, received = shared_to(loader, sizes, topic, tmp_path, run_python)
    expected = list(loader)
    want = [row for images, targets in expected for row in zip(images, targets)]
    for size, (batches,) in received.items():
        if size == "none":
            assert len(batches) == len(expected)
            for k, (got, wanted) in enumerate(zip(batches, expected)):
                assert_same(got, wanted, f"batch {k}")
        else:
            assert [len(images) for images, _ in batches] == [4, 4, 4, 4, 4]
            got = [row for images, targets in batches for row in zip(images, targets)]
            assert len(got) == len(want)
            for k, (g, w) in enumerate(zip(got, want)):
                assert_same(g, w, f"row {k}")


def samples(i: int, n: int) -> Any:
    """A list of the samples themselves (`collate_fn=lambda b: b`): (image, label, name)."""
    rng = np.random.default_rng(500 + i)
    return [
        (rng.random((3, 4 + j % 3, 5), dtype=np.float32), int(rng.integers(0, 10)), f"img{i}.{j}")
        for j in range(n)
    ]


def test_writes_to_one_item_per_row_views_raise_or_stay_private(topic: str) -> None:
    """Rows read one item per row view shared memory too (tests/python/test_writes.py):
    a numpy view raises on a write, a torch tensor writes a private copy; either way a
    second read of the same batch sees what the loader yielded."""
    torch = None
    try:
        import torch
        import sluice.torch as st
    except ImportError:
        pass

    def tensors(obj: Any) -> Any:
        """The loader's batch with torch tensors where torch is installed."""
        if isinstance(obj, np.ndarray):
            return torch.from_numpy(obj)
        if isinstance(obj, dict):
            return {k: tensors(v) for k, v in obj.items()}
        return tuple(tensors(v) for v in obj) if isinstance(obj, tuple) else obj

    make = detection if torch is None else (lambda i, n: tensors(detection(i, n)))
    loader = Loader(make, batches=2, rows=4, last=4)
    expected = list(Loader(detection, batches=2, rows=4, last=4))
    thread, done = _publish_in_background(loader, topic, epochs=1, min_subscribers=1, wait_timeout=60)
    with sluice.subscribe(topic, timeout=60) as sub:
        for k, batch in enumerate(sub):
            images, targets = sluice.structured(batch)
            for value in (images[1], targets[1]["boxes"], targets[1]["area"]):
                with pytest.raises(ValueError, match="read-only"):
                    value[...] = -1
            if torch is not None:
                _, tensors = st._structured_tensors(batch)
                tensors[1]["area"].fill_(-1)
                tensors[1]["boxes"].mul_(-1)
            assert_same(sluice.structured(batch), expected[k], f"batch {k} read again")
            del images, targets, batch
    thread.join(timeout=60)
    assert "error" not in done, done.get("error")


def test_a_list_of_samples_round_trips_as_one_sample_per_row(
    topic: str, tmp_path: Path, run_python: Any
) -> None:
    loader = Loader(samples, batches=3, rows=5, last=2)
    sizes = ["none", "4"]
    _, received = shared_to(loader, sizes, topic, tmp_path, run_python)
    expected = list(loader)
    for size, (batches,) in received.items():
        if size == "none":
            for k, (got, want) in enumerate(zip(batches, expected)):
                assert_same(got, want, f"batch {k}")
        else:
            assert [len(b) for b in batches] == [4, 4, 4]
            got = [row for batch in batches for row in batch]
            for k, (g, w) in enumerate(zip(got, [row for batch in expected for row in batch])):
                assert_same(g, w, f"row {k}")


def test_a_list_of_fields_and_a_list_of_samples_with_nested_fields_are_each_read_by_row() -> None:
    """`list(zip(*samples))` is fields (a list of images, a list of labels); samples whose
    fields are dicts or tuples keep them, row by row."""
    rng = np.random.default_rng(7)
    images = tuple(rng.random((3, 4 + k, 5), dtype=np.float32) for k in range(4))
    record, _ = sluice.loader.flatten([images, (1, 2, 3, 4)])
    assert record.num_rows == 4
    assert_same(sluice.structured(record), [images, (1, 2, 3, 4)])
    nested = [
        (images[k], {"boxes": rng.random((k, 4)), "labels": np.arange(k)}, (k, f"n{k}"))
        for k in range(4)
    ]
    record, _ = sluice.loader.flatten(nested)
    assert record.num_rows == 4
    assert_same(sluice.structured(record), nested)
    # torchvision's detection samples with `collate_fn=lambda b: b`: nothing but arrays.
    detection = [(image, target) for image, target, _ in nested]
    record, _ = sluice.loader.flatten(detection)
    assert record.num_rows == 4
    assert_same(sluice.structured(record), detection)


def test_arrays_trainers_cannot_read_are_refused_when_published() -> None:
    for array in (np.array(["a", "bb"]), np.array([1 + 2j, 3j]), np.array(["2026-01-01"], "M8[D]")):
        with pytest.raises(TypeError, match="publish arrays of numbers"):
            sluice.loader.flatten({"x": array})


def test_a_loader_read_one_item_per_row_stays_so_when_a_batch_would_fit_as_columns() -> None:
    """A last batch of 3 images of 3 channels would fit as 3 columns of 3 rows: it is read
    per row, as the loader's first batch was."""
    def batch(n: int) -> Any:
        rng = np.random.default_rng(n)
        images = tuple(rng.random((3, 4 + k, 5), dtype=np.float32) for k in range(n))
        return images, tuple(range(n))

    _, first = sluice.loader.flatten(batch(4))
    record, last = sluice.loader.flatten(batch(3), like=first)
    assert last == first and record.num_rows == 3
    _, alone = sluice.loader.flatten(batch(3))
    assert alone != first, "read alone, the columns fit: the first batch decides"
    assert_same(sluice.structured(record), batch(3))


def segmentation(i: int, n: int) -> Any:
    """`collate_fn=lambda b: list(zip(*b))` over (image, mask) samples of one shape, whose
    first dimension (3 channels, 3 classes) would also read as rows of columns."""
    rng = np.random.default_rng(700 + i)
    images = tuple(rng.random((3, 6, 6), dtype=np.float32) for _ in range(n))
    masks = tuple(rng.integers(0, 2, (3, 6, 6)).astype(np.uint8) for _ in range(n))
    return [images, masks]


class SizedLoader(Loader):
    """Says its batch size, as torch's `DataLoader` does."""

    @property
    def batch_size(self) -> int:
        return self.rows


def test_a_loader_s_batch_size_decides_a_first_batch_that_reads_two_ways(
    topic: str, tmp_path: Path, run_python: Any
) -> None:
    """A list of a tuple of 8 images and one of 8 masks, all 3 x 6 x 6, fits as 16 columns
    of 3 rows too; the loader says batches of 8, so it is 8 rows of (image, mask), and its
    last batch of 5 is the same structure, not another one."""
    loader = SizedLoader(segmentation, batches=3, rows=8, last=5)
    alone, _ = sluice.loader.flatten(loader.make_batch(0))
    assert alone.num_rows == 3, "without the loader's word, the columns fit first"
    record, first = sluice.loader.flatten(loader.make_batch(0), rows=8)
    assert record.num_rows == 8
    last, structure = sluice.loader.flatten(loader.make_batch(2), like=first)
    assert structure == first and last.num_rows == 5
    _, received = shared_to(loader, ["none", "3"], topic, tmp_path, run_python)
    expected = list(loader)
    (batches,) = received["none"]
    assert len(batches) == len(expected)
    for k, (got, want) in enumerate(zip(batches, expected)):
        assert_same(got, want, f"batch {k}")
    (threes,) = received["3"]
    assert [len(images) for images, _ in threes] == [3] * 7
    got = [row for images, masks in threes for row in zip(images, masks)]
    want = [row for images, masks in expected for row in zip(images, masks)]
    assert len(got) == len(want) == 21
    for k, (g, w) in enumerate(zip(got, want)):
        assert_same(g, w, f"row {k}")


def features(i: int, n: int) -> Any:
    """torch's `default_collate` of (x, y) samples: a *list* of x (n, 4) and y (n, 2),
    which also reads as two rows of variable shape."""
    rng = np.random.default_rng(800 + i)
    return [rng.random((n, 4), dtype=np.float32), rng.random((n, 2), dtype=np.float32)]


def test_a_default_collated_list_of_features_and_targets_is_columns_of_the_loader_s_rows(
    topic: str, tmp_path: Path, run_python: Any
) -> None:
    """`[x (8, 4), y (8, 2)]` from a loader of batches of 8 is 8 rows of (x, y), its last
    batch of 5 too, to a subscriber of the loader's batches and one of its own size."""
    loader = SizedLoader(features, batches=3, rows=8, last=5)
    stats, received = shared_to(loader, ["none", "3"], topic, tmp_path, run_python)
    assert stats.rows == 21
    expected = list(loader)
    (batches,) = received["none"]
    assert len(batches) == 3
    for k, (got, want) in enumerate(zip(batches, expected)):
        assert_same(got, want, f"batch {k}")
    (threes,) = received["3"]
    assert [len(x) for x, _ in threes] == [3] * 7
    assert_same(concat(threes), concat(expected))


def test_bools_missing_strings_and_empty_batches_round_trip() -> None:
    """A bool label per row (bytes on the wire, bool again on receipt), captions with a
    missing one (a null, back as None), and a batch of no rows."""
    labels = np.array([True, False, True])
    record, _ = sluice.loader.flatten((np.arange(3), labels))
    assert_same(sluice.structured(record), (np.arange(3), labels))
    captions = {"x": np.arange(3), "caption": ["a", None, "c"]}
    record, _ = sluice.loader.flatten(captions)
    assert_same(sluice.structured(record), captions)
    empty = (np.zeros((0, 3, 4), dtype=np.float32), np.zeros(0, dtype=np.int64))
    record, _ = sluice.loader.flatten(empty)
    assert record.num_rows == 0
    assert_same(sluice.structured(record), empty)


def test_a_later_batch_of_only_missing_captions_or_none_keeps_the_first_s_structure() -> None:
    """The first batch makes a column of strings; a later batch whose captions are all
    missing (or that has no rows) is that many missing strings, not another structure,
    per row as well as per column."""
    first = (np.arange(2), ["a cat", None])
    _, like = sluice.loader.flatten(first)
    for later in [(np.arange(2, 3), [None]), (np.arange(0), [])]:
        record, structure = sluice.loader.flatten(later, like=like)
        assert structure == like
        assert record.schema.field("1").type == pa.string()
        assert_same(sluice.structured(record), later)
    samples = [{"x": np.float32(1), "caption": "a"}, {"x": np.float32(2), "caption": None}]
    record, like = sluice.loader.flatten(samples)
    missing = [{"x": np.float32(3), "caption": None}, {"x": np.float32(4), "caption": None}]
    record, structure = sluice.loader.flatten(missing, like=like)
    assert structure == like
    assert [row["caption"] for row in sluice.structured(record)] == [None, None]


def test_big_endian_arrays_arrive_as_their_values_and_unreadable_ones_are_named() -> None:
    """An array in the other byte order (from a file) is published as its values (one
    copy into this machine's order); rows without values and numbers wider than 64 bits
    are refused naming the column."""
    big = np.arange(6, dtype=">f4").reshape(3, 2)
    record, _ = sluice.loader.flatten({"x": big, "y": np.arange(3, dtype=">i8")})
    back = sluice.structured(record)
    assert back["x"].dtype.isnative and back["y"].dtype.isnative
    np.testing.assert_array_equal(back["x"], big)
    np.testing.assert_array_equal(back["y"], np.arange(3))
    rows = [np.arange(3, dtype=">f4"), np.arange(5, dtype=">f4")]
    record, _ = sluice.loader.flatten({"x": rows})
    for got, want in zip(sluice.structured(record)["x"], rows):
        assert got.dtype.isnative
        np.testing.assert_array_equal(got, want)
    with pytest.raises(ValueError, match="'x' has rows of shape \\[0\\]"):
        sluice.loader.flatten({"x": np.zeros((3, 0))})
    if hasattr(np, "float128"):
        with pytest.raises(TypeError, match="'x' is an array of float128"):
            sluice.loader.flatten({"x": np.zeros(3, dtype=np.float128)})


def one_batch_loader() -> Any:
    """A loader's factory, importable by trainers (``resumable=True``)."""
    return [np.arange(3)]


def test_an_iterator_cannot_be_published_for_more_than_one_epoch(topic: str) -> None:
    """A generator runs once: a second epoch would be empty, so more than one is refused
    before anything starts; ``epochs=None`` is one, as for ``sluice.Producer``."""
    with pytest.raises(ValueError, match="iterator, which runs once"):
        sluice.publish((np.arange(3) for _ in range(2)), topic, epochs=2)
    stats = sluice.publish((np.arange(3) for _ in range(2)), topic, epochs=None, linger=0)
    assert stats.batches == 2
    # Another iterator is found out when its second epoch comes empty: the run fails.
    with pytest.raises(ValueError, match="list_iterator is an iterator, which runs once"):
        sluice.publish(iter([np.arange(3)]), topic, epochs=2, linger=0)

    class Restarting:
        """An iterator whose ``__iter__`` starts over: one batch an epoch."""

        def __iter__(self) -> Any:
            self.left = 1
            return self

        def __next__(self) -> Any:
            if not self.left:
                raise StopIteration
            self.left -= 1
            return np.arange(3)

    assert sluice.publish(Restarting(), topic, epochs=3, linger=0).batches == 3

    # A factory (resumable) is checked once made: the function itself is no loader.
    assert sluice.publish(one_batch_loader, topic, epochs=2, linger=0, resumable=True).batches == 2


def _waiting_trainer(topic: str, run_python: Any) -> Any:
    """A trainer process waiting for ``topic`` (its interest registered), which prints
    ``told: …`` with the ``ProducerFailed`` it is told."""
    trainer = run_python(
        "import sys, sluice\n"
        "try:\n"
        "    list(sluice.subscribe(sys.argv[1], timeout=120))\n"
        "except sluice.ProducerFailed as e:\n"
        "    print('told:', e)\n",
        topic,
    )
    deadline = time.monotonic() + 60
    while waiting_subscribers(os.environ["SLUICE_NAMESPACE"], topic) < 1:
        assert time.monotonic() < deadline, "the trainer did not start waiting"
        time.sleep(0.01)
    return trainer


def test_a_loader_whose_topic_cannot_be_created_tells_its_waiting_trainer(
    topic: str, run_python: Any
) -> None:
    """Batches too large for the shared memory (here: room for a hundred million
    subscribers) fail the run before the topic exists; the trainer waiting for it hears
    why, instead of waiting for a topic that never comes."""
    trainer = _waiting_trainer(topic, run_python)
    with pytest.raises(sluice.SluiceError, match="shared memory"):
        sluice.publish([np.zeros((4, 1024))], topic, max_subscribers=100_000_000)
    out, err = trainer.communicate(timeout=60)
    assert "told:" in out and "shared memory" in out, (out, err)


SLOW_TRAINER = r"""
import sys, time, sluice
got = []
with sluice.subscribe(sys.argv[1], timeout=60) as sub:
    for epoch in sub.epochs():
        for batch in epoch:
            time.sleep(0.1)  # a training step
            got.append(int(sluice.structured(batch)[0][0]))
print(got, flush=True)
"""


class Growing:
    """A sequence-length curriculum: 8 sequences a batch, 32 to 2048 tokens long over 40
    batches; the topic's shared memory grows with them, each time a segment of its own."""

    def __iter__(self) -> Any:
        for i in range(40):
            n = int(32 * 64 ** (i / 39))
            yield [np.full(n - k, i, dtype=np.int64) for k in range(8)]


def test_a_slow_trainer_gets_every_batch_of_messages_that_grew_after_the_publisher_finished(
    topic: str, run_python: Any
) -> None:
    """The loader's 40 batches are all queued at once (a window of 64) and the trainer
    takes 4 s for them: the publisher, done at once, waits while the trainer still takes
    messages (it says so every 16 messages or 0.25 s, whichever comes first; the linger of
    2.5 s bounds a wait without that), so batches in segments the trainer had not mapped
    yet are not lost with it. (With every 16 alone, 1.6 s here, a loaded machine lost
    them.)"""
    trainer = run_python(SLOW_TRAINER, topic)
    stats = sluice.publish(
        Growing(), topic, min_subscribers=1, wait_timeout=60, linger=2.5, window=64
    )
    assert stats.batches == 40
    out, err = trainer.communicate(timeout=120)
    assert trainer.returncode == 0, err
    assert out.strip() == str(list(range(40)))


def test_what_a_batch_cannot_be_read_as_is_a_value_error_not_a_crash_or_an_import() -> None:
    """Two parts naming one column, and a namedtuple named by a topic's metadata that
    only a module's lazy import would find; an empty list beside rows stays one."""
    q = collections.namedtuple("Q", ["b"])
    with pytest.raises(ValueError, match="two parts of a batch make the column 'a.b'"):
        sluice.loader.flatten({"a": q(np.arange(2)), "a.b": np.array([0.5, 1.5])})
    images = (np.zeros((3, 4, 5)), np.ones((2, 6, 5)))
    record, _ = sluice.loader.flatten({"images": images, "extra": []})
    assert_same(sluice.structured(record), {"images": images, "extra": []})
    p = collections.namedtuple("P", ["x", "y"])
    _, structure = sluice.loader.flatten(p(1, 2))
    assert structure["lib"] == "list", "numbers alone stay a column, as before"
    record, structure = sluice.loader.flatten(named(0, 2))
    lazy = "numpy.f2py"
    if lazy in sys.modules:
        pytest.skip(f"{lazy} is imported already")
    structure["namedtuple"] = ["numpy", "f2py.Batch", ["images", "labels"]]
    metadata = {sluice.loader.STRUCTURE_KEY: json.dumps(structure).encode()}
    back = sluice.structured(record.replace_schema_metadata(metadata))
    assert back._fields == ("images", "labels") and lazy not in sys.modules


@pytest.mark.parametrize("structure", [
    [1, 2],                                                   # not an object
    {"col": "missing", "lib": "numpy", "dtype": "<f4", "shape": [2, 3]},
    {"tuple": [{"lib": "numpy"}]},                            # a leaf without a column
    {"rows": {"dict": [["x", 5]]}, "kind": "tuple"},
    {"tuple": "images"},
    {"dict": [["a"]]},
    {"tuple": [{"tuple": []}] * 3},                            # fewer values than rows
], ids=["list", "missing-column", "no-column", "rows-of-a-number", "tuple-of-a-string",
        "dict-item", "nested"])
def test_a_structure_that_does_not_fit_its_columns_is_a_value_error(structure: Any) -> None:
    """A batch's structure is data from the topic: whatever it says, reading the batch
    raises ValueError or gives a value, never another exception."""
    record, _ = sluice.loader.flatten(named(0, 4))
    metadata = {sluice.loader.STRUCTURE_KEY: json.dumps(structure).encode()}
    try:
        sluice.structured(record.replace_schema_metadata(metadata))
    except ValueError:
        pass


def test_a_structure_nested_past_the_interpreter_s_depth_is_a_value_error() -> None:
    record, _ = sluice.loader.flatten(named(0, 4))
    deep = '{"tuple": [' * 5000 + "]}" * 5000
    metadata = {sluice.loader.STRUCTURE_KEY: deep.encode()}
    with pytest.raises(ValueError):
        sluice.structured(record.replace_schema_metadata(metadata))


def test_a_list_of_arrays_of_one_shape_stays_a_list_of_columns() -> None:
    """Arrays of the same shape in a list are columns, as a loader's tuple is; rows of
    variable shape need one dtype and rank."""
    a, b = np.zeros((4, 2)), np.ones((4, 2))
    _, structure = sluice.loader.flatten([a, b])
    assert "list" in structure
    _, structure = sluice.loader.flatten([np.zeros(3), np.zeros(5)])
    assert structure.get("ragged") is True
    with pytest.raises(ValueError, match="as many rows"):
        sluice.loader.flatten([np.zeros(3), np.zeros((5, 1))])


def _publish_in_background(loader: Any, topic: str, **options: Any) -> Any:
    import threading

    done: dict[str, Any] = {}

    def run() -> None:
        try:
            done["stats"] = sluice.publish(loader, topic, **options)
        except BaseException as e:  # noqa: BLE001 - handed to the test
            done["error"] = e

    thread = threading.Thread(target=run)
    thread.start()
    return thread, done


def test_a_fed_topic_s_lag_limit_detaches_a_slow_trainer_or_lets_it_skip(topic: str) -> None:
    """``lag_limit`` on a topic fed by a loader: the producer waits for no one; a trainer
    that falls behind gets ``Lagged``, or with ``on_lag="skip"`` goes on with the gap
    counted; the loader's batches go out all the same."""
    import time

    class Counted(Loader):
        yielded = 0

        def __iter__(self) -> Any:
            for batch in super().__iter__():
                self.yielded += 1
                yield batch

    for on_lag in ("error", "skip"):
        loader = Counted(lambda i, n: np.arange(100 * i, 100 * i + n, dtype=np.int64), batches=80)
        name = f"{topic}-{on_lag}"
        thread, done = _publish_in_background(loader, name, min_subscribers=1, lag_limit=2,
                                              window=2, wait_timeout=60, linger=2)
        with sluice.subscribe(name, timeout=30, on_lag=on_lag) as sub:
            first = next(sub)
            del first
            # The producer does not wait for this trainer: the loader runs to its end
            # (only the epoch's end waits for the trainer's queue).
            deadline = time.monotonic() + 60
            while loader.yielded < 80:
                assert time.monotonic() < deadline, loader.yielded
                time.sleep(0.01)
            if on_lag == "error":
                with pytest.raises(sluice.Lagged):
                    for batch in sub:
                        del batch
            else:
                rows = 16 + sum(len(b) for b in sub)
                summary = sub.last_epoch
                assert rows < 80 * 16 and summary.missed > 0 and not summary.complete
        thread.join(60)
        assert done["stats"].batches == 80, done


def test_a_fed_topic_s_max_held_copies_or_refuses_batches_held_beyond_it(topic: str) -> None:
    """``max_held`` on a topic fed by a loader: a trainer that keeps more batches than it
    may hold gets ``TransportError`` with ``on_max_held="error"`` (losing nothing), and
    private copies by default."""
    loader = Loader(lambda i, n: np.arange(100 * i, 100 * i + n, dtype=np.int64), batches=10)
    for mode in ("error", "copy"):
        name = f"{topic}-{mode}"
        thread, done = _publish_in_background(loader, name, min_subscribers=1, max_held=3,
                                              wait_timeout=60)
        ids: list[int] = []
        with sluice.subscribe(name, timeout=30, on_max_held=mode) as sub:
            held = []
            if mode == "error":
                with pytest.raises(sluice.TransportError, match="max_held = 3"):
                    for batch in sub:
                        held.append(batch)
                copies = [b.copy() for b in held]
                del held, batch
                ids += [int(i) for b in copies for i in np.asarray(sluice.structured(b))]
                held = copies
            for batch in sub:
                # Under "error" a trainer copies what it keeps; by default Sluice does.
                held.append(batch.copy() if mode == "error" else batch)
                ids += [int(i) for i in np.asarray(sluice.structured(batch))]
            del batch
            assert mode == "error" or sum(b.shm_range is None for b in held) >= len(held) - 3
            del held
        thread.join(60)
        assert "error" not in done, done
        assert ids == [v for b in loader for v in b.tolist()]


def test_a_loader_runs_as_a_producer_with_a_plan_s_interface(topic: str) -> None:
    """``sluice.Producer(loader, topic=…)``: the loader published from a thread of this
    process, with a plan producer's interface (progress, wait, a ``with`` block that
    waits, a clear error for settings that do not apply)."""
    batches = [np.arange(i * 10, i * 10 + 10, dtype=np.int64) for i in range(20)]
    with pytest.raises(ValueError, match="topic"):
        sluice.Producer(batches)
    with pytest.raises(TypeError, match="batch_rows"):
        sluice.Producer(batches, topic=topic, batch_rows=5)
    with pytest.raises(TypeError, match="settings of a loader"):
        sluice.Producer("pipelines/demo.sql", window=2)
    got: list[list[int]] = [[], []]
    with sluice.Producer(batches, topic=topic, epochs=2, min_subscribers=1, window=4) as producer:
        assert (producer.topic, producer.plan_file, producer.epochs) == (topic, None, 2)
        with sluice.subscribe(topic, timeout=60) as sub:
            for batch in sub:
                got[batch.epoch].extend(int(i) for i in sluice.structured(batch))
    assert got == [list(range(200))] * 2
    assert producer.wait().rows == 400 and not producer.running
    assert producer.progress["rows"] == 400


def test_a_loader_producer_closes_while_its_trainer_reads_nothing(topic: str) -> None:
    """``close()`` stops a loader's run even while it waits for a trainer that reads
    nothing; the trainer is told the run ended. A loader's exception is raised by
    ``wait()``."""

    class Endless:
        def __iter__(self):
            i = 0
            while True:
                yield np.arange(i, i + 10, dtype=np.int64)
                i += 10

    producer = sluice.Producer(Endless(), topic=topic, min_subscribers=1, window=2)
    sub = sluice.subscribe(topic, timeout=60)
    next(iter(sub))
    producer.close()
    assert not producer.running
    # "stopped", or lost where its queue was full then (a stopping producer waits for
    # no one): docs/python.md, "Produce".
    with pytest.raises((sluice.ProducerFailed, sluice.ProducerLost)):
        for _ in sub:
            pass
    sub.close()

    class Failing:
        def __iter__(self):
            yield np.arange(10, dtype=np.int64)
            raise KeyError("no such image")

    failing = sluice.Producer(Failing(), topic=topic + "f", wait_timeout=60)
    with pytest.raises(KeyError, match="no such image"):
        failing.wait(60)


def test_lists_of_numbers_or_strings_become_what_pyarrow_makes_of_them() -> None:
    """A loader's lists go to Arrow through numpy (pyarrow's own conversion looks for
    pandas on every call and loses a Ctrl-C landing there): the same arrays, and the same
    refusals, as ``pyarrow.array(list)``."""
    from sluice.loader import _scalars

    cases = [[1, 2], [True, False], [1.5, float("nan")], [1, 2.5], ["a\x00", "", "é"],
             [2**63 + 1, 1], [-1, 2**63], [2**63], [2**70], ["a", 1]]
    for values in cases:
        try:
            expected = pa.array(values)
        except (pa.ArrowException, OverflowError, TypeError) as e:
            with pytest.raises(type(e)):
                _scalars(values)
            continue
        got = _scalars(values)
        assert got.type == expected.type and got.to_pylist()[:1] == expected.to_pylist()[:1], values
        assert str(got) == str(expected), values


class Padded:
    """Token ids padded to each batch's longest row (Hugging Face's
    `DataCollatorWithPadding`): `(B, L)` with L of its own per batch."""

    batch_size = 4

    def __iter__(self) -> Any:
        for i in range(5):
            rows, length = (4 if i < 4 else 2), 3 + 2 * i
            yield {
                "input_ids": np.full((rows, length), i, dtype=np.int64),
                "attention_mask": np.ones((rows, length), dtype=np.bool_),
                "label": np.arange(rows),
            }


def test_batches_padded_to_their_own_length_reach_a_trainer_of_the_loader_s_batches(
    topic: str, tmp_path: Path, run_python: Any
) -> None:
    """One structure whatever each batch's padded length: a trainer of the loader's
    batches gets each as it was; one of its own batch size is told to keep them, since
    rows of two lengths make no tensor."""
    loader = Padded()
    _, received = shared_to(loader, ["none"], topic, tmp_path, run_python)
    (batches,) = received["none"]
    expected = list(loader)
    assert len(batches) == len(expected)
    for k, (got, want) in enumerate(zip(batches, expected)):
        assert_same(got, want, f"batch {k}")
    thread, done = _publish_in_background(loader, f"{topic}-own", min_subscribers=1, wait_timeout=60)
    with sluice.subscribe(f"{topic}-own", batch_size=3, timeout=60) as sub:
        with pytest.raises(sluice.SluiceError, match="keep the producer's batches"):
            for epoch in sub.epochs():
                for _ in epoch:
                    pass
    thread.join(timeout=60)
    assert not thread.is_alive()


def test_later_batches_read_as_the_first_where_they_can_and_ranks_do_not_change() -> None:
    """A loader of token sequences of their own lengths whose last batch is one sequence,
    or sequences of one length, keeps its rows of variable shape; a column whose rank
    changes (labels (B,) then (B, 1)) is another structure, not a padded length."""
    _, first = sluice.loader.flatten([np.arange(3), np.arange(5)])
    for later in ([np.arange(7)], [np.arange(4), np.arange(4)]):
        record, structure = sluice.loader.flatten(later, like=first)
        assert structure == first and record.num_rows == len(later)
        assert_same(sluice.structured(record), later)
    x = np.zeros((4, 3), dtype=np.float32)
    _, flat = sluice.loader.flatten((x, np.arange(4)))
    with pytest.raises(ValueError, match="another structure"):
        sluice.loader.flatten((x, np.arange(4).reshape(4, 1)), like=flat)


def _counted(topic: str, want: tuple[int, int]) -> tuple[Any, Any]:
    """``sluice.epoch_size(topic)`` once it is ``want`` (reports are rewritten every
    250 ms), or what it is after 10 s."""
    import time

    deadline = time.monotonic() + 10
    size = sluice.epoch_size(topic, timeout=30)
    while size != want and time.monotonic() < deadline:
        time.sleep(0.05)
        size = sluice.epoch_size(topic, timeout=30)
    return size


def test_an_epoch_s_size_is_the_loader_s_word_until_an_epoch_is_counted(topic: str, ns: str) -> None:
    """What trainers' ``len()`` reads: a loader's ``len()`` before its first epoch ends
    (a list of batches says nothing of its rows), then the epoch as published."""
    with pytest.raises(sluice.Timeout, match="no producer of topic"):
        sluice.epoch_size(topic, timeout=0.3)
    with pytest.raises(ValueError, match="remote topic"):
        sluice.epoch_size("flight://127.0.0.1:1/t")
    loader = [np.full((n, 2), i, np.float32) for i, n in enumerate([8, 8, 8, 3])]
    producer = sluice.Producer(loader, topic=topic, epochs=2, min_subscribers=1)
    assert sluice.epoch_size(topic, timeout=30) == (4, None)
    with sluice.subscribe(topic, timeout=30) as sub:
        epochs = sub.epochs()
        assert [b.num_rows for b in next(epochs)] == [8, 8, 8, 3]
        assert _counted(topic, (4, 27)) == (4, 27)
        assert sum(1 for _ in next(epochs)) == 4
    producer.wait(timeout=30)


def test_a_plan_s_epoch_size_is_known_once_its_first_epoch_ended(plans: Any) -> None:
    producer = sluice.Producer(plans.plan(rows=230, batch_rows=50, epochs=2), min_subscribers=1)
    assert sluice.epoch_size(plans.topic, timeout=30) == (None, None)
    with sluice.subscribe(plans.topic, timeout=30) as sub:
        epochs = sub.epochs()
        assert sum(b.num_rows for b in next(epochs)) == 230
        assert _counted(plans.topic, (5, 230)) == (5, 230)
        for _ in next(epochs):
            pass
    producer.wait(timeout=30)


def test_a_batch_of_some_columns_is_refused_naming_what_it_lacks() -> None:
    """A subscriber that named ``columns=`` gets batches without the loader's other
    columns: rebuilding the loader's structure from one says which column is missing and
    why, not a KeyError."""
    record, _ = sluice.loader.flatten({"img": np.zeros((2, 3)), "label": np.arange(2)})
    some = record.select(["label"])
    assert sluice.loader.STRUCTURE_KEY in (some.schema.metadata or {})
    with pytest.raises(ValueError, match="no column 'img' of its loader's structure: a subscriber that names columns="):
        sluice.structured(some)


def test_the_size_of_an_epoch_of_a_loader_that_failed_in_this_process_is_its_failure(topic: str) -> None:
    """A loader that fails at its first batch reports no size: ``epoch_size`` (and with it
    a ``SharedLoader``'s ``len()``) raises the failure as a subscription would, rather than
    waiting for a report that never comes."""

    class Failing:
        def __len__(self) -> int:
            return 2

        def __iter__(self) -> Any:
            raise RuntimeError("no such shard")
            yield  # a generator function

    producer = sluice.Producer(Failing(), topic=topic, min_subscribers=0)
    with pytest.raises(sluice.ProducerFailed, match="no such shard"):
        sluice.epoch_size(topic, timeout=60)
    with pytest.raises(RuntimeError, match="no such shard"):
        producer.wait(timeout=60)


def test_a_loaders_device_is_checked_and_a_gpu_topic_without_a_gpu_tells_its_trainer(
    topic: str, run_python: Any
) -> None:
    """``publish(device=…)`` takes a plan's device names (and a ``torch.device``); on a
    machine without a GPU a ``cuda:N`` run fails before its topic exists, saying so, and
    the trainer waiting for it is told the same (test_gpu.py runs the topic on a GPU)."""
    batches = [np.zeros((4, 3), np.float32)]
    with pytest.raises(ValueError, match="'cpu', 'cuda:N' or 'cuda_host:N'"):
        sluice.publish(batches, topic, device="gpu")
    with pytest.raises(TypeError, match="torch.device"):
        sluice.publish(batches, topic, device=0)
    with pytest.raises(ValueError, match="'cuda:N'"):
        sluice.Producer(batches, topic=topic, device="cuda")
    if cuda_driver_present():
        pytest.skip("this machine has a CUDA driver: test_gpu.py publishes to its GPU")
    trainer = _waiting_trainer(topic, run_python)
    for device in ("cuda:0", "cuda_host:0"):
        with pytest.raises(sluice.SluiceError, match="no CUDA driver found"):
            sluice.publish(batches, topic, device=device)
    out, err = trainer.communicate(timeout=60)
    assert "told:" in out and "no CUDA driver found" in out, (out, err)


def test_arrow_batches_whose_columns_change_fail_a_stream_reader_not_the_run(topic: str) -> None:
    """A loader's Arrow batches of other columns go out as they are: a subscriber that
    reads batches gets each as it is, one that reads the topic as one Arrow stream gets
    an error where the columns change (it read them as the first one's: garbage, or a
    crash in polars)."""
    loader = [pa.record_batch({"a": pa.array(["x", "y"])}), pa.record_batch({"a": pa.array([1, 2])})]
    producer = sluice.Producer(loader, topic=topic, epochs=1, min_subscribers=2)
    batches = sluice.subscribe(topic, timeout=60)
    stream = sluice.subscribe(topic, timeout=60)
    types = [str(pa.record_batch(b).schema.field("a").type) for b in batches]
    assert types == ["string", "int64"]
    with pytest.raises(Exception, match="changed their columns"):
        pa.table(stream)
    producer.wait(timeout=60)


FORKED_CHILD = """
import os, sys, numpy as np, sluice
producer = sluice.Producer([{"id": np.arange(10)}] * 100, topic=sys.argv[1], epochs=1, min_subscribers=1)
pid = os.fork()
if pid == 0:
    for use in (producer.close, producer.wait):
        try:
            use()
            os._exit(1)
        except sluice.TransportError as e:
            assert "forked child" in str(e), e
    os._exit(0)
_, status = os.waitpid(pid, 0)
print("child", os.waitstatus_to_exitcode(status), flush=True)
producer.close()
"""


def test_a_loader_producer_used_in_a_forked_child_is_refused_not_a_hang(topic: str, run_python: Any) -> None:
    """``close()`` and ``wait()`` of a loader's producer in a forked child raise
    ``TransportError`` (``close()`` waited for good for a run thread the child does not
    have)."""
    child = run_python(FORKED_CHILD, topic)
    out, err = child.communicate(timeout=60)
    assert child.returncode == 0 and "child 0" in out, (out, err)


INTERRUPTED_WAIT = """
import os, signal, sys, threading, time, numpy as np, sluice
class Slow:
    def __iter__(self):
        for i in range(100):
            time.sleep(0.01)
            yield {"id": np.arange(i * 10, (i + 1) * 10)}
producer = sluice.Producer(Slow(), topic=sys.argv[1], epochs=1)
threading.Timer(0.3, lambda: os.kill(os.getpid(), signal.SIGINT)).start()
try:
    producer.wait()
    print("not interrupted", flush=True)
except KeyboardInterrupt:
    print("interrupted; running", producer.running, flush=True)
print("rows", producer.wait(timeout=60).rows, flush=True)
"""


def test_ctrl_c_in_wait_leaves_a_loader_producer_running(topic: str, run_python: Any) -> None:
    """Ctrl-C in ``wait()`` interrupts the wait, not the run: the producer says it runs,
    and a later ``wait()`` gets every row (it said the run was closed, mid-epoch)."""
    child = run_python(INTERRUPTED_WAIT, topic)
    out, err = child.communicate(timeout=90)
    assert "interrupted; running True" in out and "rows 1000" in out, (out, err)


def test_epoch_size_checks_its_timeout(ns: str) -> None:
    for bad in (float("nan"), -1):
        with pytest.raises(ValueError, match="timeout"):
            sluice.epoch_size("t", timeout=bad)
    with pytest.raises(TypeError, match="timeout"):
        sluice.epoch_size("t", timeout="1")
