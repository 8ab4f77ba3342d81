"""Share any Python data loader: publish what it yields, receive it in its own structure.

::

    # the producer process: the loader you have, unchanged
    sluice.publish(loader, topic="images", epochs=10)

    # every trainer: one line changes
    for epoch in range(10):
        for images, labels in sluice.torch.SharedLoader("images"):
            ...

A batch the loader yields may be a numpy array or a torch tensor (first dimension: rows),
a tuple, list or dict of those (nested; a namedtuple comes back as the loader's class
where the trainer has imported its module, else as a namedtuple of the same name and
fields), a list of strings or numbers (one per row), a ``pyarrow.RecordBatch`` or
``Table``, or anything exporting ``__arrow_c_array__`` / ``__arrow_c_stream__``
(polars). Each becomes one Arrow record batch: 1-D arrays as
columns, arrays of more dimensions as ``arrow.fixed_shape_tensor`` columns of their row
shape, without a copy in Python; its single copy is the producer's write into shared
memory. A *list* of arrays or tensors of one dtype and rank whose shapes differ (one per
row: token sequences, boxes per image) is a row of variable shape each: a list column of
the rows' values, and one of their shapes (joining the rows is one copy in Python); a
tuple or list of one item per row (``tuple(zip(*samples))``: images of their own sizes,
target dicts; or a list of the samples themselves) is read as such where columns would
not fit. The structure (nesting,
names, dtypes, row shapes) travels in the schema's
metadata, so :func:`structured` rebuilds the loader's own batch from a Sluice batch, as
numpy arrays (or torch tensors, see ``sluice.torch.SharedLoader``), viewing shared memory.
Each batch the loader yields is one message: a subscriber without ``batch_size`` receives
exactly the loader's batches; one with a ``batch_size`` receives the same rows in its own.
"""

from __future__ import annotations

import collections
import contextvars
import functools
import importlib
import inspect
import json
import os
import sys
import threading
from collections.abc import Callable, Iterable, Iterator, Mapping
from typing import TYPE_CHECKING, Any

from sluice._sluice import DeviceBatch, Feeder, RunStats

if TYPE_CHECKING:
    import numpy as np

__all__ = ["flatten", "publish", "structured", "STRUCTURE_KEY"]

#: The schema metadata key that holds a batch's structure (JSON).
STRUCTURE_KEY = b"sluice.structure"

_SCALARS = (str, bytes, bool, int, float)

# The column of each list of numbers or strings of the loader's first batch, and their
# kind, while a later batch is read (:func:`_columns`): there a list all ``None``, or
# empty, is that many missing values of that kind, not a structure of its own.
_LIST_KINDS: contextvars.ContextVar[dict[str, str]] = contextvars.ContextVar("_LIST_KINDS")


def _pa() -> Any:
    import pyarrow as pa

    return pa


def _np() -> Any:
    import numpy

    return numpy


def _is_numpy(obj: Any) -> bool:
    return type(obj).__module__ == "numpy" and hasattr(obj, "ndim")


def _is_torch(obj: Any) -> bool:
    return type(obj).__module__.startswith("torch") and hasattr(obj, "numpy")


def _column(name: str, array: np.ndarray, lib: str) -> tuple[Any, dict[str, Any]]:
    np = _np()
    """An array of rows as an Arrow column and its leaf of the structure."""
    pa = _pa()
    if array.ndim == 0:
        raise ValueError(f"'{name}' is a scalar, not a batch of rows (its first dimension)")
    if array.dtype.hasobject:
        raise TypeError(f"'{name}' holds Python objects ({array.dtype}); publish numbers or strings")
    if array.dtype.kind not in "biuf" or array.dtype.itemsize > 8:
        # Trainers read numbers (`_leaf`); strings go as a list of str, one per row.
        raise TypeError(
            f"'{name}' is an array of {array.dtype}: publish arrays of numbers of at most 64 "
            "bits, and strings as a list of str"
        )
    if array.ndim > 1 and len(array) > 0 and array.size == 0:
        raise ValueError(
            f"'{name}' has rows of shape {list(array.shape[1:])}, which hold no values: "
            "publish rows of at least one value"
        )
    if not array.dtype.isnative:
        # Arrow holds numbers in this machine's byte order: a big-endian array (from a
        # file) is copied once into it, and its leaf says the native dtype.
        array = array.astype(array.dtype.newbyteorder("="))
    leaf = {"col": name, "lib": lib, "dtype": array.dtype.str, "shape": list(array.shape[1:])}
    if array.dtype == np.bool_:
        # Arrow tensors and booleans hold bits, which no tensor views: one byte per
        # value, seen as bool again on receipt (the leaf's dtype).
        array = array.view(np.uint8)
    if array.ndim == 1:
        return pa.array(array), leaf
    if len(array) == 0:
        # pyarrow builds no tensor array from an empty ndarray: its storage, empty.
        size = int(np.prod(array.shape[1:]))
        value = pa.from_numpy_dtype(array.dtype)
        storage = pa.array([], type=pa.list_(value, size))
        return pa.ExtensionArray.from_storage(pa.fixed_shape_tensor(value, array.shape[1:]), storage), leaf
    tensor = pa.FixedShapeTensorArray.from_numpy_ndarray(np.ascontiguousarray(array))
    return tensor, leaf


