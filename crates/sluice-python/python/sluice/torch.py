"""PyTorch adapter: a ``torch.utils.data.IterableDataset`` over a Sluice topic.

::

    from torch.utils.data import DataLoader
    import sluice.torch

    ds = sluice.torch.IterableDataset("demo", batch_size=256, columns=["pixels", "label"])
    loader = DataLoader(ds, batch_size=None)      # batches are already made by Sluice
    for epoch in range(num_epochs):
        for batch in loader:                      # one Sluice epoch per pass
            loss = model(batch["pixels"]).loss(batch["label"])

Each pass over the dataset (each ``iter(loader)``) yields one epoch of the stream, so the
usual ``for epoch ...: for batch in loader`` loop sees the producer's epochs; a pass
after the end of the stream yields nothing. The subscription is opened on the first pass
and kept between passes.

On a GPU topic (``sluice.device = 'cuda:N'``) numeric columns become CUDA tensors on
torch's current stream, without a host copy; they are shared with the other trainers,
and torch does not enforce read-only, so say which you want: ``writable=True`` gives
tensors of your own (a device copy per batch), ``writable=False`` the shared ones (write
nothing into them); the default gives the shared ones with a ``SharedTensorWarning``.

``device="cuda"`` (or ``"cuda:N"``, or a ``torch.device``) asks for CUDA tensors whatever
the topic::

    ds = sluice.torch.IterableDataset("demo", batch_size=256, device="cuda")

On a host topic (``cpu`` or ``cuda_host:N``) each batch is then copied to that GPU with
:meth:`sluice.Batch.to_device`, an asynchronous host-to-device copy queued on torch's
current stream of that device (on a ``cuda_host:N`` topic the shared memory is pinned, so
the copy runs at full speed), and the shared-memory sample is handed back as soon as the
copy has completed. These tensors are this process's own copies: writing into them
changes nothing for the other trainers. Columns that are not tensors stay zero-copy
pyarrow arrays on the host, as on the CPU path (they hold the sample). On a ``cuda:N``
topic the batches already are on the GPU; ``device`` must then name that GPU (or be
``"cuda"``). ``device="cpu"`` gives CPU tensors, copying GPU batches back with
:meth:`sluice.DeviceBatch.to_host`. The default, ``device=None``, leaves every batch
where the topic puts it.

Numeric columns (and fixed-size lists of numbers, as 2-D or N-D tensors) become CPU
tensors through DLPack, without a copy: they view shared memory, so treat them as
read-only (``.clone()`` what you modify) and move them to the GPU with ``.to(device)``
as usual. Other columns (strings, nested lists) are passed as ``pyarrow`` arrays, or give
``transform=`` to build whatever the model wants from each :class:`sluice.Batch`.

Use ``num_workers=0``: preprocessing already happened in the producer, and every
subscriber receives every row, so several workers would each see the whole stream
(the adapter refuses to run in more than one worker). One worker works with
``persistent_workers=True``: the worker keeps its subscription from pass to pass, so
each pass gets the next epoch whole. Without it, torch starts a new worker for every
pass, whose new subscription would miss what the producer published in between; the
adapter refuses that configuration with an error that says so. A worker that torch
stops with SIGTERM (at the end of a script, while the worker waits for a batch) closes
its subscriptions first, leaving nothing in ``/dev/shm``.

JAX has no dataset class; the same loop works with DLPack directly::

    import jax, jax.numpy as jnp, numpy as np, sluice

    with sluice.subscribe("demo", batch_size=256) as sub:
        for epoch in sub.epochs():
            for batch in epoch:
                x = jnp.asarray(np.from_dlpack(batch["pixels"]))   # one host-to-device copy
                y = jnp.asarray(np.from_dlpack(batch["label"]))
                params, opt_state = train_step(params, opt_state, x, y)

(``jax.dlpack.from_dlpack(batch["pixels"])`` also works and avoids the copy on the CPU
backend when the buffer is aligned as XLA wants.)
"""

from __future__ import annotations

import functools

import os
import signal
import sys
import weakref
from typing import Any, Callable, Iterator, Sequence

import sluice
from sluice.loader import _is_namedtuple

try:  # torch is optional: import it lazily so `import sluice` never needs it.
    import torch as _torch
    from torch.utils.data import IterableDataset as _Base
