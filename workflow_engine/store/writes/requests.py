"""What a control action does to one locked instance, and the requests an engine applies.

:func:`transition` is the per-instance rule every operator action goes through (the
one-instance operations and bulk alike): an instance no engine runs changes at once, one
that an engine runs gets a ``requested_action``. :func:`apply_requested` is the engine's
side: it carries out the request as it stands under the row lock, at the run's next step
boundary, fenced by the run's lease."""

from __future__ import annotations

from dataclasses import dataclass

import sqlalchemy as sa
from sqlalchemy.engine import Connection, Engine

from onceflow.vocabulary import (
    RETRYABLE_STATUSES,
    TERMINAL_STATUSES,
    BulkAction,
    ControlAction,
    InstanceStatus,
    LifecycleEvent,
    ParentClosePolicy,
    StepKind,
    StepStatus,
)
from workflow_engine.store import lifecycle
from workflow_engine.store.commands import Lease
from workflow_engine.store.db import retry_on_deadlock
from workflow_engine.store.fragments import held as lease_held
from workflow_engine.store.fragments import notify_runnable as _notify
from workflow_engine.store.writes import children, stream_values

#: What :func:`apply_requested` answers when this engine no longer holds the instance.
LOST = "lost"


_REQUEST = sa.text(
    "UPDATE onceflow_instances SET requested_action = :a, updated_at = now() WHERE job_id = :j"
)


def _request(conn: Connection, job_id: str, action: ControlAction | None) -> None:
    conn.execute(_REQUEST, {"a": action, "j": job_id})


@dataclass(frozen=True, slots=True)
class Transition:
    """What one operator action did to one locked instance."""

    status: InstanceStatus  # the status it has now
    requested: ControlAction | None = None  # asked of the engine running it
    changed: bool = True  # False: it was already so (pausing a paused instance)
    runnable: bool = False  # it became claimable: wake the engines
    refused: str | None = None  # why the action does not apply to it
    note: str | None = None  # what it did, where the status does not say (a retry)


# An instance that never started keeps its delayed start (run_at, start_after: migration
# 0021), which a pause keeps too; one that ran resumes now (replay re-suspends a sleep).
_RESUME = sa.text(
    "UPDATE onceflow_instances SET status = :queued,"
    " run_after = CASE WHEN started_at IS NULL THEN GREATEST(run_after, now()) ELSE now() END,"
    " updated_at = now() WHERE job_id = :j"
)


def transition(
    conn: Connection,
    job_id: str,
    action: BulkAction,
    status: InstanceStatus,
    requested: ControlAction | None,
) -> Transition:
    """The one set of rules for pause, resume, terminate and restart, applied to an
    instance already locked ``FOR UPDATE``. The single operations below raise on a
    refusal; :mod:`workflow_engine.store.operations.bulk` counts it as skipped."""
    running = status == InstanceStatus.RUNNING
    if (member := _member_refusal(conn, job_id, action, status)) is not None:
        return Transition(status, changed=False, refused=member)
    if status == InstanceStatus.BATCHING:  # terminate: it leaves its pool, never runs
        apply_terminate(conn, job_id)
        return Transition(InstanceStatus.TERMINATED)
    if action == BulkAction.RETRY:
        if status not in RETRYABLE_STATUSES:
            refusal = (
                f"{job_id} is {status}; only an errored or terminated instance can be"
                " retried from its failed step"
            )
            return Transition(status, changed=False, refused=refusal)
        return Transition(InstanceStatus.QUEUED, runnable=True, note=apply_retry(conn, job_id))
    if action == BulkAction.RESUME:
        if running and requested == ControlAction.PAUSE:
            _request(conn, job_id, None)
            return Transition(status)
        if status != InstanceStatus.PAUSED:
            return Transition(status, changed=False, refused=f"{job_id} is {status}, not paused")
        # Queued at once: replay re-suspends a sleep or wait that is not over yet.
        conn.execute(_RESUME, {"j": job_id, "queued": str(InstanceStatus.QUEUED)})
        lifecycle.emit(conn, [(job_id, LifecycleEvent.RESUMED, None)])
        return Transition(InstanceStatus.QUEUED, runnable=True)
    if action != BulkAction.RESTART and status in TERMINAL_STATUSES:
        refusal = (
            f"{job_id} is {status}; only a live instance can be paused"
            if action == BulkAction.PAUSE
            else f"{job_id} is already {status}"
        )
        return Transition(status, changed=False, refused=refusal)
    if action == BulkAction.PAUSE and status == InstanceStatus.PAUSED:
        return Transition(status, changed=False)
    if running:
        asked = ControlAction(str(action))
        _request(conn, job_id, asked)
        return Transition(status, asked)
    if action == BulkAction.PAUSE:
        apply_pause(conn, job_id)
        return Transition(InstanceStatus.PAUSED)
    if action == BulkAction.TERMINATE:
        apply_terminate(conn, job_id)
        return Transition(InstanceStatus.TERMINATED)
    apply_restart(conn, job_id)
    return Transition(InstanceStatus.QUEUED, runnable=True)


