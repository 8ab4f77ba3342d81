"""GPU path tests: producers with ``sluice.device = 'cuda:0'`` or ``'cuda_host:0'`` and
subscriber processes.

These need an NVIDIA GPU, its driver, and (for some) PyTorch. Where the driver is missing
(the development machine, CI) every test here is skipped with the reason
"no CUDA driver: ..."; ``scripts/gpu-check.sh`` runs them on a GPU machine.

They are written against the GPU subscriber surface described in docs/gpu.md
(``sluice.DeviceBatch``; columns with ``__dlpack_device__() == (kDLCUDA=2, ordinal)``;
``sluice.Batch.to_device`` for ``cuda_host`` topics). ``scripts/gpu-check.sh`` runs them on
the GPU machine of the device tool (an H100 on 2026-11-25, an H200 on 2026-11-26:
docs/gpu.md).
"""

from __future__ import annotations

import hashlib
import json
import os
import pickle
import queue
import signal
import subprocess
import sys
import threading
import time
from pathlib import Path

import pytest
from helpers import cuda_driver_present

# JAX takes 75 % of the GPU when it starts unless told otherwise; the other processes of
# these tests need memory too.
os.environ.setdefault("XLA_PYTHON_CLIENT_PREALLOCATE", "false")


pytestmark = pytest.mark.skipif(
    not cuda_driver_present(),
    reason="no CUDA driver: libcuda.so not loadable; skipped the GPU tests (checksum vs CPU path, "
    "4 subscribers, subscriber killed mid-stream, torch consumers of different batch sizes, "
    "subscriber holding batches, release versus completion, CuPy/JAX, Arrow C Device, "
    "producer killed while trainers hold tensors (ProducerLost, never garbage, restart and "
    "reconnect), a trainer holding a dead producer's device batch reconnecting to its "
    "successor, cuda_host to_device with the CPU path's rows and private writes, cuda_host "
    "holding samples only until the copy completes, sluice.torch with device='cuda', "
    "subscribers and sluice.torch naming their columns on GPU topics, device views kept after "
    "their subscriber left never changing)",
)

import sluice  # noqa: E402

KDL_CUDA = 2
GPU = "SET sluice.device = 'cuda:0';\n"
HOST = "SET sluice.device = 'cuda_host:0';\n"
NUMERIC = "SELECT id, x, vec FROM t"


def _ids_on_gpu(batch) -> list[int]:
    col = batch["id"]
    assert col.__dlpack_device__() == (KDL_CUDA, 0)
    cai = col.__cuda_array_interface__
    assert cai["shape"] == (len(col),)
    torch = pytest.importorskip("torch", reason="torch is needed to read CUDA columns back")
    return torch.from_dlpack(col).cpu().tolist()


def _host_digests(batch) -> dict[str, str]:
    import numpy as np

    return {name: hashlib.sha256(np.ascontiguousarray(np.asarray(batch[name])).tobytes()).hexdigest()
            for name in ("id", "x", "vec")}


def _device_digests(batch) -> dict[str, str]:
    torch = pytest.importorskip("torch", reason="torch is needed to read CUDA columns back")
    return {name: hashlib.sha256(torch.from_dlpack(batch[name]).cpu().numpy().tobytes()).hexdigest()
            for name in ("id", "x", "vec")}


def test_gpu_batches_carry_the_same_bytes_as_the_cpu_path(plans):
    """The same plan on ``cpu`` and on ``cuda:0``: every batch, at the same position, has
    the same bytes in every column (sha256 of the host buffers against sha256 of the
    device buffers copied back)."""
    cpu_plan = plans.plan(rows=1000, batch_rows=128, select=NUMERIC, name="cpu.sql")
    producer = sluice.Producer(cpu_plan, min_subscribers=1)
    on_cpu = {}
    for batch in sluice.subscribe(plans.topic, timeout=60):
        assert isinstance(batch, sluice.Batch), type(batch)
        on_cpu[(batch.epoch, batch.index)] = _host_digests(batch)
        del batch
    producer.wait(timeout=60)

    gpu_plan = plans.plan(rows=1000, batch_rows=128, extra=GPU, select=NUMERIC, name="gpu.sql")
    producer = sluice.Producer(gpu_plan, min_subscribers=1)
    on_gpu = {}
    ids = []
    for batch in sluice.subscribe(plans.topic, timeout=60):
        assert isinstance(batch, sluice.DeviceBatch), type(batch)
        ids += _ids_on_gpu(batch)
        on_gpu[(batch.epoch, batch.index)] = _device_digests(batch)
        del batch
    producer.wait(timeout=60)
    assert sorted(ids) == list(range(1000))
    assert len(on_cpu) == 8
    assert on_gpu == on_cpu


# Each child subscribes with its own batch size, keeps nothing, and checks every row once
# and the sums of x and vec computed on the GPU.
_SIZED = r'''
import sys, sluice, torch
topic, batch_size, rows = sys.argv[1], int(sys.argv[2]), int(sys.argv[3])
ids, x_sum, vec_sum, sizes = [], 0.0, 0.0, set()
for b in sluice.subscribe(topic, batch_size=batch_size, timeout=60):
    ids += torch.from_dlpack(b["id"]).cpu().tolist()
    x_sum += float(torch.from_dlpack(b["x"]).sum())
    vec_sum += float(torch.from_dlpack(b["vec"]).double().sum())
    sizes.add(len(b))
assert sorted(ids) == list(range(rows)), len(ids)
assert x_sum == sum(i * 0.5 for i in range(rows)), x_sum
assert vec_sum == sum(4 * i + 6 for i in range(rows)), vec_sum
assert max(sizes) == min(batch_size, rows), sizes
print("ok", batch_size, len(ids), flush=True)
'''


def test_four_subscriber_processes_with_different_batch_sizes_each_receive_every_row(
        plans, run_python):
    pytest.importorskip("torch")
    rows = 2000
    producer = sluice.Producer(plans.plan(rows=rows, batch_rows=100, extra=GPU, select=NUMERIC),
                               min_subscribers=4)
    procs = [run_python(_SIZED, plans.topic, str(size), str(rows)) for size in (1, 37, 100, 256)]
    for p in procs:
        code = p.wait(timeout=180)
        assert code == 0, p.stderr.read()
        assert p.stdout.read().startswith("ok")
    producer.wait(timeout=60)


