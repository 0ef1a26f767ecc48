"""Time limits (migration 0023; README, "Time limits"): the expiry of instances that were
not started within their start limit, run by a claim whose pick saw one due
(:data:`EXPIRY_DUE`), in its transaction.

The other limit, the execution deadline, has no statement of its own: the claim that
first starts an instance sets it (``fragments.mark_running``), every claim says whether
it has passed (``Claimed.overdue``), a step's start checks it under the lease
(``execution._START_STEPS``), and a suspension wakes at it (``waits._SUSPEND``).

The start limit cannot race a claim: the expiry locks the rows it errors (``FOR UPDATE
SKIP LOCKED``) and re-tests ``started_at IS NULL`` on the row it updates (after a wait
for a claim's lock, on the claim's committed version), while a claim never starts a
row whose limit has passed (``mark_running`` tests it on the row it locked). Whichever
locks the row first decides; the other skips it or finds it changed
(tests/integration/test_time_limits.py, the failpoint between the two).
"""

from __future__ import annotations

import sqlalchemy as sa
from sqlalchemy.engine import Connection, Engine

from onceflow import failpoints
from onceflow.vocabulary import InstanceStatus, LifecycleEvent, TimeoutKind
from workflow_engine.store import lifecycle
from workflow_engine.store.writes import children

#: Some queued instance never started is past its start limit (the claim's pick probes
#: it, and runs :func:`expire_unstarted` only then).
EXPIRY_DUE = f"""EXISTS (
    SELECT 1 FROM onceflow_instances
    WHERE start_by <= now() AND started_at IS NULL AND start_by IS NOT NULL
      AND status = '{InstanceStatus.QUEUED}')"""

#: The most instances one claim's expiry errors (``limit`` if that is more): it does not
#: depend on the claiming engine's free slots, so a backlog of expired instances is
#: errored in a few claims (the engine claims again at once after one that expired any).
EXPIRY_BATCH = 100

_EXPIRE = sa.text(
    f"""
WITH due AS (
    -- onceflow_instances_start_by_idx: queued instances never started, with a limit
    SELECT job_id FROM onceflow_instances
    WHERE start_by <= now() AND started_at IS NULL AND start_by IS NOT NULL
      AND status = '{InstanceStatus.QUEUED}'
    ORDER BY start_by
    LIMIT :limit
    FOR UPDATE SKIP LOCKED
)
UPDATE onceflow_instances i
SET status = '{InstanceStatus.ERRORED}', timeout_kind = '{TimeoutKind.START_TIMEOUT}',
    error = '{TimeoutKind.START_TIMEOUT}: not started by '
            || to_char(i.start_by AT TIME ZONE 'UTC', 'YYYY-MM-DD"T"HH24:MI:SS.US"Z"')
            || ' (start_within)',
    finished_at = now(), updated_at = now(), run_after = now()
FROM due
-- re-tested on the row as locked: a claim that took it first has started it
WHERE i.job_id = due.job_id AND i.started_at IS NULL AND i.status = '{InstanceStatus.QUEUED}'
RETURNING i.job_id, i.workflow, i.parent_job_id, i.error
"""
)


def expire_unstarted(conn: Connection, limit: int) -> list[tuple[str, str]]:
    """Error up to ``limit`` queued instances whose start limit has passed, in the
    caller's transaction (the engine's claim), with their ``instance.errored`` events
    and the wake of a parent awaiting one; returns their ``(job_id, workflow)``."""
    rows = conn.execute(_EXPIRE, {"limit": limit}).all()
    if not rows:
        return []
    failpoints.hit("claim.after_expiry", rows[0].job_id)
    extra = {"timeout": str(TimeoutKind.START_TIMEOUT)}
    lifecycle.emit(
        conn, [(r.job_id, LifecycleEvent.ERRORED, {"error": r.error, **extra}) for r in rows]
    )
    children.wake_parents(conn, [(r.parent_job_id, r.job_id) for r in rows if r.parent_job_id])
    return [(r.job_id, r.workflow) for r in rows]


def expire_due(db: Engine) -> list[tuple[str, str]]:
    """The expiry on its own, in its own transaction: what an engine with no free slot
    runs every poll interval instead of a claim, so a full fleet still errors what it
    could not have started in time (a claim's lease refuses those anyway)."""
    with db.begin() as conn:
        return expire_unstarted(conn, EXPIRY_BATCH)
