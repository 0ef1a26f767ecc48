"""Lifecycle events written in the transaction of their change (the outbox, migration 0017).

Two ways in, one table, one shape of data (``onceflow_event_data``):

* the hot paths (create, claim, checkpoints, finish) insert their events in the very
  statement that makes the change, one more CTE (:func:`outbox_insert`), and bump the
  instance's ``event_seq`` in that statement too: no extra round trip, one multi-row
  insert per batch;
* the rarer changes (an operator's action, a suspension, a duplicate delivery, a child
  created) call :func:`emit` after their change, in its transaction: one statement
  (``onceflow_emit``) for all the events of that change.

Whether a session writes events is the database session's ``onceflow.lifecycle_events``
(``onceflow_events_on()``; :func:`session_options` sets it from the setting), so the same
statements serve both, and with events off they write nothing and lock nothing more.

The sequence is the counter ``onceflow_instances.event_seq``, bumped under the row's
lock by the statement that writes the event: unique per job id and increasing in commit
order, and the outbox row of a later change is inserted only after the earlier change
committed, so its position is higher too (the relay publishes in position order).
"""

from __future__ import annotations

from collections.abc import Sequence
from typing import Any

import orjson
import sqlalchemy as sa
from sqlalchemy.engine import Connection

from onceflow.vocabulary import EVENT_TYPE_PREFIX, LifecycleEvent

#: The SQL test "this session writes lifecycle events".
EVENTS_ON = "onceflow_events_on()"

#: What a statement adds to ``event_seq`` for one event: 1, or 0 with events off.
ONE_EVENT = f"CASE WHEN {EVENTS_ON} THEN 1 ELSE 0 END"

#: A timestamp as the events write it (RFC 3339, UTC, microseconds), for ``.format(sql)``.
RFC3339 = "to_char({} AT TIME ZONE 'UTC', 'YYYY-MM-DD\"T\"HH24:MI:SS.US\"Z\"')"

#: The session setting that turns the events off (``off``) for one connection.
SESSION_SETTING = "onceflow.lifecycle_events"

#: The default provenance of an event: the instance's job record, joined by job id.
_JOB_OF = "LEFT JOIN onceflow_jobs j ON j.job_id = e.job_id"


def record_position(alias: str) -> str:
    """The SQL of an instance's record's position (origin, topic, partition, offset:
    the events' provenance) as columns of ``alias``."""
    return f"{alias}.origin, {alias}.source_topic, {alias}.source_partition, {alias}.source_offset"


_JOB_POSITION = record_position("j")


def outbox_insert(
    source: str,
    kind: str,
    extra: str = "NULL",
    *,
    where: str = "true",
    provenance: str | None = None,
) -> str:
    """The body of a CTE that writes one event for each row of the CTE ``source``
    (alias ``e``: its columns ``job_id``, ``workflow``, ``version``, ``seq``, ``status``,
    ``run``, the instance's after the change), when the session writes events.

    ``kind``: the SQL of the kind without its prefix (``'step.completed'`` or a CASE);
    ``extra``: the SQL of the jsonb object the kind adds; ``where``: which rows of
    ``source`` have an event. ``provenance``: the SQL of origin, topic, partition and
    offset of the creating record; by default read from the job's record (``j``)."""
    join = "" if provenance is not None else _JOB_OF
    position = provenance if provenance is not None else _JOB_POSITION
    return f"""
    INSERT INTO onceflow_outbox (id, aggregateid, type, seq, workflow, payload)
    SELECT e.job_id || ':' || e.seq, e.job_id, '{EVENT_TYPE_PREFIX}' || {kind}, e.seq,
           e.workflow,
           onceflow_event_data(e.job_id, e.workflow, e.version, e.seq, e.status,
                               {position},
                               jsonb_build_object('run', e.run) || coalesce({extra}, '{{}}'::jsonb))
    FROM {source} e {join}
    WHERE {EVENTS_ON} AND ({where})
    ORDER BY e.job_id
    RETURNING 1"""


_EMIT = sa.text(
    "SELECT onceflow_emit(CAST(:job_ids AS text[]), CAST(:kinds AS text[]),"
    " CAST(CAST(:extras AS text[]) AS jsonb[]))"
)


def emit(
    conn: Connection, events: Sequence[tuple[str, LifecycleEvent, dict[str, Any] | None]]
) -> None:
    """Write ``(job_id, kind, extra data)`` events of changes the caller's transaction
    made (after them: the data carries each instance's status after the change), in
    order; an instance that no longer exists gets none. One statement."""
    if not events:
        return
    conn.execute(
        _EMIT,
        {
            "job_ids": [job_id for job_id, _, _ in events],
            "kinds": [str(kind) for _, kind, _ in events],
            "extras": [orjson.dumps(extra).decode() if extra else None for _, _, extra in events],
        },
    )


def session_options(lifecycle_events: bool) -> str | None:
    """The libpq ``options`` that turn a connection's events off, or None (on)."""
    return None if lifecycle_events else f"-c {SESSION_SETTING}=off"