# Holds the tensors of its first three batches, says so, and waits to be killed.
_HOLD_AND_WAIT = r'''
import sys, time, sluice, torch
held = []
for b in sluice.subscribe(sys.argv[1], timeout=60):
    held.append({name: torch.from_dlpack(b[name]) for name in ("id", "vec")})
    torch.cuda.synchronize()
    if len(held) == 3:
        print("holding", flush=True)
        time.sleep(600)
'''


def test_a_subscriber_killed_while_holding_device_tensors_does_not_stall_the_others(
        plans, run_python):
    """A subscriber process holds torch tensors of three batches (their slots stay
    pinned) and is SIGKILLed; the other subscriber still receives every row and the
    producer reclaims the dead one's slots and exits."""
    pytest.importorskip("torch")
    rows = 4000
    producer = sluice.Producer(
        plans.plan(rows=rows, batch_rows=100, extra=GPU + "SET sluice.window = 4;\n",
                   select=NUMERIC),
        min_subscribers=2)
    holder = _Child(run_python(_HOLD_AND_WAIT, plans.topic))
    ids = []
    for i, batch in enumerate(sluice.subscribe(plans.topic, timeout=60)):
        if i == 0:
            holder.expect("holding", 60)
            holder.process.kill()
            holder.finish(10)
        ids += _ids_on_gpu(batch)
        del batch
    assert sorted(ids) == list(range(rows))
    producer.wait(timeout=60)


@pytest.mark.parametrize("batch_size", [1, 37, 100, 256])
def test_torch_consumers_of_any_batch_size_see_every_row(plans, batch_size):
    torch = pytest.importorskip("torch")
    producer = sluice.Producer(plans.plan(rows=1000, batch_rows=100, extra=GPU, select=NUMERIC),
                               min_subscribers=1)
    ids = []
    for batch in sluice.subscribe(plans.topic, batch_size=batch_size, timeout=60):
        t = torch.from_dlpack(batch["id"])
        assert t.is_cuda and len(t) <= batch_size
        ids += t.cpu().tolist()
    producer.wait(timeout=60)
    assert sorted(ids) == list(range(1000))


def test_a_subscriber_holding_batches_is_never_overwritten(plans):
    torch = pytest.importorskip("torch")
    # Three batches held, the loop's current one and the next it receives: 5 samples.
    producer = sluice.Producer(plans.plan(rows=3000, batch_rows=100, select=NUMERIC,
                                          extra=GPU + "SET sluice.max_held = 6;\n"),
                               min_subscribers=1)
    held = []
    for i, batch in enumerate(sluice.subscribe(plans.topic, timeout=60)):
        t = torch.from_dlpack(batch["id"])
        if i < 3:
            held.append((t, t.cpu().clone()))
    for tensor, copy in held:
        assert torch.equal(tensor.cpu(), copy), "a held GPU batch was overwritten"
    producer.wait(timeout=60)


def test_a_tensor_dropped_while_a_kernel_reads_it_is_not_overwritten(plans):
    """The race of release versus completion: with a window of one message the producer
    reuses slots as soon as they come back, and each tensor is dropped right after a long
    kernel and a read were queued on it. Its slot must come back only after the read ran."""
    torch = pytest.importorskip("torch")
    producer = sluice.Producer(
        plans.plan(rows=2000, batch_rows=100, extra=GPU + "SET sluice.window = 1;\n",
                   select=NUMERIC),
        min_subscribers=1)
    sums = []
    for batch in sluice.subscribe(plans.topic, timeout=60):
        t = torch.from_dlpack(batch["id"])
        torch.cuda._sleep(20_000_000)  # GPU cycles queued before the read
        sums.append(t.sum())
        del t, batch
    torch.cuda.synchronize()
    producer.wait(timeout=60)
    assert sum(int(s) for s in sums) == sum(range(2000))


def test_torch_cupy_and_jax_take_columns_without_a_copy(plans):
    """Zero copy, checked by pointer: the tensor that torch, CuPy and JAX each build from a
    column starts at the column's device address (``__cuda_array_interface__``), which
    lies in the producer's slot; the values are the published ones. JAX takes the float32
    ``vec`` column: with 64-bit types disabled (its default) it converts int64 to int32,
    which is a copy."""
    torch = pytest.importorskip("torch")
    producer = sluice.Producer(plans.plan(rows=500, batch_rows=100, extra=GPU, select=NUMERIC),
                               min_subscribers=1)
    try:
        import cupy
    except ImportError:
        cupy = None
    try:
        import jax
        import jax.dlpack
    except ImportError:
        jax = None
    ids, seen = [], {"torch": 0, "cupy": 0, "jax": 0}
    for batch in sluice.subscribe(plans.topic, timeout=60):
        assert batch.producer_batches == 1
        col = batch["id"]
        cai = col.__cuda_array_interface__
        assert cai["version"] == 3 and cai["shape"] == (len(col),)
        address = cai["data"][0]
        t = torch.from_dlpack(col)
        assert t.data_ptr() == address
        seen["torch"] += 1
        values = t.cpu().tolist()
        if cupy is not None:
            a = cupy.from_dlpack(col)
            assert a.data.ptr == address
            assert cupy.asnumpy(a).tolist() == values
            seen["cupy"] += 1
        if jax is not None:
            # float32: JAX without jax_enable_x64 converts int64 to int32, a copy.
            vec = batch["vec"]
            x = jax.dlpack.from_dlpack(vec)
            assert list(x.devices())[0].platform == "gpu"
            assert x.unsafe_buffer_pointer() == vec.__cuda_array_interface__["data"][0]
            assert x.shape == (len(values), 4)
            assert x.tolist() == torch.from_dlpack(vec).cpu().tolist()
            seen["jax"] += 1
        ids += values
        del t, col, batch
    producer.wait(timeout=60)
    assert sorted(ids) == list(range(500))
    print("zero-copy imports:", seen, file=sys.stderr)
    if cupy is None or jax is None:
        pytest.skip(f"CuPy or JAX missing; torch checked: {seen}")


