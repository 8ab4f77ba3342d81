"""Type stubs of the ``sluice._sluice`` extension module (see ``sluice`` for an overview)."""

from __future__ import annotations

import os
from types import TracebackType
from typing import Any, Iterator, Literal, Sequence

__version__: str

JoinMode = Literal["now", "next_epoch", "replay", "catch_up"]
OnLagMode = Literal["error", "skip"]
OnMaxHeldMode = Literal["copy", "error"]

class SluiceError(Exception):
    """Base class of every error Sluice raises; the message is the Rust runtime's."""

class PlanError(SluiceError):
    """The plan file or a configuration value is wrong; plan errors name file:line:column."""

class ProducerLost(SluiceError):
    """The producer exited or was killed without ending the stream."""

class ProducerFailed(SluiceError):
    """The producer failed (for example, its query failed part-way) and told its subscribers why."""

class Lagged(SluiceError):
    """This subscriber fell further behind than the producer's ``sluice.lag_limit`` and was
    detached; subscribe with ``on_lag="skip"`` to continue past gaps."""

class Timeout(SluiceError):
    """Waiting (for a producer, a batch or a run) took longer than the caller allowed."""

class TransportError(SluiceError):
    """The shared-memory transport failed: a busy topic, too little /dev/shm, an iceoryx2 error."""

class CorruptMessage(SluiceError):
    """A message read from shared memory failed validation; nothing was trusted."""

class Column:
    """One column of a :class:`Batch`.

    Implements the Arrow PyCapsule protocol (``pyarrow.array(col)``) and DLPack
    (``numpy.from_dlpack(col)``, ``torch.from_dlpack(col)``) without copying. DLPack
    works for fixed-width numbers (1-D) and fixed-size lists of them (N-D, or the shape
    of an ``arrow.fixed_shape_tensor`` column), and raises ``BufferError`` for columns
    with nulls or other types. The tensor is read-only when the consumer asks for DLPack
    1.0 (numpy >= 2): it is shared memory.
    """

    @property
    def name(self) -> str:
        """The column's name."""
    @property
    def type(self) -> str:
        """The Arrow type, as text."""
    @property
    def null_count(self) -> int:
        """Null values in the column."""
    @property
    def shape(self) -> list[int] | None:
        """The shape ``numpy.from_dlpack(col)`` gives, or ``None`` if DLPack cannot export it."""
    def __len__(self) -> int: ...
    def __arrow_c_schema__(self) -> object:
        """Exports the field as an ``arrow_schema`` PyCapsule."""
    def __arrow_c_array__(self, requested_schema: object | None = None) -> tuple[object, object]:
        """Exports ``(arrow_schema, arrow_array)`` PyCapsules, zero-copy."""
    def __arrow_c_device_array__(
        self, requested_schema: object | None = None, **kwargs: Any
    ) -> tuple[object, object]:
        """Exports ``(arrow_schema, arrow_device_array)`` PyCapsules (device: CPU), zero-copy."""
    def __dlpack__(
        self,
        *,
        stream: Any | None = None,
        max_version: tuple[int, int] | None = None,
        dl_device: tuple[int, int] | None = None,
        copy: bool | None = None,
    ) -> object:
        """Exports a DLPack capsule (``dltensor``, or ``dltensor_versioned`` for ``max_version >= (1, 0)``)."""
    def __dlpack_device__(self) -> tuple[int, int]:
        """``(1, 0)``: host memory (kDLCPU)."""
    def to_numpy(self) -> Any:
        """``numpy.from_dlpack(self)``: zero-copy and read-only."""
    def __array__(self, dtype: Any | None = None, copy: bool | None = None) -> Any:
        """``np.asarray(col)``: the zero-copy view; ``np.array(col)``: a writable copy."""
    def to_pyarrow(self) -> Any:
        """``pyarrow.array(self)``: zero-copy."""

