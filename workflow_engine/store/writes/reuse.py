"""Id reuse (issue 26 item 8): a new submission of a finished job id starts a new run.

``@workflow(id_reuse=...)`` (or the job's own, stricter ``id_reuse``) decides what a
resubmission of a job id whose instance exists does, in the worker's creating
transaction, before the creating statement (``create.py``) sees the batch:

* ``never``, a live run, or a finished run the policy does not follow: nothing here;
  the delivery goes on to the creating statement and collapses as a duplicate, counted
  and audited exactly as always;
* a finished run the policy follows (``IdReuse.reusable``): the job id's one instance
  row starts run N+1 with the resubmission's params (and its priority, callback,
  attributes, start time, start limit, and this process's version of the workflow).
  Run N is archived first as an ``onceflow_runs`` row with its outcome and steps (an
  operator's restart forgets the history; a reuse keeps it, numbered), then its steps,
  attempts, consumed events and output values go, as a restart's do.

Never two runs at once: the finished runs are read first (:data:`_CANDIDATES`, no lock),
then locked ``FOR UPDATE`` in job-id order, and the decision is taken on what the lock
returned (the committed row, re-read after any wait): the run read must still be the
run, and still finished in a way the policy follows. Two workers resubmitting one id at
once: the second waits on the first's lock, reads run N+1 (queued) and its delivery
collapses as a duplicate of it. A redelivery of the record that started a run is
recognised by its position (``onceflow_runs_position_key``) and recorded nothing more,
as a redelivery of a recorded duplicate is not.

The lease fence: ``claim_count`` is never reset by a new run, so an engine still
holding a lease of run N (a zombie past its lease) names a claim number no claim of run
N+1 can have, and its fenced writes (``held``: owner and claim) miss.

A child's id is not resubmitted by its parent: a parent's ``start_child`` goes through
``children.py``, and a later run of the parent starts children of its own
(``<parent>__<name>~run<N>``: ``children.child_job_id``), never an earlier run's; a child
instance is never given a new run by a submission either (its parent owns its lifecycle).
"""

from __future__ import annotations

from collections.abc import Sequence
from typing import Any

import orjson
import sqlalchemy as sa
from sqlalchemy.engine import Connection

from onceflow import failpoints
from onceflow.vocabulary import (
    TERMINAL_STATUSES,
    IdReuse,
    IdReuseDecision,
    InstanceStatus,
    JobKind,
    LifecycleEvent,
)
from workflow_engine.model import Delivery
from workflow_engine.store import lifecycle
from workflow_engine.store.writes import stream_values

# What a resubmission may follow, read without a lock (only to narrow the ids to lock):
# the instance's run and status, whether it is a child, and whether the delivery's own
# position already started a run of it.
_CANDIDATES = sa.text(
    """
SELECT i.job_id, i.run, i.status, i.workflow, i.parent_job_id IS NOT NULL AS child
FROM onceflow_instances i WHERE i.job_id = ANY(:ids)
"""
)
# Where each delivery's Kafka position is already recorded: as the record that started a
# later run (a redelivery of it: nothing more is written), or as the job id's creating
# record or a duplicate (a redelivery: never a new run; the creating statement records
# it as it always did).
_POSITIONS = sa.text(
    """
SELECT p.ord,
       EXISTS (SELECT 1 FROM onceflow_runs r
               WHERE (r.source_topic, r.source_partition, r.source_offset)
                     = (p.topic, p.part, p.off) AND r.run > 1) AS run_start,
       EXISTS (SELECT 1 FROM onceflow_jobs j
               WHERE j.job_id = p.job_id
                 AND (j.source_topic, j.source_partition, j.source_offset)
                     = (p.topic, p.part, p.off))
       OR EXISTS (SELECT 1 FROM onceflow_duplicate_deliveries d
                  WHERE (d.source_topic, d.source_partition, d.source_offset)
                        = (p.topic, p.part, p.off)) AS recorded
FROM unnest(CAST(:ords AS int[]), CAST(:ids AS text[]), CAST(:topics AS text[]),
            CAST(:parts AS int[]), CAST(:offs AS bigint[])) AS p(ord, job_id, topic, part, off)
"""
)
# The decision's lock: the job ids' registry rows first, then their instances, each in
# job-id order, the order (and, for the registry rows, the strength: ON CONFLICT DO
# UPDATE's) the creating statement and its duplicate flags take them. The creating
# statement that follows locks the batch's other ids' registry rows after these, so two
# batches sharing ids can still deadlock; PostgreSQL aborts one (40P01) and the worker
# runs its transaction again, as it does for every conflict.
_LOCK_JOBS = sa.text(
    "SELECT job_id FROM onceflow_jobs WHERE job_id = ANY(:ids) ORDER BY job_id FOR NO KEY UPDATE"
)
_LOCK = sa.text(
    "SELECT job_id, run, status, workflow, parent_job_id IS NOT NULL AS child"
    " FROM onceflow_instances WHERE job_id = ANY(:ids) ORDER BY job_id FOR UPDATE"
)

