"""The outbox's two layouts (migration 0029) give the same events.

By default the hot paths (create, claim, checkpoints, finish) write ONE outbox row per
statement, its events as arrays, and the relay builds each event's data in Python
(``writes.outbox.due_events``); with ``onceflow.outbox_layout = 'per_event'`` (for
Debezium's outbox router) each event is a row with its data built in SQL
(``onceflow_event_data``), as before. The contract (docs/events.md) must not depend on
which: these tests drive the engine's own statements through a workflow that retries,
fails a step and errors, and one that completes with a result holding numbers JSON
libraries mangle, in both layouts, and compare every event the relay would publish with
the view ``onceflow_outbox_events`` and with the other layout's, field by field.
"""

from __future__ import annotations

import json
from datetime import datetime
from decimal import Decimal
from typing import Any

import pytest
import sqlalchemy as sa

from onceflow.envelope import JobEnvelope
from onceflow.vocabulary import AttemptOutcome, InstanceStatus
from workflow_engine.model import Delivery
from workflow_engine.store import sqlalchemy_url, writes
from workflow_engine.store.lifecycle import LARGE_EXTRA_BYTES
from workflow_engine.store.writes import (
    Chain,
    FinishInstance,
    FinishStep,
    StartStep,
    create_instances,
    due_events,
    write_batch,
)

pytestmark = pytest.mark.timeout(60)

#: Numbers a float would change: a 31-digit integer and a decimal's trailing zero.
_RESULT = b'{"big": 1234567890123456789012345678901, "amount": 1.50, "ok": true}'


def _engine(db: sa.Engine, layout: str) -> sa.Engine:
    url = db.url.render_as_string(hide_password=False)
    options = {"options": f"-c onceflow.outbox_layout={layout}"} if layout else {}
    return sa.create_engine(sqlalchemy_url(url), connect_args=options, pool_size=2)


#: A result over ``LARGE_EXTRA_BYTES``: its event gets a row of its own.
_LARGE = b'{"blob": "%s"}' % (b"x" * 5000)


def _run(db: sa.Engine, prefix: str, topic: str, offset: int) -> None:
    """Three instances through claim, steps and finish, as the engine writes them:
    ``ok`` and ``large`` three steps then complete (``large`` with a big result);
    ``bad`` a retried step, then a failed one, errored."""
    ok, bad, large = f"{prefix}ok", f"{prefix}bad", f"{prefix}large"
    create_instances(
        db,
        [
            Delivery(JobEnvelope(ok, "noop-workflow", {}), topic, 0, offset),
            Delivery(JobEnvelope(bad, "noop-workflow", {}), topic, 0, offset + 1),
            Delivery(JobEnvelope(large, "noop-workflow", {}), topic, 0, offset + 2),
        ],
    )
    runs = {r.job_id: r.claim_count for r in writes.claim(db, "t-engine", 10, 60.0)}
    assert set(runs) == {ok, bad, large}

    def start(job: str, position: int) -> StartStep:
        return StartStep(job, runs[job], position, f"step {position + 1}")

    def done(job: str, position: int, attempt: int, at: datetime, outcome, **kw) -> FinishStep:
        return FinishStep(job, runs[job], position, attempt, at, outcome, **kw)

    a_ok, a_bad, a_large = write_batch(
        db, "t-engine", [start(ok, 0), start(bad, 0), start(large, 0)]
    )
    a_ok, a_bad, a_large = write_batch(
        db,
        "t-engine",
        [
            Chain(done(ok, 0, 1, a_ok.at, AttemptOutcome.COMPLETE, result=b"1"), start(ok, 1)),
            Chain(done(bad, 0, 1, a_bad.at, AttemptOutcome.RETRY, error="timeout"), start(bad, 0)),
            Chain(done(large, 0, 1, a_large.at, AttemptOutcome.COMPLETE), start(large, 1)),
        ],
    )
    a_ok, _, a_large = write_batch(
        db,
        "t-engine",
        [
            Chain(done(ok, 1, 1, a_ok.at, AttemptOutcome.COMPLETE, result=b"2"), start(ok, 2)),
            Chain(
                done(bad, 0, 2, a_bad.at, AttemptOutcome.FAILED, error="card declined"),
                FinishInstance(bad, runs[bad], InstanceStatus.ERRORED, error="card declined"),
            ),
            Chain(done(large, 1, 1, a_large.at, AttemptOutcome.COMPLETE), start(large, 2)),
        ],
    )
    write_batch(
        db,
        "t-engine",
        [
            Chain(
                done(ok, 2, 1, a_ok.at, AttemptOutcome.COMPLETE, result=b"3"),
                FinishInstance(ok, runs[ok], InstanceStatus.COMPLETE, _RESULT),
            ),
            Chain(
                done(large, 2, 1, a_large.at, AttemptOutcome.COMPLETE),
                FinishInstance(large, runs[large], InstanceStatus.COMPLETE, _LARGE),
            ),
        ],
    )


