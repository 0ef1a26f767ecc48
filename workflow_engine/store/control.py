"""Control operations: pause, resume, terminate, restart, send an event; list instances.

An instance that no engine is running is changed at once. One that an engine is
running gets a ``requested_action``, which the engine carries out at its next step
boundary (a step, sleep or event wait), so no step is cut off half-way.
"""

from __future__ import annotations

from dataclasses import dataclass
from datetime import datetime
from typing import Any

import orjson
import sqlalchemy as sa
from sqlalchemy.engine import Connection, Engine

from onceflow.core.errors import OnceflowError
from workflow_engine.store.instances import TERMINAL_STATUSES as TERMINAL
from workflow_engine.store.instances import notify_runnable as _notify


class ControlError(OnceflowError):
    """A control operation that cannot apply to the instance in its current state."""


class InstanceNotFound(ControlError):
    """No instance of that workflow has that job id."""


@dataclass(frozen=True)
class ControlResult:
    job_id: str
    status: str
    requested: str | None = None

    def describe(self) -> str:
        if self.requested:
            return f"{self.job_id}: {self.requested} requested (the engine applies it next step)"
        return f"{self.job_id}: {self.status}"


def _lock(conn: Connection, workflow: str, job_id: str) -> tuple[str, str | None]:
    row = conn.execute(
        sa.text(
            "SELECT workflow, status, requested_action FROM onceflow_instances"
            " WHERE job_id = :j FOR UPDATE"
        ),
        {"j": job_id},
    ).one_or_none()
    if row is None or row.workflow != workflow:
        raise InstanceNotFound(f"no instance of {workflow!r} with job id {job_id!r}")
    return row.status, row.requested_action


def _request(conn: Connection, job_id: str, action: str | None) -> None:
    conn.execute(
        sa.text(
            "UPDATE onceflow_instances SET requested_action = :a, updated_at = now()"
            " WHERE job_id = :j"
        ),
        {"a": action, "j": job_id},
    )


def pause(engine: Engine, workflow: str, job_id: str) -> ControlResult:
    with engine.begin() as conn:
        status, _ = _lock(conn, workflow, job_id)
        if status in TERMINAL:
            raise ControlError(f"{job_id} is {status}; only a live instance can be paused")
        if status == "paused":
            return ControlResult(job_id, status)
        if status == "running":
            _request(conn, job_id, "pause")
            return ControlResult(job_id, status, "pause")
        apply_pause(conn, job_id)
        return ControlResult(job_id, "paused")


def resume(engine: Engine, workflow: str, job_id: str) -> ControlResult:
    with engine.begin() as conn:
        status, requested = _lock(conn, workflow, job_id)
        if status == "running" and requested == "pause":
            _request(conn, job_id, None)
            return ControlResult(job_id, status)
        if status != "paused":
            raise ControlError(f"{job_id} is {status}, not paused")
        # Queued at once: replay re-suspends a sleep or wait that is not over yet.
        conn.execute(
            sa.text(
                "UPDATE onceflow_instances SET status = 'queued', run_after = now(),"
                " updated_at = now() WHERE job_id = :j"
            ),
            {"j": job_id},
        )
        _notify(conn)
        return ControlResult(job_id, "queued")


def terminate(engine: Engine, workflow: str, job_id: str) -> ControlResult:
    with engine.begin() as conn:
        status, _ = _lock(conn, workflow, job_id)
        if status in TERMINAL:
            raise ControlError(f"{job_id} is already {status}")
        if status == "running":
            _request(conn, job_id, "terminate")
            return ControlResult(job_id, status, "terminate")
        apply_terminate(conn, job_id)
        return ControlResult(job_id, "terminated")


def restart(engine: Engine, workflow: str, job_id: str) -> ControlResult:
    with engine.begin() as conn:
        status, _ = _lock(conn, workflow, job_id)
        if status == "running":
            _request(conn, job_id, "restart")
            return ControlResult(job_id, status, "restart")
        apply_restart(conn, job_id)
        _notify(conn)
        return ControlResult(job_id, "queued")