def test_columns_and_batches_export_arrow_c_device_arrays_on_cuda(plans):
    """The capsules of the Arrow C Device interface: struct layout checked through the
    ArrowDeviceArray fields (device type 2 = ARROW_DEVICE_CUDA, a non-null sync_event)."""
    import ctypes

    producer = sluice.Producer(plans.plan(rows=200, batch_rows=100, extra=GPU,
                                          select="SELECT id, x FROM t"), min_subscribers=1)
    get = ctypes.pythonapi.PyCapsule_GetPointer
    get.restype = ctypes.c_void_p
    get.argtypes = [ctypes.py_object, ctypes.c_char_p]
    for batch in sluice.subscribe(plans.topic, timeout=60):
        for obj in (batch, batch["id"]):
            schema, array = obj.__arrow_c_device_array__()
            ptr = get(array, b"arrow_device_array")
            device_id = ctypes.c_int64.from_address(ptr + 80).value
            device_type = ctypes.c_int32.from_address(ptr + 88).value
            sync_event = ctypes.c_void_p.from_address(ptr + 96).value
            assert (device_type, device_id) == (2, batch.__dlpack_device__()[1])
            assert sync_event
    producer.wait(timeout=60)


def test_the_rust_two_process_ipc_test_passes():
    """Runs the prebuilt Rust GPU test binary (scripts/gpu-check.sh sets its path)."""
    import os

    binary = os.environ.get("SLUICE_GPU_IPC_TEST")
    if not binary:
        pytest.skip("SLUICE_GPU_IPC_TEST not set (scripts/gpu-check.sh sets it)")
    out = subprocess.run([binary, "--nocapture"], capture_output=True, text=True, timeout=300)
    assert out.returncode == 0, out.stdout + out.stderr
    assert "SKIPPED" not in out.stderr, out.stderr
    print(out.stdout, out.stderr, file=sys.stderr)


# --- Helpers for tests that drive child processes step by step --------------------------


class _Child:
    """A child process (from the ``run_python`` fixture) whose stdout and stderr are read
    on threads: a test waits for a line with a time limit, so a hung child fails the test
    with what it printed instead of blocking it, and a child that writes much to stderr
    never blocks on a full pipe."""

    def __init__(self, process: subprocess.Popen[str]) -> None:
        self.process = process
        self._lines: queue.Queue[str | None] = queue.Queue()
        self._stderr: list[str] = []
        self._threads = [
            threading.Thread(target=self._pump, args=(process.stdout, self._lines.put), daemon=True),
            threading.Thread(target=self._pump, args=(process.stderr, self._stderr.append),
                             daemon=True),
        ]
        for thread in self._threads:
            thread.start()

    @staticmethod
    def _pump(stream, put) -> None:
        try:
            for line in stream:
                put(line.rstrip("\n"))
        except (ValueError, OSError):  # the fixture closed the pipe at the end of the test
            pass
        put(None)

    def stderr(self) -> str:
        return "\n".join(line for line in self._stderr[-60:] if line is not None)

    def expect(self, word: str, timeout: float) -> str:
        """The rest of the next stdout line that starts with ``word`` (other lines are
        skipped); fails the test if none comes within ``timeout`` seconds."""
        deadline = time.monotonic() + timeout
        while True:
            left = deadline - time.monotonic()
            try:
                line = self._lines.get(timeout=max(left, 0.001))
            except queue.Empty:
                pytest.fail(f"no '{word}' line from the child within {timeout} s; "
                            f"its stderr:\n{self.stderr()}")
            if line is None:
                self.process.wait(10)
                pytest.fail(f"the child exited with code {self.process.returncode} before "
                            f"printing '{word}'; its stderr:\n{self.stderr()}")
            if line == word or line.startswith(word + " "):
                return line[len(word) + 1:]

    def finish(self, timeout: float) -> int:
        """Waits for the child to exit (killing it after ``timeout`` seconds)."""
        try:
            code = self.process.wait(timeout)
        except subprocess.TimeoutExpired:
            self.process.kill()
            self.process.wait(10)
            pytest.fail(f"the child did not exit within {timeout} s; its stderr:\n{self.stderr()}")
        for thread in self._threads:
            thread.join(5)
        return code


def _wait_until_stopped(pid: int, timeout: float = 10) -> None:
    """Waits until the kernel reports ``pid`` stopped (state T in /proc/PID/stat): a
    SIGSTOP is delivered asynchronously, and the test must know that nothing more can be
    published before it tells the subscribers."""
    deadline = time.monotonic() + timeout
    while time.monotonic() < deadline:
        stat = Path(f"/proc/{pid}/stat").read_text()
        if stat.rsplit(")", 1)[1].split()[0] in ("T", "t"):
            return
        time.sleep(0.005)
    pytest.fail(f"process {pid} did not stop within {timeout} s")


def _cuda_error_is_clear(kind: str, message: str) -> bool:
    """Whether an exception raised when reading a held tensor says what went wrong: a
    Sluice error, or torch's RuntimeError (or its AcceleratorError subclass) carrying a
    CUDA error."""
    sluice_errors = {cls.__name__ for cls in (sluice.SluiceError, *sluice.SluiceError.__subclasses__())}
    return kind in sluice_errors or "cuda" in message.lower()


# --- A producer killed while trainers hold its tensors -----------------------------------

# Starts the producer and says so; it is killed with SIGKILL by the test.
# Arguments: the plan, then the subscribers to wait for (default 2).
_PRODUCER = (
    "import sys, sluice\n"
    "p = sluice.Producer(sys.argv[1], min_subscribers=int(sys.argv[2]) if len(sys.argv) > 2 else 2)\n"
    "print('started', flush=True)\n"
    "p.wait()\n"
)