def _exact(text: str | bytes) -> dict[str, Any]:
    """JSON parsed with its numbers as written (no float in between)."""
    return json.loads(text, parse_float=Decimal)


def _viewed(db: sa.Engine, prefix: str) -> list[tuple[str, int, str, dict[str, Any]]]:
    with db.connect() as conn:
        rows = conn.execute(
            sa.text(
                "SELECT aggregateid, seq, type, CAST(payload AS text)"
                " FROM onceflow_outbox_events WHERE aggregateid LIKE :p"
                " ORDER BY position, ordinality"
            ),
            {"p": prefix + "%"},
        ).all()
    return [(job, seq, type_, _exact(data)) for job, seq, type_, data in rows]


def _relayed(db: sa.Engine, prefix: str) -> list[tuple[str, int, str, dict[str, Any]]]:
    with db.connect() as conn:
        events = due_events(conn, 10_000)
    mine = [e for e in events if e.job_id.startswith(prefix)]
    for e in mine:  # the headers' fields agree with the data
        data = _exact(e.data)
        assert (e.id, e.version, e.time) == (f"{e.job_id}:{e.seq}", data["version"], data["time"])
        assert (data["job_id"], data["sequence"], data["workflow"]) == (e.job_id, e.seq, e.workflow)
    return [(e.job_id, e.seq, e.type, _exact(e.data)) for e in mine]


def _rows(db: sa.Engine, prefix: str) -> tuple[int, int]:
    """(rows of one event, rows of several) holding ``prefix``'s events."""
    with db.connect() as conn:
        return conn.execute(
            sa.text(
                "SELECT count(*) FILTER (WHERE job_ids IS NULL AND aggregateid LIKE :p),"
                " count(*) FILTER (WHERE job_ids[1] LIKE :p) FROM onceflow_outbox"
            ),
            {"p": prefix + "%"},
        ).one()


def _by_job(event: tuple[str, int, str, dict[str, Any]]) -> tuple[str, int]:
    return event[0], event[1]


_COMPLETED = ["instance.created", "instance.started", *["step.completed"] * 3, "instance.complete"]
_KINDS = {
    "ok": _COMPLETED,
    "large": _COMPLETED,
    "bad": [
        "instance.created",
        "instance.started",
        "step.retrying",
        "step.failed",
        "instance.errored",
    ],
}


def test_both_layouts_publish_the_same_events(settings, db):
    batched, per_event = _engine(db, ""), _engine(db, "per_event")
    try:
        _run(batched, "b-", settings.jobs_topic, 100)
        _run(per_event, "p-", settings.jobs_topic, 200)
        # the layouts as written: a statement's row of several, or a row per event
        # create, claim, 3 checkpoint statements, 2 finishes: a row each, but for the
        # large result's instance.complete, a row of its own
        assert _rows(batched, "b-") == (1, 7)
        assert _rows(per_event, "p-") == (17, 0)
        relayed, viewed = _relayed(batched, "b-"), _viewed(batched, "b-")
        per_event_relayed = _relayed(per_event, "p-")
    finally:
        batched.dispose()
        per_event.dispose()
    # what the relay builds in Python is what the view builds in SQL (within a row the
    # relay puts each job's events in sequence order, the view as the arrays hold them)
    assert sorted(relayed, key=_by_job) == sorted(viewed, key=_by_job)
    for name, kinds in _KINDS.items():
        job = f"b-{name}"
        mine = [e for e in relayed if e[0] == job]
        assert [t.removeprefix("dev.onceflow.") for _, _, t, _ in mine] == kinds
        assert [seq for _, seq, _, _ in mine] == list(range(1, len(kinds) + 1))
    # and each event of one layout is the other's, but for the job's id and time and
    # its record's offset
    assert len(relayed) == len(per_event_relayed) == 17

    def same(event: tuple[str, int, str, dict[str, Any]]) -> tuple[Any, ...]:
        job, seq, type_, data = event
        data = {**data, "job_id": None, "time": None}
        if data["kafka"] is not None:
            data["kafka"] = {**data["kafka"], "offset": data["kafka"]["offset"] % 100}
        return job[2:], seq, type_, data

    assert sorted(map(same, relayed)) == sorted(map(same, per_event_relayed))
    done = next(d for j, _, t, d in relayed if j == "b-ok" and t.endswith("instance.complete"))
    assert done["result"] == {
        "big": 1234567890123456789012345678901,
        "amount": Decimal("1.50"),
        "ok": True,
    }
    assert done["kafka"] == {"topic": settings.jobs_topic, "partition": 0, "offset": 100}
    failed = next(d for j, _, t, d in relayed if t.endswith("step.failed"))
    assert failed["step"] == {"position": 0, "name": "step 1", "attempt": 2}
    assert failed["error"] == "card declined"
    large = next(d for j, _, t, d in relayed if j == "b-large" and t.endswith("instance.complete"))
    assert large["result"] == {"blob": "x" * 5000} and len(_LARGE) > LARGE_EXTRA_BYTES
