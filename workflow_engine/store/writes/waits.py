"""The rare lease-guarded writes of a running instance, one round trip each: sleeps and
event waits (:func:`begin_wait`, :func:`close_entry`, :func:`consume_event`), markers
(:func:`record_marker`, patches), and suspension (:func:`suspend`).

Like the batched checkpoints (:mod:`workflow_engine.store.writes.execution`), each locks the
instance row and checks ``lease_owner``, so an engine whose lease was taken over writes
nothing.
"""

from __future__ import annotations

from datetime import datetime
from typing import Any

import sqlalchemy as sa
from sqlalchemy.engine import Engine
from sqlalchemy.exc import IntegrityError

from onceflow.vocabulary import InstanceStatus, LifecycleEvent, StepKind, StepStatus
from workflow_engine.errors import ControlRequested, LeaseLost, NonDeterminismError
from workflow_engine.store import lifecycle
from workflow_engine.store.commands import Lease
from workflow_engine.store.db import constraint_of
from workflow_engine.store.fragments import LEASE_CTE as _LEASE_CTE
from workflow_engine.store.fragments import NOW as _NOW
from workflow_engine.store.fragments import RUNNABLE, held, notify_runnable
from workflow_engine.store.fragments import json_text as _json_text
from workflow_engine.store.lifecycle import RFC3339
from workflow_engine.store.writes import children


def _write_leased(db: Engine, sql: sa.TextClause, params: dict[str, Any], lost: str) -> None:
    """Run a one-row write guarded by the lease; LeaseLost if it changed nothing."""
    with db.begin() as conn:
        if conn.execute(sql, params).rowcount != 1:
            raise LeaseLost(lost)


_BEGIN_WAIT = sa.text(
    f"""
WITH {_LEASE_CTE},
entry AS (
    INSERT INTO onceflow_steps AS s (job_id, position, name, kind, status, wake_at, event_type)
    SELECT job_id, :position, :name, :kind, :status,
           CASE WHEN :delay IS NULL THEN CAST(:wake_at AS timestamptz)
                ELSE {_NOW} + make_interval(secs => CAST(:delay AS double precision)) END,
           :event_type
    FROM lease WHERE requested_action IS NULL
    ON CONFLICT ON CONSTRAINT onceflow_steps_pkey DO NOTHING
    RETURNING s.wake_at
)
SELECT EXISTS (SELECT 1 FROM lease), (SELECT requested_action FROM lease),
       coalesce((SELECT wake_at FROM entry),
                (SELECT wake_at FROM onceflow_steps WHERE job_id = :job_id
                   AND position = :position)) AS wake_at,
       {_NOW} AS now
"""
)


def begin_wait(
    db: Engine,
    lease: Lease,
    job_id: str,
    position: int,
    name: str,
    kind: StepKind,
    now: datetime | None,
    delay: float | None = None,
    wake_at: datetime | None = None,
    event_type: str | None = None,
) -> tuple[datetime | None, bool]:
    """Record a sleep or event wait (once); return (its wake time, whether it is due)."""
    status = StepStatus.SLEEPING if kind == StepKind.SLEEP else StepStatus.WAITING
    with db.begin() as conn:
        leased, action, wake, db_now = conn.execute(
            _BEGIN_WAIT,
            {
                **lease._asdict(),
                "job_id": job_id,
                "position": position,
                "name": name,
                "kind": kind,
                "status": status,
                "delay": delay,
                "wake_at": wake_at,
                "event_type": event_type,
                "now": now,
            },
        ).one()
    if not leased:
        raise LeaseLost(f"lease on {job_id} lost before {kind} {name!r}")
    if action is not None:
        raise ControlRequested(action)
    return wake, wake is not None and wake <= db_now


_RECORD_MARKER = sa.text(
    f"""
WITH {_LEASE_CTE},
entry AS (
    INSERT INTO onceflow_steps AS s (job_id, position, name, kind, status, attempts,
                                     finished_at)
    SELECT job_id, :position, :name, '{StepKind.PATCH}', '{StepStatus.COMPLETE}', 0, now()
    FROM lease WHERE requested_action IS NULL
    ON CONFLICT ON CONSTRAINT onceflow_steps_pkey DO NOTHING
    RETURNING s.position
)
SELECT EXISTS (SELECT 1 FROM lease), (SELECT requested_action FROM lease),
       EXISTS (SELECT 1 FROM entry)
"""
)


