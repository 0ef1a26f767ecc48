"""One job's timeline, as the ``job_trace`` SQL function (migration 0003) gives it."""

from __future__ import annotations

from dataclasses import dataclass
from datetime import datetime

import sqlalchemy as sa
from sqlalchemy.engine import Engine


@dataclass(frozen=True)
class TraceEvent:
    at: datetime | None
    event: str
    detail: str
    layer: str


def job_trace(engine: Engine, job_id: str) -> list[TraceEvent]:
    with engine.connect() as conn:
        rows = conn.execute(sa.text("SELECT * FROM job_trace(:j)"), {"j": job_id})
        return [TraceEvent(*row) for row in rows]
