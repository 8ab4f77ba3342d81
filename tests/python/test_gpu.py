"""GPU path tests: a producer with ``sluice.device = 'cuda:0'`` and subscriber processes.

These need an NVIDIA GPU, its driver, and (for some) PyTorch. Where the driver is missing
(the development machine, CI) every test here is skipped with the reason
"no CUDA driver: ..."; ``scripts/gpu-check.sh`` runs them on a GPU machine.

They are written against the GPU subscriber surface described in docs/gpu.md
(``sluice.DeviceBatch``; columns with ``__dlpack_device__() == (kDLCUDA=2, ordinal)``).
None of them has run on a GPU yet (issue 16 runs them through scripts/gpu-check.sh).
"""

from __future__ import annotations

import ctypes
import subprocess
import sys

import pytest


def _driver_present() -> bool:
    for name in ("libcuda.so.1", "libcuda.so"):
        try:
            ctypes.CDLL(name)
            return True
        except OSError:
            continue
    return False


pytestmark = pytest.mark.skipif(
    not _driver_present(),
    reason="no CUDA driver: libcuda.so not loadable; skipped the GPU tests (checksum vs CPU path, "
    "4 subscribers, subscriber killed mid-stream, torch consumers of different batch sizes, "
    "subscriber holding batches)",
)

import sluice  # noqa: E402

KDL_CUDA = 2
GPU = "SET sluice.device = 'cuda:0';\n"
NUMERIC = "SELECT id, x, vec FROM t"


def _ids_on_gpu(batch) -> list[int]:
    col = batch["id"]
    assert col.__dlpack_device__() == (KDL_CUDA, 0)
    cai = col.__cuda_array_interface__
    assert cai["shape"] == (len(col),)
    torch = pytest.importorskip("torch", reason="torch is needed to read CUDA columns back")
    return torch.from_dlpack(col).cpu().tolist()


def test_gpu_batches_carry_the_same_rows_as_the_cpu_path(plans):
    producer = sluice.Producer(plans.plan(rows=1000, batch_rows=128, extra=GPU, select=NUMERIC),
                               min_subscribers=1)
    ids = []
    for batch in sluice.subscribe(plans.topic, timeout=60):
        ids += _ids_on_gpu(batch)
    producer.wait(timeout=60)
    assert sorted(ids) == list(range(1000))


def test_four_subscriber_processes_each_receive_every_row(plans, run_python):
    producer = sluice.Producer(plans.plan(rows=2000, batch_rows=100, extra=GPU, select=NUMERIC),
                               min_subscribers=4)
    code = (
        "import sys, sluice, torch\n"
        "ids = []\n"
        "for b in sluice.subscribe(sys.argv[1], timeout=60):\n"
        "    ids += torch.from_dlpack(b['id']).cpu().tolist()\n"
        "assert sorted(ids) == list(range(2000)), len(ids)\n"
    )
    procs = [run_python(code, plans.topic) for _ in range(4)]
    for p in procs:
        assert p.wait(timeout=120) == 0
    producer.wait(timeout=60)


def test_a_killed_subscriber_does_not_stall_the_others(plans, run_python):
    producer = sluice.Producer(plans.plan(rows=4000, batch_rows=100, extra=GPU, select=NUMERIC),
                               min_subscribers=2)
    slow = run_python(
        "import sys, time, sluice\n"
        "for b in sluice.subscribe(sys.argv[1], timeout=60):\n"
        "    time.sleep(10)\n", plans.topic)
    ids = []
    for i, batch in enumerate(sluice.subscribe(plans.topic, timeout=60)):
        if i == 2:
            slow.kill()
        ids += _ids_on_gpu(batch)
    assert sorted(ids) == list(range(4000))
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
    producer = sluice.Producer(plans.plan(rows=3000, batch_rows=100, extra=GPU, select=NUMERIC),
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


def test_cupy_and_jax_take_columns_without_a_copy(plans):
    producer = sluice.Producer(plans.plan(rows=500, batch_rows=100, extra=GPU, select=NUMERIC),
                               min_subscribers=1)
    ids = []
    for batch in sluice.subscribe(plans.topic, timeout=60):
        col = batch["id"]
        cai = col.__cuda_array_interface__
        assert cai["version"] == 3 and cai["shape"] == (len(col),)
        try:
            import cupy
        except ImportError:
            cupy = None
        if cupy is not None:
            a = cupy.from_dlpack(col)
            assert a.data.ptr == cai["data"][0] or batch.producer_batches > 1
            ids += cupy.asnumpy(a).tolist()
        else:
            ids += batch.to_host()["id"].to_pylist()
        jax = pytest.importorskip("jax")
        x = jax.dlpack.from_dlpack(col)
        assert list(x.devices())[0].platform == "gpu"
    producer.wait(timeout=60)
    assert sorted(ids) == list(range(500))


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
