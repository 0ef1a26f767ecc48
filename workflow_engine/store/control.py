"""Control operations: pause, resume, terminate, restart, send an event; list instances.

An instance that no engine is running is changed at once. One that an engine is
running gets a ``requested_action``, which the engine carries out at its next step
boundary (a step, sleep or event wait), so no step is cut off half-way.
"""

from __future__ import annotations

from dataclasses import dataclass
from datetime import datetime
from typing import Any

import sqlalchemy as sa
from sqlalchemy.engine import Connection, Engine

from onceflow.errors import OnceflowError
from onceflow.instance_events import check_event
from onceflow.vocabulary import (
    TERMINAL_STATUSES,
    BulkAction,
    ControlAction,
    InstanceStatus,
    OperatorAction,
    ParentClosePolicy,
)
from workflow_engine.store import children, operator_audit
from workflow_engine.store.db import retry_on_deadlock
from workflow_engine.store.fragments import held as lease_held
from workflow_engine.store.instances import notify_runnable as _notify
from workflow_engine.store.operator_audit import ActionEntry, Actor
from workflow_engine.store.writes import Lease

#: What :func:`apply_requested` answers when this engine no longer holds the instance.
LOST = "lost"


class ControlError(OnceflowError):
    """A control operation that cannot apply to the instance in its current state."""


class InstanceNotFound(ControlError):
    """No instance of that workflow has that job id."""


@dataclass(frozen=True)
class ControlResult:
    job_id: str
    status: InstanceStatus
    requested: ControlAction | None = None

    def describe(self) -> str:
        if self.requested:
            return f"{self.job_id}: {self.requested} requested (the engine applies it next step)"
        return f"{self.job_id}: {self.status}"


def _lock(
    conn: Connection, workflow: str, job_id: str
) -> tuple[InstanceStatus, ControlAction | None]:
    row = conn.execute(
        sa.text(
            "SELECT workflow, status, requested_action FROM onceflow_instances"
            " WHERE job_id = :j FOR UPDATE"
        ),
        {"j": job_id},
    ).one_or_none()
    if row is None or row.workflow != workflow:
        raise InstanceNotFound(f"no instance of {workflow!r} with job id {job_id!r}")
    requested = ControlAction(row.requested_action) if row.requested_action else None
    return InstanceStatus(row.status), requested


def _request(conn: Connection, job_id: str, action: ControlAction | None) -> None:
    conn.execute(
        sa.text(
            "UPDATE onceflow_instances SET requested_action = :a, updated_at = now()"
            " WHERE job_id = :j"
        ),
        {"a": action, "j": job_id},
    )


@dataclass(frozen=True, slots=True)
class Transition:
    """What one operator action did to one locked instance."""

    status: InstanceStatus  # the status it has now
    requested: ControlAction | None = None  # asked of the engine running it
    changed: bool = True  # False: it was already so (pausing a paused instance)
    runnable: bool = False  # it became claimable: wake the engines
    refused: str | None = None  # why the action does not apply to it


def transition(
    conn: Connection,
    job_id: str,
    action: BulkAction,
    status: InstanceStatus,
    requested: ControlAction | None,
) -> Transition:
    """The one set of rules for pause, resume, terminate and restart, applied to an
    instance already locked ``FOR UPDATE``. The single operations below raise on a
    refusal; :mod:`workflow_engine.store.bulk` counts it as skipped."""
    running = status == InstanceStatus.RUNNING
    if action == BulkAction.RESUME:
        if running and requested == ControlAction.PAUSE:
            _request(conn, job_id, None)
            return Transition(status)
        if status != InstanceStatus.PAUSED:
            return Transition(status, changed=False, refused=f"{job_id} is {status}, not paused")
        # Queued at once: replay re-suspends a sleep or wait that is not over yet.
        conn.execute(
            sa.text(
                "UPDATE onceflow_instances SET status = :queued, run_after = now(),"
                " updated_at = now() WHERE job_id = :j"
            ),
            {"j": job_id, "queued": str(InstanceStatus.QUEUED)},
        )
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


@retry_on_deadlock
def _operate(
    engine: Engine, action: BulkAction, workflow: str, job_id: str, actor: Actor | None
) -> tuple[ControlResult, ActionEntry | None]:
    with engine.begin() as conn:
        status, requested = _lock(conn, workflow, job_id)
        done = transition(conn, job_id, action, status, requested)
        if done.refused is not None:
            raise ControlError(done.refused)
        if done.runnable:
            _notify(conn)
        result = ControlResult(job_id, done.status, done.requested)
        # The operator's row commits with the change, or neither does.
        audited = None
        if actor is not None:
            audited = operator_audit.record(
                conn,
                actor,
                OperatorAction.of_control(action),
                workflow=workflow,
                job_id=job_id,
                detail=result.describe(),
            )
        return result, audited


