"""Every database operation of the engine runner, one function each, one round trip each.

All writes on behalf of a running instance are guarded by its lease: they lock the
instance row (``FOR SHARE``) and check ``lease_owner``, so an engine whose lease was
taken over can never write a checkpoint for an instance another engine now runs.
"""

from __future__ import annotations

from dataclasses import dataclass
from datetime import datetime
from typing import Any

import orjson
import sqlalchemy as sa
from sqlalchemy.engine import Engine
from sqlalchemy.exc import IntegrityError

from workflow_engine.errors import (
    ControlRequested,
    LeaseLost,
    NonDeterminismError,
    StepResultError,
)
from workflow_engine.instances import notify_runnable


@dataclass(frozen=True, slots=True)
class Claimed:
    job_id: str
    workflow: str
    params: dict[str, Any]
    created_at: datetime
    submitted_at: datetime | None
    claim_count: int


@dataclass(frozen=True, slots=True)
class RecordedStep:
    position: int
    name: str
    status: str
    attempts: int
    result: Any
    kind: str = "step"
    wake_at: datetime | None = None
    error: str | None = None


_NOW = "coalesce(CAST(:now AS timestamptz), now())"

_CLAIM_SQL = f"""
WITH candidates AS (
    SELECT job_id FROM onceflow_instances
    WHERE status IN ('queued', 'sleeping', 'waiting') AND run_after <= {_NOW}
      AND {{workflow_filter}}
    ORDER BY run_after
    LIMIT :limit
    FOR UPDATE SKIP LOCKED
)
UPDATE onceflow_instances i
SET status = 'running', lease_owner = :owner,
    lease_expires_at = now() + make_interval(secs => :lease),
    started_at = coalesce(i.started_at, now()), updated_at = now(),
    claim_count = i.claim_count + 1
FROM candidates c, onceflow_jobs j
WHERE i.job_id = c.job_id AND j.job_id = c.job_id
RETURNING i.job_id, i.workflow, i.params, i.created_at, j.submitted_at, i.claim_count
"""
_CLAIM_UNLIMITED = sa.text(_CLAIM_SQL.format(workflow_filter="workflow <> ALL(:limited)"))
_CLAIM_ONE_WORKFLOW = sa.text(_CLAIM_SQL.format(workflow_filter="workflow = :workflow"))
_RUNNING_OF = sa.text(
    "SELECT count(*) FROM onceflow_instances WHERE workflow = :workflow AND status = 'running'"
)


def _json_text(data: bytes | None) -> str | None:
    return data.decode() if data is not None else None


def _write_leased(engine: Engine, sql: sa.TextClause, params: dict[str, Any], lost: str) -> None:
    """Run a one-row write guarded by the lease; LeaseLost if it changed nothing."""
    with engine.begin() as conn:
        if conn.execute(sql, params).rowcount != 1:
            raise LeaseLost(lost)


def claim(
    engine: Engine,
    owner: str,
    limit: int,
    lease_seconds: float,
    now: datetime | None = None,
    limits: dict[str, int] | None = None,
) -> list[Claimed]:
    """Claim up to ``limit`` runnable instances.

    Workflows with a concurrency limit are claimed under a per-workflow advisory lock
    held to commit, so that engines claiming at the same time cannot exceed it.
    Sleeping and waiting instances do not count toward a limit.
    """
    limits = limits or {}
    params = {"owner": owner, "lease": lease_seconds, "now": now}
    with engine.begin() as conn:
        rows = list(
            conn.execute(_CLAIM_UNLIMITED, {**params, "limit": limit, "limited": list(limits)})
        )
        for workflow, cap in limits.items():
            room = limit - len(rows)
            if room <= 0:
                break
            conn.execute(
                sa.text("SELECT pg_advisory_xact_lock(hashtext(:k))"),
                {"k": f"onceflow.limit.{workflow}"},
            )
            running = conn.execute(_RUNNING_OF, {"workflow": workflow}).scalar() or 0
            take = min(room, cap - running)
            if take > 0:
                rows += conn.execute(
                    _CLAIM_ONE_WORKFLOW, {**params, "limit": take, "workflow": workflow}
                )
        return [Claimed(*row) for row in rows]


