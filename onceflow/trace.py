"""``onceflow trace``: one job's timeline from the ``job_trace`` SQL function."""

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


def render_trace(job_id: str, events: list[TraceEvent]) -> str:
    lines = [f"trace of {job_id}:"]
    for e in events:
        at = e.at.isoformat(timespec="milliseconds") if e.at else "-"
        lines.append(f"  {at:<29}  {e.layer:<8}  {e.event:<22}  {e.detail}")
    return "\n".join(lines)