def apply_terminate(conn: Connection, job_id: str) -> None:
    conn.execute(
        sa.text(
            "UPDATE onceflow_instances SET status = 'terminated', finished_at = now(),"
            " updated_at = now(), lease_owner = NULL, lease_expires_at = NULL,"
            " requested_action = NULL, error = 'terminated by operator' WHERE job_id = :j"
        ),
        {"j": job_id},
    )


def apply_restart(conn: Connection, job_id: str) -> None:
    """Forget the history and queue the instance to run from its first step."""
    conn.execute(sa.text("DELETE FROM onceflow_steps WHERE job_id = :j"), {"j": job_id})
    conn.execute(
        sa.text("DELETE FROM onceflow_events WHERE job_id = :j AND consumed_at IS NOT NULL"),
        {"j": job_id},
    )
    conn.execute(
        sa.text(
            "UPDATE onceflow_instances SET status = 'queued', run_after = now(), started_at = NULL,"
            " finished_at = NULL, result = NULL, error = NULL, lease_owner = NULL,"
            " lease_expires_at = NULL, requested_action = NULL, restart_count = restart_count + 1,"
            " updated_at = now() WHERE job_id = :j"
        ),
        {"j": job_id},
    )


def apply_pause(conn: Connection, job_id: str) -> None:
    conn.execute(
        sa.text(
            "UPDATE onceflow_instances SET status = 'paused', lease_owner = NULL,"
            " lease_expires_at = NULL, requested_action = NULL, run_after = now(),"
            " updated_at = now() WHERE job_id = :j"
        ),
        {"j": job_id},
    )


def apply_requested(engine: Engine, owner: str, job_id: str, action: str) -> str:
    """Carry out a requested action on an instance this engine holds; its new status."""
    with engine.begin() as conn:
        held = conn.execute(
            sa.text(
                "SELECT 1 FROM onceflow_instances WHERE job_id = :j AND lease_owner = :o"
                " AND status = 'running' FOR UPDATE"
            ),
            {"j": job_id, "o": owner},
        ).scalar()
        if not held:
            return "lost"
        if action == "pause":
            apply_pause(conn, job_id)
            return "paused"
        if action == "terminate":
            apply_terminate(conn, job_id)
            return "terminated"
        apply_restart(conn, job_id)
        _notify(conn)
        return "queued"


def send_event(
    engine: Engine, workflow: str, job_id: str, event_type: str, payload: Any = None
) -> int:
    """Store an event for the instance and wake it if it waits; return the event id."""
    with engine.begin() as conn:
        status, _ = _lock(conn, workflow, job_id)
        if status in TERMINAL:
            raise ControlError(f"{job_id} is {status}; it takes no more events")
        event_id = conn.execute(
            sa.text(
                "INSERT INTO onceflow_events (job_id, type, payload)"
                " VALUES (:j, :t, CAST(:p AS jsonb)) RETURNING id"
            ),
            {"j": job_id, "t": event_type, "p": orjson.dumps(payload).decode()},
        ).scalar_one()
        if status == "waiting":
            conn.execute(
                sa.text("UPDATE onceflow_instances SET run_after = now() WHERE job_id = :j"),
                {"j": job_id},
            )
            _notify(conn)
        return int(event_id)


@dataclass(frozen=True)
class InstanceRow:
    job_id: str
    workflow: str
    status: str
    created_at: datetime
    finished_at: datetime | None


def list_instances(
    engine: Engine,
    workflow: str | None = None,
    status: str | None = None,
    created_since: datetime | None = None,
    id_prefix: str | None = None,
    limit: int = 100,
) -> list[InstanceRow]:
    sql = sa.text(
        "SELECT job_id, workflow, status, created_at, finished_at FROM onceflow_instances"
        " WHERE (CAST(:w AS text) IS NULL OR workflow = :w)"
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
                "s": status,
                "since": created_since,
                "prefix": id_prefix,
                "pattern": pattern,
                "limit": limit,
            },
        )
        return [InstanceRow(*r) for r in rows]