_LOAD_STEPS = sa.text(
    "SELECT position, name, status, attempts, result, kind, wake_at, error FROM onceflow_steps "
    "WHERE job_id = :job_id ORDER BY position"
)


def load_steps(engine: Engine, job_id: str) -> list[RecordedStep]:
    with engine.connect() as conn:
        return [RecordedStep(*row) for row in conn.execute(_LOAD_STEPS, {"job_id": job_id})]


_LEASE_CTE = """
lease AS (
    SELECT job_id, requested_action FROM onceflow_instances
    WHERE job_id = :job_id AND lease_owner = :owner AND status = 'running'
    FOR SHARE
)"""

_START_STEP = sa.text(
    f"""
WITH {_LEASE_CTE},
step AS (
    INSERT INTO onceflow_steps AS s (job_id, position, name, status, attempts)
    SELECT job_id, :position, :name, 'running', 1 FROM lease WHERE requested_action IS NULL
    ON CONFLICT ON CONSTRAINT onceflow_steps_pkey DO UPDATE
        SET attempts = s.attempts + 1, status = 'running', error = NULL, finished_at = NULL
        WHERE s.name = EXCLUDED.name AND s.status <> 'complete'
    RETURNING s.attempts
),
abandoned AS (
    UPDATE onceflow_step_attempts SET outcome = 'abandoned', finished_at = now()
    WHERE job_id = :job_id AND position = :position AND finished_at IS NULL
      AND EXISTS (SELECT 1 FROM step)
),
attempt AS (
    INSERT INTO onceflow_step_attempts (job_id, position, attempt, engine_id)
    SELECT :job_id, :position, attempts, :owner FROM step
    RETURNING attempt
)
SELECT (SELECT attempt FROM attempt), (SELECT requested_action FROM lease),
       EXISTS (SELECT 1 FROM lease)
"""
)


def start_step(engine: Engine, owner: str, job_id: str, position: int, name: str) -> int:
    """Record the start of a step attempt; return its attempt number (1-based)."""
    try:
        with engine.begin() as conn:
            attempt, action, leased = conn.execute(
                _START_STEP, {"owner": owner, "job_id": job_id, "position": position, "name": name}
            ).one()
    except IntegrityError as exc:
        diag = getattr(exc.orig, "diag", None)
        if getattr(diag, "constraint_name", None) == "onceflow_steps_name_key":
            raise NonDeterminismError(
                f"step name {name!r} is used twice in one workflow run"
            ) from None
        raise
    if not leased:
        raise LeaseLost(f"lease on {job_id} lost before step {name!r}")
    if action is not None:
        raise ControlRequested(action)
    if attempt is None:
        raise NonDeterminismError(f"step {name!r} at position {position} does not match history")
    return int(attempt)


_FINISH_STEP = sa.text(
    f"""
WITH {_LEASE_CTE},
step AS (
    UPDATE onceflow_steps s
    SET status = :status,
        result = CAST(:result AS jsonb),
        error = :error,
        finished_at = CASE WHEN :status = 'running' THEN NULL ELSE now() END
    FROM lease
    WHERE s.job_id = lease.job_id AND s.position = :position AND s.status = 'running'
    RETURNING s.position
),
attempt AS (
    UPDATE onceflow_step_attempts a
    SET outcome = :outcome, error = :error, finished_at = now()
    FROM step
    WHERE a.job_id = :job_id AND a.position = step.position AND a.attempt = :attempt
    RETURNING a.attempt
)
SELECT (SELECT count(*) FROM step), (SELECT count(*) FROM attempt)
"""
)


