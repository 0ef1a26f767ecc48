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


_TRACE = sa.text("SELECT * FROM job_trace(:j)")
_HOLD_REASON = sa.text("SELECT now(), onceflow_hold_reason(:j)")


def job_trace(db: Engine, job_id: str) -> list[TraceEvent]:
    """The timeline, and last, when the job waits to be claimed, why it is held back
    (flow control: ``onceflow_hold_reason``, migration 0009)."""
    with db.connect() as conn:
        rows = conn.execute(_TRACE, {"j": job_id})
        events = [TraceEvent(*row) for row in rows]
        held = conn.execute(_HOLD_REASON, {"j": job_id}).one()
        if held[1] is not None:
            events.append(TraceEvent(held[0], "held back", held[1], "engine"))
        return events
