"""Schedules as read: the list, one schedule, the next fire times (the scheduler's
gauge), and which schedule and tick created a job (``instances describe``)."""

from __future__ import annotations

from dataclasses import dataclass
from datetime import datetime

import sqlalchemy as sa
from sqlalchemy.engine import Engine

from onceflow.vocabulary import (
    TickTrigger,
)
from workflow_engine.store.schedule_rows import (
    COLUMNS,
    FROM,
    ScheduleNotFound,
    ScheduleView,
    schedule_view,
)


@dataclass(frozen=True)
class TickView:
    """Which schedule and tick created a job (``onceflow instances describe``)."""

    schedule: str
    tick_at: datetime
    trigger: TickTrigger
    fired_at: datetime
    lateness_seconds: float


_SCHEDULES = sa.text(f"SELECT {COLUMNS}{FROM} ORDER BY s.name")


def list_schedules(db: Engine) -> list[ScheduleView]:
    with db.connect() as conn:
        rows = conn.execute(_SCHEDULES)
        return [schedule_view(r) for r in rows]


_NEXT_FIRE_TIMES = sa.text("SELECT name, paused, next_fire_at FROM onceflow_schedules")


def next_fire_times(db: Engine) -> dict[str, datetime | None]:
    """Each schedule's next fire time (None while paused): the scheduler's gauge."""
    with db.connect() as conn:
        rows = conn.execute(_NEXT_FIRE_TIMES)
        return {r.name: None if r.paused else r.next_fire_at for r in rows}


_SCHEDULE = sa.text(f"SELECT {COLUMNS}{FROM} WHERE s.name = :n")


def get_schedule(db: Engine, name: str) -> ScheduleView:
    with db.connect() as conn:
        row = conn.execute(_SCHEDULE, {"n": name}).one_or_none()
    if row is None:
        raise ScheduleNotFound(f"no schedule named {name!r}")
    return schedule_view(row)


_TICK_OF = sa.text(
    "SELECT schedule, tick_at, trigger, fired_at, lateness_seconds"
    " FROM onceflow_schedule_ticks WHERE job_id = :j"
)


def tick_of(db: Engine, job_id: str) -> TickView | None:
    """Which schedule and tick created this job, if a schedule did."""
    with db.connect() as conn:
        row = conn.execute(_TICK_OF, {"j": job_id}).one_or_none()
    if row is None:
        return None
    return TickView(
        row.schedule, row.tick_at, TickTrigger(row.trigger), row.fired_at, row.lateness_seconds
    )
