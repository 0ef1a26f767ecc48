"""A schedule's row as every schedule module reads it (:class:`ScheduleView`, its
columns), the time a schedule is judged at, the insert both the operators' create and
the declared upsert share, and the schedules' errors."""

from __future__ import annotations

from dataclasses import asdict, dataclass
from datetime import datetime
from typing import Any

import orjson
import sqlalchemy as sa
from sqlalchemy.engine import Connection

from onceflow.ticks import (
    TickSpec,
)
from onceflow.vocabulary import (
    TERMINAL_STATUSES,
    CatchupPolicy,
    InstanceStatus,
    OverlapPolicy,
)
from workflow_engine.model import ScheduleDef, ScheduleError


class ScheduleNotFound(ScheduleError):
    """No schedule has that name."""


class ScheduleExists(ScheduleError):
    """A schedule with that name exists already."""


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


COLUMNS = (
    "s.name, s.workflow, s.cron, s.every_seconds, s.timezone, s.params, s.catchup,"
    " s.overlap, s.max_catchup, s.declared, s.paused, s.next_fire_at, s.buffered_tick_at,"
    " s.last_tick_at, s.last_job_id, s.last_fired_at, s.ticks_fired, s.ticks_skipped,"
    " s.created_at, s.updated_at, i.status AS last_status"
)


FROM = " FROM onceflow_schedules s LEFT JOIN onceflow_instances i ON i.job_id = s.last_job_id"


def schedule_view(row: sa.Row[Any]) -> ScheduleView:
    doc = dict(row._mapping)
    doc["catchup"] = CatchupPolicy(doc["catchup"])
    doc["overlap"] = OverlapPolicy(doc["overlap"])
    doc["last_status"] = InstanceStatus(doc["last_status"]) if doc["last_status"] else None
    return ScheduleView(**doc)


_JUDGED_AT = sa.text("SELECT coalesce(CAST(:now AS timestamptz), now())")


def judged_at(conn: Connection, now: datetime | None) -> datetime:
    """The time a schedule is judged at: the test clock's, else the database's."""
    at: datetime = conn.execute(_JUDGED_AT, {"now": now}).scalar_one()
    return at


def def_params(d: ScheduleDef, at: datetime) -> dict[str, Any]:
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


INSERT = """
INSERT INTO onceflow_schedules AS s (name, workflow, cron, every_seconds, timezone, params,
    catchup, overlap, max_catchup, declared, next_fire_at)
VALUES (:name, :workflow, :cron, :every, :tz, CAST(:params AS jsonb), :catchup, :overlap,
    :max_catchup, {declared}, :next)
"""