def _flatten(
    obj: Any, path: str, columns: dict[str, Any], per_row: bool = False, lists: str = "auto"
) -> dict[str, Any]:
    """The structure of ``obj``; its columns added to ``columns`` by name. ``per_row``:
    a tuple or list of items of one kind is one item per row (see :func:`flatten`).
    ``lists``: how a list of arrays of one dtype and rank reads: ``"auto"``, rows of
    variable shape where their shapes differ; ``"columns"`` (without ``per_row``), columns
    where they have one first dimension (`[x (B, 4), y (B, 2)]`); ``"rows"``, rows of
    variable shape even where the shapes agree (a last batch of one token sequence)."""
    def name_of(part: str) -> str:
        return f"{path}.{part}" if path else part

    if _is_numpy(obj) or _is_torch(obj):
        lib = "torch" if _is_torch(obj) else "numpy"
        array, torch_dtype = _torch_numpy(obj) if lib == "torch" else (obj, None)
        name = path or "0"
        column, leaf = _column(name, array, lib)
        if torch_dtype:
            leaf["torch_dtype"] = torch_dtype
        _add(columns, name, column)
        return leaf
    if isinstance(obj, Mapping):
        items = []
        for key, value in obj.items():
            if not isinstance(key, str):
                raise TypeError(f"dict keys must be strings to name columns, not {key!r}")
            items.append([key, _flatten(value, name_of(key), columns, per_row, lists)])
        return {"dict": items}
    if isinstance(obj, tuple) and _is_namedtuple(type(obj)) and not _scalars_only(obj):
        # A record of fields (a loader's `Batch(images=..., labels=...)`), never a column
        # of scalars: its columns are named for its fields.
        cls = type(obj)
        fields = list(cls._fields)
        return {
            "namedtuple": [cls.__module__, cls.__qualname__, fields],
            "tuple": [_flatten(v, name_of(f), columns, per_row, lists) for f, v in zip(fields, obj)],
        }
    kind = _LIST_KINDS.get({}).get(path or "0")
    if isinstance(obj, (list, tuple)) and kind is not None and all(v is None for v in obj):
        leaf = _scalar_column(path or "0", list(obj), columns, kind)
        if isinstance(obj, tuple):
            leaf["seq"] = "tuple"
        return leaf
    if isinstance(obj, list) and _list_of_rows(obj, per_row, lists):
        return _ragged_column(path or "0", obj, columns)
    if isinstance(obj, (list, tuple)):
        if _scalars_only(obj):
            leaf = _scalar_column(path or "0", list(obj), columns)
            if isinstance(obj, tuple):
                leaf["seq"] = "tuple"  # `tuple(zip(*samples))`'s labels come back a tuple
            return leaf
        kind = "tuple" if isinstance(obj, tuple) else "list"
        if not (per_row and _one_kind(obj)):
            return {kind: [_flatten(v, name_of(str(i)), columns, per_row, lists) for i, v in enumerate(obj)]}
        if not _tuples(obj):
            return {"rows": _row_items(path or "0", list(obj), columns), "kind": kind}
        return _fields_or_samples(obj, path or "0", columns)
    raise TypeError(
        f"cannot publish a {type(obj).__name__} in a batch: use numpy arrays, torch tensors, "
        "lists of numbers or strings, or tuples, lists and dicts of those"
    )


def _fields_or_samples(items: list[Any], name: str, columns: dict[str, Any]) -> dict[str, Any]:
    """A list of tuples of one length: fields (`list(zip(*samples))`) where they read with
    one row count, else the samples themselves (`collate_fn=lambda b: b`)."""
    kept = dict(columns)
    try:
        fields = [_flatten(v, f"{name}.{i}", columns, True) for i, v in enumerate(items)]
        if _rows_differ({k: c for k, c in columns.items() if k not in kept}) is None:
            return {"list": fields}
    except (TypeError, ValueError):
        pass
    columns.clear()
    columns.update(kept)
    return {"rows": _row_items(name, items, columns), "kind": "list"}


def _add(columns: dict[str, Any], name: str, column: Any) -> None:
    if name in columns:
        raise ValueError(
            f"two parts of a batch make the column {name!r}: rename a dict key or a field"
        )
    columns[name] = column


def _one_kind(items: Any) -> bool:
    """Whether ``items`` could be one item per row: arrays or tensors of one dtype and
    rank, dicts with the same keys, or — in a list, as `collate_fn=lambda b: b` leaves
    the samples — plain tuples of one length (a tuple of tuples is fields, as
    `tuple(zip(*samples))` makes them)."""
    if not items:
        return False
    first = items[0]
    if type(first) is tuple and first and isinstance(items, list):
        return all(type(v) is tuple and len(v) == len(first) for v in items)
    if isinstance(first, Mapping) and first:
        return all(isinstance(v, Mapping) and list(v) == list(first) for v in items)
    return _arrays_of_one_kind(items)


def _tuples(items: Any) -> bool:
    return type(items[0]) is tuple


def _arrays_of_one_kind(items: Any) -> bool:
    first = items[0]
    return all(
        (_is_numpy(v) or _is_torch(v)) and v.dtype == first.dtype and v.ndim == first.ndim
        for v in items
    )


def _row_items(name: str, items: list[Any], columns: dict[str, Any]) -> dict[str, Any]:
    """One item per row (see :func:`_one_kind`): a dict's values by key, or a tuple's by
    position, each key's or position's values a column of their own
    (:func:`_row_values`)."""
    if type(items[0]) is tuple:
        width = len(items[0])
        values = [[item[i] for item in items] for i in range(width)]
        return {"tuple": [_row_values(f"{name}.{i}", v, columns) for i, v in enumerate(values)]}
    if not isinstance(items[0], Mapping):
        return _row_values(name, items, columns)
    fields = []
    for key in items[0]:
        if not isinstance(key, str):
            raise TypeError(f"dict keys must be strings to name columns, not {key!r}")
        fields.append([key, _row_values(f"{name}.{key}", [item[key] for item in items], columns)])
    return {"dict": fields}


def _row_values(name: str, values: list[Any], columns: dict[str, Any]) -> dict[str, Any]:
    """A value per row as one column: numbers or strings as they are, 0-d arrays stacked,
    arrays of any shape as rows of variable shape."""
    kind = _LIST_KINDS.get({}).get(name)
    if _scalars_only(values) or (kind is not None and all(v is None for v in values)):
        return _scalar_column(name, values, columns, kind)
    if (isinstance(values[0], Mapping) or _tuples(values)) and _one_kind(values):
        return _row_items(name, values, columns)  # a sample's dict or tuple, per row
    if not _arrays_of_one_kind(values):
        raise TypeError(
            f"'{name}': one value per row needs arrays of one dtype and rank, or numbers or strings"
        )
    if values[0].ndim == 0:
        lib = "torch" if _is_torch(values[0]) else "numpy"
        converted = [_torch_numpy(v) if lib == "torch" else (v, None) for v in values]
        column, leaf = _column(name, _np().stack([a for a, _ in converted]), lib)
        if converted[0][1]:
            leaf["torch_dtype"] = converted[0][1]
        _add(columns, name, column)
        return leaf
    return _ragged_column(name, values, columns)


