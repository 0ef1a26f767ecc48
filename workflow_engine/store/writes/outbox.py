"""The relay's side of the outbox (migration 0017): who relays, what is due, what was
published, and how deep the outbox is.

The events are written by the changes themselves (:mod:`workflow_engine.store.lifecycle`);
here the relay takes them in position order and deletes what Kafka acknowledged. One
relay is active at a time across engines: the one whose dedicated connection holds the
session advisory lock :data:`RELAY_LOCK_KEY` (released by PostgreSQL when that
connection or its process dies, so another engine's relay takes over).

Rows are read in position order, never past a cursor: a transaction that drew a lower
position may commit after a higher one was published, and is read by the next round.
One job's events cannot be affected by this: the instance's row lock orders them, so a
later event of a job is inserted only after the earlier one committed.
"""

from __future__ import annotations

from dataclasses import dataclass

import sqlalchemy as sa
from sqlalchemy.engine import Connection, Engine

#: The session advisory lock of the active relay (any constant no other lock uses).
RELAY_LOCK_KEY = 0x6F6E6365_0017

_TRY_LOCK = sa.text("SELECT pg_try_advisory_lock(:k)")
_UNLOCK = sa.text("SELECT pg_advisory_unlock(:k)")


def try_lock_relay(conn: Connection) -> bool:
    """Take the relay's lock on ``conn`` (a connection the caller keeps for as long as it
    relays); False if another session holds it."""
    got = bool(conn.execute(_TRY_LOCK, {"k": RELAY_LOCK_KEY}).scalar())
    conn.commit()
    return got


def unlock_relay(conn: Connection) -> None:
    conn.execute(_UNLOCK, {"k": RELAY_LOCK_KEY})
    conn.commit()


@dataclass(frozen=True, slots=True)
class OutboxEvent:
    """One row of the outbox, as the relay publishes it."""

    position: int
    id: str  # ce_id, <job_id>:<seq>
    job_id: str
    type: str  # ce_type
    seq: int
    workflow: str
    version: str | None
    time: str  # ce_time (RFC 3339, UTC)
    data: bytes  # the event's JSON data, as stored


_DUE = sa.text(
    """
SELECT position, id, aggregateid, type, seq, workflow, payload ->> 'version',
       payload ->> 'time', CAST(payload AS text)
FROM onceflow_outbox
ORDER BY position
LIMIT :limit
"""
)


def due_events(conn: Connection, limit: int) -> list[OutboxEvent]:
    """The first ``limit`` events in position order (committed ones only)."""
    rows = conn.execute(_DUE, {"limit": limit}).all()
    conn.commit()
    return [
        OutboxEvent(pos, id_, job, type_, seq, workflow, version, time, data.encode())
        for pos, id_, job, type_, seq, workflow, version, time, data in rows
    ]


# Deleted once Kafka acknowledged them; each row's age (the database's clock on both
# sides) is the relay's lag from the change's transaction to the acknowledgement.
_DELETE = sa.text(
    """
WITH deleted AS (
    DELETE FROM onceflow_outbox WHERE position = ANY(CAST(:positions AS bigint[]))
    RETURNING type, extract(epoch FROM clock_timestamp() - created_at) AS age
)
SELECT type, count(*), max(age) FROM deleted GROUP BY type
"""
)


def delete_published(conn: Connection, positions: list[int]) -> list[tuple[str, int, float]]:
    """Delete the published rows; per type, how many, and the oldest one's seconds
    since its change."""
    rows = conn.execute(_DELETE, {"positions": positions}).all()
    conn.commit()
    return [(type_, int(count), float(age)) for type_, count, age in rows]


@dataclass(frozen=True, slots=True)
class OutboxDepth:
    rows: int  # at most the cap the caller gave
    oldest_age_seconds: float  # 0 when empty


# Counting is bounded (a backlog of millions is not counted every second), and the
# oldest row is the first in position order (a later commit of a lower position is
# younger than that, never much older).
_DEPTH = sa.text(
    """
SELECT (SELECT count(*) FROM (SELECT 1 FROM onceflow_outbox LIMIT :cap) AS t),
       coalesce(extract(epoch FROM now() - (
           SELECT created_at FROM onceflow_outbox ORDER BY position LIMIT 1)), 0)
"""
)


def outbox_depth(db: Engine, cap: int) -> OutboxDepth:
    """How many rows wait in the outbox (counted up to ``cap``), and the oldest's age."""
    with db.connect() as conn:
        rows, age = conn.execute(_DEPTH, {"cap": cap}).one()
    return OutboxDepth(int(rows), float(age))
