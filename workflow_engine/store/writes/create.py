"""Creating and reading workflow instances: the API other packages use.

``create_instances`` is the equivalent of ``env.ORDER_WORKFLOW.create({id, params})``
for a whole batch of Kafka deliveries, in one statement and one round trip:

* the first delivery of a job id inserts its ``onceflow_jobs`` row (the named unique
  constraint ``onceflow_jobs_job_id_key``) and its queued instance;
* every other delivery - a Kafka redelivery or a client resubmission, in this batch
  or any earlier one - is a no-op for the instance and becomes one audit row in
  ``onceflow_duplicate_deliveries``, flagged when its params differ from the winner's.
"""

from __future__ import annotations

from collections.abc import Sequence
from datetime import timedelta
from typing import Any

import orjson
import sqlalchemy as sa
from sqlalchemy.engine import Connection, Engine

from onceflow.envelope import params_digest
from onceflow.vocabulary import (
    InstanceStatus,
    JobKind,
    LifecycleEvent,
)
from workflow_engine.model import CreateResult, Delivery
from workflow_engine.store import lifecycle
from workflow_engine.store.fragments import RUNNABLE_CHANNEL
from workflow_engine.store.lifecycle import ONE_EVENT, outbox_insert
from workflow_engine.store.prepared import execute_prepared
from workflow_engine.store.writes import debounce, reuse, singleton

# Duplicate rows are idempotent per Kafka position: the named unique constraint
# onceflow_duplicate_deliveries_position_key turns a record redelivered again (the
# worker died between the database commit and the offset commit, twice) into a no-op.
# A delivery is a redelivery when its position is the creating record's; one whose
# position already has a duplicate row is skipped before the insert (``known``) and
# by the constraint (a concurrent batch), so it never counts twice.
# instance.created, for each instance the statement inserts, with the record's position
# from the input (the job's registry row, inserted by this statement, is not visible to it).
_CREATED_EVENTS = outbox_insert(
    "(SELECT n.*, f.origin, f.topic, f.part, f.off, f.callback"
    " FROM inst n JOIN firsts f USING (job_id))",
    f"'{LifecycleEvent.CREATED}'",
    "jsonb_build_object('priority', e.priority, 'callback', e.callback)",
    provenance=("e.origin", "e.topic", "e.part", "e.off"),
)

