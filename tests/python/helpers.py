"""Small helpers shared by the tests."""

from __future__ import annotations

import ctypes

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
