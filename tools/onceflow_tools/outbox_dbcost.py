"""The database's side of the outbox's cost (issue 25): the engine's statements of a
three-step workflow, driven directly (no engine, no Kafka), with events on and off, and
the PostgreSQL backend's CPU for each class of statement.

``python -m onceflow_tools.outbox_dbcost --jobs 6000 --rounds 3``: a fresh database,
``jobs`` pre-filled instances, then batches of ``--batch`` instances run as the engine
runs them: claim, start step 1, (checkpoint 1 + start 2), (checkpoint 2 + start 3),
(checkpoint 3 + finish), each one transaction, and, with events on, the relay's read
and delete of what those wrote. The CPU is the one backend's (``/proc/<pid>/schedstat``,
nanoseconds: the server runs on this machine), per workflow, per class; the client's
own time is not in it, so a busy box changes these figures far less than a rate.
On and off alternate, ``rounds`` times each.
"""

from __future__ import annotations

import statistics
import uuid
from collections import defaultdict
from datetime import datetime
from pathlib import Path
from typing import Any

import click
import orjson
import sqlalchemy as sa

from onceflow.envelope import JobEnvelope
from onceflow.settings import get_settings
from onceflow.vocabulary import AttemptOutcome, InstanceStatus
from onceflow_tools.stack import drop_database, recreate_database
from workflow_engine.model import Delivery
from workflow_engine.store import make_engine, migrate, writes
from workflow_engine.store.writes import (
    Chain,
    FinishInstance,
    FinishStep,
    StartStep,
    create_instances,
    delete_published,
    due_events,
    write_batch,
)

_CLASSES = ("claim", "start", "checkpoint+start", "checkpoint+finish", "relay")


def _backend_ns(pid: int) -> int:
    return int(Path(f"/proc/{pid}/schedstat").read_text().split()[0])


def _steps(db: sa.Engine, pid: int, owner: str, batch: int, cpu: dict[str, int]) -> int:
    """One batch of instances through claim, three steps and the finish."""
    t = _backend_ns(pid)

    def lap(name: str) -> None:
        nonlocal t
        now = _backend_ns(pid)
        cpu[name] += now - t
        t = now

    runs = writes.claim(db, owner, batch, 60.0)
    lap("claim")
    if not runs:
        return 0
    started: list[tuple[str, int, datetime]] = []
    for position in range(3):
        starts = [
            StartStep(r.job_id, r.claim_count, position, f"step {position + 1}") for r in runs
        ]
        if position == 0:
            answers = write_batch(db, owner, starts)
            lap("start")
        else:
            chained = [
                Chain(_done(job, claim_no, position - 1, at), s)
                for (job, claim_no, at), s in zip(started, starts, strict=True)
            ]
            answers = write_batch(db, owner, chained)
            lap("checkpoint+start")
        started = [(s.job_id, s.claim, a.at) for s, a in zip(starts, answers, strict=True)]  # type: ignore[attr-defined]
    finish = [
        Chain(
            _done(job, claim_no, 2, at),
            FinishInstance(job, claim_no, InstanceStatus.COMPLETE, b"{}"),
        )
        for job, claim_no, at in started
    ]
    write_batch(db, owner, finish)
    lap("checkpoint+finish")
    return len(runs)


def _done(job: str, claim_no: int, position: int, at: datetime) -> FinishStep:
    return FinishStep(job, claim_no, position, 1, at, AttemptOutcome.COMPLETE, b'{"step": 0}')


def _relay(conn: sa.Connection, pid: int, cpu: dict[str, int]) -> None:
    t = _backend_ns(pid)
    while events := due_events(conn, 500):
        delete_published(conn, [e.position for e in events])
    cpu["relay"] += _backend_ns(pid) - t


def one_run(base_url: str, jobs: int, batch: int, events: bool) -> dict[str, Any]:
    name = f"onceflow_dbcost_{uuid.uuid4().hex[:6]}"
    url = recreate_database(base_url, name)
    try:
        db = make_engine(url, pool_size=1, lifecycle_events=events)
        migrate(db)
        for start in range(0, jobs, 1000):
            create_instances(
                db,
                [
                    Delivery(JobEnvelope(f"e{i:07d}", "noop-workflow", {}), "t", 0, i)
                    for i in range(start, min(jobs, start + 1000))
                ],
            )
        with db.begin() as conn:
            conn.execute(sa.text("ANALYZE"))
        relay_db = make_engine(url, pool_size=1, lifecycle_events=events)
        cpu: dict[str, int] = defaultdict(int)
        with db.connect() as c:
            pid = int(c.execute(sa.text("SELECT pg_backend_pid()")).scalar_one())
        with relay_db.connect() as relay:
            relay_pid = int(relay.execute(sa.text("SELECT pg_backend_pid()")).scalar_one())
            relay.commit()
            _relay(relay, relay_pid, cpu)  # the created events, not counted below
            cpu["relay"] = 0
            done = 0
            while n := _steps(db, pid, "bench", batch, cpu):
                done += n
                if events:
                    _relay(relay, relay_pid, cpu)
        db.dispose()
        relay_db.dispose()
        per = {k: cpu[k] / 1000 / done for k in _CLASSES}
        return {
            "events": events,
            "workflows": done,
            "us_per_workflow": per,
            "total_us_per_workflow": sum(per.values()),
        }
    finally:
        drop_database(base_url, name)


@click.command()
@click.option("--jobs", type=int, default=6000)
@click.option("--batch", type=int, default=64)
@click.option("--rounds", type=int, default=3)
@click.option("--out", type=click.Path(path_type=Path), default=None)
def main(jobs: int, batch: int, rounds: int, out: Path | None) -> None:
    base_url = get_settings().database_url
    runs = []
    for _ in range(rounds):
        for events in (True, False):
            row = one_run(base_url, jobs, batch, events)
            click.echo(orjson.dumps(row).decode())
            runs.append(row)
    summary = {}
    for events in (True, False):
        mine = [r for r in runs if r["events"] is events]
        summary["on" if events else "off"] = {
            k: statistics.median(r["us_per_workflow"][k] for r in mine) for k in _CLASSES
        } | {"total": statistics.median(r["total_us_per_workflow"] for r in mine)}
    click.echo(orjson.dumps(summary, option=orjson.OPT_INDENT_2).decode())
    if out is not None:
        out.write_bytes(
            orjson.dumps({"runs": runs, "summary": summary}, option=orjson.OPT_INDENT_2)
        )


if __name__ == "__main__":
    main()
