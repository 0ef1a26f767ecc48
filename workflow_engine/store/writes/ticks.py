"""Schedule firing: the engines' scheduler takes due schedules in batches (``FOR UPDATE
SKIP LOCKED``), creates their ticks through the one create path
(:func:`~workflow_engine.store.writes.create.create_instances_in`), so a tick's job id
(``<schedule>@<UTC instant>``) meets the unique constraint and can never make two
instances, and moves ``next_fire_at`` past them in the same transaction. Also the upsert
of the schedules declared in code."""

from __future__ import annotations

from collections.abc import Mapping, Sequence
from dataclasses import dataclass, replace
from datetime import datetime

import orjson
import sqlalchemy as sa
from sqlalchemy.engine import Connection, Engine

from onceflow.envelope import JobEnvelope
from onceflow.ticks import (
    DEFAULT_GRACE_SECONDS,
    DueSchedule,
    PlannedTick,
    plan,
    tick_job_id,
)
from onceflow.vocabulary import (
    IdReuse,
    Origin,
    TickSkipReason,
    TickTrigger,
)
from workflow_engine.model import Delivery, Registry, ScheduleDef
from workflow_engine.store.fragments import TERMINAL
from workflow_engine.store.schedule_rows import (
    COLUMNS,
    FROM,
    INSERT,
    ScheduleView,
    def_params,
    judged_at,
    schedule_view,
)
from workflow_engine.store.writes.create import create_instances_in


@dataclass(frozen=True)
class FiredTick:
    schedule: str
    workflow: str
    tick_at: datetime
    job_id: str
    trigger: TickTrigger
    lateness_seconds: float
    created: bool  # False: the job id existed already (collapsed as a duplicate)


@dataclass(frozen=True)
class TickReport:
    """What firing one due schedule did."""

    schedule: str
    fired: tuple[FiredTick, ...]
    skipped: dict[TickSkipReason, int]
    next_fire_at: datetime


# A declared schedule keeps its place (next_fire_at, so a restart catches up by its
# policy), its counters and its paused state; a changed spec starts from now.
_UPSERT_DECLARED = sa.text(
    INSERT.format(declared="true")
    + """
ON CONFLICT ON CONSTRAINT onceflow_schedules_pkey DO UPDATE SET
    workflow = EXCLUDED.workflow, params = EXCLUDED.params, catchup = EXCLUDED.catchup,
    overlap = EXCLUDED.overlap, max_catchup = EXCLUDED.max_catchup,
    cron = EXCLUDED.cron, every_seconds = EXCLUDED.every_seconds, timezone = EXCLUDED.timezone,
    next_fire_at = CASE
        WHEN (s.cron, s.every_seconds, s.timezone)
             IS NOT DISTINCT FROM (EXCLUDED.cron, EXCLUDED.every_seconds, EXCLUDED.timezone)
        THEN s.next_fire_at ELSE EXCLUDED.next_fire_at END,
    -- a tick buffered under the old spec is not one of the new spec's ticks
    buffered_tick_at = CASE
        WHEN (s.cron, s.every_seconds, s.timezone)
             IS NOT DISTINCT FROM (EXCLUDED.cron, EXCLUDED.every_seconds, EXCLUDED.timezone)
        THEN s.buffered_tick_at END,
    updated_at = now()
WHERE s.declared
RETURNING s.name
"""
)


def upsert_declared(
    db: Engine, defs: Sequence[ScheduleDef], now: datetime | None = None
) -> list[str]:
    """Create or update the schedules declared in code; answers the names a schedule
    made by the CLI or API holds already (those are left alone)."""
    conflicts: list[str] = []
    with db.begin() as conn:
        at = judged_at(conn, now)
        for d in defs:
            if conn.execute(_UPSERT_DECLARED, def_params(d, at)).first() is None:
                conflicts.append(d.name)
    return conflicts