def finish_step(
    engine: Engine,
    owner: str,
    job_id: str,
    position: int,
    attempt: int,
    outcome: str,
    result_json: bytes | None = None,
    error: str | None = None,
) -> None:
    """Checkpoint a step attempt's outcome: 'complete', 'retry' or 'failed'.

    A 'complete' outcome is the step's checkpoint; the ``status = 'running'`` guard
    makes writing one twice impossible (the second finds nothing to update).
    """
    status = {"complete": "complete", "retry": "running", "failed": "failed"}[outcome]
    with engine.begin() as conn:
        steps, _ = conn.execute(
            _FINISH_STEP,
            {
                "owner": owner,
                "job_id": job_id,
                "position": position,
                "attempt": attempt,
                "status": status,
                "outcome": outcome,
                "result": _json_text(result_json),
                "error": error,
            },
        ).one()
    if steps != 1:
        raise LeaseLost(f"lease on {job_id} lost before checkpointing step {position}")


_FINISH_INSTANCE = sa.text(
    """
UPDATE onceflow_instances
SET status = :status, result = CAST(:result AS jsonb), error = :error,
    finished_at = now(), updated_at = now(), lease_owner = NULL, lease_expires_at = NULL
WHERE job_id = :job_id AND lease_owner = :owner AND status = 'running'
"""
)


def finish_instance(
    engine: Engine,
    owner: str,
    job_id: str,
    status: str,
    result_json: bytes | None = None,
    error: str | None = None,
) -> None:
    _write_leased(
        engine,
        _FINISH_INSTANCE,
        {
            "owner": owner,
            "job_id": job_id,
            "status": status,
            "result": _json_text(result_json),
            "error": error,
        },
        f"lease on {job_id} lost before it could be marked {status}",
    )


_HEARTBEAT = sa.text(
    """
UPDATE onceflow_instances SET lease_expires_at = now() + make_interval(secs => :lease)
WHERE lease_owner = :owner AND status = 'running' AND job_id = ANY(:ids)
RETURNING job_id
"""
)


def heartbeat(engine: Engine, owner: str, job_ids: list[str], lease_seconds: float) -> set[str]:
    """Extend the leases this engine holds; return the ids it still owns."""
    if not job_ids:
        return set()
    with engine.begin() as conn:
        rows = conn.execute(_HEARTBEAT, {"owner": owner, "ids": job_ids, "lease": lease_seconds})
        return set(rows.scalars())


_RESCUE = sa.text(
    """
UPDATE onceflow_instances
SET status = 'queued', lease_owner = NULL, lease_expires_at = NULL, updated_at = now()
WHERE status = 'running' AND lease_expires_at < now()
RETURNING job_id
"""
)


def rescue_expired(engine: Engine) -> list[str]:
    """Re-queue instances whose engine died (lease expired); return their ids."""
    with engine.begin() as conn:
        rescued = list(conn.execute(_RESCUE).scalars())
        if rescued:
            notify_runnable(conn)
        return rescued


_RELEASE = sa.text(
    """
UPDATE onceflow_instances
SET status = 'queued', lease_owner = NULL, lease_expires_at = NULL, updated_at = now()
WHERE lease_owner = :owner AND status = 'running' AND job_id = ANY(:ids)
"""
)


def release(engine: Engine, owner: str, job_ids: list[str]) -> int:
    """Give back instances this engine will not finish (clean shutdown)."""
    if not job_ids:
        return 0
    with engine.begin() as conn:
        return conn.execute(_RELEASE, {"owner": owner, "ids": job_ids}).rowcount


def encode_result(value: Any, max_bytes: int) -> bytes:
    """JSON-encode a step or workflow result, enforcing the size bound."""
    try:
        data = orjson.dumps(value)
    except TypeError as exc:
        raise StepResultError(f"result is not JSON-serialisable: {exc}") from None
    if len(data) > max_bytes:
        raise StepResultError(f"result is {len(data)} bytes, over the {max_bytes}-byte limit")
    return data


