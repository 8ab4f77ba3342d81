"""Small helpers shared by the tests."""

from __future__ import annotations

import ctypes
import os
import time
import tempfile
from pathlib import Path

import pyarrow as pa

_get_name = ctypes.pythonapi.PyCapsule_GetName
_get_name.restype = ctypes.c_char_p
_get_name.argtypes = [ctypes.py_object]
_get_pointer = ctypes.pythonapi.PyCapsule_GetPointer
_get_pointer.restype = ctypes.c_void_p
_get_pointer.argtypes = [ctypes.py_object, ctypes.c_char_p]


def capsule_name(capsule: object) -> str:
    """The name of a PyCapsule."""
    return _get_name(capsule).decode()


def capsule_pointer(capsule: object) -> int:
    """The pointer a PyCapsule holds."""
    return _get_pointer(capsule, _get_name(capsule))


def arrow_buffers(batch: pa.RecordBatch) -> list[tuple[int, int]]:
    """(address, size) of every non-empty buffer of every column, children included."""
    out = []
    for column in batch.columns:
        for buf in column.buffers():
            if buf is not None and buf.size > 0:
                out.append((buf.address, buf.size))
    return out


def inside(span: tuple[int, int], shm_range: tuple[int, int]) -> bool:
    """Whether the (address, size) span lies in the [start, end) range."""
    address, size = span
    start, end = shm_range
    return start <= address and address + size <= end


def shm_backing(address: int) -> tuple[str, int] | None:
    """(file, offset in it) of the /dev/shm file mapping that holds ``address`` in this
    process, from /proc/self/maps; ``None`` for process memory."""
    with open("/proc/self/maps") as maps:
        for line in maps:
            fields = line.split(maxsplit=5)
            start, end = (int(v, 16) for v in fields[0].split("-"))
            if start <= address < end:
                path = fields[5].strip() if len(fields) == 6 else ""
                # A segment removed since it was mapped: the same file for this purpose.
                path = path.removesuffix(" (deleted)")
                if not path.startswith("/dev/shm/"):
                    return None
                return path, int(fields[2], 16) + (address - start)
    return None


def in_batch_memory(array, shm_range: tuple[int, int]) -> bool:
    """Whether numpy ``array`` reads the batch's own bytes in shared memory: at the batch's
    address, or in a private mapping of the same pages (what DLPack exports hand out, so
    that a consumer writing in place changes its own copy only)."""
    start, end = shm_range
    address, size = array.ctypes.data, array.nbytes
    if start <= address and address + size <= end:
        return True
    mine, batch = shm_backing(address), shm_backing(start)
    return (mine is not None and batch is not None and mine[0] == batch[0]
            and batch[1] <= mine[1] and mine[1] + size <= batch[1] + (end - start))


def service_root(ns: str) -> Path:
    """The namespace's service directory (``Namespace::root``): in /dev/shm, beside the
    segments, or the temporary directory where there is no /dev/shm. Declared interest
    is under ``interest/<topic>/`` in it."""
    shm = Path("/dev/shm")
    return (shm if shm.is_dir() else Path(tempfile.gettempdir())) / f"sluice-{ns}"


def state_dir(ns: str) -> Path:
    """The namespace's state directory (``Namespace::state_dir``): checkpoints and
    ``sluice status`` reports, in ``$XDG_RUNTIME_DIR`` where it is set."""
    runtime = os.environ.get("XDG_RUNTIME_DIR")
    base = Path(runtime) if runtime and os.path.isabs(runtime) and os.path.isdir(runtime) \
        else Path(tempfile.gettempdir())
    return base / f"sluice-{ns}.state"


def waiting_subscribers(ns: str, topic: str) -> int:
    """Subscribers whose declared interest in ``topic`` is registered (docs/protocol.md;
    names starting with a dot are registrations being made)."""
    interest = service_root(ns) / "interest" / topic
    return sum(1 for p in interest.glob("*") if not p.name.startswith("."))


class EpochLoader:
    """A loader that yields the same batches for an epoch in any process: 200 batches of
    10 ids, a permutation of 0..1999 drawn from the epoch (``set_epoch``), 5 ms each."""

    def __init__(self) -> None:
        self.epoch = 0

    def set_epoch(self, epoch: int) -> None:
        self.epoch = epoch

    def __iter__(self):
        import numpy as np

        order = np.random.default_rng(7 + self.epoch).permutation(2000).astype(np.int64)
        for i in range(200):
            time.sleep(0.005)
            yield order[i * 10:(i + 1) * 10]


def make_epoch_loader() -> EpochLoader:
    """What ``python -m sluice publish helpers:make_epoch_loader --resumable`` runs."""
    return EpochLoader()


def cuda_driver_present() -> bool:
    """Whether this machine has an NVIDIA driver (``libcuda``) to load."""
    for name in ("libcuda.so.1", "libcuda.so"):
        try:
            ctypes.CDLL(name)
            return True
        except OSError:
            continue
    return False
