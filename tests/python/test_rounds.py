"""Rounds over data that grows: files arrive while two trainers (separate processes)
train, a row-count trigger starts each round, the trainers report losses, and each
round's selection (label-balanced top-k by loss) is exactly what an independent
computation over the same files and reports gives. Triggers by SQL and by request."""

from __future__ import annotations

import json
import os
import threading
import time
from pathlib import Path

import numpy as np
import pyarrow as pa
import pyarrow.parquet as pq
import pytest

import sluice

LABELS, PER_LABEL = 4, 25

# A trainer: reads each round whole, reports a loss per sample it received (its own
# function of the id), writes its reports out, then says which ids the round had.
_TRAINER = r'''
import json, sys
import pyarrow as pa
import sluice

topic, salt = sys.argv[1], int(sys.argv[2])
with sluice.subscribe(topic, timeout=60) as sub:
    for epoch in sub.epochs():
        ids, rounds = [], set()
        for batch in epoch:
            rounds.add(batch.round)
            ids += pa.record_batch(batch).column("id").to_pylist()
        sub.report(ids, loss=[float((i * salt) % 97) for i in ids], trainer=f"t{salt}")
        sub.flush_reports()
        print(json.dumps({"round": sub.round, "rounds": sorted(rounds), "ids": ids}), flush=True)
'''


def _write(data: Path, name: str, ids: range) -> None:
    """A Parquet file of ``ids`` (label = id % LABELS), renamed into place, settled."""
    tmp = data / f".{name}.tmp"
    pq.write_table(pa.table({"id": pa.array(ids, pa.int64()),
                             "label": pa.array([i % LABELS for i in ids], pa.int64())}), tmp)
    past = time.time() - 1
    os.utime(tmp, (past, past))
    os.replace(tmp, data / name)


_SELECTION = f"""SELECT id, label FROM (
  SELECT t.id, t.label, ROW_NUMBER() OVER (
    PARTITION BY t.label ORDER BY f.loss DESC NULLS FIRST, t.id) AS rank
  FROM train t
  LEFT JOIN (SELECT key, max(loss) AS loss FROM sluice_feedback GROUP BY key) f
    ON t.id = f.key)
WHERE rank <= {PER_LABEL}"""


def _plan(tmp_path: Path, topic: str, rounds: int, trigger: str, query: str | None = None) -> Path:
    data = tmp_path / "data"
    data.mkdir(exist_ok=True)
    plan = tmp_path / "rounds.sql"
    plan.write_text(f"""
SET sluice.topic = '{topic}';
SET sluice.batch_rows = 20;
SET sluice.rounds = {rounds};
SET sluice.trigger = '{trigger}';
SET sluice.settle_s = 0.2;
SET sluice.feedback = 'loss';
CREATE EXTERNAL TABLE train STORED AS PARQUET LOCATION '{data}/';
{query or _SELECTION};
""")
    return plan


def _expected(ids: range, losses: dict[int, float]) -> set[int]:
    """Label-balanced top-k by the highest loss reported, unreported (new) first."""
    chosen: set[int] = set()
    for label in range(LABELS):
        rows = [i for i in ids if i % LABELS == label]
        rows.sort(key=lambda i: (i in losses, -losses.get(i, 0.0), i))
        chosen |= set(rows[:PER_LABEL])
    return chosen


def test_rounds_follow_arriving_files_and_select_by_both_trainers_losses(
        tmp_path, topic, run_python):
    plan = _plan(tmp_path, topic, rounds=3, trigger="rows:120")
    data = tmp_path / "data"
    _write(data, "a.parquet", range(0, 200))
    salts = (7, 11)
    trainers = [run_python(_TRAINER, topic, str(s)) for s in salts]
    losses: dict[int, float] = {}
    with sluice.Producer(plan, min_subscribers=2, wait_timeout=60) as producer:
        rows = 200
        for r in range(3):
            seen = [json.loads(t.stdout.readline()) for t in trainers]
            for s in seen:
                assert s["round"] == r and s["rounds"] == [r], s
            assert sorted(seen[0]["ids"]) == sorted(seen[1]["ids"]), "one shared stream"
            assert set(seen[0]["ids"]) == _expected(range(rows), losses), f"round {r}"
            assert len(seen[0]["ids"]) == LABELS * PER_LABEL
            for salt, s in zip(salts, seen):
                for i in s["ids"]:
                    losses[i] = max(losses.get(i, -1.0), float((i * salt) % 97))
            if r < 2:
                # 60 rows do not start a round; 120 do.
                _write(data, f"b{r}.parquet", range(rows, rows + 60))
                time.sleep(0.6)
                assert producer.running
                _write(data, f"c{r}.parquet", range(rows + 60, rows + 120))
                rows += 120
        producer.wait(60)
    for t in trainers:
        _, err = t.communicate(timeout=60)
        assert t.returncode == 0, err


