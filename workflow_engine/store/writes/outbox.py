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
from typing import Any

import orjson
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
    """One event of the outbox, as the relay publishes it (a row's, or one of a
    statement's row of several: they share its position)."""

    position: int
    id: str  # ce_id, <job_id>:<seq>
    job_id: str
    type: str  # ce_type
    seq: int
    workflow: str
    version: str | None
    time: str  # ce_time (RFC 3339, UTC)
    data: bytes  # the event's JSON data


# A row of one event carries its data (built by the statement that wrote it); a row of
# several (migration 0029) its events' fields as arrays, the data built in Python here
# (cheaper than jsonb in the writing statement, which is the engine's hot path), and the
# time once: the events of one row are of one transaction.
#
# ``limit`` bounds the events: at most that many rows are read, and of those the ones
# that start before the limit'th event (so a round is at most one row over it).
_DUE = sa.text(
    """
SELECT position, id, aggregateid, type, seq, workflow, payload ->> 'version',
       payload ->> 'time', CAST(payload AS text),
       job_ids, seqs, types, workflows, versions, statuses, runs, kafka_topics,
       kafka_partitions, kafka_offsets, CAST(extras AS text[]),
       to_char(created_at AT TIME ZONE 'UTC', 'YYYY-MM-DD"T"HH24:MI:SS.US"Z"')
FROM onceflow_outbox
WHERE position IN (
    -- sized by the rows' counts alone (their arrays are read for the rows taken only)
    SELECT position FROM (
        SELECT position, events, sum(events) OVER (ORDER BY position) AS upto
        FROM (SELECT position, events FROM onceflow_outbox ORDER BY position LIMIT :limit) AS o
    ) AS due
    WHERE upto - events < :limit
)
ORDER BY position
"""
)


def due_events(conn: Connection, limit: int) -> list[OutboxEvent]:
    """About the first ``limit`` events in position order (committed ones only): a
    round has ``limit`` or more when more are waiting, fewer when it caught up. Within a
    row of several, each job's in sequence order."""
    rows = conn.execute(_DUE, {"limit": limit}).all()
    conn.commit()
    events: list[OutboxEvent] = []
    for row in rows:
        if row[9] is None:
            pos, id_, job, type_, seq, workflow, version, time, data = row[:9]
            events.append(
                OutboxEvent(pos, id_, job, type_, seq, workflow, version, time, data.encode())
            )
        else:
            events.extend(_unpack(row))
    return events


def _unpack(row: Any) -> list[OutboxEvent]:
    """The events of a row of several, their data to the contract (docs/events.md):
    the common fields, then what the kind adds, spliced in as PostgreSQL wrote it (its
    numbers exactly as stored, never through a float)."""
    position, time = row[0], row[20]
    events = []
    # a job's events in sequence order (the arrays hold them as the statement met them)
    for job, seq, type_, workflow, version, status, run, topic, part, off, extra in sorted(
        zip(*row[9:20], strict=True), key=lambda e: (e[0], e[1])
    ):
        kafka = None if topic is None else {"topic": topic, "partition": part, "offset": off}
        data = orjson.dumps(
            {
                "job_id": job,
                "workflow": workflow,
                "version": version,
                "sequence": seq,
                "time": time,
                "status": status,
                "kafka": kafka,
                "run": run,
            }
        )
        # an object with fields (what every writer's extra is: outbox_insert's rule)
        if extra is not None and extra.startswith("{") and extra != "{}":
            data = b"%s, %s" % (data[:-1], extra[1:].encode())
        events.append(
            OutboxEvent(position, f"{job}:{seq}", job, type_, seq, workflow, version, time, data)
        )
    return events


# Deleted once Kafka acknowledged them; the oldest row's age (the database's clock on
# both sides) is the relay's lag from the change's transaction to the acknowledgement.
_DELETE = sa.text(
    """
WITH deleted AS (
    DELETE FROM onceflow_outbox WHERE position = ANY(CAST(:positions AS bigint[]))
    RETURNING created_at
)
SELECT coalesce(extract(epoch FROM clock_timestamp() - min(created_at)), 0) FROM deleted
"""
)


def delete_published(conn: Connection, positions: list[int]) -> float:
    """Delete the published rows (each position once); the oldest one's seconds since
    its change."""
    age = conn.execute(_DELETE, {"positions": sorted(set(positions))}).scalar_one()
    conn.commit()
    return float(age)


@dataclass(frozen=True, slots=True)
class OutboxDepth:
    events: int  # in at most the cap of rows the caller gave
    oldest_age_seconds: float  # 0 when empty


# Counting is bounded (a backlog of millions is not counted every second: at most
# ``cap`` rows, each counted for its events), and the oldest row is the first in
# position order (a later commit of a lower position is younger than that, never much
# older).
_DEPTH = sa.text(
    """
SELECT (SELECT coalesce(sum(events), 0)
        FROM (SELECT events FROM onceflow_outbox LIMIT :cap) AS t),
       coalesce(extract(epoch FROM now() - (
           SELECT created_at FROM onceflow_outbox ORDER BY position LIMIT 1)), 0)
"""
)


def outbox_depth(db: Engine, cap: int) -> OutboxDepth:
    """How many events wait in the outbox (in at most ``cap`` rows), and the oldest's
    age."""
    with db.connect() as conn:
        rows, age = conn.execute(_DEPTH, {"cap": cap}).one()
    return OutboxDepth(int(rows), float(age))