def _control(
    engine: Engine, action: BulkAction, workflow: str, job_id: str, actor: Actor | None
) -> ControlResult:
    """One operator action on one instance; with an ``actor``, recorded in the audit
    trail (:mod:`workflow_engine.store.operator_audit`): in the same transaction when it
    applies, in one of its own when it is refused or fails."""
    with operator_audit.failures_recorded(
        engine, actor, OperatorAction.of_control(action), workflow=workflow, job_id=job_id
    ):
        result, audited = _operate(engine, action, workflow, job_id, actor)
    operator_audit.announce(audited)
    return result


def pause(
    engine: Engine, workflow: str, job_id: str, *, actor: Actor | None = None
) -> ControlResult:
    return _control(engine, BulkAction.PAUSE, workflow, job_id, actor)


def resume(
    engine: Engine, workflow: str, job_id: str, *, actor: Actor | None = None
) -> ControlResult:
    return _control(engine, BulkAction.RESUME, workflow, job_id, actor)


def terminate(
    engine: Engine, workflow: str, job_id: str, *, actor: Actor | None = None
) -> ControlResult:
    return _control(engine, BulkAction.TERMINATE, workflow, job_id, actor)


def restart(
    engine: Engine, workflow: str, job_id: str, *, actor: Actor | None = None
) -> ControlResult:
    return _control(engine, BulkAction.RESTART, workflow, job_id, actor)


def apply_terminate(conn: Connection, job_id: str) -> None:
    """Terminate an instance no engine runs; close its children by their policy; wake
    its parent if it awaits it (the parent's ``child_result`` raises)."""
    parent = conn.execute(
        sa.text(
            "UPDATE onceflow_instances SET status = :terminated, finished_at = now(),"
            " updated_at = now(), lease_owner = NULL, lease_expires_at = NULL,"
            " requested_action = NULL, error = 'terminated by operator' WHERE job_id = :j"
            " RETURNING parent_job_id"
        ),
        {"j": job_id, "terminated": str(InstanceStatus.TERMINATED)},
    ).scalar()
    close_children(conn, job_id)
    if parent is not None:
        children.wake_parents(conn, [(parent, job_id)])


