"""Errors are typed Python exceptions carrying the Rust message; bad arguments are
TypeError/ValueError, never a crash."""

from __future__ import annotations

import re
import signal
import time

import pytest
from helpers import cuda_driver_present

import sluice


def test_exception_classes_form_one_hierarchy():
    for cls in (
        sluice.PlanError,
        sluice.ProducerLost,
        sluice.ProducerFailed,
        sluice.Lagged,
        sluice.Timeout,
        sluice.TransportError,
        sluice.CorruptMessage,
    ):
        assert issubclass(cls, sluice.SluiceError)
        assert cls.__module__ == "sluice" and cls.__doc__
    assert issubclass(sluice.SluiceError, Exception)


def test_a_bad_plan_raises_plan_error_with_file_line_and_column(plans):
    path = plans.dir / "bad.sql"
    path.write_text("SET sluice.topic = 'x';\n\nSELEC id FROM nowhere;\n")
    with pytest.raises(sluice.PlanError, match=re.escape(str(path)) + r":3:\d+: "):
        sluice.Producer(path)


def test_an_unknown_option_lists_the_valid_ones(plans):
    path = plans.dir / "bad.sql"
    path.write_text("SET sluice.bogus = 1;\nSELECT 1 AS a;\n")
    with pytest.raises(sluice.PlanError, match=r"bad.sql:1:\d+: .*sluice.batch_rows"):
        sluice.Producer(path)


def test_invalid_settings_are_plan_errors(plans):
    with pytest.raises(sluice.PlanError, match="min_subscribers"):
        sluice.Producer(plans.plan(), min_subscribers=1000)


def test_a_missing_plan_file_is_a_sluice_error(plans):
    with pytest.raises(sluice.SluiceError, match="cannot read plan file"):
        sluice.Producer(plans.dir / "missing.sql")


def test_subscribing_without_a_producer_times_out(ns):
    start = time.monotonic()
    with pytest.raises(sluice.Timeout, match="a producer to create topic 'nobody-here'"):
        sluice.subscribe("nobody-here", timeout=0.3)
    assert time.monotonic() - start >= 0.3


def test_waiting_for_a_batch_times_out_and_loses_nothing(plans):
    producer = sluice.Producer(plans.plan(rows=100), min_subscribers=2)
    first = sluice.subscribe(plans.topic, timeout=0.3)
    with pytest.raises(sluice.Timeout, match="the next batch"):
        next(first)
    # A second subscriber lets the producer start; the first one still gets everything.
    second = sluice.subscribe(plans.topic, timeout=30)
    import threading

    rows: list[int] = []
    reader = threading.Thread(target=lambda: rows.extend(len(b) for b in second))
    reader.start()
    got = 0
    while True:
        try:
            got += sum(len(b) for b in first)
            break
        except sluice.Timeout:
            continue
    reader.join(30)
    assert got == 100 and sum(rows) == 100
    first.close()
    second.close()
    producer.wait(timeout=30)


def test_a_producer_failing_at_run_time_raises_producer_failed_in_subscribers(plans):
    """The query fails part-way (a cast of row 100); subscribers get the rows before it,
    then ProducerFailed with the producer's message, then the end of the stream."""
    select = (
        "SELECT id, CAST(CASE WHEN id < 100 THEN '1' ELSE 'oops' END AS INT) AS v FROM t"
    )
    producer = sluice.Producer(plans.plan(rows=200, batch_rows=10, select=select),
                               min_subscribers=1)
    rows = 0
    with sluice.subscribe(plans.topic, timeout=30) as sub:
        with pytest.raises(sluice.ProducerFailed, match="oops") as failed:
            for batch in sub:
                rows += len(batch)
        assert next(sub, None) is None
    assert "producer failed" in str(failed.value)
    assert 0 < rows <= 100
    with pytest.raises(sluice.SluiceError, match="oops"):
        producer.wait(timeout=30)
    # The error stays: waiting again raises it again, close() after a failure too.
    with pytest.raises(sluice.SluiceError, match="oops"):
        producer.close()


def test_a_killed_producer_raises_producer_lost(plans, run_python):
    # A short window keeps the producer mid-stream behind this subscriber; 'auto' would
    # queue all 40 batches at once and the run could be over before the SIGKILL.
    plan = plans.plan(rows=2000, batch_rows=50, extra="SET sluice.window = 4;\n")
    child = run_python(
        "import sys, sluice\n"
        "p = sluice.Producer(sys.argv[1], min_subscribers=1)\n"
        "print('started', flush=True)\n"
        "p.wait()\n",
        str(plan),
    )
    assert child.stdout.readline().strip() == "started"
    with sluice.subscribe(plans.topic, timeout=30) as sub:
        batch = next(sub)
        del batch
        child.send_signal(signal.SIGKILL)
        child.wait(10)
        with pytest.raises(sluice.ProducerLost, match=f"producer of topic '{plans.topic}' is gone"):
            for batch in sub:
                del batch