_SECONDS_UNTIL_NEXT_FIRE = sa.text(
    "SELECT extract(epoch FROM min(next_fire_at)"
    " - coalesce(CAST(:now AS timestamptz), now()))"
    " FROM onceflow_schedules WHERE NOT paused"
)


def seconds_until_next_fire(db: Engine, now: datetime | None = None) -> float | None:
    """How long until the next active schedule is due (None: there is none)."""
    with db.connect() as conn:
        value = conn.execute(_SECONDS_UNTIL_NEXT_FIRE, {"now": now}).scalar()
    return None if value is None else float(value)


# Due: a tick is due, or a buffered tick's predecessor has finished.
_TAKE_DUE = sa.text(
    f"""
SELECT {COLUMNS}{FROM}
WHERE NOT s.paused
  -- an engine fires only the schedules of workflows it has (None: a tool, any), so a
  -- tick always records its version and no engine without the workflow ever sees it
  AND (CAST(:workflows AS text[]) IS NULL OR s.workflow = ANY(CAST(:workflows AS text[])))
  AND (s.next_fire_at <= :at
       OR (s.buffered_tick_at IS NOT NULL
           AND (i.status IS NULL OR i.status IN ({TERMINAL}))))
ORDER BY s.next_fire_at
LIMIT :n
FOR UPDATE OF s SKIP LOCKED
"""
)


_RECORD_TICKS = sa.text(
    """
INSERT INTO onceflow_schedule_ticks (schedule, tick_at, job_id, trigger, fired_at,
    lateness_seconds)
SELECT r.schedule, r.tick_at, r.job_id, r.trigger, :at, r.lateness
FROM jsonb_to_recordset(CAST(:rows AS jsonb)) AS r(
    schedule text, tick_at timestamptz, job_id text, trigger text, lateness float8)
ON CONFLICT DO NOTHING
"""
)


_ADVANCE = sa.text(
    """
UPDATE onceflow_schedules s SET
    next_fire_at = u.next, buffered_tick_at = u.buffered,
    last_tick_at = coalesce(u.last_tick, s.last_tick_at),
    last_job_id = coalesce(u.last_job, s.last_job_id),
    last_fired_at = CASE WHEN u.last_job IS NULL THEN s.last_fired_at ELSE :at END,
    ticks_fired = s.ticks_fired + u.fired, ticks_skipped = s.ticks_skipped + u.skipped,
    updated_at = now()
FROM jsonb_to_recordset(CAST(:rows AS jsonb)) AS u(
    name text, next timestamptz, buffered timestamptz, last_tick timestamptz,
    last_job text, fired integer, skipped integer)
WHERE s.name = u.name
"""
)


def fire_due(
    db: Engine,
    now: datetime | None = None,
    grace_seconds: float = DEFAULT_GRACE_SECONDS,
    limit: int = 1000,
    versions: Mapping[str, str] | None = None,
    batch: int = 50,
    registry: Registry | None = None,
) -> list[TickReport]:
    """Fire the due schedules, ``batch`` per transaction, up to ``limit`` in all.

    ``registry``: the firing process's workflows (an engine's): only the schedules of
    those are fired here (an engine fleet split by workflow modules fires each schedule
    on an engine that can run it), and a tick is created with its workflow's definition
    as a Kafka record's job would be (version, fairness lane, start delay and limit,
    singleton: ``Registry.delivery``; never batching or debounce). ``versions`` (tools,
    tests, a backfill): the version and the filter only. Neither: every due schedule,
    with no definition.
    """
    if registry is not None:
        versions = registry.versions()
    workflows = None if versions is None else sorted(versions)
    reports: list[TickReport] = []
    while len(reports) < limit:
        want = min(batch, limit - len(reports))
        with db.begin() as conn:
            at = judged_at(conn, now)
            rows = conn.execute(_TAKE_DUE, {"at": at, "n": want, "workflows": workflows}).all()
            if not rows:
                break
            reports += _fire_batch(
                conn, [schedule_view(r) for r in rows], at, grace_seconds, versions, registry
            )
        if len(rows) < want:
            break
    return reports