# A trainer that keeps the tensors of every batch it takes. It talks to the test through
# stdout lines and waits for marker files: "stopped" (the producer is stopped with
# SIGSTOP, so it publishes nothing more) and "killed" (the producer is dead and reaped).
_HOLDER = r'''
import hashlib, json, os, sys, time
import sluice, torch

topic, stopped, killed, rows = sys.argv[1], sys.argv[2], sys.argv[3], int(sys.argv[4])
torch.zeros(1, device="cuda")  # torch's CUDA context first, so that it times nothing below
torch.cuda.synchronize()


def digest(tensor):
    return hashlib.sha256(tensor.cpu().numpy().tobytes()).hexdigest()


def wait_for(path):
    deadline = time.monotonic() + 60
    while not os.path.exists(path):
        if time.monotonic() > deadline:
            sys.exit(f"{path} did not appear within 60 s")
        time.sleep(0.01)


held = []  # (position, {column: tensor}, {column: digest when received})


def take(batch):
    tensors = {name: torch.from_dlpack(batch[name]) for name in ("id", "vec")}
    ids = tensors["id"].cpu().tolist()
    assert ids and all(0 <= i < rows for i in ids), ids
    held.append(([batch.epoch, batch.index], tensors,
                 {name: digest(t) for name, t in tensors.items()}))


sub = sluice.subscribe(topic, timeout=3)
deadline = time.monotonic() + 60
while len(held) < 3:  # the producer starts once both subscribers have attached
    try:
        batch = next(sub)
    except sluice.Timeout:
        if time.monotonic() > deadline:
            raise
        continue
    take(batch)
    del batch
print("held", len(held), flush=True)

# The producer is now stopped: take what it had published (up to the window), so that
# nothing of it waits in this subscriber's queue when it dies. Three seconds without a
# message, all after the stop, mean the queue is empty.
wait_for(stopped)
while True:
    try:
        batch = next(sub)
    except sluice.Timeout:
        break
    take(batch)
    del batch
print("drained", len(held), flush=True)

wait_for(killed)
start = time.monotonic()
outcome, message = None, ""
while outcome is None:
    try:
        batch = next(sub)
        outcome = f"a batch ({batch.epoch}, {batch.index}) after the producer was killed"
        del batch
    except StopIteration:
        outcome = "the stream ended instead"
    except sluice.ProducerLost as error:
        outcome, message = "ProducerLost", str(error)
    except sluice.Timeout:
        if time.monotonic() - start > 30:
            outcome = "no ProducerLost within 30 s"
    except Exception as error:
        outcome = f"{type(error).__name__}: {error}"
lost_after = time.monotonic() - start


def check():
    verdicts = []
    for position, tensors, digests in held:
        for name, tensor in tensors.items():
            try:
                now = digest(tensor)
            except Exception as error:  # a CUDA error surfaced as a Python exception
                verdicts.append([position, name, "error", type(error).__name__, str(error)[:400]])
            else:
                verdicts.append([position, name, "same" if now == digests[name] else "changed",
                                 "", ""])
    return verdicts


after_loss = check()
# Allocate and fill 2 GiB, as a trainer goes on allocating: if the dead producer's pages
# had gone back to the driver while still mapped here, they could be handed out again
# now, and reading the held tensors would show this pattern.
try:
    filler = torch.full((1 << 28,), 0x5A5A5A5A, dtype=torch.int64, device="cuda")
    torch.cuda.synchronize()
    filled = "ok"
except Exception as error:
    filled = f"{type(error).__name__}: {error}"[:400]
after_reuse = check()
print("result", json.dumps({
    "outcome": outcome, "message": message, "lost_after_s": lost_after, "held": len(held),
    "after_loss": after_loss, "filled": filled, "after_reuse": after_reuse,
}), flush=True)
'''

# A trainer that reads every batch and keeps nothing, subscribed with reconnect=: after the
# producer dies it waits for a restarted one and must end with every row exactly once.
_RECONNECTING = r'''
import json, os, sys, time
import sluice, torch

topic, stopped, rows = sys.argv[1], sys.argv[2], int(sys.argv[3])
ids, told = [], False
deadline = time.monotonic() + 180
with sluice.subscribe(topic, timeout=3, reconnect=60) as sub:
    while time.monotonic() < deadline:
        was_stopped = os.path.exists(stopped)
        try:
            batch = next(sub)
        except StopIteration:
            break
        except sluice.Timeout:
            # A whole timeout that began after the producer was stopped: nothing of it
            # is queued here any more; the test kills it only after this line.
            if was_stopped and not told:
                print("idle", flush=True)
                told = True
            continue
        ids += torch.from_dlpack(batch["id"]).cpu().tolist()
        del batch
print("result", json.dumps({"rows": len(ids), "distinct": len(set(ids)),
                            "every_row_once": sorted(ids) == list(range(rows))}), flush=True)
'''


def test_a_producer_killed_while_trainers_hold_tensors_gives_an_error_never_garbage(
        plans, run_python, tmp_path):
    """A ``cuda:0`` producer is SIGKILLed while one trainer holds tensors of its batches
    (legacy CUDA IPC: the exporter's memory goes with it). The trainer's next receive
    raises ProducerLost; its held tensors read back the same bytes or raise a clear CUDA
    error, never other values (also after it allocates memory the driver may have
    reclaimed). Then a restarted producer on the same topic serves a new subscriber every
    row, and a subscriber with ``reconnect=`` continues onto it with every row exactly once.

    The producer is stopped (SIGSTOP) before it is killed and the subscribers take what it
    had queued for them, so that "the next receive" is the one that meets the dead
    producer: messages queued before a death are delivered first, by design."""
    torch = pytest.importorskip("torch")
    rows = 3000
    # Window 2: the producer blocks on the holder's queue a few batches in. max_held 8:
    # the holder keeps its 3 batches plus the (at most 2) it drains.
    plan = plans.plan(rows=rows, batch_rows=100, select=NUMERIC,
                      extra=GPU + "SET sluice.window = 2;\nSET sluice.max_held = 8;\n")
    stopped, killed = tmp_path / "stopped", tmp_path / "killed"
    producer = _Child(run_python(_PRODUCER, str(plan)))
    producer.expect("started", 60)
    holder = _Child(run_python(_HOLDER, plans.topic, str(stopped), str(killed), str(rows)))
    reconnecting = _Child(run_python(_RECONNECTING, plans.topic, str(stopped), str(rows)))

    holder.expect("held", 60)
    producer.process.send_signal(signal.SIGSTOP)
    _wait_until_stopped(producer.process.pid)
    stopped.touch()
    holder.expect("drained", 30)
    reconnecting.expect("idle", 30)
    producer.process.send_signal(signal.SIGKILL)
    producer.process.wait(10)
    killed.touch()

    result = json.loads(holder.expect("result", 90))
    code = holder.finish(60)
    print(json.dumps(result, indent=1), file=sys.stderr)  # which of "same"/"error" happened
    assert code == 0, f"the holder crashed (exit {code}):\n{holder.stderr()}"
    assert result["outcome"] == "ProducerLost", result
    assert f"producer of topic '{plans.topic}' is gone" in result["message"], result["message"]
    assert result["lost_after_s"] < 10, result["lost_after_s"]
    verdicts = result["after_loss"] + result["after_reuse"]
    assert len(result["after_loss"]) == 2 * result["held"] >= 6
    changed = [v for v in verdicts if v[2] == "changed"]
    assert not changed, f"held tensors read other values after the producer died: {changed}"
    unclear = [v for v in verdicts if v[2] == "error" and not _cuda_error_is_clear(v[3], v[4])]
    assert not unclear, f"reading a held tensor failed without a clear CUDA error: {unclear}"

    # The holder is gone (its held samples kept the dead topic open until then): a
    # restarted producer takes the topic over and serves a new subscriber every row, and
    # the reconnecting subscriber (waiting since the kill) continues onto it.
    restarted = sluice.Producer(plan, min_subscribers=2)
    ids = []
    for batch in sluice.subscribe(plans.topic, timeout=60):
        ids += torch.from_dlpack(batch["id"]).cpu().tolist()
        del batch
    restarted.wait(timeout=60)
    assert sorted(ids) == list(range(rows))
    after = json.loads(reconnecting.expect("result", 60))
    assert reconnecting.finish(60) == 0, reconnecting.stderr()
    assert after["every_row_once"], after