# Run N archived (with its steps and their attempts) and run N+1's row, with the
# position of the record that started it; the registry row's digest becomes the new
# run's (a later duplicate's params are compared with the run it collapses into).
_ARCHIVE = sa.text(
    """
WITH input AS (
    SELECT * FROM jsonb_to_recordset(CAST(:rows AS jsonb)) AS r(
        job_id text, params jsonb, params_digest text, version text, request_id text,
        submitted_at timestamptz, traceparent text, topic text, part integer, off bigint)
),
steps AS (
    SELECT s.job_id, jsonb_agg(jsonb_build_object(
               'position', s.position, 'name', s.name, 'kind', s.kind, 'status', s.status,
               'attempts', s.attempts, 'result', s.result, 'error', s.error,
               'started_at', s.started_at, 'finished_at', s.finished_at,
               'child_job_id', s.child_job_id) ORDER BY s.position) AS steps
    FROM onceflow_steps s JOIN input USING (job_id)
    GROUP BY s.job_id
),
archived AS (
    INSERT INTO onceflow_runs AS r (
        job_id, run, source_topic, source_partition, source_offset, request_id,
        submitted_at, traceparent, params, version, callback, created_at, status,
        timeout_kind, started_at, finished_at, result, error, steps, archived_at)
    SELECT i.job_id, i.run, j.source_topic, j.source_partition, j.source_offset,
           j.request_id, j.submitted_at, j.traceparent, i.params, i.version, i.callback,
           i.created_at, i.status, i.timeout_kind, i.started_at, i.finished_at, i.result,
           i.error, coalesce(st.steps, '[]'), now()
    FROM onceflow_instances i JOIN input USING (job_id)
    JOIN onceflow_jobs j USING (job_id) LEFT JOIN steps st USING (job_id)
    ORDER BY i.job_id
    -- run 1 has no row yet; a later run has the one its start wrote (its position kept)
    ON CONFLICT ON CONSTRAINT onceflow_runs_pkey DO UPDATE
        SET status = excluded.status, callback = excluded.callback,
            timeout_kind = excluded.timeout_kind,
            started_at = excluded.started_at, finished_at = excluded.finished_at,
            result = excluded.result, error = excluded.error, steps = excluded.steps,
            archived_at = excluded.archived_at
    RETURNING r.job_id
),
next_run AS (
    INSERT INTO onceflow_runs (job_id, run, source_topic, source_partition, source_offset,
                               request_id, submitted_at, traceparent, params, version,
                               created_at)
    SELECT i.job_id, i.run + 1, input.topic, input.part, input.off, input.request_id,
           input.submitted_at, input.traceparent, input.params, input.version, now()
    FROM onceflow_instances i JOIN input USING (job_id)
    ORDER BY i.job_id
    RETURNING job_id
)
-- (every data-modifying CTE runs, read or not)
UPDATE onceflow_jobs j SET params_digest = input.params_digest, last_seen_at = now()
FROM input WHERE j.job_id = input.job_id
"""
)
_FORGET = (
    # attempts first: no foreign key cascades into the partitioned attempts table
    sa.text("DELETE FROM onceflow_step_attempts WHERE job_id = ANY(:ids)"),
    sa.text("DELETE FROM onceflow_steps WHERE job_id = ANY(:ids)"),
    # events not consumed yet stay, as a restart leaves them: the new run may wait for them
    sa.text("DELETE FROM onceflow_events WHERE job_id = ANY(:ids) AND consumed_at IS NOT NULL"),
)
# The new run: queued, with the resubmission's params and options, its time limits
# anew; claim_count and event_seq go on counting (the lease fence, the events' order).
_NEW_RUN = sa.text(
    """
WITH input AS (
    SELECT * FROM jsonb_to_recordset(CAST(:rows AS jsonb)) AS r(
        job_id text, params jsonb, version text, priority smallint, lane_path text[],
        callback text, run_after timestamptz, attributes jsonb, start_within double precision)
)
UPDATE onceflow_instances i
SET run = i.run + 1, status = :queued, params = input.params, version = input.version,
    priority = input.priority, flow_lane = onceflow_flow_lane(input.params, input.lane_path),
    callback = input.callback, attributes = coalesce(input.attributes, '{}'),
    run_after = GREATEST(input.run_after, now()),
    start_by = GREATEST(input.run_after, now()) + make_interval(secs => input.start_within),
    started_at = NULL, finished_at = NULL, result = NULL, error = NULL, lease_owner = NULL,
    lease_expires_at = NULL, requested_action = NULL, failed_position = NULL,
    deadline = NULL, timeout_kind = NULL, retry_count = 0, restart_count = 0,
    -- (duplicated and mismatched stay: they tell of the job id's deliveries, all runs')
    singleton_key = NULL, skipped_for = NULL, cancelled_by = NULL, updated_at = now()
FROM input WHERE i.job_id = input.job_id
RETURNING i.job_id, i.workflow, i.run
"""
)

