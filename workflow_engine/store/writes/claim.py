"""Claiming runnable instances, and giving them back.

:func:`claim` leases a batch of runnable instances in one transaction: for the workflows
without flow control, a pick in claim order (SKIP LOCKED) and the lease of what it
picked; then, under its advisory lock, each flow-controlled workflow's claim
(:mod:`workflow_engine.store.writes.flow`); and the histories of all of them in one query.
:func:`rescue_expired` re-queues the instances of a dead engine; :func:`release` gives
back those a stopping engine will not finish.
"""

from __future__ import annotations

import random
from collections.abc import Collection, Sequence
from dataclasses import dataclass, field
from datetime import datetime
from typing import Any

import sqlalchemy as sa
from sqlalchemy.engine import Engine

from onceflow import failpoints
from onceflow.vocabulary import InstanceStatus, StepKind, StepStatus
from workflow_engine.model import FlowControl, RecordedStep
from workflow_engine.store.fragments import (
    CLAIMED_OUT,
    STARTED_EVENTS,
    held,
    in_index_order,
    mark_running,
    notify_runnable,
)
from workflow_engine.store.fragments import NOW as _NOW
from workflow_engine.store.fragments import RUNNABLE as _RUNNABLE
from workflow_engine.store.prepared import execute_prepared
from workflow_engine.store.writes import time_limits
from workflow_engine.store.writes.flow import HAVE_VERSION, claim_flow


@dataclass(frozen=True, slots=True)
class Claimed:
    job_id: str
    workflow: str
    params: dict[str, Any]
    created_at: datetime
    submitted_at: datetime | None
    claim_count: int
    history: list[RecordedStep] = field(default_factory=list)
    #: The job's W3C trace context (``onceflow_jobs.traceparent``): the parent of its spans.
    traceparent: str | None = None
    version: str | None = None  # the definition version it was created with
    #: The execution deadline (execution_timeout; None: no limit), and whether the
    #: claim's clock (its pick's: the database's, or a test clock) is past it: the run
    #: is then errored ``timed_out`` without running anything (a sleep or wait woken
    #: at its deadline, a rescue).
    deadline: datetime | None = None
    overdue: bool = False
    run: int = 1  # the job id's run (id reuse, migration 0027): in the engine's log lines


_HAVE_VERSION = HAVE_VERSION

# A claim is two statements. The first picks and locks the runnable instances in claim
# order, planned with sorting priced out (``fragments.in_index_order``): its only plan
# without a sort reads the claim-order indexes in order and stops at the limit. Left to the
# statistics, the planner sorts the whole runnable set when it believes that set small,
# and statistics taken before a burst (analysed with a few hundred runnable, a million
# queued since) say just that: every claim then read the whole backlog (40,000 queued:
# 155 ms a claim instead of ~1; tests/integration/test_engine_plans.py). The second
# statement, planned as usual, leases what the first picked.
_PLAIN_AND_LANED = f"""
WITH plain AS (
    -- instances of workflows without flow control (no lane), priority first, aged by
    -- time waited (migration 0009): onceflow_instances_claim_order_idx, in order
    SELECT job_id, onceflow_claim_order(run_after, priority) AS ord FROM onceflow_instances
    WHERE status IN ({_RUNNABLE}) AND run_after <= {_NOW} AND flow_lane IS NULL
      AND workflow <> ALL(CAST(:limited AS text[])) AND job_id <> ALL(CAST(:inflight AS text[]))
      {_HAVE_VERSION}
    ORDER BY onceflow_claim_order(run_after, priority)
    LIMIT CAST(:limit AS integer)
    FOR UPDATE SKIP LOCKED
),
laned AS (
    -- instances given a lane while their workflow had flow control, which it has no
    -- longer: normally none (one probe of onceflow_instances_lane_idx per workflow)
    SELECT l.* FROM unnest(CAST(:uncontrolled AS text[])) AS w(name) CROSS JOIN LATERAL (
        SELECT job_id, onceflow_claim_order(run_after, priority) AS ord
        FROM onceflow_instances
        WHERE workflow = w.name AND flow_lane IS NOT NULL
          AND status IN ({_RUNNABLE}) AND run_after <= {_NOW}
          {_HAVE_VERSION}
        ORDER BY flow_lane, onceflow_claim_order(run_after, priority)
        LIMIT CAST(:limit AS integer)
        FOR UPDATE SKIP LOCKED
    ) AS l
)"""

# A row of NULLs when some queued instance is past its start limit (start_within): the
# claim then runs the expiry (one probe of onceflow_instances_start_by_idx in the pick's
# round trip; the expiry's own statement on every claim cost an idle claim ~0.6 ms).
_EXPIRY_PROBE = f"UNION ALL SELECT NULL, NULL, CAST(NULL AS text[]) WHERE {time_limits.EXPIRY_DUE}"