@pytest.mark.parametrize(
    "call",
    [
        lambda: sluice.subscribe(42),
        lambda: sluice.subscribe(b"bytes"),
        lambda: sluice.subscribe("t", batch_size="64"),
        lambda: sluice.subscribe("t", batch_size=6.4),
        lambda: sluice.subscribe("t", batch_size=True),
        lambda: sluice.subscribe("t", join=1),
        lambda: sluice.subscribe("t", timeout="soon"),
        lambda: sluice.subscribe("t", on_lag=False),
        lambda: sluice.Subscriber(None),
        lambda: sluice.Producer(42),
        lambda: sluice.Producer("plan.sql", epochs="2"),
        lambda: sluice.Producer("plan.sql", min_subscribers=1.5),
        lambda: sluice.Producer("plan.sql", linger="long"),
        lambda: sluice.Producer("plan.sql", 2),
    ],
)
def test_wrong_argument_types_raise_type_error(ns, call):
    with pytest.raises(TypeError):
        call()


@pytest.mark.parametrize(
    "call, message",
    [
        (lambda: sluice.subscribe("t", batch_size=0), "batch_size must be at least 1"),
        (lambda: sluice.subscribe("t", batch_size=-5), "batch_size must be at least 1"),
        (lambda: sluice.subscribe("t", join="later"), "unknown join mode"),
        (lambda: sluice.subscribe("t", on_lag="ignore"), "unknown on_lag mode"),
        (lambda: sluice.subscribe("t", on_max_held="drop"),
         "unknown on_max_held mode 'drop'; use 'copy' or 'error'"),
        (lambda: sluice.subscribe("t", timeout=-1), "timeout must be"),
        (lambda: sluice.subscribe("t", reconnect=-1), "reconnect must be"),
        (lambda: sluice.subscribe("t", timeout=float("nan")), "timeout must be"),
        (lambda: sluice.subscribe("no spaces please"), "invalid topic name"),
        (lambda: sluice.Producer("plan.sql", epochs=0), "epochs must be at least 1"),
        (lambda: sluice.Producer("plan.sql", topic="a/b"), "invalid topic name"),
    ],
)
def test_wrong_argument_values_raise_value_error(ns, call, message):
    with pytest.raises(ValueError, match=message):
        call()


LAG_PLAN = "SET sluice.lag_limit = 2;\nSET sluice.window = 2;\n"


def test_a_subscriber_behind_the_lag_limit_raises_lagged(plans):
    """Under sluice.lag_limit the producer waits for no one; a subscriber that falls
    behind is detached with Lagged."""
    plan = plans.plan(rows=4000, batch_rows=50, extra=LAG_PLAN)
    producer = sluice.Producer(plan, min_subscribers=1)
    with sluice.subscribe(plans.topic, timeout=30) as sub:
        batch = next(sub)
        del batch
        # The producer does not wait for us: it publishes (and we miss) most batches.
        deadline = time.monotonic() + 30
        while producer.progress["rows"] < 4000 and time.monotonic() < deadline:
            time.sleep(0.05)
        with pytest.raises(sluice.Lagged, match="fell further behind"):
            for batch in sub:
                del batch
    producer.wait(timeout=30)


def test_on_lag_skip_goes_on_and_reports_the_gap(plans):
    # The window left at 'auto': with a lag limit the queues hold the limit.
    plan = plans.plan(rows=4000, batch_rows=50, extra="SET sluice.lag_limit = 3;\n")
    producer = sluice.Producer(plan, min_subscribers=1, linger=30)
    with sluice.subscribe(plans.topic, timeout=30, on_lag="skip") as sub:
        assert sub.on_lag == "skip"
        batch = next(sub)
        del batch
        deadline = time.monotonic() + 30
        while producer.progress["rows"] < 4000 and time.monotonic() < deadline:
            time.sleep(0.05)
        rows = 50 + sum(len(b) for b in sub)
        summary = sub.last_epoch
    assert rows < 4000
    assert summary.complete is False and summary.missed > 0
    assert summary.rows == rows and summary.producer_rows == 4000
    assert producer.wait(timeout=30).window == 3


def test_sluice_torch_imports_without_torch_and_says_what_is_missing(ns):
    import importlib.util

    if importlib.util.find_spec("torch") is not None:
        pytest.skip("torch is installed; test_torch.py covers the adapter")
    import sluice.torch

    with pytest.raises(ImportError, match="sluice.torch needs PyTorch"):
        sluice.torch.IterableDataset("t")