# The runs being archived, as they ended (for the new run's instance.created).
_OUTCOMES = sa.text("SELECT job_id, run, status FROM onceflow_instances WHERE job_id = ANY(:ids)")

_NEW_RUN_COLUMNS = (
    "job_id",
    "params",
    "version",
    "priority",
    "lane_path",
    "callback",
    "run_after",
    "attributes",
    "start_within",
)


def start_new_runs(
    conn: Connection, deliveries: Sequence[Delivery], rows: Sequence[dict[str, Any]]
) -> tuple[set[int], list[str], list[tuple[str, str]]]:
    """Start the new runs the batch's resubmissions are owed, inside the creating
    transaction. ``rows`` are the creating statement's input rows of ``deliveries``
    (same order). Answers the deliveries' indexes the creating statement must not see
    (the new runs' and redeliveries of a run's starting record), the job ids given a
    new run (consumption order) and the (workflow, decision) pairs for the counter.

    Another delivery of an id the batch starts a new run of gets in its row the run it
    is a duplicate of (``run``: the creating statement writes it on the duplicate's row,
    migration 0031): one before the new run's record joined the run read, not the one
    the batch then started, which the creating statement would read (found in review)."""
    asking = [
        n
        for n, d in enumerate(deliveries)
        if d.kind == JobKind.WORKFLOW and d.id_reuse is not IdReuse.NEVER
    ]
    if not asking:
        return set(), [], []
    ids = sorted({deliveries[n].envelope.job_id for n in asking})
    first = {r.job_id: r for r in conn.execute(_CANDIDATES, {"ids": ids})}
    finished = sorted(j for j, r in first.items() if InstanceStatus(r.status) in TERMINAL_STATUSES)
    if finished:
        failpoints.hit("reuse.after_read", finished[0])
        conn.execute(_LOCK_JOBS, {"ids": finished})
    locked = {r.job_id: r for r in conn.execute(_LOCK, {"ids": finished})} if finished else {}
    # read after the lock: a record that started a run on another worker meanwhile
    known = _positions(conn, deliveries, asking)
    skip, chosen, decisions = _decide(deliveries, asking, first, locked, known)
    # Another delivery of an id this batch starts a new run of is a duplicate: of the
    # run read before the new run's record, of the new run after it. (Any other
    # duplicate joined the run the creating statement reads: it needs nothing here.)
    for n, d in enumerate(deliveries):
        start = chosen.get(d.envelope.job_id)
        if start is not None and n != start:
            rows[n]["run"] = first[d.envelope.job_id].run + (1 if n > start else 0)
    if chosen:
        _apply(conn, [rows[n] for n in chosen.values()], chosen)
    return skip, list(chosen), decisions


