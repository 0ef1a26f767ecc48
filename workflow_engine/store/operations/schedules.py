"""Schedules: every statement on ``onceflow_schedules`` and ``onceflow_schedule_ticks``.

A tick is a job like any other: :func:`fire_due` hands its deliveries to the one create
path (:func:`~workflow_engine.store.writes.create.create_instances_in`), so its job id
(``<schedule>@<UTC instant>``) meets the unique constraint ``onceflow_jobs_job_id_key``
and a tick can never make two instances, whichever engine fires it, however often.

Several engines run the scheduler at once. Each takes a batch of due schedules with
``FOR UPDATE SKIP LOCKED`` and, in the same transaction, creates the ticks' instances
and moves ``next_fire_at`` past them: a second engine skips the locked row, then finds it
no longer due. The lock only saves work; the unique constraint is what guarantees.

A tick has no Kafka record; its job row records the synthetic position
``schedule:<name>`` / 0 / <tick's Unix seconds>, unique per tick like a record's, so a
tick delivered twice (a backfill over fired ticks) is audited as a redelivery.
"""

from __future__ import annotations

from collections.abc import Mapping
from dataclasses import dataclass
from datetime import datetime
from typing import Any

import sqlalchemy as sa
from sqlalchemy.engine import Engine
from sqlalchemy.exc import IntegrityError

from onceflow.ticks import (
    BackfillRange,
    PlannedTick,
    TickSpec,
    backfill_range,
)
from onceflow.vocabulary import (
    TickTrigger,
)
from workflow_engine.model import ScheduleDef
from workflow_engine.store.db import constraint_of
from workflow_engine.store.schedule_rows import (
    INSERT,
    ScheduleExists,
    ScheduleNotFound,
    ScheduleView,
    def_params,
    judged_at,
)
from workflow_engine.store.views.schedules import get_schedule
from workflow_engine.store.writes.ticks import create_ticks

#: A backfill creates at most this many ticks (ask for a shorter range beyond it).
MAX_BACKFILL = 10_000
_CHUNK = 500


@dataclass(frozen=True)
class BackfillResult:
    schedule: str
    count: int
    first: datetime | None
    last: datetime | None
    dry_run: bool
    created: int = 0
    existing: int = 0  # ticks whose job id had an instance already


# A schedule made by the CLI or API is not declared: the engine's declared upsert leaves
# it alone.
_INSERT_UNDECLARED = sa.text(INSERT.format(declared="false"))


def create_schedule(db: Engine, d: ScheduleDef, now: datetime | None = None) -> ScheduleView:
    """Create a schedule; its first tick is the first one after now."""
    try:
        with db.begin() as conn:
            values = def_params(d, judged_at(conn, now))
            conn.execute(_INSERT_UNDECLARED, values)
    except IntegrityError as exc:
        if constraint_of(exc) == "onceflow_schedules_pkey":
            raise ScheduleExists(f"a schedule named {d.name!r} exists already") from None
        raise
    return get_schedule(db, d.name)


_PAUSE = sa.text(
    "UPDATE onceflow_schedules SET paused = true, updated_at = now() WHERE name = :n RETURNING name"
)


def pause_schedule(db: Engine, name: str) -> ScheduleView:
    """Stop firing. Ticks that fall due while paused are not run (not caught up)."""
    with db.begin() as conn:
        _require(conn.execute(_PAUSE, {"n": name}).first(), name)
    return get_schedule(db, name)


_LOCK_SPEC = sa.text(
    "SELECT cron, every_seconds, timezone, paused FROM onceflow_schedules"
    " WHERE name = :n FOR UPDATE"
)
_RESUME = sa.text(
    # a tick buffered before the pause is dropped: it would fire at
    # once, while resume promises the first tick after now
    "UPDATE onceflow_schedules SET paused = false, next_fire_at = :next,"
    " buffered_tick_at = NULL, updated_at = now() WHERE name = :n"
)


def resume_schedule(db: Engine, name: str, now: datetime | None = None) -> ScheduleView:
    """Fire again, from the first tick after now."""
    with db.begin() as conn:
        at = judged_at(conn, now)
        row = _require(conn.execute(_LOCK_SPEC, {"n": name}).first(), name)
        if row.paused:
            spec = TickSpec(row.cron, row.every_seconds, row.timezone)
            conn.execute(_RESUME, {"n": name, "next": spec.next_after(at)})
    return get_schedule(db, name)


_DELETE = sa.text("DELETE FROM onceflow_schedules WHERE name = :n RETURNING name")


def delete_schedule(db: Engine, name: str) -> None:
    """Delete a schedule (its ticks' instances and their history stay)."""
    with db.begin() as conn:
        _require(conn.execute(_DELETE, {"n": name}).first(), name)


def _require(row: Any, name: str) -> Any:
    if row is None:
        raise ScheduleNotFound(f"no schedule named {name!r}")
    return row


def backfill(
    db: Engine,
    name: str,
    start: datetime,
    end: datetime,
    dry_run: bool = False,
    now: datetime | None = None,
    versions: Mapping[str, str] | None = None,
) -> BackfillResult:
    """Create one instance per tick of ``[start, end]`` (``dry_run``: only count them).

    Ticks whose job id exists already (fired on time, or backfilled before) collapse
    into the existing instance, like any duplicate; ``existing`` counts them.
    """
    s = get_schedule(db, name)
    ticks: BackfillRange = backfill_range(s.spec, start, end, MAX_BACKFILL)
    result = BackfillResult(name, ticks.total, ticks.first, ticks.last, dry_run)
    if dry_run or not ticks.ticks:
        return result
    created = 0
    planned = [(s, PlannedTick(t, TickTrigger.BACKFILL)) for t in ticks.ticks]
    for i in range(0, len(planned), _CHUNK):
        with db.begin() as conn:
            at = judged_at(conn, now)
            fired = create_ticks(conn, planned[i : i + _CHUNK], at, versions or {})
            created += sum(1 for f in fired if f.created)
    return BackfillResult(
        name, ticks.total, ticks.first, ticks.last, False, created, ticks.total - created
    )
