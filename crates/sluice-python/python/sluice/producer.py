"""``sluice.Producer``: a plan file, or any Python data loader, published from a
background thread of this process."""

from __future__ import annotations

import itertools
import os
import time
import weakref
from types import TracebackType
from typing import Any

from sluice._sluice import Producer as _PlanProducer
from sluice._sluice import ProducerFailed, RunStats, Timeout
from sluice._sluice import epoch_size as _epoch_size
from sluice.loader import LoaderRun


# The producers of this process, for `epoch_size`, which must not wait for the report of
# one that failed here; numbered, so that the newest of a topic's counts.
_MINE: weakref.WeakSet[Producer] = weakref.WeakSet()
_SERIAL = itertools.count()


class Producer:
    """Publishes a topic from a background thread of this process: a plan file
    (``Producer("pipelines/demo.sql", min_subscribers=2)``), or what a Python data loader
    yields (``Producer(loader, topic="images", epochs=3)``, as :func:`sluice.publish`
    does, with its settings: ``window``, ``max_subscribers``, ``max_held``,
    ``lag_limit``, ``resumable``).

    A plan is loaded in the constructor (``PlanError`` with file:line:column; the
    subscribers waiting for its topic get ``ProducerFailed`` with the same message); a
    loader's settings are checked there too. The run starts at once, after the
    subscribers already waiting for the topic (in this process or others) have
    attached. Leaving a ``with`` block waits for the run and raises its error; an
    exception in the block stops the run instead.
    """

    def __init__(
        self,
        source: str | os.PathLike[str] | Any,
        *,
        topic: str | None = None,
        epochs: int | None = None,
        batch_rows: int | None = None,
        min_subscribers: int | None = None,
        wait_timeout: float | None = None,
        linger: float = 10.0,
        **loader_settings: Any,
    ) -> None:
        common = {"min_subscribers": min_subscribers, "wait_timeout": wait_timeout, "linger": linger}
        if isinstance(source, (str, os.PathLike)):
            if loader_settings:
                raise TypeError(f"{sorted(loader_settings)}: settings of a loader's run, not of a plan file's")
            self._run: Any = _PlanProducer(source, topic=topic, epochs=epochs, batch_rows=batch_rows, **common)
            self._serial = next(_SERIAL)
            _MINE.add(self)
            return
        if not hasattr(source, "__iter__") and not (callable(source) and loader_settings.get("resumable")):
            raise TypeError(
                f"Producer takes a plan file's path or a data loader (anything iterable), "
                f"not {type(source).__name__}"
            )
        if topic is None:
            raise ValueError("a loader's Producer needs its topic: Producer(loader, topic='images')")
        if batch_rows is not None:
            raise TypeError("batch_rows is a plan's setting: a loader's batches are published as it yields them")
        self._run = LoaderRun(source, topic, 1 if epochs is None else epochs, **common, **loader_settings)
        self._serial = next(_SERIAL)
        _MINE.add(self)

    @property
    def topic(self) -> str:
        return self._run.topic

    @property
    def plan_file(self) -> str | None:
        """The plan's file, or ``None`` for a loader."""
        return self._run.plan_file

    @property
    def epochs(self) -> int:
        return self._run.epochs

    @property
    def running(self) -> bool:
        return self._run.running

    @property
    def progress(self) -> dict[str, int]:
        """``epoch``, ``batches``, ``rows``, ``bytes``, ``subscribers`` so far."""
        return self._run.progress

    def wait(self, timeout: float | None = None) -> RunStats:
        """Waits for the run to end; raises its error, or ``Timeout``."""
        return self._run.wait(timeout)

    def close(self) -> None:
        """Stops the run if it is going and waits for it; idempotent. Raises the run's
        error if it failed before ``close()``."""
        self._run.close()

    def __enter__(self) -> Producer:
        return self

    def __exit__(
        self,
        exc_type: type[BaseException] | None,
        exc: BaseException | None,
        tb: TracebackType | None,
    ) -> bool:
        if isinstance(self._run, _PlanProducer):
            return self._run.__exit__(exc_type, exc, tb)
        if exc_type is not None:
            try:
                self.close()
            except Exception:  # noqa: BLE001 - the block's exception is the one raised
                pass
        elif not self._run.closed:
            self.wait()
        return False

    def __repr__(self) -> str:
        if isinstance(self._run, _PlanProducer):
            return repr(self._run)
        return f"sluice.Producer(loader, topic={self.topic!r}, epochs={self.epochs}, running={self.running})"


def epoch_size(topic: str, timeout: float | None = None) -> tuple[int | None, int | None]:
    """``(batches, rows)`` of an epoch of ``topic``, as its producer in this namespace
    reports it: those of its last whole epoch, or before the first ended what the loader
    it publishes says of itself (``len(loader)``, and a ``DataLoader``'s rows); either is
    ``None`` where not known. Waits for a producer up to ``timeout`` seconds (``None``:
    as long as it takes), then raises :class:`sluice.Timeout`; a producer of the topic
    that failed (one of this process's, or one still telling its subscribers why) raises
    :class:`sluice.ProducerFailed` with its error, as a subscription would. Remote (``flight://``) topics are a ``ValueError``: their
    producer's reports are on another machine."""
    if not isinstance(topic, str):
        raise TypeError(f"topic must be a str, not {type(topic).__name__}")
    if "://" in topic:
        raise ValueError(f"the size of an epoch of the remote topic '{topic}' is not known here")
    if timeout is not None:
        if isinstance(timeout, bool) or not isinstance(timeout, (int, float)):
            raise TypeError(f"timeout must be a number of seconds or None, not {type(timeout).__name__}")
        if not timeout >= 0:  # NaN too
            raise ValueError(f"timeout must be a number of seconds, at least 0, not {timeout}")
    deadline = None if timeout is None else time.monotonic() + timeout
    while True:
        # Before the report too: a failed run's report may still be there for a moment.
        _raise_if_failed_here(topic)
        size = _epoch_size(topic)
        if size is not None:
            return size
        if deadline is not None and time.monotonic() >= deadline:
            raise Timeout(f"no producer of topic '{topic}' is running (waited {timeout} s)")
        # Reports are rewritten every 250 ms: a shorter poll finds nothing sooner.
        time.sleep(0.1)


def _raise_if_failed_here(topic: str) -> None:
    """``ProducerFailed`` where the newest producer of ``topic`` in this process has ended
    with an error (it reports nothing once it failed); not one that was closed."""
    mine = [p for p in list(_MINE) if p.topic == topic]
    if not mine:
        return
    newest = max(mine, key=lambda p: p._serial)
    if newest.running or getattr(newest._run, "closed", False):
        return
    try:
        newest.wait(0)
    except Timeout:
        return
    except Exception as error:  # noqa: BLE001 - any error of the run is its failure
        raise ProducerFailed(f"the producer of topic '{topic}' in this process failed: {error}") from error