# Torch dtypes numpy lacks: they travel as the integers of their bits and are viewed as
# themselves again by torch trainers (and by numpy ones where `ml_dtypes` is installed).
_TORCH_BITS = {"bfloat16": "int16", "float8_e4m3fn": "uint8", "float8_e5m2": "uint8"}


def _torch_numpy(tensor: Any) -> tuple[Any, str | None]:
    """A CPU torch tensor's values as a numpy array, and the torch dtype it stands for
    where numpy has none."""
    tensor = tensor.detach().cpu()
    name = str(tensor.dtype).removeprefix("torch.")
    if name in _TORCH_BITS:
        torch = sys.modules["torch"]
        return tensor.view(getattr(torch, _TORCH_BITS[name])).numpy(), name
    return tensor.numpy(), None


def _as_torch_dtype(tensor: Any, leaf: dict[str, Any]) -> Any:
    """``tensor`` (of the bits) viewed as the torch dtype ``leaf`` names, if any."""
    name = leaf.get("torch_dtype")
    if name is None:
        return tensor
    if name not in _TORCH_BITS:
        raise ValueError(f"column {leaf['col']!r}: the structure names torch dtype {name!r}")
    return tensor.view(getattr(sys.modules["torch"], name))


def _as_numpy_dtype(array: Any, leaf: dict[str, Any]) -> Any:
    """``array`` (of the bits) as the ``ml_dtypes`` dtype ``leaf`` names where that
    package is installed (JAX's), else as it is."""
    name = leaf.get("torch_dtype")
    if name is None:
        return array
    if name not in _TORCH_BITS:
        raise ValueError(f"column {leaf['col']!r}: the structure names torch dtype {name!r}")
    try:
        import ml_dtypes
    except ImportError:
        return array
    return array.view(getattr(ml_dtypes, name))


def _scalar_column(
    name: str, values: list[Any], columns: dict[str, Any], kind: str | None = None
) -> dict[str, Any]:
    """Numbers or strings, one per row, as a column (:func:`_scalars`), and its leaf;
    ``kind``: the first batch's, for values all ``None`` (or none)."""
    present = next((type(v).__name__ for v in values if v is not None), None)
    if present is None and kind in _ARROW_KINDS:
        _add(columns, name, _pa().nulls(len(values), type=_ARROW_KINDS[kind]()))
        return {"col": name, "lib": "list", "kind": kind}
    _add(columns, name, _scalars(values))
    return {"col": name, "lib": "list", "kind": present}


# The Arrow type of each kind of a list of numbers or strings (what `_scalars` makes).
_ARROW_KINDS: dict[str, Callable[[], Any]] = {
    "str": lambda: _pa().string(),
    "bytes": lambda: _pa().binary(),
    "bool": lambda: _pa().bool_(),
    "int": lambda: _pa().int64(),
    "float": lambda: _pa().float64(),
}


def _scalars_only(items: Any) -> bool:
    """Numbers or strings, some of them missing (``None``: a null, back as ``None``)."""
    return any(isinstance(v, _SCALARS) for v in items) and all(
        v is None or isinstance(v, _SCALARS) for v in items
    )


def _is_namedtuple(cls: type) -> bool:
    fields = getattr(cls, "_fields", None)
    return issubclass(cls, tuple) and isinstance(fields, tuple) and all(isinstance(f, str) for f in fields)


@functools.lru_cache(maxsize=64)
def _namedtuple_class(module: str, qualname: str, fields: tuple[str, ...]) -> type:
    """The loader's namedtuple class where this process has imported its module already
    (nothing is imported on a batch's word), else a namedtuple of the same name and
    fields: attribute access and unpacking work alike."""
    cls: Any = sys.modules.get(module)
    for part in qualname.split("."):
        # The namespace itself, not getattr: a module's `__getattr__` may import.
        cls = vars(cls).get(part) if hasattr(cls, "__dict__") else None
    if isinstance(cls, type) and _is_namedtuple(cls) and cls._fields == fields:
        return cls
    name = qualname.rsplit(".", 1)[-1]
    try:
        return collections.namedtuple(name, fields)
    except ValueError as e:
        raise ValueError(f"this batch's structure names a namedtuple {qualname!r} {fields}: {e}") from None


def _namedtuple(spec: Any, values: list[Any]) -> Any:
    ok = (
        isinstance(spec, list) and len(spec) == 3
        and isinstance(spec[0], str) and isinstance(spec[1], str)
        and isinstance(spec[2], list) and all(isinstance(f, str) for f in spec[2])
        and len(spec[2]) == len(values)
    )
    if not ok:
        raise ValueError(f"this batch's structure has a malformed namedtuple: {spec!r}")
    return _namedtuple_class(spec[0], spec[1], tuple(spec[2]))(*values)


def _scalars(values: list[Any]) -> Any:
    """A list of numbers or strings as an Arrow array, through numpy where they are all
    of one type: pyarrow's conversion of a Python list looks for pandas on every call
    (a search of ``sys.path`` where it is not installed, ten times the conversion), and
    a Ctrl-C that lands in that search is lost."""
    pa, np = _pa(), _np()
    kind = type(values[0])
    if all(type(v) is kind for v in values):
        if kind is str:
            array = np.empty(len(values), dtype=object)
            array[:] = values
            return pa.array(array, type=pa.string())
        # numpy makes ints beyond int64 floats or uint64: those go to pyarrow, which
        # refuses them as it always did.
        want = {int: np.dtype(np.int64), float: np.dtype(np.float64), bool: np.dtype(np.bool_)}
        if kind in want:
            array = np.asarray(values)
            if array.dtype == want[kind]:
                return pa.array(array)
    return pa.array(values)


def _ragged(obj: list[Any]) -> bool:
    """Whether ``obj`` is one array per row, of one dtype and rank, whose shapes differ
    (a list of same-shaped arrays stays a list of columns, as a loader's tuple would)."""
    if len(obj) < 2 or not _arrays_of_one_kind(obj):
        return False
    return obj[0].ndim >= 1 and len({tuple(v.shape) for v in obj}) > 1


def _list_of_rows(obj: list[Any], per_row: bool, lists: str) -> bool:
    """Whether a list is rows of variable shape, one array each (see :func:`_flatten`)."""
    if lists == "rows":
        return bool(obj) and _arrays_of_one_kind(obj) and obj[0].ndim >= 1
    if not _ragged(obj):
        return False
    return per_row or lists != "columns" or not _one_length(obj)


