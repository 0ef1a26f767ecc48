"""The relay's unpacking of a statement's outbox row of several events (migration 0029):
each event's data to the contract, what the kind adds spliced in exactly as PostgreSQL
wrote it, each job's events in sequence order."""

from __future__ import annotations

import json
from decimal import Decimal

from workflow_engine.store.writes.outbox import _unpack

T = "2026-12-07T18:00:00.123456Z"


def _row(job_ids, seqs, extras, topics=None):
    n = len(job_ids)
    return (
        *(7, None, None, None, None, None, None, None, None),
        job_ids,
        seqs,
        ["dev.onceflow.step.completed"] * n,
        ["w"] * n,
        [None] * n,
        ["running"] * n,
        [1] * n,
        topics or ["jobs"] * n,
        [0] * n,
        [41] * n,
        extras,
        T,
    )


def test_the_common_fields_then_the_kinds_exactly():
    extra = '{"result": {"big": 1234567890123456789012345678901, "amount": 1.50}}'
    (event,) = _unpack(_row(["a"], [3], [extra]))
    data = json.loads(event.data, parse_float=Decimal)
    assert data == {
        "job_id": "a",
        "workflow": "w",
        "version": None,
        "sequence": 3,
        "time": T,
        "status": "running",
        "kafka": {"topic": "jobs", "partition": 0, "offset": 41},
        "run": 1,
        "result": {"big": 1234567890123456789012345678901, "amount": Decimal("1.50")},
    }
    assert (event.position, event.id, event.time, event.version) == (7, "a:3", T, None)


def test_no_extra_an_empty_one_or_one_that_is_no_object_adds_nothing():
    events = _unpack(_row(["a", "b", "c"], [1, 1, 1], [None, "{}", "null"], [None, "t", "t"]))
    datas = [json.loads(e.data) for e in events]
    assert [sorted(d) for d in datas] == [sorted(datas[0])] * 3
    assert "result" not in datas[0] and datas[0]["kafka"] is None


def test_a_jobs_events_in_sequence_order_whatever_the_arrays_order():
    events = _unpack(_row(["b", "a", "b", "a"], [5, 2, 4, 1], [None] * 4))
    assert [(e.job_id, e.seq) for e in events] == [("a", 1), ("a", 2), ("b", 4), ("b", 5)]