def test_a_plan_that_cannot_load_fails_the_subscribers_waiting_for_it(plans, ns):
    """``sluice.Producer`` on a plan that fails while it is planned raises ``PlanError``,
    and the subscriber already waiting for its topic gets ``ProducerFailed`` with the same
    message instead of waiting until its timeout (issue 13)."""
    import threading

    from helpers import waiting_subscribers

    plans.data(10)
    bad = plans.dir / "bad.sql"
    bad.write_text(
        f"SET sluice.topic = '{plans.topic}';\n"
        f"CREATE EXTERNAL TABLE t STORED AS PARQUET LOCATION '{plans.dir / 'data'}/';\n"
        "SELECT no_such_column FROM t;\n"
    )
    errors: list[BaseException] = []

    def wait() -> None:
        try:
            with sluice.subscribe(plans.topic, timeout=60) as sub:
                next(iter(sub))
        except BaseException as e:  # noqa: BLE001 - reported by the main thread
            errors.append(e)

    waiter = threading.Thread(target=wait)
    waiter.start()
    deadline = time.monotonic() + 20
    while waiting_subscribers(ns, plans.topic) == 0:
        assert time.monotonic() < deadline, "the subscriber did not start waiting"
        time.sleep(0.01)
    started = time.monotonic()
    with pytest.raises(sluice.PlanError, match="no_such_column"):
        sluice.Producer(bad)
    waiter.join(30)
    assert not waiter.is_alive()
    assert len(errors) == 1 and isinstance(errors[0], sluice.ProducerFailed), errors
    assert "no_such_column" in str(errors[0])
    assert time.monotonic() - started < 30  # told, not timed out


def test_to_device_checks_its_arguments_and_says_when_there_is_no_gpu(plans):
    """``Batch.to_device`` (the cuda_host mode): a device that is not a GPU is a
    ValueError/TypeError naming the valid forms, a bad stream a ValueError, and without a
    driver the copy raises SluiceError saying so; the batch stays usable on the CPU."""
    producer = sluice.Producer(plans.plan(rows=100, batch_rows=50), min_subscribers=1)
    with sluice.subscribe(plans.topic, timeout=30) as sub:
        batch = next(sub)
        with pytest.raises(ValueError, match="'cuda', 'cuda:N'"):
            batch.to_device(device="cpu")
        with pytest.raises(ValueError, match="cuda:N"):
            batch.to_device(device="cuda:x")
        with pytest.raises(TypeError, match="GPU ordinal"):
            batch.to_device(device=1.5)
        with pytest.raises(ValueError, match="stream"):
            batch.to_device(stream=-5)
        if not cuda_driver_present():
            with pytest.raises(sluice.SluiceError, match="no CUDA driver found"):
                batch.to_device()
            with pytest.raises(sluice.SluiceError, match="no CUDA driver found"):
                batch.to_device(device="cuda:0", stream=2)
        assert batch["id"].to_numpy().tolist() == list(range(50))
        rows = len(batch) + sum(len(b) for b in sub)
    assert rows == 100
    producer.wait(timeout=30)


def test_last_published_ns_is_the_producers_monotonic_clock(plans):
    """Every message carries the producer's CLOCK_MONOTONIC time of publishing, which is
    time.monotonic_ns() in this process: a batch was published before it was received."""
    plan = plans.plan(rows=100, batch_rows=10)
    before = time.monotonic_ns()
    producer = sluice.Producer(plan, min_subscribers=1)
    with sluice.subscribe(plans.topic, timeout=30) as sub:
        assert sub.last_published_ns is None
        seen = []
        for batch in sub:
            got = time.monotonic_ns()
            published = sub.last_published_ns
            assert published is not None and published <= got
            seen.append(published)
            del batch
    # The producer started after `before`; publish times never go back.
    assert len(seen) == 10 and seen[0] >= before and seen == sorted(seen)
    producer.wait(timeout=30)


def test_close_inside_a_producer_block_is_a_stop_not_an_error(plans):
    """``producer.close()`` inside ``with sluice.Producer(...)`` stops the run; leaving the
    block raises nothing, and ``wait()`` afterwards says it was stopped and where, never
    that it waited for the subscribers of a previous producer that did not exist, however
    soon after the start it is closed."""
    plan = plans.plan(rows=200)
    for round in range(20):
        with sluice.Producer(plan, min_subscribers=1) as producer:
            if round % 2:
                time.sleep(0.05)
            producer.close()
        with pytest.raises(sluice.SluiceError, match="^stopped") as stopped:
            producer.wait(timeout=30)
        assert "previous producer" not in str(stopped.value)