_MEMBER = sa.text(
    "SELECT m.batch_key IS NOT NULL AS member, m.batch_id, m.batch_index, b.batch_size"
    " FROM onceflow_instances m LEFT JOIN onceflow_instances b ON b.job_id = m.batch_id"
    " WHERE m.job_id = :j"
)


def _member_refusal(
    conn: Connection, job_id: str, action: BulkAction, status: InstanceStatus
) -> str | None:
    """What an operator cannot do to a member of a batched workflow (migration 0026):
    waiting in its pool, it can only be terminated (it leaves the pool); in a batch, or
    finished with one, nothing: the batch run is what runs, and it is the one to pause,
    terminate, restart or retry (its members follow it). Another instance: None, and
    one primary-key read only for the statuses and actions that could be a member's."""
    maybe = status in (InstanceStatus.BATCHING, InstanceStatus.BATCHED) or action in (
        BulkAction.RESTART,
        BulkAction.RETRY,
    )
    if not maybe:
        return None
    row = conn.execute(_MEMBER, {"j": job_id}).one_or_none()
    if row is None or not row.member:
        return None
    if status == InstanceStatus.BATCHING:
        if action == BulkAction.TERMINATE:
            return None
        return (
            f"{job_id} is waiting to be batched; it can be terminated (it leaves its pool),"
            f" no {action}"
        )
    if row.batch_id is None:
        return f"{job_id} is a batch member that never ran ({status}); no {action}"
    place = f"member {row.batch_index + 1} of {row.batch_size}"
    return f"{job_id} is in batch {row.batch_id} ({place}); {action} the batch run instead"


_TERMINATE = sa.text(
    "UPDATE onceflow_instances SET status = :terminated, finished_at = now(),"
    " updated_at = now(), lease_owner = NULL, lease_expires_at = NULL,"
    " requested_action = NULL,"
    # a singleton's newer instance (store/writes/singleton.py) or an operator
    " error = coalesce('cancelled by ' || cancelled_by || ' (singleton)',"
    " 'terminated by operator') WHERE job_id = :j"
    " RETURNING parent_job_id"
)


def apply_terminate(conn: Connection, job_id: str) -> None:
    """Terminate an instance no engine runs; close its children by their policy; wake
    its parent if it awaits it (the parent's ``child_result`` raises)."""
    parent = conn.execute(
        _TERMINATE, {"j": job_id, "terminated": str(InstanceStatus.TERMINATED)}
    ).scalar()
    lifecycle.emit(conn, [(job_id, LifecycleEvent.TERMINATED, None)])
    close_children(conn, job_id)
    if parent is not None:
        children.wake_parents(conn, [(parent, job_id)])


# Locked in job-id order, like every multi-row write, to avoid deadlocks.
_LOCK_CLOSING_CHILDREN = sa.text(
    "SELECT job_id, status, requested_action FROM onceflow_instances"
    " WHERE parent_job_id = :j AND parent_close_policy = :policy"
    " AND status <> ALL(:final) ORDER BY job_id FOR UPDATE"
)