except ImportError as _error:  # pragma: no cover - exercised where torch is absent
    _torch = None
    _IMPORT_ERROR: ImportError | None = _error

    class _Base:  # type: ignore[no-redef]
        """Stands in for torch's IterableDataset when torch is not installed."""

else:
    _IMPORT_ERROR = None


def _require_torch() -> Any:
    if _torch is None:
        raise ImportError(
            "sluice.torch needs PyTorch (pip install torch); "
            f"importing it failed: {_IMPORT_ERROR}"
        )
    return _torch


def _check_worker(info: Any) -> None:
    """Refuses DataLoader configurations whose passes would lose data silently."""
    if info.num_workers > 1:
        raise RuntimeError(
            "sluice.torch.IterableDataset must run in one DataLoader worker "
            "(num_workers=0, or num_workers=1 with persistent_workers=True): every "
            "subscriber receives every row, so each worker would see the whole stream"
        )
    if _persistent_workers() is False:
        raise RuntimeError(
            "sluice.torch.IterableDataset in a DataLoader worker needs "
            "persistent_workers=True (or num_workers=0): torch starts a new worker for "
            "every pass, whose new subscription would miss what the producer published "
            "between two passes (whole epochs, or the rest of the stream)"
        )


def _dlpack_stream(stream: Any) -> int:
    """The DLPack stream value of a torch CUDA stream.

    torch's legacy default stream has the handle 0, which DLPack does not allow (it is
    ambiguous); DLPack spells that stream 1, as ``torch.from_dlpack`` itself does."""
    handle = int(stream.cuda_stream)
    return 1 if handle == 0 else handle


def _parse_device(device: Any) -> Any:
    """``device=`` as a ``torch.device`` (``None`` stays ``None``); only CPU and CUDA."""
    if device is None:
        return None
    torch = _require_torch()
    try:
        parsed = torch.device(device)
    except (RuntimeError, TypeError) as error:
        raise ValueError(f"device must be None, 'cpu', 'cuda' or 'cuda:N': {error}") from error
    if parsed.type not in ("cpu", "cuda"):
        raise ValueError(f"device must be None, 'cpu', 'cuda' or 'cuda:N', not {device!r}")
    return parsed


def _cuda_index(torch: Any, device: Any) -> int:
    """The ordinal of a CUDA ``torch.device`` in this process; ``"cuda"`` without an index
    is torch's current device, looked up when the batch arrives (a DataLoader worker may
    have set another one than the process that built the dataset)."""
    return device.index if device.index is not None else torch.cuda.current_device()


class SharedTensorWarning(UserWarning):
    """CUDA tensors of a ``cuda:N`` topic view the producer's device memory, which every
    trainer on that GPU reads: torch has no read-only tensors, so an in-place write in
    one trainer changes the others' batches. Choose with ``writable=``."""


_warned_shared = False


def _warn_shared_once() -> None:
    global _warned_shared
    if not _warned_shared:
        _warned_shared = True
        import warnings

        warnings.warn(
            "the CUDA tensors of this cuda:N topic are the producer's device memory, shared "
            "with every trainer on this GPU, and torch does not enforce read-only: an "
            "in-place operation (x.mul_(...), x /= 255, x[mask] = 0) changes what the other "
            "trainers read. Pass writable=True for tensors of your own (a device copy per "
            "batch), or writable=False to say you never write into them (no copy; this "
            "warning goes)",
            SharedTensorWarning,
            stacklevel=4,
        )