# A trainer loop as trainers write it, on a `cuda:0` topic: `for batch in sub` keeps the
# previous device batch (and so a mapping of the producer's GPU slot) while it asks for
# the next one, so when the producer dies the trainer holds one of the dead producer's
# device batches all the while it waits for the restarted producer.
_HOLDING_GPU_TRAINER = r"""
import json, sys, time
import sluice, torch

ids = []
with sluice.subscribe(sys.argv[1], timeout=60, reconnect=60) as sub:
    for batch in sub:
        assert isinstance(batch, sluice.DeviceBatch), type(batch)
        before = len(ids)
        ids += torch.from_dlpack(batch["id"]).cpu().tolist()
        if before < 1000 <= len(ids):
            print("reading", flush=True)
        time.sleep(0.002)
print("result", json.dumps({"rows": len(ids), "distinct": len(set(ids)),
                            "every_row_once": sorted(ids) == list(range(int(sys.argv[2])))}),
      flush=True)
"""


def test_a_trainer_holding_a_dead_producers_device_batch_continues_onto_its_successor(
        plans, run_python):
    """The GPU side of the producer restart: a trainer holds a device batch of a
    ``cuda:0`` producer that is SIGKILLed mid-stream. A restarted producer must take the
    topic over (another generation of its services, its own GPU ring) without waiting for
    the held batch, and the trainer, reconnecting, gets every row exactly once."""
    pytest.importorskip("torch")
    rows = 6000
    plan = plans.plan(rows=rows, batch_rows=50, select=NUMERIC,
                      extra=GPU + "SET sluice.window = 4;\n")
    trainer = _Child(run_python(_HOLDING_GPU_TRAINER, plans.topic, str(rows)))
    first = _Child(run_python(_PRODUCER, str(plan), "1"))
    first.expect("started", 60)
    trainer.expect("reading", 60)
    first.process.send_signal(signal.SIGKILL)
    first.process.wait(10)
    restarted = sluice.Producer(plan, min_subscribers=1)
    restarted.wait(timeout=90)
    result = json.loads(trainer.expect("result", 60))
    assert trainer.finish(60) == 0, trainer.stderr()
    assert result["every_row_once"], result


# --- cuda_host: each subscriber copies shared memory to its own GPU memory ----------------

# Copies every batch to the GPU on a stream of its own (not the default stream, so that
# the copy is known to be ordered on the stream it was given), prints the bytes it found
# there, then writes into its copy and checks that the write stayed private.
_WRITER = r'''
import hashlib, json, sys
import sluice, torch

side = torch.cuda.Stream()
with torch.cuda.stream(side), sluice.subscribe(sys.argv[1], timeout=60) as sub:
    for batch in sub:
        assert isinstance(batch, sluice.Batch), type(batch)
        shared = batch.to_pyarrow()  # zero-copy: the published rows in shared memory
        device = batch.to_device(stream=side.cuda_stream)
        tensors, digests = {}, {}
        for name in ("id", "x", "vec"):
            column = device[name]
            assert column.__dlpack_device__() == (2, 0), column.__dlpack_device__()
            tensor = torch.from_dlpack(column)
            assert tensor.is_cuda and tensor.device.index == 0, tensor.device
            tensors[name] = tensor
            digests[name] = hashlib.sha256(tensor.cpu().numpy().tobytes()).hexdigest()
        published = tensors["id"].cpu()
        for tensor in tensors.values():
            tensor.add_(1)  # in place, into this process's own copy
        side.synchronize()
        assert torch.equal(tensors["id"].cpu(), published + 1), "the write did not happen"
        # Neither the shared memory nor a second copy of the same batch sees the write.
        assert shared.column("id").to_pylist() == published.tolist()
        again = torch.from_dlpack(batch.to_device(stream=side.cuda_stream)["id"])
        assert torch.equal(again.cpu(), published), "a second copy saw the first one's write"
        print("copied", json.dumps({"position": [batch.epoch, batch.index], "sha": digests}),
              flush=True)
        del shared, device, tensors, tensor, column, again, batch
'''


def test_cuda_host_batches_copy_to_the_device_with_the_same_rows_as_the_cpu_path(
        plans, run_python):
    """A ``cuda_host:0`` topic is a CPU topic: subscribers get host batches. One subscriber
    process copies each with ``to_device`` and finds on its GPU exactly the bytes a CPU
    subscriber (this process) reads; it then writes into its copy, and this process, which
    reads each batch only once the writer has written, still reads the source's values."""
    pytest.importorskip("torch")
    import numpy as np

    rows = 1000
    producer = sluice.Producer(plans.plan(rows=rows, batch_rows=100, extra=HOST, select=NUMERIC),
                               min_subscribers=2)
    writer = _Child(run_python(_WRITER, plans.topic))
    ids = []
    with sluice.subscribe(plans.topic, timeout=60) as sub:
        for batch in sub:
            assert isinstance(batch, sluice.Batch), type(batch)
            # Holding this batch, wait until the writer has copied it and written into
            # its copy (it does not need this process to move on: it has the batch too).
            line = json.loads(writer.expect("copied", 90))
            assert line["position"] == [batch.epoch, batch.index]
            host = {name: np.asarray(batch[name]) for name in ("id", "x", "vec")}
            assert (host["x"] == host["id"] * 0.5).all()
            assert (host["vec"] == host["id"][:, None] + np.arange(4)).all()
            assert line["sha"] == {name: hashlib.sha256(a.tobytes()).hexdigest()
                                   for name, a in host.items()}, "the GPU copy differs"
            ids += host["id"].tolist()
            del host, batch
    assert writer.finish(60) == 0, writer.stderr()
    producer.wait(timeout=60)
    assert sorted(ids) == list(range(rows))


