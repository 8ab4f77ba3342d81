"""Sluice: one ML preprocessing pipeline per machine, fed zero-copy to every trainer.

A producer runs a plan file (DataFusion SQL) once and publishes its output as Arrow
record batches in shared memory; every subscriber on the machine reads the same memory.

Subscribing::

    import sluice, numpy as np, pyarrow as pa

    with sluice.subscribe("demo", batch_size=256) as sub:
        for epoch in sub.epochs():
            for batch in epoch:
                table = pa.record_batch(batch)          # zero-copy (Arrow PyCapsule)
                x = np.from_dlpack(batch["features"])  # zero-copy, read-only, 2-D
            print(epoch.epoch, epoch.rows, epoch.complete)

Producing from Python (a background thread of this process)::

    with sluice.Producer("pipelines/demo.sql", min_subscribers=2, epochs=3) as producer:
        ...                  # start trainers; the block's end waits for the run

Batches stay valid and unchanged for as long as anything refers to them (a pyarrow array,
a numpy array, a tensor), whatever happens to the subscriber (closed, left by ``break``
or an exception, garbage-collected): the shared-memory sample goes back to the producer
when the last view is gone. A subscriber holds batches of at most ``sluice.max_held``
producer messages in shared memory at once (a plan option, default 4; batches cut from
one message count once); beyond that, batches arrive as private copies (one warning),
or, with ``on_max_held="error"``, receiving raises :class:`TransportError`.
Keep longer-lived data as copies: ``batch.copy()``, or ``np.array(batch["x"])`` (while
``np.asarray(batch["x"])`` is a zero-copy view).
Iterating a subscriber through the Arrow stream interface
(``pyarrow.RecordBatchReader.from_stream(sub)``, ``polars.DataFrame(sub)``) copies each
batch once for that reason; iterate the subscriber itself for zero-copy batches.

Errors are subclasses of :class:`SluiceError`. Waiting releases the GIL and Ctrl-C
interrupts it.

On a GPU topic (``SET sluice.device = 'cuda:N'``) iteration yields
:class:`DeviceBatch` objects: their columns stay in GPU memory and are exported to torch,
CuPy and JAX through DLPack on CUDA and ``__cuda_array_interface__`` (docs/gpu.md).

PyTorch: :mod:`sluice.torch` (an ``IterableDataset``, one epoch per pass). JAX: see the
recipe in :mod:`sluice.torch`'s documentation (``jnp.asarray(np.from_dlpack(col))``).
"""

from __future__ import annotations

import atexit as _atexit

from sluice._sluice import (
    Batch,
    Column,
    CorruptMessage,
    DeviceBatch,
    DeviceColumn,
    Epoch,
    Epochs,
    EpochSummary,
    Lagged,
    PlanError,
    ProducerFailed,
    ProducerLost,
    RunStats,
    SluiceError,
    Subscriber,
    Timeout,
    TransportError,
    __version__,
    _shutdown,
    request_round,
    subscribe,
)
from sluice.loader import publish, structured
from sluice.producer import Producer, epoch_size

# Producers still running when the interpreter exits are stopped, so that they remove
# their shared memory instead of leaving it to be reclaimed by the next process.
_atexit.register(_shutdown)

__all__ = [
    "Batch",
    "Column",
    "CorruptMessage",
    "DeviceBatch",
    "DeviceColumn",
    "Epoch",
    "EpochSummary",
    "Epochs",
    "Lagged",
    "PlanError",
    "Producer",
    "ProducerFailed",
    "ProducerLost",
    "RunStats",
    "SluiceError",
    "Subscriber",
    "Timeout",
    "TransportError",
    "__version__",
    "epoch_size",
    "publish",
    "request_round",
    "structured",
    "subscribe",
]