def test_a_round_starts_when_a_trainer_asks_or_when_a_query_over_the_feedback_holds(
        tmp_path, topic):
    """``sluice.trigger = 'manual'``: the next round waits for ``request_round``; a
    ``sql:`` trigger waits until its query over ``sluice_feedback`` holds, also where
    the plan's own query does not read the reports (its rounds then start without)."""
    data = tmp_path / "data"
    over_feedback = "sql:SELECT count(*) >= 50 FROM sluice_feedback WHERE round = sluice_round()"
    for trigger, query in (("manual", None), (over_feedback, None),
                           (over_feedback, "SELECT id, label FROM train")):
        plan = _plan(tmp_path, topic, rounds=2, trigger=trigger, query=query)
        _write(data, "a.parquet", range(0, 200))
        with sluice.Producer(plan, min_subscribers=1, wait_timeout=60) as producer:
            with sluice.subscribe(topic, timeout=60) as sub:
                epochs = sub.epochs()
                first = [b.round for b in next(epochs)]
                assert set(first) == {0}
                got: list = []
                reader = threading.Thread(target=lambda: got.extend(
                    b.round for b in next(epochs)))
                reader.start()
                reader.join(1.0)
                assert reader.is_alive() and not got, "no round before the trigger"
                if trigger == "manual":
                    sluice.request_round(topic)
                else:
                    sub.report(list(range(49)), loss=[1.0] * 49)
                    sub.flush_reports()
                    reader.join(1.0)
                    assert reader.is_alive(), "49 reports do not start a round"
                    # Not flushed by hand: the waiting subscriber writes it within a second.
                    sub.report([49], loss=[1.0])
                reader.join(60)
                assert got and set(got) == {1}
            producer.wait(60)


def test_reports_are_checked_where_they_are_made(plans):
    with sluice.Producer(plans.plan(rows=50), min_subscribers=1, wait_timeout=60):
        with sluice.subscribe(plans.topic, timeout=60) as sub:
            batch = next(iter(sub))
            assert sub.round is None, "a plan of one round has no rounds"
            # A batch's column, numpy arrays and pyarrow arrays are taken as they are.
            ids = batch["id"]
            sub.report(ids, loss=np.zeros(len(ids)))
            sub.report(pa.array([1, 2]), loss=pa.array([0.5, None]))
            with pytest.raises(ValueError, match="another"):
                sub.report([1], loss=[0.5], trainer="someone-else")
            with pytest.raises(ValueError, match="at least one value"):
                sub.report([1, 2])
            with pytest.raises(ValueError, match="2 keys but 1 values of loss"):
                sub.report([1, 2], loss=[0.5])
            with pytest.raises(TypeError, match="keys must be integers"):
                sub.report(["a"], loss=[0.5])
            with pytest.raises(sluice.SluiceError, match="reported column"):
                sub.report([1], key=[0.5])
            for _ in sub:
                pass


def test_each_trainer_gets_its_own_subset_of_one_shared_stream(plans):
    """A plan computes a mask and a weight per trainer; ``mask=`` hands each trainer only
    its rows (the mask dropped, the weight kept), while positions count the whole stream."""
    select = ("SELECT id, x, id % 2 = 0 AS mask_a, "
              "CASE WHEN id % 3 = 0 THEN 1.5 ELSE 0.0 END AS weight_b FROM t")
    with sluice.Producer(plans.plan(rows=300, select=select), min_subscribers=3,
                         wait_timeout=60):
        subs = [sluice.subscribe(plans.topic, timeout=60, mask=m)
                for m in ("mask_a", "weight_b", None)]
        got = []
        for sub in subs:
            batches = [pa.record_batch(b) for b in sub]
            got.append(batches)
            sub.close()
    a, b, whole = got
    assert sum((x.column("id").to_pylist() for x in a), []) == list(range(0, 300, 2))
    assert all("mask_a" not in x.schema.names for x in a)
    assert sum((x.column("id").to_pylist() for x in b), []) == list(range(0, 300, 3))
    assert all(set(x.column("weight_b").to_pylist()) == {1.5} for x in b)
    assert sum(x.num_rows for x in whole) == 300
    with pytest.raises(sluice.PlanError, match="add it to columns"):
        sluice.subscribe(plans.topic, columns=["id"], mask="mask_a", timeout=1)