def close_children(conn: Connection, job_id: str) -> int:
    """Parent close policy: terminate the live children of a terminated parent started
    with ``on_parent_close="terminate"`` (by the same rules as an operator's terminate:
    a running child is asked, and its engine applies it at its next step boundary, which
    closes its own children in turn); ``"abandon"`` children are left to run."""
    rows = conn.execute(
        sa.text(
            "SELECT job_id, status, requested_action FROM onceflow_instances"
            " WHERE parent_job_id = :j AND parent_close_policy = :policy"
            " AND status <> ALL(:final) ORDER BY job_id FOR UPDATE"
        ),
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


def apply_restart(conn: Connection, job_id: str) -> None:
    """Forget the history and queue the instance to run from its first step."""
    # Attempts first, explicitly: no foreign key cascades into the partitioned
    # attempts table (migration 0012), and the restarted steps count attempts from 1.
    conn.execute(sa.text("DELETE FROM onceflow_step_attempts WHERE job_id = :j"), {"j": job_id})
    conn.execute(sa.text("DELETE FROM onceflow_steps WHERE job_id = :j"), {"j": job_id})
    conn.execute(
        sa.text("DELETE FROM onceflow_events WHERE job_id = :j AND consumed_at IS NOT NULL"),
        {"j": job_id},
    )
    conn.execute(
        sa.text(
            "UPDATE onceflow_instances SET status = :queued, run_after = now(), started_at = NULL,"
            " finished_at = NULL, result = NULL, error = NULL, lease_owner = NULL,"
            " lease_expires_at = NULL, requested_action = NULL, restart_count = restart_count + 1,"
            " updated_at = now() WHERE job_id = :j"
        ),
        {"j": job_id, "queued": str(InstanceStatus.QUEUED)},
    )


def apply_pause(conn: Connection, job_id: str) -> None:
    conn.execute(
        sa.text(
            "UPDATE onceflow_instances SET status = :paused, lease_owner = NULL,"
            " lease_expires_at = NULL, requested_action = NULL, run_after = now(),"
            " updated_at = now() WHERE job_id = :j"
        ),
        {"j": job_id, "paused": str(InstanceStatus.PAUSED)},
    )


@retry_on_deadlock
def apply_requested(engine: Engine, lease: Lease, job_id: str) -> tuple[str, str | None]:
    """Carry out the action requested of an instance this engine holds, as it stands
    now under the row lock, not as the run saw it: between the run's write that saw a
    request and this transaction, an operator may have changed it (terminate after
    pause) or withdrawn it (resume after pause). Answers (new status, the action applied
    or None); :data:`LOST` if the engine no longer holds it. A withdrawn request gives
    the instance back to the queue: the run has already unwound, and its next claim
    replays it from its history."""
    with engine.begin() as conn:
        row = conn.execute(
            sa.text(
                "SELECT requested_action FROM onceflow_instances"
                f" WHERE job_id = :j AND {lease_held()} FOR UPDATE"
            ),
            {"j": job_id, **lease._asdict()},
        ).one_or_none()
        if row is None:
            return LOST, None
        action = row.requested_action
        if action is None:
            conn.execute(
                sa.text(
                    "UPDATE onceflow_instances SET status = :queued, run_after = now(),"
                    " lease_owner = NULL, lease_expires_at = NULL, updated_at = now()"
                    " WHERE job_id = :j"
                ),
                {"j": job_id, "queued": str(InstanceStatus.QUEUED)},
            )
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


def send_event(
    engine: Engine,
    workflow: str,
    job_id: str,
    event_type: str,
    payload: Any = None,
    *,
    actor: Actor | None = None,
) -> int:
    """Store an event for the instance and wake it if it waits; return the event id.

    The instance row is locked first (``FOR UPDATE``), the same row, in the same order,
    as the engine's suspend locks before it re-checks pending events
    (:func:`workflow_engine.store.waits.suspend`). So the two serialize: an instance
    still running when this commits sees the event in its suspend and does not wait;
    one that suspended first is seen here as waiting and woken. No event is left
    beside an instance that waits for it.

    The event is checked first (:func:`onceflow.instance_events.check_event`: the type
    pattern and the size caps, for every front end alike); a refused one raises
    :class:`~onceflow.instance_events.InvalidEvent` and nothing is stored.

    With an ``actor``, the event and its audit-trail row commit together; a refusal is
    recorded on its own (:func:`_control` does the same for the other actions)."""
    target = {"workflow": workflow, "job_id": job_id}
    with operator_audit.failures_recorded(engine, actor, OperatorAction.SEND_EVENT, **target):
        encoded = check_event(event_type, payload)
        with engine.begin() as conn:
            status, _ = _lock(conn, workflow, job_id)
            if status in TERMINAL_STATUSES:
                raise ControlError(f"{job_id} is {status}; it takes no more events")
            event_id = conn.execute(
                sa.text(
                    "INSERT INTO onceflow_events (job_id, type, payload)"
                    " VALUES (:j, :t, CAST(:p AS jsonb)) RETURNING id"
                ),
                {"j": job_id, "t": event_type, "p": encoded.decode()},
            ).scalar_one()
            if status == InstanceStatus.WAITING:
                conn.execute(
                    sa.text("UPDATE onceflow_instances SET run_after = now() WHERE job_id = :j"),
                    {"j": job_id},
                )
                _notify(conn)
            audited = None
            if actor is not None:
                what = f"event {event_type!r} stored (id {event_id})"
                audited = operator_audit.record(
                    conn, actor, OperatorAction.SEND_EVENT, detail=what, **target
                )
    operator_audit.announce(audited)
    return int(event_id)


@dataclass(frozen=True)
class InstanceRow:
    job_id: str
    workflow: str
    status: InstanceStatus
    created_at: datetime
    finished_at: datetime | None
    version: str | None = None


def list_instances(
    engine: Engine,
    workflow: str | None = None,
    status: InstanceStatus | None = None,
    created_since: datetime | None = None,
    id_prefix: str | None = None,
    limit: int = 100,
    version: str | None = None,
) -> list[InstanceRow]:
    sql = sa.text(
        "SELECT job_id, workflow, status, created_at, finished_at, version"
        " FROM onceflow_instances"
        " WHERE (CAST(:w AS text) IS NULL OR workflow = :w)"
        " AND (CAST(:v AS text) IS NULL OR version = :v)"
        " AND (CAST(:s AS text) IS NULL OR status = :s)"
        " AND (CAST(:since AS timestamptz) IS NULL OR created_at >= :since)"
        " AND (CAST(:prefix AS text) IS NULL OR job_id LIKE :pattern)"
        " ORDER BY created_at DESC, job_id LIMIT :limit"
    )
    pattern = None
    if id_prefix is not None:
        pattern = id_prefix.replace("\\", "\\\\").replace("%", "\\%").replace("_", "\\_") + "%"
    with engine.connect() as conn:
        rows = conn.execute(
            sql,
            {
                "w": workflow,
                "s": str(status) if status is not None else None,
                "since": created_since,
                "prefix": id_prefix,
                "pattern": pattern,
                "limit": limit,
                "v": version,
            },
        )
        return [
            InstanceRow(
                r.job_id,
                r.workflow,
                InstanceStatus(r.status),
                r.created_at,
                r.finished_at,
                r.version,
            )
            for r in rows
        ]