def record_marker(db: Engine, lease: Lease, job_id: str, position: int, name: str) -> None:
    """Record a ``ctx.patched()`` marker at ``position`` (lease-guarded, once)."""
    try:
        with db.begin() as conn:
            leased, action, written = conn.execute(
                _RECORD_MARKER,
                {**lease._asdict(), "job_id": job_id, "position": position, "name": name},
            ).one()
    except IntegrityError as exc:
        if constraint_of(exc) == "onceflow_steps_name_key":
            raise NonDeterminismError(
                f"patch id {name!r} is also used as a step name in this workflow"
            ) from None
        raise
    if not leased:
        raise LeaseLost(f"lease on {job_id} lost before patch marker {name!r}")
    if action is not None:
        raise ControlRequested(action)
    if not written:
        raise NonDeterminismError(
            f"patch marker {name!r} at position {position}: another entry is recorded there"
        )


_CLOSE_ENTRY = sa.text(
    f"""
WITH {_LEASE_CTE}
UPDATE onceflow_steps s
SET status = :status, result = CAST(:result AS jsonb), error = :error, finished_at = now()
FROM lease
WHERE s.job_id = lease.job_id AND s.position = :position
  AND s.status IN ('{StepStatus.SLEEPING}', '{StepStatus.WAITING}')
"""
)


def close_entry(
    db: Engine,
    lease: Lease,
    job_id: str,
    position: int,
    status: StepStatus,
    result_json: bytes | None = None,
    error: str | None = None,
) -> None:
    """Finish a sleep (complete) or an event wait (complete with payload, or failed)."""
    _write_leased(
        db,
        _CLOSE_ENTRY,
        {
            **lease._asdict(),
            "job_id": job_id,
            "position": position,
            "status": status,
            "result": _json_text(result_json),
            "error": error,
        },
        f"lease on {job_id} lost before closing entry {position}",
    )


_CONSUME_EVENT = sa.text(
    f"""
WITH {_LEASE_CTE},
entry AS (
    SELECT s.event_type FROM onceflow_steps s JOIN lease USING (job_id)
    WHERE s.position = :position AND s.status = '{StepStatus.WAITING}'
),
pick AS (
    SELECT e.id FROM onceflow_events e, entry
    WHERE e.job_id = :job_id AND e.type = entry.event_type AND e.consumed_at IS NULL
    ORDER BY e.id LIMIT 1
    FOR UPDATE OF e
),
used AS (
    UPDATE onceflow_events e SET consumed_at = now(), consumed_by = :position
    FROM pick WHERE e.id = pick.id
    RETURNING e.payload
),
done AS (
    UPDATE onceflow_steps s
    SET status = '{StepStatus.COMPLETE}',
        result = coalesce((SELECT payload FROM used), 'null'::jsonb), finished_at = now()
    WHERE s.job_id = :job_id AND s.position = :position AND EXISTS (SELECT 1 FROM used)
    RETURNING s.result
)
SELECT EXISTS (SELECT 1 FROM used), (SELECT result FROM done)
"""
)


def consume_event(db: Engine, lease: Lease, job_id: str, position: int) -> tuple[bool, Any]:
    """Take the oldest pending event of the wait's type; (found, payload)."""
    with db.begin() as conn:
        found, payload = conn.execute(
            _CONSUME_EVENT, {**lease._asdict(), "job_id": job_id, "position": position}
        ).one()
    return bool(found), payload