def _one_length(arrays: list[Any]) -> bool:
    return len({len(a) for a in arrays}) == 1


def _ragged_column(name: str, rows: list[Any], columns: dict[str, Any]) -> dict[str, Any]:
    """Rows of variable shape as a list column of their values (``name``) and one of
    their shapes (``name.shape``)."""
    np, pa = _np(), _pa()
    lib = "torch" if _is_torch(rows[0]) else "numpy"
    converted = [_torch_numpy(r) if lib == "torch" else (r, None) for r in rows]
    # In this machine's byte order, as `_column` makes a column's (one copy each).
    arrays = [a if a.dtype.isnative else a.astype(a.dtype.newbyteorder("=")) for a, _ in converted]
    if arrays[0].dtype.hasobject:
        raise TypeError(f"'{name}' holds Python objects; publish numbers")
    values = np.concatenate([a.reshape(-1) for a in arrays])
    if values.dtype == np.bool_:
        values = values.view(np.uint8)
    offsets = np.zeros(len(arrays) + 1, dtype=np.int64)
    np.cumsum([a.size for a in arrays], out=offsets[1:])
    _add(columns, name, pa.LargeListArray.from_arrays(pa.array(offsets), pa.array(values)))
    # Built from numpy (see `_scalars`): every row has the first one's rank.
    rank = arrays[0].ndim
    shapes = np.array([a.shape for a in arrays], dtype=np.int64).reshape(-1)
    starts = np.arange(0, len(shapes) + 1, max(rank, 1), dtype=np.int32)
    _add(columns, f"{name}.shape", pa.ListArray.from_arrays(pa.array(starts), pa.array(shapes)))
    leaf = {"col": name, "lib": lib, "dtype": arrays[0].dtype.str, "ragged": True}
    if converted[0][1]:
        leaf["torch_dtype"] = converted[0][1]
    return leaf


def _ragged_rows(record: Any, name: str, want: Any) -> list[Any]:
    """The rows of a ragged column, each a numpy array of its own shape viewing the
    column's values."""
    np = _np()
    column = record.column(name)
    values = column.values.to_numpy(zero_copy_only=False)
    if values.dtype != want:
        values = values.view(want) if values.dtype.itemsize == want.itemsize else values.astype(want)
    offsets = column.offsets.to_numpy()
    shapes = record.column(f"{name}.shape").to_pylist()
    return [values[offsets[i]:offsets[i + 1]].reshape(shapes[i]) for i in range(len(shapes))]


def _arrow(obj: Any) -> Any:
    """``obj`` as one pyarrow RecordBatch if it is Arrow data, else ``None``."""
    pa = _pa()
    if hasattr(obj, "to_arrow") and not isinstance(obj, (pa.RecordBatch, pa.Table)):
        obj = obj.to_arrow()  # polars
    if isinstance(obj, pa.RecordBatch):
        return obj
    if isinstance(obj, pa.Table) or hasattr(obj, "__arrow_c_stream__"):
        table = pa.table(obj).combine_chunks()
        batches = table.to_batches()
        return batches[0] if batches else pa.RecordBatch.from_pylist([], schema=table.schema)
    if hasattr(obj, "__arrow_c_array__"):
        return pa.record_batch(obj)
    return None


#: The reading (per_row, lists) that made each recent first batch's structure, by the
#: structure's id (the structure is kept, so that its id is not reused): a loader's later
#: batches try it first instead of the readings before it, each a copy of a ragged
#: list's values (a batch of token sequences and `[x, y]` columns took three readings).
_READ_AS: dict[int, tuple[dict[str, Any], tuple[bool, str]]] = {}


def _remember_reading(structure: dict[str, Any], reading: tuple[bool, str]) -> None:
    if len(_READ_AS) >= 16:
        _READ_AS.clear()  # runs are few; a forgotten one only reads its batches slower
    _READ_AS[id(structure)] = (structure, reading)


def _columns(
    batch: Any, like: dict[str, Any] | None = None, rows: int | None = None
) -> tuple[dict[str, Any], dict[str, Any]]:
    """The structure and columns of a batch that is not Arrow data. Its tuples and lists
    are columns (or structures of them) unless that leaves the columns with different row
    counts, or items that are no column (a number per dict): then those whose items are
    of one kind are one item per row (`tuple(zip(*samples))`, torchvision's detection
    batches: a tuple of images of their own sizes and one of target dicts). A list of
    arrays of one dtype and rank whose shapes differ is rows of variable shape.
    ``like``: the structure of the loader's first batch; a later batch is read as it was
    where it can be (a last batch of 3 images of 3 channels would fit as columns too).
    ``rows``: for a first batch, the loader's batch size where it says one: where more
    than one reading fits, the one with that many rows (a tuple of 32 images of 3
    channels fits as columns of 3 rows, but a batch of 32 is 32 images; `[x (32, 4),
    y (32, 2)]`, torch's `default_collate` of (x, y) samples, is 32 rows, not 2)."""
    # (per_row, lists), the way the first batch was probably read first: each reading
    # is a copy of a ragged list's values.
    readings = [(False, "auto"), (True, "auto"), (False, "columns")]
    if like is not None and _has(like, "rows"):
        readings = [(True, "auto"), (False, "auto"), (False, "columns")]
    elif like is not None and _has(like, "ragged"):
        readings = [(False, "auto"), (True, "auto"), (False, "columns"), (False, "rows")]
    elif like is not None:
        readings = [(False, "columns"), (False, "auto"), (True, "auto")]
    # Tried first, but errors and fits are told in the order above, as without it.
    order = {reading: i for i, reading in enumerate(readings)}
    known = _READ_AS.get(id(like)) if like is not None else None
    if known is not None and known[0] is like and known[1] in order:
        readings = [known[1]] + [r for r in readings if r != known[1]]
    token = _LIST_KINDS.set(_list_kinds(like))
    try:
        return _read(batch, like, rows, readings, order)
    finally:
        _LIST_KINDS.reset(token)


def _list_kinds(node: Any) -> dict[str, str]:
    """The columns of lists of numbers or strings in structure ``node``, and their kinds."""
    return {leaf["col"]: leaf["kind"] for leaf in _leaves(node) if leaf.get("lib") == "list" and "kind" in leaf}