def close_children(conn: Connection, job_id: str) -> int:
    """Parent close policy: terminate the live children of a terminated parent started
    with ``on_parent_close="terminate"`` (by the same rules as an operator's terminate:
    a running child is asked, and its engine applies it at its next step boundary, which
    closes its own children in turn); ``"abandon"`` children are left to run."""
    rows = conn.execute(
        _LOCK_CLOSING_CHILDREN,
        {
            "j": job_id,
            "policy": str(ParentClosePolicy.TERMINATE),
            "final": sorted(TERMINAL_STATUSES),
        },
    ).all()
    for child, status, requested in rows:
        asked = ControlAction(requested) if requested else None
        transition(conn, child, BulkAction.TERMINATE, InstanceStatus(status), asked)
    return len(rows)


_FORGET_ATTEMPTS = sa.text("DELETE FROM onceflow_step_attempts WHERE job_id = :j")
_FORGET_STEPS = sa.text("DELETE FROM onceflow_steps WHERE job_id = :j")
# Events not consumed yet stay: the restarted run may still wait for them.
_FORGET_CONSUMED_EVENTS = sa.text(
    "DELETE FROM onceflow_events WHERE job_id = :j AND consumed_at IS NOT NULL"
)
_RESTART = sa.text(
    "UPDATE onceflow_instances SET status = :queued, run_after = now(), started_at = NULL,"
    " finished_at = NULL, result = NULL, error = NULL, lease_owner = NULL,"
    " lease_expires_at = NULL, requested_action = NULL, restart_count = restart_count + 1,"
    " failed_position = NULL, deadline = NULL, start_by = NULL, timeout_kind = NULL,"
    " updated_at = now(),"
    # a restarted instance is live again, out of any singleton or debounce decision it had;
    # a debounced one out of its key too: it opened no window, so it neither leads one
    # (leading) nor is a window's pending instance (trailing)
    " skipped_for = NULL, cancelled_by = NULL, debounced_into = NULL,"
    f" debounce_key = CASE WHEN status = '{InstanceStatus.DEBOUNCED}' THEN NULL"
    " ELSE debounce_key END,"
    f" debounce_window_start = CASE WHEN status = '{InstanceStatus.DEBOUNCED}' THEN NULL"
    " ELSE debounce_window_start END WHERE job_id = :j"
)


def apply_restart(conn: Connection, job_id: str) -> None:
    """Forget the history and queue the instance to run from its first step."""
    # Attempts first, explicitly: no foreign key cascades into the partitioned
    # attempts table (migration 0012), and the restarted steps count attempts from 1.
    conn.execute(_FORGET_ATTEMPTS, {"j": job_id})
    conn.execute(_FORGET_STEPS, {"j": job_id})
    conn.execute(_FORGET_CONSUMED_EVENTS, {"j": job_id})
    stream_values.forget_values(conn, job_id)
    conn.execute(_RESTART, {"j": job_id, "queued": str(InstanceStatus.QUEUED)})
    lifecycle.emit(conn, [(job_id, LifecycleEvent.RESTARTED, None)])


# The step the instance errored at (failed_position) becomes a step not yet run: its row
# stays (name, position) with no result, so replay runs it; its attempts go on counting
# (the earlier ones stay in onceflow_step_attempts) while retry_base makes its next start
# the first try of a fresh budget. The error says why it is open (and tells it from an
# attempt a crash cut off). Only a step's own failure: a timed-out wait or a failed
# child is left as recorded.
_RESET_FAILED_STEP = sa.text(
    f"""
WITH failed AS (
    SELECT s.job_id, s.position, s.name, s.attempts FROM onceflow_steps s
    JOIN onceflow_instances i ON i.job_id = s.job_id AND i.failed_position = s.position
    WHERE s.job_id = :j AND s.kind = '{StepKind.STEP}' AND s.status = '{StepStatus.FAILED}'
    FOR UPDATE OF s
)
UPDATE onceflow_steps s
SET status = '{StepStatus.RUNNING}', retry_base = failed.attempts, result = NULL,
    error = 'retried by an operator', finished_at = NULL
FROM failed WHERE s.job_id = failed.job_id AND s.position = failed.position
RETURNING failed.position, failed.name, failed.attempts
"""
)
_RETRY = sa.text(
    "UPDATE onceflow_instances SET status = :queued, run_after = now(), finished_at = NULL,"
    " result = NULL, error = NULL, failed_position = NULL, requested_action = NULL,"
    # a fresh execution_timeout from its next start, no start limit (migration 0023)
    " deadline = NULL, start_by = NULL, timeout_kind = NULL,"
    " retry_count = retry_count + 1, updated_at = now(),"
    # live again, out of the singleton decision that stopped it (as a restart): kept,
    # cancelled_by would mark it as being stopped, and no newer instance would cancel it
    " cancelled_by = NULL WHERE job_id = :j"
)