class Batch:
    """A record batch received from a topic.

    Implements the Arrow PyCapsule protocol (``__arrow_c_schema__``,
    ``__arrow_c_array__``, ``__arrow_c_device_array__``), so ``pyarrow.record_batch(b)``
    and ``polars.from_arrow(...)`` import it without copying. ``batch["x"]`` gives a
    :class:`Column`.
    """

    @property
    def epoch(self) -> int:
        """Epoch of the batch."""
    @property
    def index(self) -> int:
        """Position of the batch in its epoch, in this subscriber's batches."""
    @property
    def round(self) -> int | None:
        """The round of a plan of several rounds the batch belongs to (``None``: one)."""
    @property
    def shm_range(self) -> tuple[int, int] | None:
        """``(start, end)`` addresses of the shared-memory sample the batch lies in, or
        ``None`` for a batch assembled (copied once) from two producer batches."""
    @property
    def num_rows(self) -> int: ...
    @property
    def num_columns(self) -> int: ...
    @property
    def column_names(self) -> list[str]: ...
    @property
    def nbytes(self) -> int:
        """Bytes of Arrow buffers the batch references."""
    def column(self, key: str | int) -> Column:
        """The column ``key`` (name or position)."""
    def __getitem__(self, key: str | int) -> Column: ...
    def __contains__(self, name: str) -> bool: ...
    def __len__(self) -> int: ...
    def __arrow_c_schema__(self) -> object: ...
    def __arrow_c_array__(self, requested_schema: object | None = None) -> tuple[object, object]: ...
    def __arrow_c_device_array__(
        self, requested_schema: object | None = None, **kwargs: Any
    ) -> tuple[object, object]: ...
    def copy(self) -> Batch:
        """A deep copy in process memory, which holds no shared memory."""
    def to_device(self, device: int | str | Any | None = None, stream: int | None = None) -> DeviceBatch:
        """Copies the batch to a GPU of this process (the ``cuda_host`` mode; any batch).

        One asynchronous host-to-device copy per Arrow buffer, straight from the shared
        memory (registered as pinned memory in 8 MiB blocks), queued on ``stream``
        (``None``/1 legacy default, 2 per-thread default, -1 copy and wait here, or a
        stream handle such as ``torch.cuda.current_stream().cuda_stream``). The shared
        memory goes back to the producer once the copies complete. ``device``: an
        ordinal, ``"cuda"``, ``"cuda:N"`` or a CUDA ``torch.device`` (default 0). The
        result is this process's own GPU memory: writes to its tensors are private.
        Raises :class:`SluiceError` ("no CUDA driver found ...") without a GPU."""
    def to_pyarrow(self) -> Any:
        """``pyarrow.record_batch(self)``: zero-copy."""

class DeviceColumn:
    """One column of a :class:`DeviceBatch`, in GPU memory.

    ``torch.from_dlpack(col)``, ``cupy.from_dlpack(col)`` and ``jax.dlpack.from_dlpack(col)``
    take it without a copy when the batch lies within one producer batch (a read-only
    view of the producer's device slot, shared with every other subscriber: pass
    ``copy=True`` to write into it); a batch spanning several producer batches is
    assembled into this subscriber's own memory. Fixed-width numbers and fixed-size lists
    of them without nulls only; other columns raise ``BufferError``.
    """

    @property
    def name(self) -> str: ...
    @property
    def type(self) -> str: ...
    @property
    def shape(self) -> list[int] | None:
        """The tensor's shape, or ``None`` if the column cannot be a tensor."""
    def __len__(self) -> int: ...
    def __dlpack__(
        self,
        *,
        stream: int | None = None,
        max_version: tuple[int, int] | None = None,
        dl_device: tuple[int, int] | None = None,
        copy: bool | None = None,
    ) -> object:
        """A DLPack capsule on the GPU; ``stream`` (the consumer's) waits for the data, and
        the producer's slot is handed back only after work queued on it has completed."""
    def __dlpack_device__(self) -> tuple[int, int]:
        """``(2, ordinal)``: kDLCUDA, the GPU as numbered in this process."""
    @property
    def __cuda_array_interface__(self) -> dict[str, Any]:
        """Version 3; ``stream`` is the subscriber's stream the data is ready on."""
    def __arrow_c_device_array__(
        self, requested_schema: object | None = None, **kwargs: Any
    ) -> tuple[object, object]:
        """``(arrow_schema, arrow_device_array)`` on ``ARROW_DEVICE_CUDA`` with a ``sync_event``."""

class DeviceBatch:
    """A batch of a GPU topic (``sluice.device = 'cuda:N'``): columns stay on the GPU."""

    @property
    def epoch(self) -> int: ...
    @property
    def index(self) -> int: ...
    @property
    def num_rows(self) -> int: ...
    @property
    def num_columns(self) -> int: ...
    @property
    def column_names(self) -> list[str]: ...
    @property
    def producer_batches(self) -> int:
        """Producer batches the rows come from (more than one: columns are assembled)."""
    def __dlpack_device__(self) -> tuple[int, int]: ...
    def column(self, key: str | int) -> DeviceColumn: ...
    def __getitem__(self, key: str | int) -> DeviceColumn: ...
    def __contains__(self, name: str) -> bool: ...
    def __len__(self) -> int: ...
    def __arrow_c_device_array__(
        self, requested_schema: object | None = None, **kwargs: Any
    ) -> tuple[object, object]:
        """A struct array of the (tensor) columns on ``ARROW_DEVICE_CUDA`` with a ``sync_event``."""
    def __arrow_c_schema__(self) -> object:
        """The schema with its metadata (``pyarrow.schema(batch)``)."""
    def to_host(self) -> Batch:
        """The rows copied to host memory."""

