"""Lifecycle events written in the transaction of their change (the outbox, migration 0017).

Two ways in, one table, one shape of data (``onceflow_event_data``):

* the hot paths (create, claim, checkpoints, finish) insert their events in the very
  statement that makes the change, one more CTE (:func:`outbox_insert`), and bump the
  instance's ``event_seq`` in that statement too: no extra round trip, and by default
  one outbox row for the whole batch's events, as arrays (migration 0029);
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

#: The SQL test "this session writes the hot paths' events one row per statement".
BATCHED = "onceflow_outbox_batched()"

#: An event whose extra data may be larger than this (bytes, as stored) has a row of
#: its own: a finish's result can be megabytes, and a row of several would hold them all.
LARGE_EXTRA_BYTES = 2000


#: The SQL of a creating record's origin, topic, partition and offset.
Provenance = tuple[str, str, str, str]


def position_of(alias: str) -> Provenance:
    """An instance's record's position (origin, topic, partition, offset: the events'
    provenance) as columns of ``alias``, one by one."""
    return (
        f"{alias}.origin",
        f"{alias}.source_topic",
        f"{alias}.source_partition",
        f"{alias}.source_offset",
    )


def record_position(alias: str) -> str:
    """:func:`position_of` as one SQL list."""
    return ", ".join(position_of(alias))


def outbox_insert(
    source: str,
    kind: str,
    extra: str = "NULL",
    *,
    where: str = "true",
    provenance: Provenance | None = None,
    large: str = "false",
) -> str:
    """The body of a CTE that writes one event for each row of the CTE ``source``
    (alias ``e``: its columns ``job_id``, ``workflow``, ``version``, ``seq``, ``status``,
    ``run``, the instance's after the change), when the session writes events.

    ``kind``: the SQL of the kind without its prefix (``'step.completed'`` or a CASE);
    ``extra``: the SQL of the jsonb object the kind adds (never one of the common fields:
    the relay puts it after them as it is); ``where``: which rows of ``source`` have an
    event. ``provenance``: the SQL of the creating record's origin, topic, partition and
    offset; by default the job's record (``j``), joined. ``large``: the SQL test "this
    event's extra may be large" (a finish's result): such an event gets a row of its own
    in either layout, so that a row of several stays small (found in review: 64 results
    of 1.5 MB in one array).

    One statement, two layouts (migration 0029), the session's setting choosing which
    branch runs (a one-time filter: the other is never executed): by default ONE row for
    all of the statement's events, as arrays (the relay builds each event's data); with
    ``onceflow.outbox_layout = 'per_event'``, a row per event with its data built here
    (``onceflow_event_data``), the rows Debezium's outbox router reads."""
    join = "" if provenance is not None else _JOB_OF
    origin, topic, partition, offset = provenance or position_of("j")
    position = ", ".join((origin, topic, partition, offset))
    return f"""
    INSERT INTO onceflow_outbox (id, aggregateid, type, seq, workflow, payload, job_ids, seqs,
                                 types, workflows, versions, statuses, runs, kafka_topics,
                                 kafka_partitions, kafka_offsets, extras, events)
    SELECT * FROM (
        SELECT e.job_id || ':' || e.seq, e.job_id, '{EVENT_TYPE_PREFIX}' || {kind}, e.seq,
               e.workflow,
               onceflow_event_data(e.job_id, e.workflow, e.version, e.seq, e.status,
                                   {position},
                                   jsonb_build_object('run', e.run)
                                   || coalesce({extra}, '{{}}'::jsonb)),
               NULL::text[], NULL::int[], NULL::text[], NULL::text[], NULL::text[],
               NULL::text[], NULL::int[], NULL::text[], NULL::int[], NULL::bigint[],
               NULL::jsonb[], 1
        FROM {source} e {join}
        WHERE {EVENTS_ON} AND (NOT {BATCHED} OR ({large})) AND ({where})
        ORDER BY e.job_id
    ) AS per_event
    UNION ALL
    SELECT NULL, NULL, NULL, NULL, NULL, NULL,
           array_agg(e.job_id), array_agg(e.seq), array_agg('{EVENT_TYPE_PREFIX}' || {kind}),
           array_agg(e.workflow), array_agg(e.version), array_agg(e.status), array_agg(e.run),
           array_agg(CAST(CASE WHEN {origin} IN ('http', 'kafka') THEN {topic} END AS text)),
           array_agg(CAST({partition} AS integer)), array_agg(CAST({offset} AS bigint)),
           array_agg(CAST({extra} AS jsonb)), CAST(count(*) AS integer)
    FROM {source} e {join}
    WHERE {EVENTS_ON} AND {BATCHED} AND NOT ({large}) AND ({where})
    HAVING count(*) > 0
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