_PICK = sa.text(
    f"""{_PLAIN_AND_LANED},
locks AS (
    -- the advisory locks of the flow-controlled workflows, only tried (a workflow
    -- another engine is claiming right now is left to it, so two engines cannot
    -- deadlock on them), in this round trip; their claims are later statements,
    -- whose snapshots are taken after the locks; only for a workflow with an instance
    -- due that could take a place in this batch (its claim order before the last plain
    -- candidate, when they fill it), so an idle one costs no further round trips and
    -- is left unlocked. The CASE orders the two: as ``EXISTS (...) AND lock``, the
    -- planner made the EXISTS a semi-join and tried the lock on every name first
    -- (found in review; tests/integration/test_engine_plans.py).
    SELECT array_agg(w) AS got FROM unnest(CAST(:limited AS text[])) AS w
    WHERE CASE WHEN EXISTS (
        SELECT 1 FROM onceflow_instances c
        -- (a workflow with only a concurrency limit stores no lane: any status index)
        WHERE c.workflow = w AND c.status IN ({_RUNNABLE})
          AND c.run_after <= {_NOW}
          AND ((SELECT count(*) FROM plain) < CAST(:limit AS integer)
               OR onceflow_claim_order(c.run_after, c.priority) <= (SELECT max(ord) FROM plain)))
      THEN pg_try_advisory_xact_lock(hashtext('onceflow.limit.' || w)) ELSE false END
)
SELECT job_id, ord, CAST(NULL AS text[]) AS locked FROM plain
UNION ALL SELECT job_id, ord, NULL FROM laned
UNION ALL SELECT NULL, NULL, got FROM locks WHERE got IS NOT NULL
{_EXPIRY_PROBE}
"""
)

# The pick when no workflow has flow control: the same two kinds of candidate, in the
# same shape, without the ``locks`` CTE, whose planning (the EXISTS over the runnable
# instances, the count and max over ``plain``) cost every claim about 0.3 ms of the
# database's CPU for an empty ``:limited`` (pgbench on the engine bench's database:
# the pick took 1,050 us of the database's CPU with it, 710 without).
_PICK_NO_FLOWS = sa.text(
    f"""{_PLAIN_AND_LANED}
SELECT job_id, ord, CAST(NULL AS text[]) AS locked FROM plain
UNION ALL SELECT job_id, ord, NULL FROM laned
{_EXPIRY_PROBE}
"""
)

_LEASE_PICKED = sa.text(
    f"""
WITH candidates AS (
    SELECT * FROM unnest(CAST(:picked AS text[])) AS t(job_id)
),
claimed AS ({mark_running("candidates")}
),
started AS ({STARTED_EVENTS}
)
SELECT {CLAIMED_OUT} FROM claimed
"""
)


_RUNNING_OF = sa.text(
    "SELECT count(*) FROM onceflow_instances"
    f" WHERE workflow = :workflow AND status = '{InstanceStatus.RUNNING}'"
)


def claim(
    db: Engine,
    owner: str,
    limit: int,
    lease_seconds: float,
    now: datetime | None = None,
    versions: dict[str, str] | None = None,
    flows: dict[str, FlowControl] | None = None,
    inflight: Collection[str] = (),
    timeouts: dict[str, float] | None = None,
    expired: list[tuple[str, str]] | None = None,
) -> list[Claimed]:
    """Claim up to ``limit`` runnable instances of the workflow ``versions`` this engine
    has (``{workflow: version}``); instances without a recorded version are claimed by
    any engine that has their workflow. Higher priority first, aged by time waited
    (``onceflow_claim_order``), in one order across plain and flow-controlled workflows.

    Workflows with flow control (``flows``: a concurrency limit, per-key limits, rate
    limits, fairness, :mod:`workflow_engine.store.writes.flow`) are claimed under
    a per-workflow advisory lock held to commit, so that engines claiming at the same
    time cannot exceed a limit. Sleeping and waiting instances do not count toward a
    limit unless ``hold_while_waiting`` says so.

    ``inflight``: the ids this engine still runs; none of them is claimed again, even
    if a rescue re-queued it (``fragments.mark_running``).

    ``timeouts``: the execution timeouts of the workflows that declare one (seconds);
    the claim that first starts an instance sets its deadline from it. No claim starts
    an instance past its start limit (``fragments.mark_running`` tests it on the row it
    locks); when the pick saw one, the claim errors them, in the same transaction
    (:func:`~workflow_engine.store.writes.time_limits.expire_unstarted`), and appends
    their ``(job_id, workflow)`` to ``expired`` if given (the engine counts them).
    """
    controlled = flows or {}
    params = _claim_params(owner, lease_seconds, now, versions, inflight, timeouts or {})
    versions = versions or {}
    with db.begin() as conn:
        locked, picked, expiring = _pick(conn, params, limit, controlled, versions)
        rows: list[Any] = []
        if locked:
            rows = _claim_flows(conn, controlled, locked, picked, limit, params)
        plain = [job_id for job_id, _ in picked[: limit - len(rows)]]
        if plain:
            failpoints.hit("claim.before_lease", plain[0])
            # The lease's ``:inflight`` is the in-flight ids among ``plain``: it updates
            # only rows of ``plain``, so it excludes exactly what the whole list would,
            # without the database parsing and testing every id this engine runs on
            # each claim (~0.13 ms of its CPU at 64 in flight). Normally none: the pick
            # excluded them.
            running = set(inflight)
            skip = [job_id for job_id in plain if job_id in running]
            lease = {**params, "picked": plain, "inflight": skip}
            rows += execute_prepared(conn, _LEASE_PICKED, lease).all()
        if expiring:
            # EXPIRY_BATCH, or more: with one slot free, not one expired per claim
            gone = time_limits.expire_unstarted(conn, max(limit, time_limits.EXPIRY_BATCH))
            if expired is not None:
                expired += gone
        # The histories of everything claimed, in one query, in this transaction.
        return _with_histories(rows, load_steps(conn, [row[0] for row in rows]))


