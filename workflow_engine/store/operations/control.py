"""Control operations: pause, resume, terminate, restart, retry, send an event.

An instance that no engine is running is changed at once. One that an engine is
running gets a ``requested_action``, which the engine carries out at its next step
boundary (a step, sleep or event wait), so no step is cut off half-way. ``retry``
applies only to an instance no engine runs (errored or terminated); forking is
:mod:`workflow_engine.store.operations.forks`.

Every action locks the instance row ``FOR UPDATE`` and decides on the status it reads
under that lock, in the transaction that changes it: an engine finishing the instance
or a second operator acting on it at the same moment waits for the lock and then sees
the new state (failpoint ``operations.after_lock``; tests/integration/test_retry_fork.py).
"""

from __future__ import annotations

from dataclasses import dataclass
from typing import Any

import sqlalchemy as sa
from sqlalchemy.engine import Connection, Engine

from onceflow import failpoints
from onceflow.errors import OnceflowError
from onceflow.instance_events import check_event
from onceflow.vocabulary import (
    TERMINAL_STATUSES,
    BulkAction,
    ControlAction,
    InstanceStatus,
    OperatorAction,
)
from workflow_engine.store import operator_audit
from workflow_engine.store.db import retry_on_deadlock
from workflow_engine.store.fragments import notify_runnable as _notify
from workflow_engine.store.operator_audit import ActionEntry, Actor
from workflow_engine.store.writes.requests import transition


class ControlError(OnceflowError):
    """A control operation that cannot apply to the instance in its current state."""


class InstanceNotFound(ControlError):
    """No instance of that workflow has that job id."""


@dataclass(frozen=True)
class ControlResult:
    job_id: str
    status: InstanceStatus
    requested: ControlAction | None = None
    note: str | None = None  # what a retry ran again

    def describe(self) -> str:
        if self.requested:
            return f"{self.job_id}: {self.requested} requested (the engine applies it next step)"
        if self.note:
            return f"{self.job_id}: {self.status}; {self.note}"
        return f"{self.job_id}: {self.status}"


_LOCK_INSTANCE = sa.text(
    "SELECT workflow, status, requested_action FROM onceflow_instances WHERE job_id = :j FOR UPDATE"
)


def _lock(
    conn: Connection, workflow: str, job_id: str
) -> tuple[InstanceStatus, ControlAction | None]:
    row = conn.execute(_LOCK_INSTANCE, {"j": job_id}).one_or_none()
    if row is None or row.workflow != workflow:
        raise InstanceNotFound(f"no instance of {workflow!r} with job id {job_id!r}")
    requested = ControlAction(row.requested_action) if row.requested_action else None
    return InstanceStatus(row.status), requested


@retry_on_deadlock
def _operate(
    db: Engine, action: BulkAction, workflow: str, job_id: str, actor: Actor | None
) -> tuple[ControlResult, ActionEntry | None]:
    with db.begin() as conn:
        status, requested = _lock(conn, workflow, job_id)
        failpoints.hit("operations.after_lock", job_id)
        done = transition(conn, job_id, action, status, requested)
        if done.refused is not None:
            raise ControlError(done.refused)
        if done.runnable:
            _notify(conn)
        result = ControlResult(job_id, done.status, done.requested, done.note)
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
    db: Engine, action: BulkAction, workflow: str, job_id: str, actor: Actor | None
) -> ControlResult:
    """One operator action on one instance; with an ``actor``, recorded in the audit
    trail (:mod:`workflow_engine.store.operator_audit`): in the same transaction when it
    applies, in one of its own when it is refused or fails."""
    with operator_audit.failures_recorded(
        db, actor, OperatorAction.of_control(action), workflow=workflow, job_id=job_id
    ):
        result, audited = _operate(db, action, workflow, job_id, actor)
    operator_audit.announce(audited)
    return result


def pause(db: Engine, workflow: str, job_id: str, *, actor: Actor | None = None) -> ControlResult:
    return _control(db, BulkAction.PAUSE, workflow, job_id, actor)


def resume(db: Engine, workflow: str, job_id: str, *, actor: Actor | None = None) -> ControlResult:
    return _control(db, BulkAction.RESUME, workflow, job_id, actor)


def terminate(
    db: Engine, workflow: str, job_id: str, *, actor: Actor | None = None
) -> ControlResult:
    return _control(db, BulkAction.TERMINATE, workflow, job_id, actor)


def restart(db: Engine, workflow: str, job_id: str, *, actor: Actor | None = None) -> ControlResult:
    return _control(db, BulkAction.RESTART, workflow, job_id, actor)


def retry(db: Engine, workflow: str, job_id: str, *, actor: Actor | None = None) -> ControlResult:
    """Run an errored (or terminated) instance again from its failed step: completed
    steps keep their checkpoints, the failed step gets a fresh attempt budget
    (:func:`workflow_engine.store.writes.requests.apply_retry`)."""
    return _control(db, BulkAction.RETRY, workflow, job_id, actor)


_INSERT_EVENT = sa.text(
    "INSERT INTO onceflow_events (job_id, type, payload)"
    " VALUES (:j, :t, CAST(:p AS jsonb)) RETURNING id"
)
# A waiting instance is due now: the engine's next claim finds the event.
_WAKE = sa.text("UPDATE onceflow_instances SET run_after = now() WHERE job_id = :j")


def send_event(
    db: Engine,
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
    (:func:`workflow_engine.store.writes.waits.suspend`). So the two serialize: an instance
    still running when this commits sees the event in its suspend and does not wait;
    one that suspended first is seen here as waiting and woken. No event is left
    beside an instance that waits for it.

    The event is checked first (:func:`onceflow.instance_events.check_event`: the type
    pattern and the size caps, for every front end alike); a refused one raises
    :class:`~onceflow.instance_events.InvalidEvent` and nothing is stored.

    With an ``actor``, the event and its audit-trail row commit together; a refusal is
    recorded on its own (:func:`_control` does the same for the other actions)."""
    target = {"workflow": workflow, "job_id": job_id}
    with operator_audit.failures_recorded(db, actor, OperatorAction.SEND_EVENT, **target):
        encoded = check_event(event_type, payload)
        with db.begin() as conn:
            status, _ = _lock(conn, workflow, job_id)
            if status in TERMINAL_STATUSES:
                raise ControlError(f"{job_id} is {status}; it takes no more events")
            if status in (InstanceStatus.BATCHING, InstanceStatus.BATCHED):
                raise ControlError(  # its batch run runs, not it: nothing would read one
                    f"{job_id} is a batch member ({status}); it never runs on its own, so"
                    " it takes no events"
                )
            event_id = conn.execute(
                _INSERT_EVENT, {"j": job_id, "t": event_type, "p": encoded.decode()}
            ).scalar_one()
            if status == InstanceStatus.WAITING:
                conn.execute(_WAKE, {"j": job_id})
                _notify(conn)
            audited = None
            if actor is not None:
                what = f"event {event_type!r} stored (id {event_id})"
                audited = operator_audit.record(
                    conn, actor, OperatorAction.SEND_EVENT, detail=what, **target
                )
    operator_audit.announce(audited)
    return int(event_id)
