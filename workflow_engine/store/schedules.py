"""Schedules: every statement on ``onceflow_schedules`` and ``onceflow_schedule_ticks``.

A tick is a job like any other: :func:`fire_due` hands its deliveries to the one create
path (:func:`~workflow_engine.store.instances.create_instances_in`), so its job id
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

from collections.abc import Mapping, Sequence
from dataclasses import asdict, dataclass, field
from datetime import datetime
from typing import Any

import orjson
import sqlalchemy as sa
from sqlalchemy.engine import Connection, Engine
from sqlalchemy.exc import IntegrityError

from onceflow.envelope import JobEnvelope
from onceflow.errors import OnceflowError
from onceflow.ticks import (
    DEFAULT_GRACE_SECONDS,
    BackfillRange,
    DueSchedule,
    PlannedTick,
    TickSpec,
    backfill_range,
    check_name,
    plan,
    tick_job_id,
)
from onceflow.vocabulary import (
    TERMINAL_STATUSES,
    CatchupPolicy,
    InstanceStatus,
    Origin,
    OverlapPolicy,
    TickSkipReason,
    TickTrigger,
)
from workflow_engine.store.db import constraint_of
from workflow_engine.store.fragments import TERMINAL
from workflow_engine.store.instances import Delivery, create_instances_in

#: A backfill creates at most this many ticks (ask for a shorter range beyond it).
MAX_BACKFILL = 10_000
_CHUNK = 500


class ScheduleError(OnceflowError):
    """A schedule operation that cannot be done."""


class ScheduleNotFound(ScheduleError):
    """No schedule has that name."""


class ScheduleExists(ScheduleError):
    """A schedule with that name exists already."""


@dataclass(frozen=True)
class ScheduleDef:
    """A schedule as declared (``@workflow(schedule=...)``) or created (CLI, API)."""

    name: str
    workflow: str
    spec: TickSpec
    params: Mapping[str, Any] = field(default_factory=dict)
    catchup: CatchupPolicy = CatchupPolicy.RUN_ONCE
    overlap: OverlapPolicy = OverlapPolicy.SKIP
    max_catchup: int = 100

    def __post_init__(self) -> None:
        check_name(self.name)
        if not 1 <= self.max_catchup <= 1000:
            raise ScheduleError("max_catchup must be between 1 and 1000")
        try:  # plain strings ("run-all") are welcome; unknown words fail here, early
            object.__setattr__(self, "catchup", CatchupPolicy(self.catchup))
            object.__setattr__(self, "overlap", OverlapPolicy(self.overlap))
        except ValueError as exc:
            raise ScheduleError(str(exc)) from None


@dataclass(frozen=True)
class ScheduleView:
    name: str
    workflow: str
    cron: str | None
    every_seconds: int | None
    timezone: str
    params: dict[str, Any]
    catchup: CatchupPolicy
    overlap: OverlapPolicy
    max_catchup: int
    declared: bool
    paused: bool
    next_fire_at: datetime
    buffered_tick_at: datetime | None
    last_tick_at: datetime | None
    last_job_id: str | None
    last_fired_at: datetime | None
    ticks_fired: int
    ticks_skipped: int
    created_at: datetime
    updated_at: datetime
    last_status: InstanceStatus | None = None  # of the last tick's instance

    @property
    def spec(self) -> TickSpec:
        return TickSpec(self.cron, self.every_seconds, self.timezone)

    @property
    def previous_running(self) -> bool:
        return self.last_status is not None and self.last_status not in TERMINAL_STATUSES

    def to_dict(self) -> dict[str, Any]:
        doc = asdict(self)
        doc["spec"] = self.spec.describe()
        return doc


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


@dataclass(frozen=True)
class BackfillResult:
    schedule: str
    count: int
    first: datetime | None
    last: datetime | None
    dry_run: bool
    created: int = 0
    existing: int = 0  # ticks whose job id had an instance already


@dataclass(frozen=True)
class TickView:
    """Which schedule and tick created a job (``onceflow instances describe``)."""

    schedule: str
    tick_at: datetime
    trigger: TickTrigger
    fired_at: datetime
    lateness_seconds: float


_COLUMNS = (
    "s.name, s.workflow, s.cron, s.every_seconds, s.timezone, s.params, s.catchup,"
    " s.overlap, s.max_catchup, s.declared, s.paused, s.next_fire_at, s.buffered_tick_at,"
    " s.last_tick_at, s.last_job_id, s.last_fired_at, s.ticks_fired, s.ticks_skipped,"
    " s.created_at, s.updated_at, i.status AS last_status"
)
_FROM = " FROM onceflow_schedules s LEFT JOIN onceflow_instances i ON i.job_id = s.last_job_id"


def _view(row: sa.Row[Any]) -> ScheduleView:
    doc = dict(row._mapping)
    doc["catchup"] = CatchupPolicy(doc["catchup"])
    doc["overlap"] = OverlapPolicy(doc["overlap"])
    doc["last_status"] = InstanceStatus(doc["last_status"]) if doc["last_status"] else None
    return ScheduleView(**doc)


def _now(conn: Connection, now: datetime | None) -> datetime:
    """The time a schedule is judged at: the test clock's, else the database's."""
    at: datetime = conn.execute(
        sa.text("SELECT coalesce(CAST(:now AS timestamptz), now())"), {"now": now}
    ).scalar_one()
    return at


def _def_params(d: ScheduleDef, at: datetime) -> dict[str, Any]:
    return {
        "name": d.name,
        "workflow": d.workflow,
        "cron": d.spec.cron,
        "every": d.spec.every_seconds,
        "tz": d.spec.timezone,
        "params": orjson.dumps(dict(d.params)).decode(),
        "catchup": str(d.catchup),
        "overlap": str(d.overlap),
        "max_catchup": d.max_catchup,
        "next": d.spec.next_after(at),
    }


_INSERT = """
INSERT INTO onceflow_schedules AS s (name, workflow, cron, every_seconds, timezone, params,
    catchup, overlap, max_catchup, declared, next_fire_at)