def _claim_params(
    owner: str,
    lease_seconds: float,
    now: datetime | None,
    versions: dict[str, str] | None,
    inflight: Collection[str],
    timeouts: dict[str, float],
) -> dict[str, Any]:
    """The values every statement of a claim reads (the plain and the flow claims)."""
    return {
        "any_workflow": versions is None,
        "owner": owner,
        "lease": lease_seconds,
        "now": now,
        "inflight": list(inflight),
        "have_workflows": list(versions or {}),
        "have_versions": list((versions or {}).values()),
        "timeout_workflows": list(timeouts),
        "timeout_seconds": list(timeouts.values()),
    }


def _pick(
    conn: sa.Connection,
    params: dict[str, Any],
    limit: int,
    controlled: dict[str, FlowControl],
    versions: dict[str, str],
) -> tuple[list[str], list[Any], bool]:
    """The pick (``_PICK``; ``_PICK_NO_FLOWS`` when no workflow has flow control): the
    flow-controlled workflows whose advisory lock it got,
    the plain candidates it locked, as ``(job_id, claim order)`` in claim order, and
    whether some queued instance is past its start limit (the expiry is due)."""
    picked = in_index_order(
        conn,
        _PICK if controlled else _PICK_NO_FLOWS,
        {
            **params,
            "limit": limit,
            "limited": list(controlled),
            "uncontrolled": [w for w in versions if w not in controlled],
        },
        prepared=True,
    )
    markers = [row[2] for row in picked if row[0] is None]
    locked = [workflow for got in markers if got is not None for workflow in got]
    # Both kinds of plain candidate in claim order; what is picked and not leased
    # stays locked (by this transaction only) and unclaimed.
    plain = sorted((row[:2] for row in picked if row[0] is not None), key=lambda r: r[1])
    return locked, plain, None in markers


def _with_histories(rows: Sequence[Any], history: dict[str, list[RecordedStep]]) -> list[Claimed]:
    """The leased rows (``mark_running``'s columns) as claims, each with its history."""
    return [
        Claimed(
            job_id,
            workflow,
            params,
            created,
            submitted,
            claims,
            history.get(job_id, []),
            tp,
            version,
            deadline,
            bool(due),
            run,
        )
        for (
            job_id,
            workflow,
            params,
            created,
            submitted,
            claims,
            tp,
            version,
            deadline,
            due,
            run,
        ) in rows
    ]


_JIT_OFF = "SET LOCAL jit = off"


def _claim_flows(
    conn: sa.Connection,
    controlled: dict[str, FlowControl],
    locked: list[str],
    picked: list[Any],
    limit: int,
    params: dict[str, Any],
) -> list[Any]:
    """Claim the flow-controlled workflows' share of the batch, in the one claim order.

    The plain candidates (``picked``, in claim order) are not leased yet: a
    flow-controlled instance takes a place in the batch only if it comes before the
    last plain candidate that would fill it (``:cutoff``), so a batch is the first
    ``limit`` of both kinds in claim order (priority, aged by time waited), whichever
    kind is queued deeper; the plain ones fill what is left. Before, the plain claim
    filled the batch first and a priority-1 job of a limited workflow waited 186 s
    behind 5,936 priority-5 jobs created before it (issue 23, case 4). ``locked``: the
    workflows whose advisory lock the pick got."""
    # The flow claim's row estimate on a deep backlog (~141k for 20k rows) is past the
    # JIT threshold: JIT then took ~55 ms of a ~60 ms claim whose execution is ~5 ms.
    # Off for the rest of this transaction only.
    conn.exec_driver_sql(_JIT_OFF)
    # A random first workflow, so one busy workflow does not always fill the batch.
    start = random.randrange(len(locked))
    rows: list[Any] = []
    for workflow in locked[start:] + locked[:start]:
        room = limit - len(rows)
        if room <= 0:
            break
        full = len(picked) >= room  # the plain ones alone would fill what is left
        cutoff = picked[room - 1][1] if full else None
        rows += _claim_controlled(
            conn, workflow, controlled[workflow], room, {**params, "cutoff": cutoff}
        )
    return rows