def _leaves(node: Any) -> Iterator[dict[str, Any]]:
    """The leaves of a structure (the dicts that name a column), depth first."""
    if isinstance(node, dict):
        if isinstance(node.get("col"), str):
            yield node
            return
        for value in node.values():
            yield from _leaves(value)
    elif isinstance(node, list):
        for value in node:
            yield from _leaves(value)


def _read(
    batch: Any,
    like: dict[str, Any] | None,
    rows: int | None,
    readings: list[tuple[bool, str]],
    order: dict[tuple[bool, str], int],
) -> tuple[dict[str, Any], dict[str, Any]]:
    """The first of ``readings`` of ``batch`` that fits (see :func:`_columns`)."""
    errors: list[tuple[int, bool, Exception]] = []
    fits: list[tuple[int, dict[str, Any], dict[str, Any], tuple[bool, str]]] = []
    for per_row, lists in readings:
        if lists != "auto" and like is None and rows is None:
            break  # without a word from the loader, such lists read as they always did
        columns: dict[str, Any] = {}
        try:
            structure = _flatten(batch, "", columns, per_row, lists)
            mismatch = _rows_differ(columns)
        except (TypeError, ValueError, OverflowError, _pa().ArrowException) as e:
            mismatch = e
        if mismatch is not None:
            errors.append((order[(per_row, lists)], per_row, mismatch))
        elif like is not None and _shapeless(structure) == _shapeless(like):
            return structure, columns
        elif like is None and (rows is None or _row_count(columns) == rows):
            _remember_reading(structure, (per_row, lists))
            return structure, columns
        else:
            fits.append((order[(per_row, lists)], structure, columns, (per_row, lists)))
    if fits:
        _, structure, columns, reading = min(fits, key=lambda fit: fit[0])
        if like is None:
            _remember_reading(structure, reading)
        return structure, columns
    errors.sort(key=lambda error: error[0])
    (_, _, first), (_, second_per_row, second) = errors[0], errors[1]
    if str(first) == str(second):
        raise first
    how = "read one item per row" if second_per_row else "read"
    raise type(first)(f"{first} ({how}: {second})") from first


def _row_count(columns: dict[str, Any]) -> int | None:
    return next((len(c) for c in columns.values()), None)


def _shapeless(node: Any) -> Any:
    """A structure with its row shapes as their ranks: batches padded to their own longest
    row (a `(B, L)` of token ids, L per batch) are one structure; each batch carries its
    own shapes."""
    if isinstance(node, dict):
        return {
            k: len(v) if k == "shape" and "col" in node and isinstance(v, list) else _shapeless(v)
            for k, v in node.items()
        }
    if isinstance(node, list):
        return [_shapeless(v) for v in node]
    return node


def _has(node: Any, key: str) -> bool:
    """Whether a structure reads some tuple or list as one item per row (``"rows"``), or
    some list as rows of variable shape (``"ragged"``)."""
    if isinstance(node, dict):
        return key in node or any(_has(v, key) for v in node.values())
    if isinstance(node, list):
        return any(_has(v, key) for v in node)
    return False


def _rows_differ(columns: dict[str, Any]) -> ValueError | None:
    lengths = {name: len(c) for name, c in columns.items()}
    if len(set(lengths.values())) > 1:
        return ValueError(f"the arrays of a batch must have as many rows each: {lengths}")
    return None


def flatten(
    batch: Any, like: dict[str, Any] | None = None, rows: int | None = None
) -> tuple[Any, dict[str, Any]]:
    """One batch of a loader as a pyarrow RecordBatch carrying its structure, and the
    structure (see the module docs); ``like``: the structure of the loader's first batch,
    read the same way where it fits, and a ``ValueError`` naming both where it has another
    (row shapes may differ, see :func:`_shapeless`); ``rows``: for a first batch, the
    loader's batch size (:func:`_batch_size`), which decides between two readings that
    both fit."""
    pa = _pa()
    arrow = _arrow(batch)
    if arrow is not None:
        # Batches of other columns are published as they are: a subscriber that reads
        # them one by one gets each as it is, and one that reads the topic as one Arrow
        # stream gets an error where the columns change.
        structure: dict[str, Any] = {"arrow": True}
        metadata = dict(arrow.schema.metadata or {})
    else:
        structure, columns = _columns(batch, like, rows if like is None else None)
        arrow = pa.RecordBatch.from_arrays(list(columns.values()), names=list(columns))
        metadata = {}
    if like is not None and _shapeless(structure) != _shapeless(like):
        raise ValueError(
            f"a batch of the loader has another structure than the first: "
            f"{json.dumps(structure)} instead of {json.dumps(like)}"
        )
    metadata[STRUCTURE_KEY] = json.dumps(structure).encode()
    return arrow.replace_schema_metadata(metadata), structure


def publish(
    loader: Iterable[Any],
    topic: str,
    epochs: int | None = 1,
    *,
    min_subscribers: int | None = None,
    wait_timeout: float | None = None,
    linger: float = 10.0,
    window: int | None = None,
    max_subscribers: int | None = None,
    max_held: int | None = None,
    lag_limit: int | None = None,
    resumable: bool = False,
    device: Any = None,
) -> RunStats:
    """Publishes what ``loader`` yields on ``topic``, iterating it once per epoch.

    ``loader`` is anything iterated again for each epoch (a ``DataLoader``, a list, an
    object whose ``__iter__`` starts over; a generator runs once, so pass a function
    that makes one: ``publish(lambda: gen(), ...)`` is not iterable, wrap it in a class
    with ``__iter__``). The other arguments are the topic settings of a plan
    (``sluice.min_subscribers`` and so on; ``epochs=None`` is one). Returns the run's
    :class:`RunStats`. Before
    each epoch a loader with ``set_epoch`` (a streaming dataset's), or else its sampler
    (a ``DataLoader`` over a ``DistributedSampler``), is told the epoch.

    ``resumable=True``: ``loader`` is a function of a module that trainers can import
    (``package.module:make_loader``, not a lambda, a local function or ``__main__``'s),
    which makes the loader, and the loader it makes yields the same batches for an epoch
    in any process (seeded, shuffled per ``set_epoch``). A trainer restarted from a state
    the topic no longer holds then makes it again in its own process to catch up
    (docs/python.md, "Resuming a trainer"); without it such a state is refused.

    ``device`` is where the topic's batches are, as a plan's ``sluice.device``: ``"cpu"``
    (the default: shared memory), ``"cuda:N"`` (copied once into the producer's device
    slots on GPU ``N``, which every trainer reads over CUDA IPC), ``"cuda_host:N"``
    (pinned shared memory each trainer copies to its GPU), or a ``torch.device`` with
    an index. CUDA tensors the loader yields are copied to the host first.

    An exception the loader raises reaches every subscriber as ``ProducerFailed`` with
    its type and message, then propagates here; Ctrl-C stops the run (subscribers are
    told it stopped). A batch whose structure differs from the first one's (other
    nesting, names, dtypes or row ranks; row shapes may differ, as in batches padded to
    their own length) is a ``ValueError`` naming both, which the subscribers get too.
    """
    epochs = 1 if epochs is None else epochs
    feeder, loader = _start(
        loader,
        topic,
        epochs,
        resumable,
        min_subscribers=min_subscribers,
        wait_timeout=wait_timeout,
        linger=linger,
        window=window,
        max_subscribers=max_subscribers,
        max_held=max_held,
        lag_limit=lag_limit,
        device=device,
    )
    return _feed(feeder, loader, epochs)