def test_cuda_host_holds_the_sample_only_until_the_copy_completes(plans):
    """With a window of one message and at most 3 held samples, a subscriber that keeps
    every DeviceBatch (and drops the host batch at once) still receives all 20 batches:
    each shared-memory sample goes back when its copy has completed, not when the device
    batch dies (otherwise the fourth receive raises TransportError: too many held).

    3 rather than 2: completed copies are collected, without waiting, when the subscriber
    receives, so the previous batch's copy may still be in flight at the next receive."""
    rows, max_held = 2000, 3
    producer = sluice.Producer(
        plans.plan(rows=rows, batch_rows=100, select=NUMERIC,
                   extra=HOST + f"SET sluice.window = 1;\nSET sluice.max_held = {max_held};\n"),
        min_subscribers=1)
    kept = []
    with sluice.subscribe(plans.topic, timeout=60) as sub:
        for batch in sub:
            assert isinstance(batch, sluice.Batch), type(batch)
            kept.append(batch.to_device(device=0))
            del batch
    producer.wait(timeout=60)
    assert len(kept) == rows // 100 > max_held
    ids = []
    for device_batch in kept:
        assert device_batch.__dlpack_device__() == (KDL_CUDA, 0)
        ids += device_batch.to_host()["id"].to_pyarrow().to_pylist()
    assert sorted(ids) == list(range(rows))


@pytest.mark.parametrize("topic_device, device, columns", [
    ("cuda_host:0", "cuda", None),
    ("cuda_host:0", "cuda:0", None),
    ("cuda_host:0", "torch.device", None),  # torch.device("cuda", 0), built in the test
    ("cuda:0", "cuda", None),
    ("cuda:0", "cuda", ["x", "id"]),
    ("cuda_host:0", "cuda", ["x", "id"]),
], ids=["cuda_host-cuda", "cuda_host-cuda0", "cuda_host-torch_device", "cuda-cuda",
        "cuda-cuda-columns", "cuda_host-cuda-columns"])
def test_the_torch_dataset_with_a_cuda_device_yields_cuda_tensors(plans, topic_device, device,
                                                                   columns):
    """``sluice.torch.IterableDataset(..., device="cuda")`` on a cuda_host (CPU) topic
    copies each batch to the GPU and yields CUDA tensors with the right values; on a
    ``cuda:0`` topic it yields the GPU batches as before. With ``columns=[...]`` it yields
    only those, in that order, on either kind of topic."""
    torch = pytest.importorskip("torch")
    import sluice.torch as sluice_torch

    if device == "torch.device":
        device = torch.device("cuda", 0)
    producer = sluice.Producer(
        plans.plan(rows=500, batch_rows=100, select=NUMERIC,
                   extra=f"SET sluice.device = '{topic_device}';\n"),
        min_subscribers=1)
    dataset = sluice_torch.IterableDataset(plans.topic, timeout=60, device=device,
                                           columns=columns)
    ids = []
    for batch in dataset:
        if columns is not None:
            assert list(batch) == columns
        for name in columns or ("id", "x", "vec"):
            assert batch[name].is_cuda and batch[name].device.index == 0, (name, batch[name].device)
        if columns is None:
            assert batch["vec"].shape[1:] == (4,)
        # Values checked on the GPU, on torch's current stream (ordered after the copy).
        assert torch.equal(batch["x"], batch["id"].double() * 0.5)
        ids += batch["id"].cpu().tolist()
        del batch
    dataset.close()
    producer.wait(timeout=60)
    assert sorted(ids) == list(range(500))


def test_gpu_subscribers_naming_columns_get_those_columns_of_the_same_slot(plans):
    """``columns=`` on a ``cuda:0`` topic: a subscriber gets the columns it names, in that
    order, at the same device addresses as a subscriber of every column holding the same
    batch (the projection describes part of the producer's slot; nothing is copied), with
    the same bytes; re-batched too; a name the topic lacks raises ``PlanError`` listing
    the topic's columns, and that subscriber leaves the topic (the others are not held
    back by its queue)."""
    torch = pytest.importorskip("torch")
    # A window of 8: this test reads `rebatched` only after the others have read the
    # whole stream (5 batches and 2 control messages), so its queue must hold all of it.
    # A cuda:N topic's default window is 4, and with it the producer rightly waits for
    # `rebatched` after 4 messages (no lag limit: the slowest subscriber paces the
    # producer); the first device run of this test timed out on that.
    producer = sluice.Producer(
        plans.plan(rows=230, batch_rows=50, extra=GPU + "SET sluice.window = 8;\n",
                   select=NUMERIC),
        min_subscribers=4)
    everything = sluice.subscribe(plans.topic, timeout=60)
    named = sluice.subscribe(plans.topic, columns=["vec", "id"], timeout=60)
    rebatched = sluice.subscribe(plans.topic, columns=("id",), batch_size=7, timeout=60)
    wrong = sluice.subscribe(plans.topic, columns=["id", "pixels"], timeout=60)
    with pytest.raises(sluice.PlanError, match=r"no column 'pixels'.*id, x, vec"):
        next(wrong)
    ids = []
    for whole, picked in zip(everything, named, strict=True):
        assert isinstance(whole, sluice.DeviceBatch) and isinstance(picked, sluice.DeviceBatch)
        assert (picked.epoch, picked.index) == (whole.epoch, whole.index)
        assert whole.column_names == ["id", "x", "vec"]
        assert picked.column_names == ["vec", "id"] and picked.num_columns == 2
        assert "x" not in picked and len(picked) == len(whole)
        assert picked.__dlpack_device__() == (KDL_CUDA, 0)
        for name in ("vec", "id"):
            assert (picked[name].__cuda_array_interface__["data"][0]
                    == whole[name].__cuda_array_interface__["data"][0]), name
            assert torch.equal(torch.from_dlpack(picked[name]), torch.from_dlpack(whole[name]))
        assert torch.from_dlpack(picked[0]).shape[1:] == (4,), "column 0 is the first named"
        ids += _ids_on_gpu(picked)
        del whole, picked
    few = []
    for batch in rebatched:
        assert batch.column_names == ["id"]
        few += _ids_on_gpu(batch)
        del batch
    assert sorted(ids) == list(range(230))
    assert sorted(few) == list(range(230))
    producer.wait(timeout=60)
    for sub in (everything, named, rebatched, wrong):
        sub.close()


