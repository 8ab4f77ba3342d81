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
so ``.clone()`` what you modify.

Numeric columns (and fixed-size lists of numbers, as 2-D or N-D tensors) become CPU
tensors through DLPack, without a copy: they view shared memory, so treat them as
read-only (``.clone()`` what you modify) and move them to the GPU with ``.to(device)``
as usual. Other columns (strings, nested lists) are passed as ``pyarrow`` arrays, or give
``transform=`` to build whatever the model wants from each :class:`sluice.Batch`.

Use ``num_workers=0``: preprocessing already happened in the producer, and every
subscriber receives every row, so several workers would each see the whole stream
(the adapter refuses to run in more than one worker).

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

import os
from typing import Any, Callable, Iterator, Sequence

import sluice

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


def batch_to_tensors(
    batch: sluice.Batch | sluice.DeviceBatch, columns: Sequence[str] | None = None
) -> dict[str, Any]:
    """The batch as a dict: DLPack-able columns as zero-copy tensors (CPU tensors, or CUDA
    tensors on a GPU topic), others as pyarrow arrays."""
    torch = _require_torch()
    out: dict[str, Any] = {}
    for name in columns if columns is not None else batch.column_names:
        column = batch[name]
        if isinstance(column, sluice.DeviceColumn):
            # A GPU topic: torch passes its current stream, which waits for the data; the
            # tensor views the producer's device slot (or this subscriber's assembled copy).
            out[name] = torch.from_dlpack(column)
        elif column.shape is not None:
            # The unversioned capsule: torch versions differ in how they treat read-only
            # DLPack tensors; the memory is shared either way.
            out[name] = torch.from_dlpack(column.__dlpack__())
        else:
            import pyarrow as pa

            out[name] = pa.array(column)
    return out


class IterableDataset(_Base):  # type: ignore[misc,valid-type]
    """A ``torch.utils.data.IterableDataset`` that yields one Sluice epoch per pass.

    Parameters mirror :func:`sluice.subscribe`; ``columns`` selects columns (default: all),
    ``transform`` replaces the default conversion (:func:`batch_to_tensors`).
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
    ) -> None:
        _require_torch()
        super().__init__()
        self.topic = topic
        self.batch_size = batch_size
        self.join = join
        self.timeout = timeout
        self.on_lag = on_lag
        self.columns = list(columns) if columns is not None else None
        self.transform = transform
        self._subscriber: sluice.Subscriber | None = None
        self._epochs: Iterator[sluice.Epoch] | None = None
        self._pid = os.getpid()

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
            )
            self._epochs = self._subscriber.epochs()
        return self._epochs

    def __iter__(self) -> Iterator[Any]:
        info = _require_torch().utils.data.get_worker_info()
        if info is not None and info.num_workers > 1:
            raise RuntimeError(
                "sluice.torch.IterableDataset must run in one DataLoader worker "
                "(num_workers=0 or 1): every subscriber receives every row"
            )
        epoch = next(self._connect(), None)
        if epoch is None:
            return
        convert = self.transform or (lambda b: batch_to_tensors(b, self.columns))
        for batch in epoch:
            yield convert(batch)

    @property
    def last_epoch(self) -> sluice.EpochSummary | None:
        """Summary of the last epoch that ended (rows, completeness)."""
        return self._subscriber.last_epoch if self._subscriber is not None else None

    def close(self) -> None:
        """Leaves the topic."""
        if self._subscriber is not None:
            self._subscriber.close()
        self._subscriber = None
        self._epochs = None

    def __getstate__(self) -> dict[str, Any]:
        # A subscription does not cross processes: a worker opens its own.
        state = dict(self.__dict__)
        state["_subscriber"] = None
        state["_epochs"] = None
        return state