def batch_to_tensors(
    batch: sluice.Batch | sluice.DeviceBatch,
    columns: Sequence[str] | None = None,
    *,
    device: Any = None,
    writable: bool | None = None,
) -> dict[str, Any]:
    """The batch as a dict: DLPack-able columns as tensors, others as pyarrow arrays.

    ``device=None``: zero-copy tensors where the batch is (CPU tensors viewing shared
    memory, or CUDA tensors on a GPU topic). A CUDA ``device`` (``"cuda"``, ``"cuda:N"``,
    a ``torch.device``): a host batch is copied to that GPU first
    (:meth:`sluice.Batch.to_device` on torch's current stream there); a GPU batch must
    already be on it. ``device="cpu"``: a GPU batch is copied back to the host first.

    ``writable`` matters for the CUDA tensors of a ``cuda:N`` topic, which view memory
    every trainer on the GPU reads: ``True`` gives copies of this process's own (a
    device copy per column, on torch's current stream), ``False`` the shared views (no
    copy; write nothing into them), and ``None`` the shared views with a
    :class:`SharedTensorWarning`, once. CPU tensors are always safe to write: a write
    makes a private copy of the pages it touches.
    """
    torch = _require_torch()
    device = _parse_device(device)
    names = list(columns) if columns is not None else batch.column_names
    if device is not None and device.type == "cuda":
        index = _cuda_index(torch, device)
        if isinstance(batch, sluice.DeviceBatch):
            _check_same_gpu(batch, index)
        else:
            return _host_batch_to_cuda(torch, batch, names, index)
    elif device is not None and isinstance(batch, sluice.DeviceBatch):  # device="cpu"
        batch = batch.to_host()
    out: dict[str, Any] = {}
    for name in names:
        column = batch[name]
        if isinstance(column, sluice.DeviceColumn):
            out[name] = _device_tensor(torch, column, writable)
        elif column.shape is not None:
            # The unversioned capsule: torch versions differ in how they treat read-only
            # DLPack tensors; the memory is shared either way.
            out[name] = torch.from_dlpack(column.__dlpack__())
        else:
            import pyarrow as pa

            out[name] = pa.array(column)
    return out


def _device_tensor(torch: Any, column: sluice.DeviceColumn, writable: bool | None) -> Any:
    """A GPU topic's column as a CUDA tensor: torch passes its current stream, which waits
    for the data; the tensor views the producer's device slot (or this subscriber's
    assembled copy), or with ``writable=True`` is a copy of this process's own."""
    tensor = torch.from_dlpack(column)
    if writable:
        # Queued on the same stream: the slot is retired after the copy has read it.
        return tensor.clone()
    if writable is None:
        _warn_shared_once()
    return tensor


def _check_same_gpu(batch: sluice.DeviceBatch, index: int) -> None:
    """A GPU topic's batches stay on their GPU: copying each one to another GPU would be a
    hidden peer copy per batch, so a mismatch is a configuration error."""
    have = batch.__dlpack_device__()[1]
    if have != index:
        raise ValueError(
            f"the topic's batches are on cuda:{have} (as this process numbers its GPUs), "
            f"but the dataset was asked for cuda:{index}; use device=None or 'cuda:{have}'"
        )


def _host_batch_to_cuda(
    torch: Any, batch: sluice.Batch, names: Sequence[str], index: int
) -> dict[str, Any]:
    """Copies a host batch to GPU ``index`` and returns its columns as CUDA tensors.

    The copy is queued on torch's current stream of that GPU, the stream the model's
    kernels run on, so they are ordered after it without a host synchronization; the
    tensors are this process's own memory. Sluice keeps the shared-memory sample only
    until the copy has completed, however long the tensors live."""
    tensor_columns = [name for name in names if batch[name].shape is not None]
    moved = None
    if tensor_columns:
        stream = _dlpack_stream(torch.cuda.current_stream(index))
        moved = batch.to_device(device=index, stream=stream)
    out: dict[str, Any] = {}
    for name in names:
        if moved is not None and name in tensor_columns:
            # torch.from_dlpack passes torch's current stream of the column's device,
            # which the copy above was queued on: no extra wait.
            out[name] = torch.from_dlpack(moved[name])
        else:
            # Not a tensor column (strings, nested lists, nulls): it stays on the host,
            # as on the CPU path, as a zero-copy pyarrow array (which holds the sample).
            import pyarrow as pa

            out[name] = pa.array(batch[name])
    return out


def move_batch(batch: sluice.Batch | sluice.DeviceBatch, device: Any) -> Any:
    """The batch on ``device`` (as for :class:`IterableDataset`): a host batch copied to a
    CUDA device (a :class:`sluice.DeviceBatch`), a GPU batch copied back for ``"cpu"``,
    anything else as it is. What a ``transform`` receives when ``device`` is given."""
    torch = _require_torch()
    device = _parse_device(device)
    if device is None:
        return batch
    if device.type == "cuda":
        index = _cuda_index(torch, device)
        if isinstance(batch, sluice.DeviceBatch):
            _check_same_gpu(batch, index)
            return batch
        return batch.to_device(
            device=index, stream=_dlpack_stream(torch.cuda.current_stream(index))
        )
    return batch.to_host() if isinstance(batch, sluice.DeviceBatch) else batch