# Issue 55, part 3: device views a trainer keeps after leaving its subscriber never change.
# Small sizes (as in test_kept_views.py): the topic has few chunks, and a cuda:N topic
# binds one device slot to each chunk, so a producer that went on by a hundred messages
# has reused every slot that no live view pins.
KEPT_ROUNDS = int(os.environ.get("SLUICE_GPU_TEST_ROUNDS", "5"))
KEPT_SIZES = ("SET sluice.window = 4;\nSET sluice.max_subscribers = 4;\n"
              "SET sluice.max_held = 4;\nSET sluice.message_batches = 1;\n")
# A producer in a process of its own, closed once the file named second exists.
_LONG_PRODUCER = """
import os, sys, time, sluice
p = sluice.Producer(sys.argv[1], min_subscribers=1)
print("started", flush=True)
while not os.path.exists(sys.argv[2]):
    time.sleep(0.05)
p.close()
"""
_READER = """
import sys, sluice
try:
    with sluice.subscribe(sys.argv[1], timeout=60) as sub:
        for batch in sub:
            del batch
except sluice.SluiceError as e:
    print(type(e).__name__, flush=True)
"""


class _KeptOnDevice:
    """Views of a device batch as a trainer keeps them (the batch, torch tensors through
    DLPack, a CuPy array through ``__cuda_array_interface__``), with copies taken at
    receipt. A ``cuda_host`` batch is kept as its ``to_device`` copy, its host batch
    dropped at once."""

    def __init__(self, batch, torch) -> None:
        import cupy

        self.torch = torch
        self.batch = batch.to_device(device=0) if isinstance(batch, sluice.Batch) else batch
        self.ids = torch.from_dlpack(self.batch["id"])
        self.vec = torch.from_dlpack(self.batch["vec"])
        self.x = cupy.asarray(self.batch["x"])
        self.before = (self.ids.clone(), self.vec.clone(), self.x.copy())

    def check(self, when: str) -> None:
        torch = self.torch
        torch.cuda.synchronize()
        ids, vec, x = self.before
        assert torch.equal(self.ids, ids), f"a kept device view changed {when}"
        assert torch.equal(self.vec, vec), f"a kept device view changed {when}"
        assert bool((self.x == x).all()), f"a kept CuPy view changed {when}"
        assert torch.equal(torch.from_dlpack(self.batch["id"]), ids), when
        # And they are the published rows: vec = id + [0, 1, 2, 3].
        expected = ids[:, None].double() + torch.arange(4, device=ids.device).double()
        assert torch.equal(self.vec.double(), expected), f"kept rows are not the plan's {when}"


def _keep_three_on_device(sub, torch) -> list[_KeptOnDevice]:
    kept = []
    for batch in sub:
        kept.append(_KeptOnDevice(batch, torch))
        del batch
        if len(kept) == 3:
            break
    return kept


def _let_the_producer_go_on(topic: str, batches: int = 100) -> None:
    with sluice.subscribe(topic, timeout=60) as witness:
        for i, batch in enumerate(witness):
            del batch
            if i + 1 >= batches:
                break


@pytest.mark.parametrize("topic_device", ["cuda:0", "cuda_host:0"])
@pytest.mark.parametrize("leave", ["break", "close", "gc", "exception"])
def test_device_views_kept_after_leaving_never_change(plans, run_python, topic_device, leave):
    """A trainer keeps torch and CuPy views of its first three device batches (on a
    ``cuda_host`` topic: their ``to_device`` copies, the host batch dropped at once) and
    leaves its subscriber (``break`` out of the ``with`` block, ``close()``, garbage
    collection, an exception), while the producer, in its own process, goes on for
    another subscriber through every free slot: the views never change, nor after the
    producer finishes."""
    torch = pytest.importorskip("torch")
    pytest.importorskip("cupy")
    import gc

    plan = plans.plan(rows=640, batch_rows=64, epochs=100000, select=NUMERIC,
                      extra=f"SET sluice.device = '{topic_device}';\n" + KEPT_SIZES)
    stop = plan.parent / "stop"
    producer = _Child(run_python(_LONG_PRODUCER, str(plan), str(stop)))
    producer.expect("started", 60)
    run_python(_READER, plans.topic)
    views: list[_KeptOnDevice] = []
    for _ in range(KEPT_ROUNDS):
        if leave == "break":
            with sluice.subscribe(plans.topic, timeout=60) as sub:
                views = _keep_three_on_device(sub, torch)
        elif leave == "close":
            sub = sluice.subscribe(plans.topic, timeout=60)
            views = _keep_three_on_device(sub, torch)
            sub.close()
        elif leave == "gc":
            sub = sluice.subscribe(plans.topic, timeout=60)
            views = _keep_three_on_device(sub, torch)
            del sub
            gc.collect()
        else:
            views = []
            with pytest.raises(ZeroDivisionError):
                with sluice.subscribe(plans.topic, timeout=60) as sub:
                    views += _keep_three_on_device(sub, torch)
                    1 / 0
        _let_the_producer_go_on(plans.topic)
        for view in views:
            view.check("while the producer went on")
    stop.touch()
    assert producer.finish(60) == 0, producer.stderr()
    for view in views:
        view.check("after the producer finished")


