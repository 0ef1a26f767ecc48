"""One instance's webhook deliveries, as describe, the console and the job status show
them (the trace reads the attempts through ``job_trace``, migration 0019)."""

from __future__ import annotations

from dataclasses import dataclass
from datetime import datetime

import sqlalchemy as sa
from sqlalchemy.engine import Connection

from onceflow.vocabulary import WebhookStatus

#: The most deliveries describe lists for one instance (the newest).
MAX_LISTED = 100


@dataclass(frozen=True)
class DeliveryView:
    endpoint: str
    kind: str
    event_id: str
    status: WebhookStatus
    attempts: int
    last_code: int | None
    last_error: str | None
    dead_reason: str | None
    next_attempt_at: datetime | None  # when pending: the next attempt is due then
    created_at: datetime
    finished_at: datetime | None


_DELIVERIES = sa.text(
    """
SELECT endpoint, kind, event_id, status, attempts, last_code, last_error, dead_reason,
       CASE WHEN status = 'pending' THEN next_attempt_at END AS next_attempt_at,
       created_at, finished_at
FROM (SELECT * FROM onceflow_webhook_deliveries WHERE job_id = :job_id
      ORDER BY id DESC LIMIT :n) d
ORDER BY id
"""
)


def deliveries_of(conn: Connection, job_id: str) -> list[DeliveryView]:
    """The instance's deliveries, oldest first (at most :data:`MAX_LISTED`, the newest)."""
    rows = conn.execute(_DELIVERIES, {"job_id": job_id, "n": MAX_LISTED})
    return [DeliveryView(**{**dict(r._mapping), "status": WebhookStatus(r.status)}) for r in rows]