def _persistent_workers() -> bool | None:
    """Whether this DataLoader worker is persistent, as torch's worker loop was told
    (``None`` where it cannot be read: not in a worker, or a torch that names it
    otherwise)."""
    frame = sys._getframe(1)
    while frame is not None:
        if frame.f_code.co_name == "_worker_loop" and "persistent_workers" in frame.f_locals:
            return bool(frame.f_locals["persistent_workers"])
        frame = frame.f_back
    return None


# The datasets of this process with an open subscription, closed on SIGTERM in a worker.
_OPEN: weakref.WeakSet[IterableDataset] = weakref.WeakSet()
_SIGTERM_PID: int | None = None
_WATCHED_PID: int | None = None


def _leave_with_parent() -> None:
    """In a DataLoader worker: when the trainer process dies, close this process's
    subscriptions and exit, at once.

    torch's own check notices a dead parent only every 5 s, and never where the worker
    started after its parent died (it then takes pid 1 for its parent): such a worker
    holds its subscription, and with it the producer and every other trainer, for good.
    ``multiprocessing`` hands each child a pipe from its parent, which the kernel closes
    when the parent dies however it ends; a thread waits on it and then stops the worker
    as torch's shutdown does (SIGTERM, which :func:`_close_on_sigterm` handles)."""
    global _WATCHED_PID
    import multiprocessing
    import threading
    from multiprocessing.connection import wait

    parent = multiprocessing.parent_process()
    if parent is None or _WATCHED_PID == os.getpid():
        return
    _WATCHED_PID = os.getpid()

    def watch() -> None:
        wait([parent.sentinel])
        os.kill(os.getpid(), signal.SIGTERM)

    threading.Thread(target=watch, name="sluice-parent-watch", daemon=True).start()


def _worker_mark(creator: int, token: str) -> str:
    """The file by which a dataset's creator learns that DataLoader workers iterate it
    (``state_dict`` there would otherwise return a position it never had)."""
    import tempfile

    return os.path.join(tempfile.gettempdir(), f"sluice-worker-{creator}-{token}")


def _mark_iterated_in_worker(path: str) -> None:
    try:
        os.close(os.open(path, os.O_CREAT | os.O_EXCL | os.O_WRONLY | os.O_NOFOLLOW, 0o600))
    except OSError:
        pass  # there already, or nowhere to write it: state_dict() then cannot tell


def _remove_mark(path: str, creator: int | None = None) -> None:
    # A forked worker's copy of the dataset is collected in the worker: the mark is the
    # creator's to remove.
    if creator is not None and os.getpid() != creator:
        return
    try:
        os.remove(path)
    except OSError:
        pass


def _sweep_marks() -> None:
    """Removes the marks of trainers that ended without removing theirs (killed)."""
    import glob
    import tempfile

    for path in glob.glob(os.path.join(tempfile.gettempdir(), "sluice-worker-*-*")):
        try:
            pid = int(os.path.basename(path).split("-")[2])
            os.kill(pid, 0)
        except ProcessLookupError:
            _remove_mark(path)
        except (ValueError, IndexError, PermissionError):
            continue


def _close_on_sigterm() -> None:
    """In a DataLoader worker: on SIGTERM, close this process's subscriptions and exit.

    torch stops a worker that does not finish within a few seconds of shutdown with
    SIGTERM, whose default action kills it with its iceoryx2 node files still in
    ``/dev/shm``. A Python handler runs between two of the subscriber's 50 ms waits: it
    closes every subscription of the process and raises ``SystemExit``, which torch's
    worker loop does not catch, so the worker exits normally and drops what it held."""
    global _SIGTERM_PID
    if _SIGTERM_PID == os.getpid():
        return
    _SIGTERM_PID = os.getpid()
    previous = signal.getsignal(signal.SIGTERM)

    def handler(signum: int, frame: Any) -> None:
        for dataset in list(_OPEN):
            dataset.close()
        if callable(previous):
            previous(signum, frame)
        raise SystemExit(128 + signum)

    try:
        signal.signal(signal.SIGTERM, handler)
    except ValueError:  # not the main thread: leave the default action
        _SIGTERM_PID = None