def _fire_batch(
    conn: Connection,
    due: Sequence[ScheduleView],
    at: datetime,
    grace_seconds: float,
    versions: Mapping[str, str] | None,
    registry: Registry | None,
) -> list[TickReport]:
    """Plan each locked schedule, create all their ticks in one statement, move them on."""
    plans = {s.name: plan(_due(s), at, grace_seconds) for s in due}
    wanted = [(s, t) for s in due for t in plans[s.name].fire]
    fired = create_ticks(conn, wanted, at, versions or {}, registry)
    reports, updates = [], []
    for s in due:
        p = plans[s.name]
        mine = tuple(f for f in fired if f.schedule == s.name)
        last = mine[-1] if mine else None
        reports.append(TickReport(s.name, mine, p.skipped, p.next_fire_at))
        updates.append(
            {
                "name": s.name,
                "next": p.next_fire_at.isoformat(),
                "buffered": p.buffered_tick_at.isoformat() if p.buffered_tick_at else None,
                "last_tick": last.tick_at.isoformat() if last else None,
                "last_job": last.job_id if last else None,
                "fired": sum(1 for f in mine if f.created),
                "skipped": sum(p.skipped.values()),
            }
        )
    conn.execute(_ADVANCE, {"rows": orjson.dumps(updates).decode(), "at": at})
    return reports


def _due(s: ScheduleView) -> DueSchedule:
    return DueSchedule(
        s.spec,
        s.catchup,
        s.overlap,
        s.max_catchup,
        s.next_fire_at,
        s.buffered_tick_at,
        s.previous_running,
    )


def _delivery(
    s: ScheduleView,
    tick: datetime,
    at: datetime,
    versions: Mapping[str, str],
    registry: Registry | None,
) -> Delivery:
    envelope = JobEnvelope(tick_job_id(s.name, tick), s.workflow, dict(s.params), submitted_at=at)
    topic, offset = f"schedule:{s.name}", int(tick.timestamp())
    if registry is not None:
        # A tick is never a batch member nor part of a debounce window (README,
        # "Batching", "Debounce": registration refuses a declared schedule of such a
        # workflow, and the engine errors such a tick), and its id, one instant's, never
        # runs again; everything else of its definition applies as to a submitted job's.
        job = registry.delivery(envelope, topic, 0, offset, origin=Origin.SCHEDULE)
        return replace(job, batch_key=None, debounce=None, id_reuse=IdReuse.NEVER)
    return Delivery(
        envelope, topic, 0, offset, version=versions.get(s.workflow), origin=Origin.SCHEDULE
    )


def create_ticks(
    conn: Connection,
    ticks: Sequence[tuple[ScheduleView, PlannedTick]],
    at: datetime,
    versions: Mapping[str, str],
    registry: Registry | None = None,
) -> list[FiredTick]:
    """Create the ticks' instances through the one create path, and record the ticks."""
    if not ticks:
        return []
    deliveries = [_delivery(s, t.tick_at, at, versions, registry) for s, t in ticks]
    created = set(create_instances_in(conn, deliveries).created_ids)
    fired = []
    for s, t in ticks:
        job_id = tick_job_id(s.name, t.tick_at)
        late = max(0.0, (at - t.tick_at).total_seconds())
        fired.append(
            FiredTick(s.name, s.workflow, t.tick_at, job_id, t.trigger, late, job_id in created)
        )
    rows = [
        {
            "schedule": f.schedule,
            "tick_at": f.tick_at.isoformat(),
            "job_id": f.job_id,
            "trigger": str(f.trigger),
            "lateness": f.lateness_seconds,
        }
        for f in fired
        if f.created
    ]
    if rows:
        conn.execute(_RECORD_TICKS, {"rows": orjson.dumps(rows).decode(), "at": at})
    return fired