def _check_loader(loader: Any, epochs: Any) -> None:
    """Whether ``loader`` can be iterated for ``epochs`` epochs: a ``TypeError`` or a
    ``ValueError`` saying why not, before anything starts."""
    kind = type(loader)
    if not (hasattr(kind, "__iter__") or hasattr(kind, "__getitem__")):
        raise TypeError(
            f"the loader is a {kind.__name__}, which cannot be iterated: pass a DataLoader, "
            "a list, or an object whose __iter__ yields the batches"
        )
    if inspect.isgenerator(loader) and isinstance(epochs, int) and epochs > 1:
        raise ValueError(_runs_once(kind.__name__, epochs))


def _runs_once(kind: str, epochs: int) -> str:
    return (
        f"{kind} is an iterator, which runs once: its second epoch would be empty. For "
        f"epochs={epochs} pass something iterated again for each epoch (a list, a "
        "DataLoader, a class whose __iter__ starts over)"
    )


def _device_name(device: Any) -> str | None:
    """``device=`` as a plan names it: a name, or a ``torch.device``'s (``cuda:1``)."""
    if device is None or isinstance(device, str):
        return device
    if type(device).__module__ == "torch" and type(device).__name__ == "device":
        return str(device)
    raise TypeError(f"device must be a name ('cpu', 'cuda:N', 'cuda_host:N') or a torch.device, not {device!r}")


def _start(loader: Any, topic: str, epochs: int, resumable: bool, **settings: Any) -> tuple[Feeder, Any]:
    """The producer ``publish`` feeds (its run started), and the loader it iterates."""
    if "device" in settings:
        settings["device"] = _device_name(settings["device"])
    factory = None
    if resumable:
        factory = _factory_name(loader)
        loader = loader()
    batches, rows = _epoch_size(loader)
    feeder = Feeder(topic, factory=factory, epochs=epochs, epoch_batches=batches, epoch_rows=rows, **settings)
    try:
        _check_loader(loader, epochs)
    except (TypeError, ValueError) as e:
        # The trainers waiting for the topic hear it too.
        feeder.fail(f"{type(e).__name__}: {e}")
        raise
    return feeder, loader


def _feed(feeder: Feeder, loader: Any, epochs: int, stop: threading.Event | None = None) -> RunStats | None:
    """Feeds ``loader``'s epochs to ``feeder``; ``None`` if ``stop`` was set meanwhile."""
    first: dict[str, Any] | None = None
    rows = _batch_size(loader)
    try:
        for epoch in range(epochs):
            _set_epoch(loader, epoch)
            sent = 0
            for batch in loader:
                if stop is not None and stop.is_set():
                    feeder.close()
                    return None
                arrow, structure = flatten(batch, like=first, rows=rows)
                first = first or structure
                feeder.send(arrow)
                sent += 1
            if sent == 0 and first is not None and isinstance(loader, Iterator):
                # Exhausted in an earlier epoch: not an empty epoch of the loader's.
                raise ValueError(_runs_once(type(loader).__name__, epochs))
            feeder.end_epoch()
    except KeyboardInterrupt:
        feeder.close()
        raise
    except BaseException as e:
        if stop is not None and stop.is_set():
            return None  # closed from another thread: the run ended by that
        feeder.fail(f"{type(e).__name__}: {e}")
        raise
    return feeder.finish()


class LoaderRun:
    """What ``sluice.Producer(loader, topic=…)`` runs: :func:`publish` on a thread of
    this process, with the interface of a plan's producer."""

    plan_file = None

    def __init__(self, loader: Any, topic: str, epochs: int, resumable: bool = False, **settings: Any) -> None:
        self.topic, self.epochs = topic, epochs
        # Made here: bad settings are raised by the constructor, as a plan's are.
        self._feeder, loader = _start(loader, topic, epochs, resumable, **settings)
        self._stop = threading.Event()
        # Set by the run's thread as it ends: `Thread.join` interrupted by Ctrl-C leaves
        # the thread marked as stopped in CPython 3.11, though it runs on.
        self._done = threading.Event()
        self._pid = os.getpid()
        self._stats: RunStats | None = None
        self._error: BaseException | None = None
        self._thread = threading.Thread(target=self._run, args=(loader,), name="sluice-publish", daemon=True)
        self._thread.start()

    def _run(self, loader: Any) -> None:
        try:
            self._stats = _feed(self._feeder, loader, self.epochs, self._stop)
        except BaseException as e:  # noqa: BLE001 - raised again by wait() / close()
            self._error = e
        finally:
            self._done.set()

    def _here(self) -> None:
        """``TransportError`` in a forked child: the run and its thread are the parent's."""
        if os.getpid() != self._pid:
            from sluice._sluice import TransportError

            raise TransportError(
                f"this producer belongs to process {self._pid}, of which this process is a "
                "forked child: its run is its parent's, so it cannot be waited for or closed here"
            )

    @property
    def running(self) -> bool:
        return not self._done.is_set()

    @property
    def closed(self) -> bool:
        """Whether :meth:`close` was called."""
        return self._stop.is_set()

    @property
    def progress(self) -> dict[str, int]:
        return self._feeder.progress

    def wait(self, timeout: float | None = None) -> RunStats:
        from sluice._sluice import SluiceError, Timeout

        self._here()
        if not self._done.wait(timeout):
            raise Timeout(f"the loader's run on topic '{self.topic}' did not end within {timeout} s")
        if self._error is not None:
            raise self._error
        if self._stats is None:
            at = self.progress
            raise SluiceError(
                f"stopped: the loader's run on topic '{self.topic}' was closed in epoch "
                f"{at['epoch']}, after {at['rows']} rows"
            )
        return self._stats

    def close(self) -> None:
        self._here()
        failed = self._error if not self._stop.is_set() and self._done.is_set() else None
        self._stop.set()
        # A send waiting for subscribers that read nothing ends with the run.
        self._feeder.close()
        self._done.wait()
        if failed is not None:
            raise failed