_CREATE_SQL = sa.text(
    f"""
WITH input AS (
    SELECT * FROM jsonb_to_recordset(CAST(:rows AS jsonb)) AS r(
        ord integer, job_id text, kind text, workflow text, params jsonb, params_digest text,
        request_id text, submitted_at timestamptz, traceparent text, origin text,
        topic text, part integer, off bigint, enqueued_at timestamptz, version text,
        priority smallint, lane_path text[], callback text, run_after timestamptz,
        attributes jsonb, start_within double precision, batch_path text[],
        debounce_path text[], run integer)
),
firsts AS (
    SELECT DISTINCT ON (job_id) * FROM input ORDER BY job_id, ord
),
upsert AS (
    INSERT INTO onceflow_jobs AS j (
        job_id, kind, type_name, params_digest, request_id, submitted_at, traceparent,
        origin, source_topic, source_partition, source_offset, enqueued_at)
    SELECT job_id, kind, workflow, params_digest, request_id, submitted_at,
           traceparent, origin, topic, part, off, enqueued_at
    FROM firsts
    ORDER BY job_id
    ON CONFLICT ON CONSTRAINT onceflow_jobs_job_id_key
        DO UPDATE SET last_seen_at = now()
    RETURNING j.job_id, j.params_digest AS winner_digest, j.type_name AS winner_type,
              j.source_topic, j.source_partition, j.source_offset, (j.xmax = 0) AS inserted,
              j.received_at AS job_received_at
),
known AS (
    SELECT DISTINCT d.source_topic, d.source_partition, d.source_offset
    FROM onceflow_duplicate_deliveries d
    JOIN input i ON (d.source_topic, d.source_partition, d.source_offset)
                    = (i.topic, i.part, i.off)
),
candidates AS (
    SELECT DISTINCT ON (i.topic, i.part, i.off) i.*, u.winner_digest, u.winner_type,
           u.job_received_at,
           (i.topic, i.part, i.off)
             = (u.source_topic, u.source_partition, u.source_offset) AS redelivery
    FROM input i
    JOIN upsert u USING (job_id)
    JOIN firsts f USING (job_id)
    WHERE NOT (u.inserted AND i.ord = f.ord)
      AND NOT EXISTS (
          SELECT 1 FROM known k
          WHERE (k.source_topic, k.source_partition, k.source_offset) = (i.topic, i.part, i.off))
    ORDER BY i.topic, i.part, i.off, i.ord
),
dups AS (
    INSERT INTO onceflow_duplicate_deliveries (
        job_id, source_topic, source_partition, source_offset, params_digest, params_match,
        workflow, workflow_match, redelivery, request_id, submitted_at, enqueued_at,
        job_received_at, run)
    SELECT c.job_id, c.topic, c.part, c.off, c.params_digest,
           c.params_digest = c.winner_digest, c.workflow, c.workflow = c.winner_type,
           c.redelivery, c.request_id, c.submitted_at, c.enqueued_at, c.job_received_at,
           -- the run it collapsed into (migration 0031: start-and-wait answers it): the
           -- one id reuse decided it against (reuse.py), else the instance's as this
           -- statement reads it; an instance this statement creates is not in its
           -- snapshot: run 1
           coalesce(c.run, i.run, 1)
    FROM candidates c LEFT JOIN onceflow_instances i ON i.job_id = c.job_id
    ORDER BY c.topic, c.part, c.off
    ON CONFLICT ON CONSTRAINT onceflow_duplicate_deliveries_position_key DO NOTHING
    RETURNING job_id, params_match, workflow_match, redelivery, workflow,
              source_topic, source_partition, source_offset
),
inst AS (
    INSERT INTO onceflow_instances (job_id, workflow, params, version, priority, flow_lane,
                                    event_seq, callback, run_after, attributes,
                                    start_by, status, batch_key, debounce_key,
                                    debounce_window_start)
    SELECT f.job_id, f.workflow, f.params, f.version, f.priority,
           -- bounded (migration 0014): the lane index takes any key's value
           onceflow_flow_lane(f.params, f.lane_path), {ONE_EVENT}, f.callback,
           -- a delayed start (run_at, start_after: migration 0021); one in the past, or
           -- none, is now (GREATEST skips a NULL), so it is not claimed ahead of the
           -- backlog as if it had waited since then
           GREATEST(f.run_after, now()),
           -- searchable attributes (migration 0022), checked by the envelope's rule;
           -- the first submission's are kept, like its params
           coalesce(f.attributes, '{{}}'),
           -- a start limit (start_within: migration 0023), from the start time
           GREATEST(f.run_after, now()) + make_interval(secs => f.start_within),
           -- a member of a batched workflow (migration 0026) waits in its key's pool,
           -- the key's value bounded like a lane
           CASE WHEN f.batch_path IS NULL THEN '{InstanceStatus.QUEUED}'
                ELSE '{InstanceStatus.BATCHING}' END,
           CASE WHEN cardinality(f.batch_path) = 0 THEN ''
                WHEN f.batch_path IS NOT NULL
                THEN onceflow_lane_key(coalesce(f.params #>> f.batch_path, '')) END,
           -- a debounce's key (bounded like a lane) and window start (migration 0025),
           -- which writes/debounce.py decides on; in the insert, not an update after it
           CASE WHEN f.debounce_path IS NOT NULL
                THEN onceflow_lane_key(coalesce(f.params #>> f.debounce_path, '')) END,
           CASE WHEN f.debounce_path IS NOT NULL THEN now() END
    FROM firsts f JOIN upsert u USING (job_id)
    WHERE u.inserted AND f.kind = CAST(:workflow_kind AS text)
    RETURNING job_id, workflow, version, priority, event_seq AS seq, status, run
),
created_events AS ({_CREATED_EVENTS}
),
task_runs AS (
    INSERT INTO onceflow_task_runs (job_id, task, params)
    SELECT f.job_id, f.workflow, f.params
    FROM firsts f JOIN upsert u USING (job_id)
    WHERE u.inserted AND f.kind = CAST(:task_kind AS text)
    RETURNING job_id
),
notified AS (
    SELECT pg_notify(CAST(:channel AS text), '') FROM (SELECT 1 FROM inst LIMIT 1) AS any_created
)
SELECT 'created' AS kind, job_id, true AS params_match, true AS workflow_match,
       false AS redelivery, CAST(NULL AS text) AS workflow, CAST(NULL AS text) AS topic,
       CAST(NULL AS integer) AS part, CAST(NULL AS bigint) AS off
FROM inst
UNION ALL
SELECT 'task', job_id, true, true, false, NULL, NULL, NULL, NULL FROM task_runs
UNION ALL
SELECT 'duplicate', job_id, params_match, workflow_match, redelivery, workflow,
       source_topic, source_partition, source_offset
FROM dups
UNION ALL
SELECT 'notify', NULL, true, true, false, NULL, NULL, NULL, NULL FROM notified
"""
)