# Suspending is two statements in one transaction. The first locks the instance row
# (if this run still holds its lease) and reads the control request; the second,
# whose snapshot is taken after that lock, suspends and re-checks every wake condition.
# Every actor that can make a suspended instance runnable (send_event, a finishing
# child, an operator's request) locks this row before it looks at the status, so
# whichever takes the row first, the other sees its commit: "nothing yet", read by the
# run in an earlier transaction (consume_event, child collect), decides nothing.
_LOCK_SUSPENDING = sa.text(
    f"""
SELECT requested_action FROM onceflow_instances WHERE job_id = :job_id AND {held()}
FOR NO KEY UPDATE
"""
)

#: An event is stored, not consumed, for one of the instance's waits in progress.
_EVENT_PENDING = f"""EXISTS (
    SELECT 1 FROM onceflow_steps s JOIN onceflow_events e
      ON e.job_id = s.job_id AND e.type = s.event_type AND e.consumed_at IS NULL
    WHERE s.job_id = i.job_id AND s.kind = '{StepKind.EVENT}'
      AND s.status = '{StepStatus.WAITING}')"""

_SUSPEND = sa.text(
    f"""
UPDATE onceflow_instances i
SET status = :status, lease_owner = NULL, lease_expires_at = NULL, updated_at = now(),
    -- never past the execution deadline (migration 0023): the claim at it errors the
    -- instance timed_out (LEAST skips a NULL deadline)
    run_after = LEAST(CASE
        WHEN {_EVENT_PENDING} OR {children.awaited_child_finished("i.job_id")} THEN {_NOW}
        WHEN :delay IS NOT NULL
            THEN {_NOW} + make_interval(secs => CAST(:delay AS double precision))
        ELSE coalesce(CAST(:wake_at AS timestamptz), 'infinity') END, i.deadline)
WHERE i.job_id = :job_id
RETURNING i.status IN ({RUNNABLE}) AND i.run_after <= {_NOW} AS runnable,
          -- for the instance.sleeping / instance.waiting event
          CASE WHEN i.run_after <> 'infinity' THEN {RFC3339.format("i.run_after")} END AS until,
          (SELECT s.event_type FROM onceflow_steps s
           WHERE s.job_id = i.job_id AND s.kind = '{StepKind.EVENT}'
             AND s.status = '{StepStatus.WAITING}'
           ORDER BY s.position DESC LIMIT 1) AS event_type
"""
)


def suspend(
    db: Engine,
    lease: Lease,
    job_id: str,
    status: InstanceStatus,
    now: datetime | None,
    wake_at: datetime | None = None,
    delay: float | None = None,
) -> bool:
    """Release the instance until ``wake_at`` / ``now + delay`` (forever if neither),
    unless something it waits for is already there; True if it is runnable at once.

    Statuses: sleeping (a sleep or a retry delay), waiting (an event, a child),
    paused. Under the instance's row lock, in the suspending transaction, it re-checks
    every wake condition (docs/architecture.md, "Suspending"): an event stored for a
    wait in progress or a finished awaited child makes it runnable now, as does a
    timer already due; a pending control request is not suspended over but raised
    (``ControlRequested``: the runner applies it, holding the lease still).
    """
    params = {
        **lease._asdict(),
        "job_id": job_id,
        "status": status,
        "wake_at": wake_at,
        "delay": delay,
        "now": now,
    }
    with db.begin() as conn:
        locked = conn.execute(_LOCK_SUSPENDING, params).one_or_none()
        if locked is None:
            raise LeaseLost(f"lease on {job_id} lost before it could be suspended")
        if locked.requested_action is not None:
            raise ControlRequested(locked.requested_action)
        done = conn.execute(_SUSPEND, params).one()
        lifecycle.emit(conn, [(job_id, *_suspended_event(status, done.until, done.event_type))])
        if done.runnable:
            notify_runnable(conn)
        return bool(done.runnable)


def _suspended_event(
    status: InstanceStatus, until: str | None, event_type: str | None
) -> tuple[LifecycleEvent, dict[str, Any]]:
    """``instance.sleeping`` (until when) or ``instance.waiting`` (for which event type,
    until when if it has a timeout; no type: it waits for a child)."""
    kind = LifecycleEvent(f"instance.{status}")
    if kind is LifecycleEvent.WAITING:
        return kind, {"event_type": event_type, "until": until}
    return kind, {"until": until}