VALUES (:name, :workflow, :cron, :every, :tz, CAST(:params AS jsonb), :catchup, :overlap,
    :max_catchup, {declared}, :next)
"""


def create_schedule(engine: Engine, d: ScheduleDef, now: datetime | None = None) -> ScheduleView:
    """Create a schedule; its first tick is the first one after now."""
    try:
        with engine.begin() as conn:
            values = _def_params(d, _now(conn, now))
            conn.execute(sa.text(_INSERT.format(declared="false")), values)
    except IntegrityError as exc:
        if constraint_of(exc) == "onceflow_schedules_pkey":
            raise ScheduleExists(f"a schedule named {d.name!r} exists already") from None
        raise
    return get_schedule(engine, d.name)


# A declared schedule keeps its place (next_fire_at, so a restart catches up by its
# policy), its counters and its paused state; a changed spec starts from now.
_UPSERT_DECLARED = sa.text(
    _INSERT.format(declared="true")
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
    engine: Engine, defs: Sequence[ScheduleDef], now: datetime | None = None
) -> list[str]:
    """Create or update the schedules declared in code; answers the names a schedule
    made by the CLI or API holds already (those are left alone)."""
    conflicts: list[str] = []
    with engine.begin() as conn:
        at = _now(conn, now)
        for d in defs:
            if conn.execute(_UPSERT_DECLARED, _def_params(d, at)).first() is None:
                conflicts.append(d.name)
    return conflicts


def list_schedules(engine: Engine) -> list[ScheduleView]:
    with engine.connect() as conn:
        rows = conn.execute(sa.text(f"SELECT {_COLUMNS}{_FROM} ORDER BY s.name"))
        return [_view(r) for r in rows]


def seconds_until_next_fire(engine: Engine, now: datetime | None = None) -> float | None:
    """How long until the next active schedule is due (None: there is none)."""
    with engine.connect() as conn:
        value = conn.execute(
            sa.text(
                "SELECT extract(epoch FROM min(next_fire_at)"
                " - coalesce(CAST(:now AS timestamptz), now()))"
                " FROM onceflow_schedules WHERE NOT paused"
            ),
            {"now": now},
        ).scalar()
    return None if value is None else float(value)


def next_fire_times(engine: Engine) -> dict[str, datetime | None]:
    """Each schedule's next fire time (None while paused): the scheduler's gauge."""
    with engine.connect() as conn:
        rows = conn.execute(sa.text("SELECT name, paused, next_fire_at FROM onceflow_schedules"))
        return {r.name: None if r.paused else r.next_fire_at for r in rows}


def get_schedule(engine: Engine, name: str) -> ScheduleView:
    with engine.connect() as conn:
        row = conn.execute(
            sa.text(f"SELECT {_COLUMNS}{_FROM} WHERE s.name = :n"), {"n": name}
        ).one_or_none()
    if row is None:
        raise ScheduleNotFound(f"no schedule named {name!r}")
    return _view(row)


def pause_schedule(engine: Engine, name: str) -> ScheduleView:
    """Stop firing. Ticks that fall due while paused are not run (not caught up)."""
    with engine.begin() as conn:
        _require(
            conn.execute(
                sa.text(
                    "UPDATE onceflow_schedules SET paused = true, updated_at = now()"
                    " WHERE name = :n RETURNING name"
                ),
                {"n": name},
            ).first(),
            name,
        )
    return get_schedule(engine, name)


def resume_schedule(engine: Engine, name: str, now: datetime | None = None) -> ScheduleView:
    """Fire again, from the first tick after now."""
    with engine.begin() as conn:
        at = _now(conn, now)
        row = _require(
            conn.execute(
                sa.text(
                    "SELECT cron, every_seconds, timezone, paused FROM onceflow_schedules"
                    " WHERE name = :n FOR UPDATE"
                ),
                {"n": name},
            ).first(),
            name,
        )
        if row.paused:
            spec = TickSpec(row.cron, row.every_seconds, row.timezone)
            conn.execute(
                sa.text(
                    # a tick buffered before the pause is dropped: it would fire at
                    # once, while resume promises the first tick after now
                    "UPDATE onceflow_schedules SET paused = false, next_fire_at = :next,"
                    " buffered_tick_at = NULL, updated_at = now() WHERE name = :n"
                ),
                {"n": name, "next": spec.next_after(at)},
            )
    return get_schedule(engine, name)


def delete_schedule(engine: Engine, name: str) -> None:
    """Delete a schedule (its ticks' instances and their history stay)."""
    with engine.begin() as conn:
        _require(
            conn.execute(
                sa.text("DELETE FROM onceflow_schedules WHERE name = :n RETURNING name"),
                {"n": name},
            ).first(),
            name,
        )


def _require(row: Any, name: str) -> Any:
    if row is None:
        raise ScheduleNotFound(f"no schedule named {name!r}")
    return row


# --- firing --------------------------------------------------------------------------

# Due: a tick is due, or a buffered tick's predecessor has finished.
_TAKE_DUE = sa.text(
    f"""
SELECT {_COLUMNS}{_FROM}
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
    engine: Engine,
    now: datetime | None = None,
    grace_seconds: float = DEFAULT_GRACE_SECONDS,
    limit: int = 1000,
    versions: Mapping[str, str] | None = None,
    batch: int = 50,
) -> list[TickReport]:
    """Fire the due schedules, ``batch`` per transaction, up to ``limit`` in all.

    ``versions``: the workflow versions of the firing process (an instance records the
    version it was created with); given, only the schedules of those workflows are
    fired here (an engine fleet split by workflow modules fires each schedule on an
    engine that can run it). None (tools, tests): every due schedule.
    """
    workflows = None if versions is None else sorted(versions)
    reports: list[TickReport] = []
    while len(reports) < limit:
        want = min(batch, limit - len(reports))
        with engine.begin() as conn:
            at = _now(conn, now)
            rows = conn.execute(_TAKE_DUE, {"at": at, "n": want, "workflows": workflows}).all()
            if not rows:
                break
            reports += _fire_batch(conn, [_view(r) for r in rows], at, grace_seconds, versions)
        if len(rows) < want:
            break
    return reports


def _fire_batch(
    conn: Connection,
    due: Sequence[ScheduleView],
    at: datetime,
    grace_seconds: float,
    versions: Mapping[str, str] | None,
) -> list[TickReport]:
    """Plan each locked schedule, create all their ticks in one statement, move them on."""
    plans = {s.name: plan(_due(s), at, grace_seconds) for s in due}
    wanted = [(s, t) for s in due for t in plans[s.name].fire]
    fired = _create_ticks(conn, wanted, at, versions or {})
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


def _delivery(s: ScheduleView, tick: datetime, at: datetime, version: str | None) -> Delivery:
    return Delivery(
        JobEnvelope(tick_job_id(s.name, tick), s.workflow, dict(s.params), submitted_at=at),
        f"schedule:{s.name}",
        0,
        int(tick.timestamp()),
        version=version,
        origin=Origin.SCHEDULE,
    )


def _create_ticks(
    conn: Connection,
    ticks: Sequence[tuple[ScheduleView, PlannedTick]],
    at: datetime,
    versions: Mapping[str, str],
) -> list[FiredTick]:
    """Create the ticks' instances through the one create path, and record the ticks."""
    if not ticks:
        return []
    deliveries = [_delivery(s, t.tick_at, at, versions.get(s.workflow)) for s, t in ticks]
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


# --- backfill and lookups ----------------------------------------------------------------


def backfill(
    engine: Engine,
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
    s = get_schedule(engine, name)
    ticks: BackfillRange = backfill_range(s.spec, start, end, MAX_BACKFILL)
    result = BackfillResult(name, ticks.total, ticks.first, ticks.last, dry_run)
    if dry_run or not ticks.ticks:
        return result
    created = 0
    planned = [(s, PlannedTick(t, TickTrigger.BACKFILL)) for t in ticks.ticks]
    for i in range(0, len(planned), _CHUNK):
        with engine.begin() as conn:
            at = _now(conn, now)
            fired = _create_ticks(conn, planned[i : i + _CHUNK], at, versions or {})
            created += sum(1 for f in fired if f.created)
    return BackfillResult(
        name, ticks.total, ticks.first, ticks.last, False, created, ticks.total - created
    )


def tick_of(engine: Engine, job_id: str) -> TickView | None:
    """Which schedule and tick created this job, if a schedule did."""
    with engine.connect() as conn:
        row = conn.execute(
            sa.text(
                "SELECT schedule, tick_at, trigger, fired_at, lateness_seconds"
                " FROM onceflow_schedule_ticks WHERE job_id = :j"
            ),
            {"j": job_id},
        ).one_or_none()
    if row is None:
        return None
    return TickView(
        row.schedule, row.tick_at, TickTrigger(row.trigger), row.fired_at, row.lateness_seconds
    )