def test_the_torch_dataset_on_a_cuda_topic_makes_writing_a_choice(plans):
    """Issue 50, finding 8: torch ignores DLPack's read-only flag, so an in-place write into
    a ``cuda:N`` topic's tensor changes every trainer's batch. ``writable=True`` yields
    copies of the trainer's own: a trainer that zeroes each of its tensors in place, while
    it holds them, leaves another subscriber of the same batches reading the published
    values; the default warns (``SharedTensorWarning``) that the tensors are shared."""
    torch = pytest.importorskip("torch")
    import sluice.torch as sluice_torch

    producer = sluice.Producer(
        plans.plan(rows=500, batch_rows=100, select=NUMERIC,
                   extra=GPU + "SET sluice.window = 8;\n"),
        min_subscribers=2)
    reader = sluice.subscribe(plans.topic, timeout=60)
    writer = iter(sluice_torch.IterableDataset(plans.topic, timeout=60, writable=True))
    ids = []
    for mine in writer:
        mine["id"].zero_()
        mine["x"].mul_(-1)
        theirs = next(reader)
        read = torch.from_dlpack(theirs["id"])
        assert read.shape == mine["id"].shape
        assert torch.equal(torch.from_dlpack(theirs["x"]), read.double() * 0.5), \
            "a writable tensor's write reached the shared slot"
        ids += read.cpu().tolist()
        del mine, theirs, read
    reader.close()
    producer.wait(timeout=60)
    assert sorted(ids) == list(range(500))

    producer = sluice.Producer(
        plans.plan(rows=100, batch_rows=100, select=NUMERIC, extra=GPU, name="warn.sql"),
        min_subscribers=1)
    sluice_torch._warned_shared = False
    with pytest.warns(sluice_torch.SharedTensorWarning, match="writable=True"):
        batches = list(sluice_torch.IterableDataset(plans.topic, timeout=60))
    assert len(batches) == 1
    del batches
    producer.wait(timeout=60)


# Issue 51: a Python loader published to the GPU. Each trainer process takes every epoch
# through sluice.torch.SharedLoader (CUDA tensors of its own: writable=True) or, for
# "numpy", through sluice.structured (the loader's structure copied to the host), and
# pickles what it got for the test to check against the loader.
GPU_LOADER = r"""
import sys, torch

def batch(i, n, device):
    g = torch.Generator().manual_seed(i)
    return {
        "pixels": torch.rand((n, 3, 8, 8), generator=g).to(device),
        "label": torch.randint(0, 10, (n,), generator=g),
        "caption": [f"image {i}.{j}" for j in range(n)],
        "meta": {"id": torch.arange(n, dtype=torch.int64) + 100 * i},
    }

class Loader:
    def __init__(self, device="cpu"):
        self.device = device
    def __iter__(self):
        for i in range(6):
            yield batch(i, 5 if i == 5 else 16, self.device)
"""

GPU_TRAINER = GPU_LOADER + r"""
import pickle, numpy as np, sluice, sluice.torch as st

def host(obj):
    if isinstance(obj, dict):
        return {k: host(v) for k, v in obj.items()}
    if isinstance(obj, torch.Tensor):
        return ("cuda" if obj.is_cuda else "cpu", obj.cpu().numpy().copy())
    if isinstance(obj, np.ndarray):
        return ("numpy", obj.copy())
    return obj

topic, size, out = sys.argv[1], sys.argv[2], sys.argv[3]
epochs = []
if size == "numpy":
    with sluice.subscribe(topic, timeout=120) as sub:
        print("subscribed", flush=True)
        for epoch in sub.epochs():
            epochs.append([host(sluice.structured(b)) for b in epoch])
else:
    loader = st.SharedLoader(topic, None if size == "none" else int(size), timeout=120, writable=True)
    for _ in range(2):
        got = []
        for b in loader:
            b["pixels"].mul_(-1)  # the trainer's own copy: nobody else sees this
            got.append(host(b))
        epochs.append(got)
with open(out, "wb") as f:
    pickle.dump(epochs, f)
"""


@pytest.mark.parametrize("tensors", ["cpu", "cuda"])
def test_a_python_loader_published_to_the_gpu_reaches_trainers_in_its_structure(
    plans, run_python, tmp_path, tensors
):
    """``publish(loader, device='cuda:0')``: the loader's batches (CPU tensors, or CUDA
    ones copied to the host first) go once into the producer's device slots; trainers of
    three batch sizes get CUDA tensors of the loader's structure and values (their
    in-place writes stay their own), a numpy consumer the structure on the host."""
    torch = pytest.importorskip("torch")
    import numpy as np

    namespace: dict = {}
    exec(GPU_LOADER, namespace)
    want = list(namespace["Loader"]())
    sizes = ["none", "5", "64", "numpy"]
    outs = [tmp_path / f"{s}.pickle" for s in sizes]
    trainers = [run_python(GPU_TRAINER, plans.topic, s, str(o)) for s, o in zip(sizes, outs)]
    stats = sluice.publish(namespace["Loader"](f"{tensors}:0" if tensors == "cuda" else "cpu"),
                           plans.topic, epochs=2, min_subscribers=4, wait_timeout=120,
                           device="cuda:0")
    assert (stats.epochs, stats.rows) == (2, 2 * (5 * 16 + 5))
    for t in trainers:
        _, err = t.communicate(timeout=180)
        assert t.returncode == 0, err

    def rows(batches, key):
        return np.concatenate([b[key][1] if key != "meta" else b["meta"]["id"][1] for b in batches])

    whole = {"pixels": torch.cat([b["pixels"] for b in want]).numpy(),
             "label": torch.cat([b["label"] for b in want]).numpy(),
             "meta": torch.cat([b["meta"]["id"] for b in want]).numpy()}
    captions = sum((b["caption"] for b in want), [])
    for size, out in zip(sizes, outs):
        got = pickle.loads(out.read_bytes())
        assert len(got) == 2, size
        for epoch in got:
            kind = "numpy" if size == "numpy" else "cuda"
            assert {b["pixels"][0] for b in epoch} == {kind}, size
            sign = 1 if size == "numpy" else -1
            np.testing.assert_array_equal(rows(epoch, "pixels"), sign * whole["pixels"], err_msg=size)
            np.testing.assert_array_equal(rows(epoch, "label"), whole["label"], err_msg=size)
            np.testing.assert_array_equal(rows(epoch, "meta"), whole["meta"], err_msg=size)
            assert sum((b["caption"] for b in epoch), []) == captions, size
            if size == "none":
                assert [len(b["caption"]) for b in epoch] == [16] * 5 + [5]