# --- sleeps, event waits, suspension -------------------------------------------------

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
    engine: Engine,
    owner: str,
    job_id: str,
    position: int,
    name: str,
    kind: str,
    now: datetime | None,
    delay: float | None = None,
    wake_at: datetime | None = None,
    event_type: str | None = None,
) -> tuple[datetime | None, bool]:
    """Record a sleep or event wait (once); return (its wake time, whether it is due)."""
    status = "sleeping" if kind == "sleep" else "waiting"
    with engine.begin() as conn:
        leased, action, wake, db_now = conn.execute(
            _BEGIN_WAIT,
            {
                "owner": owner,
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


_CLOSE_ENTRY = sa.text(
    f"""
WITH {_LEASE_CTE}
UPDATE onceflow_steps s
SET status = :status, result = CAST(:result AS jsonb), error = :error, finished_at = now()
FROM lease
WHERE s.job_id = lease.job_id AND s.position = :position
  AND s.status IN ('sleeping', 'waiting')
"""
)


def close_entry(
    engine: Engine,
    owner: str,
    job_id: str,
    position: int,
    status: str,
    result_json: bytes | None = None,
    error: str | None = None,
) -> None:
    """Finish a sleep (complete) or an event wait (complete with payload, or failed)."""
    _write_leased(
        engine,
        _CLOSE_ENTRY,
        {
            "owner": owner,
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
    WHERE s.position = :position AND s.status = 'waiting'
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
    SET status = 'complete', result = coalesce((SELECT payload FROM used), 'null'::jsonb),
        finished_at = now()
    WHERE s.job_id = :job_id AND s.position = :position AND EXISTS (SELECT 1 FROM used)
    RETURNING s.result
)
SELECT EXISTS (SELECT 1 FROM used), (SELECT result FROM done)
"""
)


def consume_event(engine: Engine, owner: str, job_id: str, position: int) -> tuple[bool, Any]:
    """Take the oldest pending event of the wait's type; (found, payload)."""
    with engine.begin() as conn:
        found, payload = conn.execute(
            _CONSUME_EVENT, {"owner": owner, "job_id": job_id, "position": position}
        ).one()
    return bool(found), payload


_SUSPEND = sa.text(
    f"""
UPDATE onceflow_instances
SET status = :status, lease_owner = NULL, lease_expires_at = NULL, updated_at = now(),
    run_after = CASE
        WHEN :delay IS NOT NULL
            THEN {_NOW} + make_interval(secs => CAST(:delay AS double precision))
        ELSE coalesce(CAST(:wake_at AS timestamptz), 'infinity') END
WHERE job_id = :job_id AND lease_owner = :owner AND status = 'running'
"""
)


def suspend(
    engine: Engine,
    owner: str,
    job_id: str,
    status: str,
    now: datetime | None,
    wake_at: datetime | None = None,
    delay: float | None = None,
) -> None:
    """Release the instance until ``wake_at`` / ``now + delay`` (forever if neither).

    Statuses: 'sleeping' (a sleep or a retry delay), 'waiting' (an event), 'paused'.
    """
    _write_leased(
        engine,
        _SUSPEND,
        {
            "owner": owner,
            "job_id": job_id,
            "status": status,
            "wake_at": wake_at,
            "delay": delay,
            "now": now,
        },
        f"lease on {job_id} lost before it could be suspended",
    )


_NEXT_DUE = sa.text(
    f"""
SELECT extract(epoch FROM min(run_after) - {_NOW}) FROM onceflow_instances
WHERE status IN ('queued', 'sleeping', 'waiting') AND run_after <> 'infinity'
"""
)


def seconds_until_next_due(engine: Engine, now: datetime | None) -> float | None:
    """Seconds until the earliest timer (sleep, retry delay, event timeout) falls due."""
    with engine.connect() as conn:
        value = conn.execute(_NEXT_DUE, {"now": now}).scalar()
    return None if value is None else float(value)