class EpochSummary:
    """How one epoch ended, as this subscriber saw it."""

    @property
    def epoch(self) -> int: ...
    @property
    def complete(self) -> bool:
        """Whether this subscriber received the whole epoch (false when it joined late)."""
    @property
    def rows(self) -> int:
        """Rows this subscriber received in the epoch."""
    @property
    def batches(self) -> int:
        """Batches this subscriber received (in its own batch size)."""
    @property
    def missed(self) -> int:
        """Messages the producer skipped for this subscriber (lag limit, ``on_lag="skip"``)."""
    @property
    def producer_rows(self) -> int:
        """Rows the producer published in the epoch."""
    @property
    def producer_batches(self) -> int:
        """Batches the producer published in the epoch."""

class Epoch(Iterator[Batch]):
    """One epoch of a subscription; iterate it for its batches.

    ``complete``, ``rows``, ``batches`` and ``summary`` are ``None`` until the epoch is
    exhausted.
    """

    @property
    def epoch(self) -> int: ...
    @property
    def done(self) -> bool: ...
    @property
    def summary(self) -> EpochSummary | None: ...
    @property
    def complete(self) -> bool | None: ...
    @property
    def rows(self) -> int | None: ...
    @property
    def batches(self) -> int | None: ...
    def __iter__(self) -> Epoch: ...
    def __next__(self) -> Batch | DeviceBatch: ...

class Epochs(Iterator[Epoch]):
    """The epochs of a subscription. Moving to the next epoch skips the rest of the current one."""

    def __iter__(self) -> Epochs: ...
    def __next__(self) -> Epoch: ...

class Subscriber(Iterator[Batch]):
    """A subscription to a topic.

    Iterating it yields batches across epochs; :meth:`epochs` yields :class:`Epoch`
    objects. Waiting releases the GIL and Ctrl-C interrupts it. Raises
    :class:`Timeout` when a batch takes longer than ``timeout`` seconds,
    :class:`ProducerLost` / :class:`ProducerFailed` when the producer dies or fails.
    """

    def __init__(
        self,
        topic: str,
        batch_size: int | None = None,
        join: JoinMode = "now",
        timeout: float | None = None,
        on_lag: OnLagMode = "error",
        reconnect: float | None = None,
        columns: Sequence[str] | None = None,
        on_max_held: OnMaxHeldMode = "copy",
        state: dict[str, Any] | str | None = None,
        mask: str | None = None,
    ) -> None: ...
    def state_dict(self) -> dict[str, Any]:
        """Where this trainer is: save it with the model, pass it as ``state=`` to resume
        exactly after the rows this subscriber handed out (``{}`` before the first)."""
    def report(self, keys: Any, trainer: str | None = None, **values: Any) -> None:
        """Reports per-sample values (``loss=``, ``grad_norm=``, …; one per key) for
        samples received, which a plan of several rounds reads as ``sluice_feedback``
        from its next round on. Written within a second, on :meth:`flush_reports` and on
        :meth:`close`."""
    def flush_reports(self) -> None:
        """Writes the reports made so far now."""
    @property
    def round(self) -> int | None:
        """The round of the last batch taken (``None``: a plan of one round)."""
    @property
    def topic(self) -> str: ...
    @property
    def batch_size(self) -> int | None: ...
    @property
    def columns(self) -> list[str] | None:
        """The names of the columns received, or ``None`` for all of them."""
    @property
    def join(self) -> JoinMode: ...
    @property
    def on_lag(self) -> OnLagMode: ...
    @property
    def timeout(self) -> float | None: ...
    @property
    def closed(self) -> bool: ...
    @property
    def last_epoch(self) -> EpochSummary | None:
        """Summary of the last epoch that ended."""
    @property
    def last_published_ns(self) -> int | None:
        """When the producer published the newest of its batches received so far, in
        ``CLOCK_MONOTONIC`` nanoseconds (``time.monotonic_ns()`` in any process of the
        machine): ``time.monotonic_ns() - sub.last_published_ns`` once a batch is
        usable is its publish-to-use latency. ``None`` before the first batch."""
    def __iter__(self) -> Subscriber: ...
    def __next__(self) -> Batch | DeviceBatch: ...
    def epochs(self) -> Epochs: ...
    def close(self) -> None:
        """Leaves the topic. Batches already received stay valid. Idempotent."""
    def __enter__(self) -> Subscriber: ...
    def __exit__(
        self,
        exc_type: type[BaseException] | None,
        exc: BaseException | None,
        tb: TracebackType | None,
    ) -> bool: ...
    def __arrow_c_stream__(self, requested_schema: object | None = None) -> object:
        """Exports the rest of the stream (all epochs) as an ``arrow_array_stream`` PyCapsule."""