def _decide(
    deliveries: Sequence[Delivery],
    asking: list[int],
    first: dict[str, Any],
    locked: dict[str, Any],
    known: dict[int, tuple[bool, bool]],
) -> tuple[set[int], dict[str, int], list[tuple[str, str]]]:
    """Per delivery asking (consumption order): a redelivery of a run's starting record
    (skipped), the first that a locked finished run allows (a new run), or a duplicate
    (``live`` or ``refused``, counted) that the creating statement records as always."""
    skip: set[int] = set()
    chosen: dict[str, int] = {}
    decisions: list[tuple[str, str]] = []
    for n in asking:
        d = deliveries[n]
        job_id = d.envelope.job_id
        run_start, recorded = known.get(n, (False, False))
        if run_start:
            skip.add(n)
            continue
        row = locked.get(job_id) or first.get(job_id)
        if row is None or recorded:
            continue  # a first submission, or a redelivery: the creating statement's
        if job_id in chosen or job_id not in locked or row.run != first[job_id].run:
            # this batch started its new run, or it was live when read: live now
            decisions.append((d.envelope.workflow, str(IdReuseDecision.LIVE)))
            continue
        status = InstanceStatus(row.status)
        if status not in TERMINAL_STATUSES:
            decisions.append((d.envelope.workflow, str(IdReuseDecision.LIVE)))
        elif (
            status in d.id_reuse.reusable and not row.child and row.workflow == d.envelope.workflow
        ):
            chosen[job_id] = n
            skip.add(n)
            decisions.append((d.envelope.workflow, str(IdReuseDecision.NEW_RUN)))
        else:
            decisions.append((d.envelope.workflow, str(IdReuseDecision.REFUSED)))
    return skip, chosen, decisions


def _positions(
    conn: Connection, deliveries: Sequence[Delivery], asking: Sequence[int]
) -> dict[int, tuple[bool, bool]]:
    """Per delivery index: (it started a later run, it is recorded otherwise)."""
    found = conn.execute(
        _POSITIONS,
        {
            "ords": list(asking),
            "ids": [deliveries[n].envelope.job_id for n in asking],
            "topics": [deliveries[n].topic for n in asking],
            "parts": [deliveries[n].partition for n in asking],
            "offs": [deliveries[n].offset for n in asking],
        },
    )
    return {r.ord: (r.run_start, r.recorded) for r in found}


def _apply(conn: Connection, rows: Sequence[dict[str, Any]], chosen: dict[str, int]) -> None:
    """Archive each chosen job id's finished run and start its next (rows: their
    deliveries' creating rows), with an ``instance.created`` event naming the run."""
    ids = sorted(chosen)
    archive = [
        {
            k: r[k]
            for k in (
                "job_id",
                "params",
                "params_digest",
                "version",
                "request_id",
                "submitted_at",
                "traceparent",
            )
        }
        | {"topic": r["topic"], "part": r["part"], "off": r["off"]}
        for r in rows
    ]
    outcomes = {r.job_id: (r.run, r.status) for r in conn.execute(_OUTCOMES, {"ids": ids})}
    conn.execute(_ARCHIVE, {"rows": orjson.dumps(archive).decode()})
    for statement in _FORGET:
        conn.execute(statement, {"ids": ids})
    for job_id in ids:
        stream_values.forget_values(conn, job_id)
    new = [{k: r[k] for k in _NEW_RUN_COLUMNS} for r in rows]
    conn.execute(
        _NEW_RUN, {"rows": orjson.dumps(new).decode(), "queued": str(InstanceStatus.QUEUED)}
    )
    lifecycle.emit(
        conn,
        [
            (
                r["job_id"],
                LifecycleEvent.CREATED,
                {
                    "run": outcomes[r["job_id"]][0] + 1,
                    "priority": r["priority"],
                    "callback": r["callback"],
                    "previous_run": {
                        "run": outcomes[r["job_id"]][0],
                        "status": outcomes[r["job_id"]][1],
                    },
                },
            )
            for r in sorted(rows, key=lambda r: r["job_id"])
        ],
    )