def _batch_size(loader: Any) -> int | None:
    """The rows of a loader's full batches where it says (a torch ``DataLoader``'s
    ``batch_size``; ``None`` when its sampler batches, or for other iterables)."""
    try:
        size = getattr(loader, "batch_size", None)
    except Exception:  # noqa: BLE001 - a loader's own property: no hint then
        return None
    return size if type(size) is int and size > 0 else None


def _length(obj: Any) -> int | None:
    """``len(obj)``, or ``None`` where it has none (or a broken one)."""
    try:
        n = len(obj)
    except Exception:  # noqa: BLE001 - no __len__, or an IterableDataset's that raises
        return None
    return n if type(n) is int and n >= 0 else None


def _epoch_size(loader: Any) -> tuple[int | None, int | None]:
    """What ``loader`` says an epoch holds: its batches (``len(loader)``) and, for a
    torch ``DataLoader`` batching its sampler's indices with the default collate, its
    rows; trainers' ``len()`` (:func:`sluice.epoch_size`) until the first epoch ended
    and was counted. A ``DataLoader`` over an ``IterableDataset`` is not asked: its
    length is the dataset's guess, and asking makes torch warn when it is passed."""
    torch = sys.modules.get("torch")
    data = getattr(torch, "utils", None) and getattr(torch.utils, "data", None)
    if data is not None and isinstance(loader, data.DataLoader) and isinstance(loader.dataset, data.IterableDataset):
        return None, None
    batches = _length(loader)
    size = _batch_size(loader)
    indices = _length(getattr(loader, "sampler", None)) if size is not None else None
    # A collate function of one's own may pack or drop rows: then only batches are known.
    collate = getattr(loader, "collate_fn", None)
    default_collate = getattr(collate, "__module__", "").startswith("torch.utils.data")
    if batches is None or size is None or indices is None or not default_collate:
        return batches, None
    drop_last = getattr(loader, "drop_last", False) is True
    rows = indices // size * size if drop_last else indices
    # A sampler whose length does not make the loader's: the rows are not that simple.
    return batches, rows if -(-rows // size) == batches else None


def _set_epoch(loader: Any, epoch: int) -> None:
    """Tells ``loader`` the epoch (``set_epoch``), or else its sampler (a ``DataLoader``
    over a ``DistributedSampler``, as a training loop would)."""
    for owner in (loader, getattr(loader, "sampler", None), getattr(getattr(loader, "batch_sampler", None), "sampler", None)):
        set_epoch = getattr(owner, "set_epoch", None)
        if callable(set_epoch):
            set_epoch(epoch)
            return


def _factory_name(make: Any) -> str:
    """``package.module:function`` naming ``make``, checked to name it in a new process."""
    module = getattr(make, "__module__", None)
    name = getattr(make, "__qualname__", "")
    if not callable(make) or not module or module == "__main__" or "<" in name:
        raise ValueError(
            f"resumable=True needs a function that makes the loader, defined at the top of a "
            f"module the trainers can import (package.module:make_loader), not {make!r}"
        )
    spec = f"{module}:{name}"
    try:
        found = _resolve(spec, None)
    except (ImportError, AttributeError) as e:
        found = e
    if found is not make:
        raise ValueError(f"{spec} does not name {make!r} when imported: define the function at the top of a module")
    return spec


def _resolve(spec: str, cwd: str | None) -> Callable[[], Any]:
    """The function ``package.module:function`` names; the producer's directory ``cwd``
    is looked in for the module after this process's path."""
    module, _, name = spec.partition(":")
    try:
        found: Any = importlib.import_module(module)
    except ImportError:
        if cwd is None or cwd in sys.path:
            raise
        sys.path.append(cwd)
        found = importlib.import_module(module)
    for part in name.split("."):
        found = getattr(found, part)
    return found


def _catch_up(sink: Any, factory: str, cwd: str, epochs: int, epoch: int, index: int) -> None:
    """Makes the loader again (``factory``) and feeds ``sink`` its batches from batch
    ``index`` of ``epoch`` to the end of the run, on a thread of its own, until the
    subscriber no longer takes them (it reached the shared stream). Called by a
    subscriber whose state the topic no longer holds (see :func:`publish`)."""
    make = _resolve(factory, cwd)

    def run() -> None:
        try:
            loader = make()
            first, size = None, _batch_size(loader)
            for e in range(epoch, epochs):
                _set_epoch(loader, e)
                batches = rows = 0
                for i, batch in enumerate(loader):
                    # Skipped batches are made too: the epoch's end counts their rows.
                    arrow, structure = flatten(batch, like=first, rows=size)
                    first = first or structure
                    batches, rows = batches + 1, rows + arrow.num_rows
                    if (e, i) >= (epoch, index) and not sink.send(e, i, arrow):
                        return
                if not sink.end_epoch(e, batches, rows):
                    return
            sink.end()
        except BaseException as exc:  # noqa: BLE001 - the subscriber gets it
            sink.fail(f"{type(exc).__name__}: {exc}")

    threading.Thread(target=run, name="sluice-catch-up", daemon=True).start()


def _leaf(batch: Any, record: Any, leaf: dict[str, Any], to_tensor: Any) -> Any:
    np = _np()
    name = leaf["col"]
    if leaf["lib"] == "list":
        values = record.column(name).to_pylist()
        return tuple(values) if leaf.get("seq") == "tuple" else values
    want = np.dtype(leaf["dtype"])
    if want.kind not in "biufc":
        # Viewing a column's bytes as Python objects would read them as pointers.
        raise ValueError(f"column {name!r}: the structure names dtype {want}, not a number")
    if leaf.get("ragged"):
        rows = _ragged_rows(record, name, want)
        if leaf["lib"] == "torch" and to_tensor is not None:
            # Tensors of rows of variable shape are this process's own copies: a view of
            # the read-only shared memory would crash an in-place write.
            torch = __import__("torch")
            return [_as_torch_dtype(torch.tensor(r), leaf) for r in rows]
        return [_as_numpy_dtype(r, leaf) for r in rows]
    if leaf["lib"] == "torch" and to_tensor is not None:
        # The Sluice column itself: its DLPack export gives the tensor of its row shape.
        column = batch[name] if batch is not record else record.column(name)
        return _as_torch_dtype(to_tensor(column, want), leaf)
    column = record.column(name)
    if leaf["shape"]:
        array = column.to_numpy_ndarray()
    else:
        array = column.to_numpy(zero_copy_only=False)
    if array.dtype != want:
        array = array.view(want) if array.dtype.itemsize == want.itemsize else array.astype(want)
    return _as_numpy_dtype(array, leaf)


def _per_row(batch: Any, record: Any, node: dict[str, Any], to_tensor: Any) -> list[Any]:
    """One value per row (see :func:`_row_items`): dicts or tuples of such, or a column's
    values."""
    if "dict" in node:
        keys = [key for key, _ in node["dict"]]
        values = [_per_row(batch, record, leaf, to_tensor) for _, leaf in node["dict"]]
        return [dict(zip(keys, row)) for row in zip(*values)]
    if "tuple" in node:
        values = [_per_row(batch, record, leaf, to_tensor) for leaf in node["tuple"]]
        return [tuple(row) for row in zip(*values)]
    values = _leaf(batch, record, node, to_tensor)
    if node.get("ragged") or node["lib"] == "list":
        return values
    # `[i, ...]`: 0-d arrays and tensors, as the loader yielded them (not numpy scalars).
    return [values[i, ...] for i in range(len(values))]


def _build(batch: Any, record: Any, node: dict[str, Any], to_tensor: Any) -> Any:
    if "col" in node:
        return _leaf(batch, record, node, to_tensor)
    if "rows" in node:
        items = _per_row(batch, record, node["rows"], to_tensor)
        return tuple(items) if node.get("kind") == "tuple" else list(items)
    if "dict" in node:
        return {key: _build(batch, record, child, to_tensor) for key, child in node["dict"]}
    if "tuple" in node:
        values = [_build(batch, record, child, to_tensor) for child in node["tuple"]]
        if "namedtuple" in node:
            return _namedtuple(node["namedtuple"], values)
        return tuple(values)
    return [_build(batch, record, child, to_tensor) for child in node["list"]]


@functools.lru_cache(maxsize=16)
def _structure_columns(text: bytes) -> tuple[str, ...]:
    """The columns a structure's leaves name (once per topic, as :func:`_structure`)."""
    return tuple(leaf["col"] for leaf in _leaves(_structure(text)))


@functools.lru_cache(maxsize=16)
def _structure(text: bytes) -> dict[str, Any]:
    """A structure's JSON, parsed once per topic rather than once per batch (read only)."""
    return json.loads(text)


class _HostRows:
    """The host side of a batch of a GPU topic, as :func:`structured` reads a record
    batch: its schema at once, its columns from one copy to the host, made only if a leaf
    needs one (lists, numpy arrays, rows of variable shape; not the tensors
    ``to_tensor`` takes from the GPU)."""

    def __init__(self, batch: DeviceBatch) -> None:
        self._batch = batch
        self.schema = _pa().schema(batch)
        self._copy: Any = None

    def _host(self) -> Any:
        if self._copy is None:
            self._copy = _pa().record_batch(self._batch.to_host())
        return self._copy

    def column(self, name: str) -> Any:
        return self._host().column(name)

    def replace_schema_metadata(self, metadata: Any) -> Any:
        return self._host().replace_schema_metadata(metadata)


def structured(batch: Any, to_tensor: Any = None) -> Any:
    """A Sluice batch of a topic :func:`publish` feeds, in the loader's own structure:
    numpy arrays (viewing shared memory: read-only), Python lists for lists of strings or
    numbers, a pyarrow RecordBatch for a loader that yielded Arrow data. ``to_tensor``
    makes the leaves the loader yielded as torch tensors from their Sluice columns and
    numpy dtypes (``sluice.torch.SharedLoader`` passes DLPack to torch). A batch of a GPU
    topic (a :class:`DeviceBatch`) gives ``to_tensor`` its device columns; what is not a
    torch tensor of the loader's comes from one copy of the batch to the host."""
    pa = _pa()
    if isinstance(batch, DeviceBatch):
        record: Any = _HostRows(batch)
    else:
        record = batch if isinstance(batch, pa.RecordBatch) else pa.record_batch(batch)
    metadata = record.schema.metadata or {}
    if STRUCTURE_KEY not in metadata:
        raise ValueError(
            "this batch carries no loader structure: its topic is not fed by sluice.publish"
        )
    try:
        structure = _structure(metadata[STRUCTURE_KEY])
        if structure.get("arrow"):
            rest = {k: v for k, v in metadata.items() if k != STRUCTURE_KEY}
            return record.replace_schema_metadata(rest or None)
        missing = [c for c in _structure_columns(metadata[STRUCTURE_KEY]) if c not in record.schema.names]
        if missing:
            raise ValueError(
                f"this batch has no column {missing[0]!r} of its loader's structure: a "
                "subscriber that names columns= gets those alone, and only batches of every "
                "column rebuild the loader's (subscribe without columns=)"
            )
        return _build(batch, record, structure, to_tensor)
    except (KeyError, IndexError, AttributeError, TypeError, RecursionError) as e:
        # The structure is the topic's metadata: one that does not fit is an error of
        # the batch, as a bad value is.
        raise ValueError(
            f"this batch's loader structure does not fit its columns ({type(e).__name__}: {e})"
        ) from e