def _claim_controlled(
    conn: sa.Connection, workflow: str, flow: FlowControl, room: int, params: dict[str, Any]
) -> list[Any]:
    """Claim up to ``room`` instances of one flow-controlled workflow, under its lock."""
    take = room
    if flow.concurrency is not None:
        running = conn.execute(_RUNNING_OF, {"workflow": workflow}).scalar() or 0
        take = min(room, flow.concurrency - running)
    if take <= 0:
        return []
    return claim_flow(conn, workflow, flow, take, params)


_LOAD_STEPS = sa.text(
    "SELECT job_id, position, name, status, attempts, result, kind, wake_at, error,"
    " child_job_id FROM onceflow_steps WHERE job_id = ANY(:job_ids) ORDER BY job_id, position"
)


def load_steps(conn: sa.Connection, job_ids: list[str]) -> dict[str, list[RecordedStep]]:
    """The recorded history of several instances, in one query."""
    history: dict[str, list[RecordedStep]] = {job: [] for job in job_ids}
    if job_ids:
        for row in conn.execute(_LOAD_STEPS, {"job_ids": job_ids}):
            job_id, position, name, status, attempts, result, kind, wake_at, error, child = row
            entry = RecordedStep(
                position,
                name,
                StepStatus(status),
                attempts,
                result,
                StepKind(kind),
                wake_at,
                error,
                child,
            )
            history[job_id].append(entry)
    return history


# Back to the queue, unleased: what a rescue and a release both do.
_REQUEUE = f"""
UPDATE onceflow_instances
SET status = '{InstanceStatus.QUEUED}', lease_owner = NULL, lease_expires_at = NULL,
    updated_at = now()"""

_RESCUE = sa.text(
    f"""{_REQUEUE}
WHERE status = '{InstanceStatus.RUNNING}' AND lease_expires_at < now()
RETURNING job_id
"""
)


def rescue_expired(db: Engine) -> list[str]:
    """Re-queue instances whose engine died (lease expired); return their ids."""
    with db.begin() as conn:
        rescued = list(conn.execute(_RESCUE).scalars())
        if rescued:
            notify_runnable(conn)
        return rescued


_RELEASE = sa.text(
    f"""{_REQUEUE}
FROM unnest(CAST(:ids AS text[]), CAST(:claims AS int[])) AS input(job_id, claim)
WHERE onceflow_instances.job_id = input.job_id
  AND {held("onceflow_instances", "input.claim")}
"""
)


def release(db: Engine, owner: str, held_runs: Sequence[tuple[str, int]]) -> int:
    """Give back instances this engine will not finish (clean shutdown, an outage cut
    a run): ``(job_id, claim)`` pairs, each released only under that very claim."""
    if not held_runs:
        return 0
    params = {
        "owner": owner,
        "ids": [job_id for job_id, _ in held_runs],
        "claims": [claim for _, claim in held_runs],
    }
    with db.begin() as conn:
        return conn.execute(_RELEASE, params).rowcount


# The next timer still to come: work already due is either being claimed (by this
# engine's next claim, or another engine's) or held back by a limit, and waking for it
# is the claim's and the notifications' business. Counting it made an engine that lost
# a due instance to another engine's claim wait its whole poll interval instead of
# waking for the timers after it (two engines, one SIGKILLed: the survivor slept through
# every delayed start until the rescue woke it, tests/integration/test_delayed_start_chaos.py).
_NEXT_DUE = sa.text(
    f"""
SELECT extract(epoch FROM min(run_after) - {_NOW}) FROM onceflow_instances
WHERE status IN ({_RUNNABLE}) AND run_after > {_NOW} AND run_after <> 'infinity'
"""
)


def seconds_until_next_due(db: Engine, now: datetime | None) -> float | None:
    """Seconds until the earliest timer still to come (sleep, retry delay, event timeout,
    delayed start, deadline) falls due; None if there is none."""
    with db.connect() as conn:
        value = conn.execute(_NEXT_DUE, {"now": now}).scalar()
    return None if value is None else float(value)