class IterableDataset(_Base):  # type: ignore[misc,valid-type]
    """A ``torch.utils.data.IterableDataset`` that yields one Sluice epoch per pass.

    Parameters mirror :func:`sluice.subscribe`; ``columns`` selects the columns received
    (default: all; the others are never decoded, and ``transform`` sees only these),
    ``transform`` replaces the default conversion (:func:`batch_to_tensors`).

    ``device``: where the tensors should be. ``None`` (the default) leaves each batch
    where the topic puts it: CPU tensors viewing shared memory on a host topic, CUDA
    tensors viewing the producer's device memory on a ``cuda:N`` topic. ``"cuda"``,
    ``"cuda:N"`` or a ``torch.device``: on a host topic (``cpu``, ``cuda_host:N``) each
    batch is copied to that GPU with :meth:`sluice.Batch.to_device` on torch's current
    stream there, giving CUDA tensors that are this process's own (writable) copies; on a
    ``cuda:N`` topic it must be the topic's GPU. ``"cpu"``: GPU batches are copied back.
    With ``transform``, the function receives the moved batch (a
    :class:`sluice.DeviceBatch` after a copy to the GPU).

    ``writable``: on a ``cuda:N`` topic, ``True`` yields CUDA tensors of this process's
    own (a device copy per column), ``False`` the views every trainer on the GPU shares
    (write nothing into them), ``None`` (the default) the shared views with a
    :class:`SharedTensorWarning` (see :func:`batch_to_tensors`).
    """

    def __init__(
        self,
        topic: str,
        *,
        batch_size: int | None = None,
        join: str = "now",
        timeout: float | None = None,
        on_lag: str = "error",
        columns: Sequence[str] | None = None,
        transform: Callable[[sluice.Batch], Any] | None = None,
        device: Any = None,
        writable: bool | None = None,
    ) -> None:
        _require_torch()
        super().__init__()
        if writable not in (None, True, False):
            raise TypeError(f"writable must be True, False or None, not {writable!r}")
        self.writable = writable
        # Parsed here so that a wrong value fails when the dataset is built, not at the
        # first batch; "cuda" without an index is resolved per batch (see _cuda_index).
        self.device = _parse_device(device)
        self.topic = topic
        self.batch_size = batch_size
        self.join = join
        self.timeout = timeout
        self.on_lag = on_lag
        if isinstance(columns, (str, bytes)):
            raise TypeError(f"columns must be a list of column names, not one: columns=[{columns!r}]")
        self.columns = list(columns) if columns is not None else None
        self.transform = transform
        self._subscriber: sluice.Subscriber | None = None
        self._epochs: Iterator[sluice.Epoch] | None = None
        self._pid = os.getpid()
        # Who made the dataset, and a name of its own: the workers that iterate a copy
        # of it say so (`_worker_mark`), for state_dict() here.
        self._creator, self._token = os.getpid(), os.urandom(8).hex()
        _sweep_marks()
        weakref.finalize(self, _remove_mark, _worker_mark(self._creator, self._token), self._creator)
        self._state: dict[str, Any] = {}
        self._known_size: tuple[int | None, int | None] | None = None

    def state_dict(self) -> dict[str, Any]:
        """Where this trainer is (``StatefulDataLoader``'s protocol): save it with the
        model; :meth:`load_state_dict` in a restarted trainer, before iterating, resumes
        exactly after the last batch this dataset yielded. In the process that iterates
        it: a ``DataLoader`` with a worker iterates a copy there (and reads ahead of what
        this process received), so here it is a ``RuntimeError``; torchdata's
        ``StatefulDataLoader`` asks the worker, batch by batch."""
        if self._subscriber is not None:
            return self._subscriber.state_dict()
        if os.getpid() == self._creator and os.path.exists(_worker_mark(self._creator, self._token)):
            raise RuntimeError(
                "state_dict(): this dataset is iterated in a DataLoader worker process, whose "
                "position this process does not see (the worker also reads ahead of the "
                "batches this process received): resume with num_workers=0, or with "
                "torchdata's StatefulDataLoader, which takes the state from the worker with "
                "each batch"
            )
        return dict(self._state)

    def load_state_dict(self, state: dict[str, Any]) -> None:
        """Starts the next subscription at ``state`` (what :meth:`state_dict` returned)."""
        if self._subscriber is not None:
            raise RuntimeError("load_state_dict() must be called before the first iteration")
        self._state = dict(state)

    def _connect(self) -> Iterator[sluice.Epoch]:
        if self._pid != os.getpid():
            # A forked DataLoader worker: the parent's subscription is not ours to use.
            self._subscriber, self._epochs, self._pid = None, None, os.getpid()
        if self._epochs is None:
            self._subscriber = sluice.subscribe(
                self.topic,
                batch_size=self.batch_size,
                join=self.join,
                timeout=self.timeout,
                on_lag=self.on_lag,
                columns=self.columns,
                state=self._state,
            )
            self._state = {}
            self._epochs = self._subscriber.epochs()
            _OPEN.add(self)
        return self._epochs

    def __iter__(self) -> Iterator[Any]:
        info = _require_torch().utils.data.get_worker_info()
        if info is not None:
            _check_worker(info)
            _close_on_sigterm()
            _leave_with_parent()
            _mark_iterated_in_worker(_worker_mark(self._creator, self._token))
        epoch = next(self._connect(), None)
        if epoch is None:
            return
        transform, device, columns = self.transform, self.device, self.columns
        writable = self.writable

        def convert(batch: sluice.Batch | sluice.DeviceBatch) -> Any:
            if transform is not None:
                return transform(move_batch(batch, device))
            return batch_to_tensors(batch, columns, device=device, writable=writable)

        for batch in epoch:
            converted = convert(batch)
            # Not kept across the yield: after a copy to the GPU the host batch is not
            # needed, and its sample goes back as soon as the copy has completed.
            del batch
            yield converted

    @property
    def last_epoch(self) -> sluice.EpochSummary | None:
        """Summary of the last epoch that ended (rows, completeness)."""
        return self._subscriber.last_epoch if self._subscriber is not None else None

    def __len__(self) -> int:
        """Batches of an epoch as this trainer gets them, for a learning-rate schedule's
        steps or a progress bar's total: with ``batch_size=None`` the publishing loader's
        ``len()``, with a batch size the epoch's rows in batches of it (the last one
        shorter). The topic's producer tells it (:func:`sluice.epoch_size`); before this
        dataset first iterates, ``len()`` waits for a producer as a subscription does
        (``timeout``), after it the last size known stands in for a producer that is
        gone. A ``TypeError`` where it is not known (``tqdm`` then shows no total): a
        loader without ``len()``, a plan's topic before its first epoch ended, a remote
        topic, no producer within ``timeout``. A trainer that joins mid-epoch gets fewer
        in its first epoch; a topic of rounds tells the last epoch's size."""
        batches, rows = self._epoch_size()
        if self.batch_size is None and batches is not None:
            return batches
        if self.batch_size is not None and rows is not None:
            return -(-rows // self.batch_size)
        wanted = "batches" if self.batch_size is None else "rows"
        raise TypeError(
            f"the length of an epoch of topic '{self.topic}' is not known: its producer does "
            f"not know its {wanted} (a loader without len(), or whose sampler or collate "
            f"function makes its batches; a plan's topic until its first epoch ended)"
        )

    def __bool__(self) -> bool:
        # Not len() != 0: truth must not wait for a producer (`loader or default`).
        return True

    def _epoch_size(self) -> tuple[int | None, int | None]:
        """What the producer reports now; once known, the last size it reported where
        it reports nothing (it ended); else a wait for it, before the first pass."""
        waited = self._subscriber is None and self._known_size is None
        timeout = self.timeout if waited else 0.0
        try:
            if waited and timeout is None:
                size = _wait_for_epoch_size(self.topic)
            else:
                size = sluice.epoch_size(self.topic, timeout=timeout)
        except (ValueError, sluice.Timeout) as e:
            if self._known_size is not None:
                return self._known_size
            raise TypeError(f"len(): {e}") from e
        self._known_size = size
        return size

    def close(self) -> None:
        """Leaves the topic. Tensors already received stay valid."""
        if self._subscriber is not None:
            self._subscriber.close()
        self._subscriber = None
        self._epochs = None
        _OPEN.discard(self)

    def __getstate__(self) -> dict[str, Any]:
        # A subscription does not cross processes: a worker opens its own.
        state = dict(self.__dict__)
        state["_subscriber"] = None
        state["_epochs"] = None
        return state


def _wait_for_epoch_size(topic: str) -> tuple[int | None, int | None]:
    """:func:`sluice.epoch_size` without a time limit, saying once after a while what
    it waits for: a producer reports in its namespace's state directory, which follows
    ``XDG_RUNTIME_DIR`` or ``TMPDIR``, so a producer started where they differ is never
    seen (while its topic is)."""
    import warnings

    try:
        return sluice.epoch_size(topic, timeout=10.0)
    except sluice.Timeout:
        warnings.warn(
            f"len() of the loader of topic '{topic}' waits for its producer's report: a "
            f"producer started with another XDG_RUNTIME_DIR or TMPDIR reports elsewhere "
            f"(set timeout= to bound the wait)",
            RuntimeWarning,
            stacklevel=4,
        )
        return sluice.epoch_size(topic)


def _structured_tensors(
    batch: sluice.Batch | sluice.DeviceBatch, device: Any = None, writable: bool | None = None
) -> Any:
    """``batch`` in its loader's structure (:func:`sluice.structured`), the loader's
    tensors as torch tensors (DLPack views of shared memory, or of the producer's device
    slot on a GPU topic: copies of their own with ``writable=True``), moved to
    ``device``."""
    torch = _require_torch()

    def tensor(column: Any, dtype: Any) -> Any:
        if isinstance(column, sluice.DeviceColumn):
            out = _device_tensor(torch, column, writable)
        else:
            out = torch.from_dlpack(column.__dlpack__())
        # Bool tensors travel as bytes (Arrow tensors hold no bits).
        return out.view(torch.bool) if dtype.kind == "b" and out.dtype != torch.bool else out

    return _moved(sluice.structured(batch, to_tensor=tensor), device)


def _moved(obj: Any, device: Any) -> Any:
    if device is None:
        return obj
    if isinstance(obj, dict):
        return {k: _moved(v, device) for k, v in obj.items()}
    if isinstance(obj, tuple) and _is_namedtuple(type(obj)):
        return type(obj)(*(_moved(v, device) for v in obj))
    if isinstance(obj, (tuple, list)):
        return type(obj)(_moved(v, device) for v in obj)
    return obj.to(device) if hasattr(obj, "to") and not isinstance(obj, str) else obj


class SharedLoader(IterableDataset):
    """A ``DataLoader`` replacement for a topic that :func:`sluice.publish` feeds: each
    pass yields one epoch of exactly what the publishing loader yielded (the same
    nesting, dtypes and shapes; with ``batch_size=None`` the same batches), so a training
    script changes one line::

        loader = sluice.torch.SharedLoader("images")   # was: DataLoader(dataset, ...)
        for epoch in range(epochs):
            for images, labels in loader:
                ...

    The loader's torch tensors arrive as CPU tensors viewing shared memory (a write
    makes a private copy of the pages it touches), its numpy arrays as numpy arrays, its
    lists as lists. ``batch_size`` re-batches to this trainer's own size; ``join``,
    ``timeout`` and ``on_lag`` are :func:`sluice.subscribe`'s; ``device`` moves every
    tensor there (``"cuda"``: a host-to-device copy per tensor, on torch's current
    stream). On a GPU topic (``publish(..., device="cuda:N")``) the loader's tensors
    arrive as CUDA tensors viewing the producer's device memory, shared by every trainer
    on that GPU: ``writable`` is as for :class:`IterableDataset` (``True``: a device copy
    of their own; ``False``: the shared views; ``None``: the views, with a
    :class:`SharedTensorWarning` once).
    """

    def __init__(
        self,
        topic: str,
        batch_size: int | None = None,
        *,
        join: str = "now",
        timeout: float | None = None,
        on_lag: str = "error",
        device: Any = None,
        writable: bool | None = None,
    ) -> None:
        if writable not in (None, True, False):
            raise TypeError(f"writable must be True, False or None, not {writable!r}")
        super().__init__(
            topic,
            batch_size=batch_size,
            join=join,
            timeout=timeout,
            on_lag=on_lag,
            transform=functools.partial(_structured_tensors, device=_parse_device(device), writable=writable),
        )
