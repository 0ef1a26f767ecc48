"""An instance's lifecycle events still in the outbox (written, not yet published).

The console shows them beside those read back from the events topic: while the relay
keeps up the outbox holds an event for milliseconds, but with Kafka away (or the relay
stopped) this is where a job's latest events are. They are read through the view
``onceflow_outbox_events`` (migration 0029: a statement's row of several events
unnested, each event's data built as the relay builds it). The outbox has no index by job id
(a queue table, rows deleted as they are published); the scan is bounded by the
outbox's depth, which backpressure bounds (``ONCEFLOW_EVENTS_OUTBOX_MAX_DEPTH``).
"""

from __future__ import annotations

from dataclasses import dataclass
from datetime import datetime
from typing import Any

import sqlalchemy as sa
from sqlalchemy.engine import Engine

from onceflow.vocabulary import EVENT_TYPE_PREFIX


@dataclass(frozen=True, slots=True)
class PendingEvent:
    kind: str  # the CloudEvents type without its prefix
    sequence: int
    data: dict[str, Any]
    written_at: datetime


_PENDING = sa.text(
    """
SELECT type, seq, payload, created_at
FROM onceflow_outbox_events
WHERE aggregateid = :job_id
ORDER BY seq
LIMIT :limit
"""
)


def pending_events(db: Engine, job_id: str, limit: int = 100) -> list[PendingEvent]:
    """``job_id``'s unpublished events in sequence order, at most ``limit``."""
    with db.connect() as conn:
        rows = conn.execute(_PENDING, {"job_id": job_id, "limit": limit}).all()
    return [
        PendingEvent(type_.removeprefix(EVENT_TYPE_PREFIX), seq, payload, at)
        for type_, seq, payload, at in rows
    ]