def _row(ord_: int, d: Delivery) -> dict[str, Any]:
    env = d.envelope
    return {
        "ord": ord_,
        "job_id": env.job_id,
        "kind": d.kind,
        "workflow": env.workflow,
        "params": env.params,
        "params_digest": params_digest(env.params),
        "request_id": env.request_id or None,
        "submitted_at": env.submitted_at.isoformat(),
        "traceparent": env.traceparent or None,
        "origin": str(d.origin or env.origin),
        "topic": d.topic,
        "part": d.partition,
        "off": d.offset,
        "enqueued_at": d.enqueued_at.isoformat() if d.enqueued_at else None,
        "version": d.version,
        "priority": env.priority,
        "lane_path": d.lane_path,
        "callback": env.callback,
        "run_after": _start(d),
        "attributes": env.attributes or None,
        "start_within": env.start_within if env.start_within is not None else d.start_within,
        "batch_path": d.batch_key,
        "debounce_path": list(d.debounce.key) if d.debounce is not None else None,
    }


def _start(d: Delivery) -> str | None:
    """When the instance may first be claimed: the job's own start time, else its
    workflow's default delay (``@workflow(start_after=)``) after submission."""
    env = d.envelope
    if env.run_at is not None:
        return env.run_at.isoformat()
    if d.start_after:
        return (env.submitted_at + timedelta(seconds=d.start_after)).isoformat()
    return None


# The instances' duplicate flags (migration 0015: what the list's has_duplicates and
# payload_mismatch filters read), set for the job ids that got a duplicate row. Its own
# statement, after _CREATE_SQL: a statement's snapshot is taken when it starts, and an
# instance another worker committed while _CREATE_SQL waited on the job id's registry
# row (keyless records of one id on two partitions) is visible only to a later one; the
# instances created in this batch are too. Only the rows that change are locked, in job
# id order (LockRows sits above the sort), so two workers flagging the same ids cannot
# deadlock; a deadlock with an engine's write batch re-runs the transaction (40P01).
_FLAG_DUPLICATED_SQL = sa.text(
    """
WITH flags AS (
    SELECT job_id, bool_or(mismatch) AS mismatch
    FROM unnest(CAST(:job_ids AS text[]), CAST(:mismatches AS boolean[])) AS f(job_id, mismatch)
    GROUP BY job_id
),
locked AS (
    SELECT i.job_id, f.mismatch FROM onceflow_instances i JOIN flags f USING (job_id)
    WHERE NOT i.duplicated OR (f.mismatch AND NOT i.mismatched)
    ORDER BY i.job_id
    FOR UPDATE OF i
)
UPDATE onceflow_instances i
SET duplicated = true, mismatched = i.mismatched OR l.mismatch
FROM locked l WHERE i.job_id = l.job_id
"""
)


def _flag_duplicated(conn: Connection, flags: dict[str, bool]) -> None:
    """Mark the instances of ``flags``' job ids duplicated (and mismatched where True)."""
    if flags:
        conn.execute(
            _FLAG_DUPLICATED_SQL,
            {"job_ids": list(flags), "mismatches": list(flags.values())},
        )