def subscribe(
    topic: str,
    batch_size: int | None = None,
    join: JoinMode = "now",
    timeout: float | None = None,
    on_lag: OnLagMode = "error",
    reconnect: float | None = None,
    columns: Sequence[str] | None = None,
    on_max_held: OnMaxHeldMode = "copy",
    state: dict[str, Any] | str | None = None,
    mask: str | None = None,
) -> Subscriber:
    """Attaches to ``topic``, waiting for its producer (up to ``timeout`` seconds).

    A subscriber that is waiting when its producer starts receives the stream from its
    first batch: it declares its interest, and the producer waits (at most
    ``sluice.attach_grace_s``) for it to attach before publishing.

    ``batch_size``: rows per batch for this subscriber (default: the producer's batches).
    ``join``: ``"now"`` (the current epoch is then flagged partial), ``"next_epoch"``, or
    ``"replay"`` (start with the oldest message the producer still holds, up to
    ``sluice.window`` back). ``reconnect``: after the producer is lost, wait up to this
    many seconds for a restarted one (``sluice run --resume``) and continue with no
    duplicate and no missing row (default: raise :class:`ProducerLost`). ``timeout``: seconds
    to wait for the producer, then for each batch (default: forever). ``on_lag``: under a
    producer with ``sluice.lag_limit``, ``"error"`` raises :class:`Lagged` when this
    subscriber fell too far behind; ``"skip"`` goes on (the epoch is then incomplete).
    ``columns``: the names of the columns to receive, in that order (default: all). The
    other columns are neither decoded nor validated, which is most of what a batch costs
    a subscriber that skips a string column; a name the topic lacks raises
    :class:`PlanError` at the first batch, listing the topic's columns. It must be a list
    or tuple of at least one name: a ``str`` alone is refused (``columns=["features"]``,
    not ``columns="features"``), and so are sets and dicts, whose order is not yours.
    ``on_max_held``: once this subscriber holds ``sluice.max_held`` producer messages
    (batches it keeps alive, views included), ``"copy"`` (the default) receives the next
    ones as private copies, warning once; ``"error"`` raises :class:`TransportError`.
    ``mask``: this trainer's own subset of the shared stream, a column the plan computes
    for it: a boolean (rows where true; the column is dropped) or a weight (rows where
    above zero; kept for the loss). Only the columns received are filtered; a batch
    selected whole stays zero-copy. ``state_dict()`` still counts every row.

    ``topic`` may also be ``"flight://HOST:PORT/TOPIC"`` (or ``"flight+tls://…"``): a
    topic that ``sluice serve --flight`` serves on another machine, with the same
    contract; the bearer token comes from ``SLUICE_TOKEN``, a TLS server's CA certificate
    from the file ``SLUICE_TLS_CA`` names. Batches then live in this process's memory.
    """

class RunStats:
    """What a finished run did."""

    @property
    def epochs(self) -> int: ...
    @property
    def batches(self) -> int: ...
    @property
    def rows(self) -> int: ...
    @property
    def bytes(self) -> int: ...
    @property
    def elapsed(self) -> float: ...
    @property
    def shm_bytes(self) -> int: ...
    @property
    def window(self) -> int:
        """Batches a subscriber could have queued: ``sluice.window`` as ``'auto'`` sized it, or the lag limit where one is set."""
    @property
    def waited_for_pipeline(self) -> float:
        """Seconds of ``elapsed`` the producer waited for its plan (each epoch's and each batch)."""
    @property
    def waited_for_subscribers(self) -> float:
        """Seconds of ``elapsed`` the producer spent on subscribers' full queues (the slowest one's)."""
    @property
    def messages(self) -> int:
        """Messages of batches published (several batches to a message where ``sluice.message_batches`` lets them)."""
    @property
    def wakeups(self) -> int:
        """Times idle subscribers were woken, for messages of batches and for each epoch's end and the stream's: fewer than ``messages`` where a burst of messages ready at once shared one."""