def apply_retry(conn: Connection, job_id: str) -> str:
    """Queue an errored or terminated instance (locked ``FOR UPDATE`` by the caller) to
    go on from where it stopped: every completed entry of its history is kept (replay
    returns it, nothing completed runs again), the step it errored at runs again with a
    fresh attempt budget, and an entry left open (a sleep or wait it was terminated in)
    is picked up as recorded. Answers what was reset, for the operator."""
    reset = conn.execute(_RESET_FAILED_STEP, {"j": job_id}).one_or_none()
    conn.execute(_RETRY, {"j": job_id, "queued": str(InstanceStatus.QUEUED)})
    step = None if reset is None else {"position": reset.position, "name": reset.name}
    lifecycle.emit(conn, [(job_id, LifecycleEvent.RETRIED, {"step": step})])
    if reset is None:
        return "queued to replay its history (no failed step to run again)"
    return (
        f"step {reset.name!r} (position {reset.position}) runs again with a fresh attempt"
        f" budget ({reset.attempts} earlier attempt(s) kept in its history)"
    )


_PAUSE = sa.text(
    "UPDATE onceflow_instances SET status = :paused, lease_owner = NULL,"
    " lease_expires_at = NULL, requested_action = NULL,"
    " run_after = CASE WHEN started_at IS NULL THEN run_after ELSE now() END,"
    " updated_at = now() WHERE job_id = :j"
)


def apply_pause(conn: Connection, job_id: str) -> None:
    conn.execute(_PAUSE, {"j": job_id, "paused": str(InstanceStatus.PAUSED)})
    lifecycle.emit(conn, [(job_id, LifecycleEvent.PAUSED, None)])


# The request as it stands now, under the row lock, and only while this engine holds it.
_LOCK_REQUESTED = sa.text(
    "SELECT requested_action FROM onceflow_instances"
    f" WHERE job_id = :j AND {lease_held()} FOR UPDATE"
)
# A withdrawn request: the lease goes and the instance is claimable again.
_REQUEUE = sa.text(
    "UPDATE onceflow_instances SET status = :queued, run_after = now(),"
    " lease_owner = NULL, lease_expires_at = NULL, updated_at = now()"
    " WHERE job_id = :j"
)


@retry_on_deadlock
def apply_requested(db: Engine, lease: Lease, job_id: str) -> tuple[str, str | None]:
    """Carry out the action requested of an instance this engine holds, as it stands
    now under the row lock, not as the run saw it: between the run's write that saw a
    request and this transaction, an operator may have changed it (terminate after
    pause) or withdrawn it (resume after pause). Answers (new status, the action applied
    or None); :data:`LOST` if the engine no longer holds it. A withdrawn request gives
    the instance back to the queue: the run has already unwound, and its next claim
    replays it from its history."""
    with db.begin() as conn:
        row = conn.execute(_LOCK_REQUESTED, {"j": job_id, **lease._asdict()}).one_or_none()
        if row is None:
            return LOST, None
        action = row.requested_action
        if action is None:
            conn.execute(_REQUEUE, {"j": job_id, "queued": str(InstanceStatus.QUEUED)})
            _notify(conn)
            return InstanceStatus.QUEUED, None
        if action == ControlAction.PAUSE:
            apply_pause(conn, job_id)
            return InstanceStatus.PAUSED, action
        if action == ControlAction.TERMINATE:
            apply_terminate(conn, job_id)
            return InstanceStatus.TERMINATED, action
        apply_restart(conn, job_id)
        _notify(conn)
        return InstanceStatus.QUEUED, action