def create_instances_in(conn: Connection, deliveries: Sequence[Delivery]) -> CreateResult:
    """Create instances for a batch of deliveries inside the caller's transaction.

    Deliveries must be in consumption order: within the batch, the earliest delivery
    of a job id is the one that can win.
    """
    result = CreateResult()
    if not deliveries:
        return result
    all_rows = [_row(i, d) for i, d in enumerate(deliveries)]
    # Id reuse first (reuse.py): a resubmission a finished run allows starts the next run
    # of the id's instance, and the creating statement does not see it.
    skip, result.new_runs, result.id_reuse_decisions = reuse.start_new_runs(
        conn, deliveries, all_rows
    )
    result.created += len(result.new_runs)
    result.created_ids += result.new_runs
    rows = orjson.dumps([r for n, r in enumerate(all_rows) if n not in skip]).decode()
    flags: dict[str, bool] = {}  # job id -> a duplicate of it mismatched
    duplicates: list[Any] = []
    # Prepared (once per connection): planning this statement took ~1.1 ms of the
    # server's CPU, ten times running it for one record, on every light-load job's path.
    for row in execute_prepared(
        conn,
        _CREATE_SQL,
        {
            "rows": rows,
            "channel": RUNNABLE_CHANNEL,
            "workflow_kind": str(JobKind.WORKFLOW),
            "task_kind": str(JobKind.TASK),
        },
    ):
        if row.kind == "created":
            result.created += 1
            result.created_ids.append(row.job_id)
        elif row.kind == "task":
            result.tasks_created += 1
            result.created_ids.append(row.job_id)
        elif row.kind == "duplicate":
            _count_duplicate(result, row, flags)
            duplicates.append(row)
    # Before the flags: only the instances this statement created, under per-key locks.
    result.singleton_decisions = singleton.decide(conn, deliveries, result.created_ids)
    result.debounce_decisions = debounce.decide(conn, deliveries, result.created_ids)
    _flag_duplicated(conn, flags)
    # Their events after the flags (the same rows, locked in the same order); a
    # duplicate of a plain task has no instance, hence no event.
    lifecycle.emit(conn, [_duplicate_event(row) for row in sorted(duplicates, key=_position)])
    result.already_recorded = (
        len(deliveries) - result.created - result.tasks_created - result.duplicates
    )
    return result


def _count_duplicate(result: CreateResult, row: Any, flags: dict[str, bool]) -> None:
    result.duplicates += 1
    result.duplicate_ids.append(row.job_id)
    mismatch = not row.params_match or row.workflow_match is False
    flags[row.job_id] = flags.get(row.job_id, False) or mismatch
    if row.redelivery:
        result.redeliveries += 1
    if not row.params_match:
        result.mismatches += 1
        result.mismatch_ids.append(row.job_id)
    if not row.workflow_match:
        result.workflow_mismatches += 1
        result.workflow_mismatch_ids.append(row.job_id)


def _position(row: Any) -> tuple[str, int, int]:
    return (row.topic or "", row.part or 0, row.off or 0)


def _duplicate_event(row: Any) -> tuple[str, LifecycleEvent, dict[str, Any]]:
    """``instance.duplicate``, or ``instance.payload_mismatch`` when the delivery's
    params or workflow differ from the winner's: the delivery's own position."""
    mismatch = not row.params_match or row.workflow_match is False
    kind = LifecycleEvent.PAYLOAD_MISMATCH if mismatch else LifecycleEvent.DUPLICATE
    return (
        row.job_id,
        kind,
        {
            "duplicate": {
                "topic": row.topic,
                "partition": row.part,
                "offset": row.off,
                "workflow": row.workflow,
                "redelivery": bool(row.redelivery),
                "params_match": bool(row.params_match),
                "workflow_match": row.workflow_match is not False,
            }
        },
    )


def create_instances(db: Engine, deliveries: Sequence[Delivery]) -> CreateResult:
    """Create instances for a batch of deliveries in one transaction (one statement)."""
    with db.begin() as conn:
        return create_instances_in(conn, deliveries)