class Producer:
    """Runs a plan file on a background thread of this process and publishes its batches.

    The plan is loaded in the constructor (``PlanError`` with file:line:column; the
    subscribers waiting for its topic get ``ProducerFailed`` with the same message); the
    run starts at once, after the subscribers already waiting for the topic (in this
    process or others) have attached. Leaving a ``with`` block waits for the run and raises its error; an
    exception in the block stops the run instead.
    """

    def __init__(
        self,
        plan: str | os.PathLike[str],
        *,
        topic: str | None = None,
        epochs: int | None = None,
        batch_rows: int | None = None,
        min_subscribers: int | None = None,
        wait_timeout: float | None = None,
        linger: float = 10.0,
    ) -> None: ...
    @property
    def topic(self) -> str: ...
    @property
    def plan_file(self) -> str: ...
    @property
    def epochs(self) -> int: ...
    @property
    def running(self) -> bool: ...
    @property
    def progress(self) -> dict[str, int]:
        """``epoch``, ``batches``, ``rows``, ``bytes``, ``subscribers`` so far."""
    def wait(self, timeout: float | None = None) -> RunStats:
        """Waits for the run to end; raises its error, or ``Timeout``."""
    def close(self) -> None:
        """Stops the run if it is going and waits for it; idempotent.

        Subscribers get ``ProducerFailed`` ("stopped"), or ``ProducerLost`` if their
        queue was full at that moment (a stopping producer waits for no one). Raises the
        run's error if it failed before ``close()``.
        """
    def __enter__(self) -> Producer: ...
    def __exit__(
        self,
        exc_type: type[BaseException] | None,
        exc: BaseException | None,
        tb: TracebackType | None,
    ) -> bool: ...

def _shutdown() -> None: ...
def epoch_size(topic: str) -> tuple[int | None, int | None] | None:
    """``(batches, rows)`` of an epoch as the running producer of ``topic`` reports them
    (``None`` without one); see :func:`sluice.epoch_size`."""

class Feeder:
    """A producer whose batches Python code feeds, one message each (what
    :func:`sluice.publish` drives; see ``sluice.loader``). The run starts at once on a
    thread of this process; the topic is created with the first batch."""

    def __init__(
        self,
        topic: str,
        *,
        epochs: int | None = None,
        window: int | None = None,
        max_subscribers: int | None = None,
        min_subscribers: int | None = None,
        max_held: int | None = None,
        lag_limit: int | None = None,
        wait_timeout: float | None = None,
        linger: float = 10.0,
        factory: str | None = None,
        epoch_batches: int | None = None,
        epoch_rows: int | None = None,
        device: str | None = None,
    ) -> None:
        """``device``: ``cpu``, ``cuda:N`` or ``cuda_host:N``, as a plan's
        ``sluice.device``. ``factory``: ``package.module:function`` that makes the loader again, which
        yields the same batches for an epoch in any process: trainers whose state the
        topic no longer holds make it again to catch up. ``epoch_batches``,
        ``epoch_rows``: what the loader says an epoch holds, reported for trainers'
        ``len()`` until the first epoch ended (:func:`sluice.epoch_size`)."""
    @property
    def topic(self) -> str: ...
    @property
    def progress(self) -> dict[str, int]:
        """``epoch``, ``batches``, ``rows``, ``bytes``, ``subscribers`` so far."""
    def send(self, batch: Any) -> None:
        """Feeds the next batch of the epoch (an ``__arrow_c_array__`` record batch);
        waits, without the GIL, while the run is two batches behind."""
    def end_epoch(self) -> None:
        """Ends the current epoch."""
    def fail(self, message: str) -> None:
        """Fails the run with ``message`` (subscribers get ``ProducerFailed``)."""
    def finish(self) -> RunStats:
        """After the last epoch: waits for the run to end and returns what it did."""
    def close(self) -> None:
        """Stops the run where it is (subscribers are told it stopped)."""

class CatchUpSink:
    """Where the loader made again in a trainer's process feeds its catch-up (see
    ``sluice.loader._catch_up``); made by a subscriber, not by users."""

    def send(self, epoch: int, index: int, batch: Any) -> bool:
        """Batch ``index`` of ``epoch``; ``False`` once nobody takes them."""
    def end_epoch(self, epoch: int, batches: int, rows: int) -> bool:
        """Ends ``epoch`` (its batches and rows in all)."""
    def end(self) -> bool:
        """Ends the stream."""
    def fail(self, message: str) -> None:
        """Fails the catch-up with ``message``."""

def request_round(topic: str) -> None:
    """Asks the producer of a local ``topic`` whose plan sets ``sluice.trigger =
    'manual'`` to start its next round once the current one ends."""
