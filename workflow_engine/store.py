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

from workflow_engine.errors import LeaseLost, NonDeterminismError


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


_CLAIM = sa.text(
    """
WITH candidates AS (
    SELECT job_id FROM onceflow_instances
    WHERE status = 'queued' AND run_after <= now()
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
)


def claim(engine: Engine, owner: str, limit: int, lease_seconds: float) -> list[Claimed]:
    with engine.begin() as conn:
        rows = conn.execute(_CLAIM, {"owner": owner, "limit": limit, "lease": lease_seconds})
        return [Claimed(*row) for row in rows]


_LOAD_STEPS = sa.text(
    "SELECT position, name, status, attempts, result FROM onceflow_steps "
    "WHERE job_id = :job_id ORDER BY position"
)


def load_steps(engine: Engine, job_id: str) -> list[RecordedStep]:
    with engine.connect() as conn:
        return [RecordedStep(*row) for row in conn.execute(_LOAD_STEPS, {"job_id": job_id})]


_LEASE_CTE = """
lease AS (
    SELECT job_id FROM onceflow_instances
    WHERE job_id = :job_id AND lease_owner = :owner AND status = 'running'
    FOR SHARE
)"""

_START_STEP = sa.text(
    f"""
WITH {_LEASE_CTE},
step AS (
    INSERT INTO onceflow_steps AS s (job_id, position, name, status, attempts)
    SELECT job_id, :position, :name, 'running', 1 FROM lease
    ON CONFLICT ON CONSTRAINT onceflow_steps_pkey DO UPDATE
        SET attempts = s.attempts + 1, status = 'running', error = NULL, finished_at = NULL
        WHERE s.name = EXCLUDED.name AND s.status <> 'complete'
    RETURNING s.attempts
),
abandoned AS (
    UPDATE onceflow_step_attempts SET outcome = 'abandoned', finished_at = now()
    WHERE job_id = :job_id AND position = :position AND finished_at IS NULL
      AND EXISTS (SELECT 1 FROM step)
)
INSERT INTO onceflow_step_attempts (job_id, position, attempt, engine_id)
SELECT :job_id, :position, attempts, :owner FROM step
RETURNING attempt
"""
)


def start_step(engine: Engine, owner: str, job_id: str, position: int, name: str) -> int:
    """Record the start of a step attempt; return its attempt number (1-based)."""
    try:
        with engine.begin() as conn:
            attempt = conn.execute(
                _START_STEP, {"owner": owner, "job_id": job_id, "position": position, "name": name}
            ).scalar()
    except IntegrityError as exc:
        diag = getattr(exc.orig, "diag", None)
        if getattr(diag, "constraint_name", None) == "onceflow_steps_name_key":
            raise NonDeterminismError(
                f"step name {name!r} is used twice in one workflow run"
            ) from None
        raise
    if attempt is None:
        raise LeaseLost(f"lease on {job_id} lost before step {name!r}")
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
                "result": result_json.decode() if result_json is not None else None,
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
    with engine.begin() as conn:
        updated = conn.execute(
            _FINISH_INSTANCE,
            {
                "owner": owner,
                "job_id": job_id,
                "status": status,
                "result": result_json.decode() if result_json is not None else None,
                "error": error,
            },
        ).rowcount
    if updated != 1:
        raise LeaseLost(f"lease on {job_id} lost before it could be marked {status}")


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
RETURNING job_id, lease_owner
"""
)


def rescue_expired(engine: Engine) -> list[str]:
    """Re-queue instances whose engine died (lease expired); return their ids."""
    with engine.begin() as conn:
        rows = conn.execute(_RESCUE).all()
        if rows:
            conn.execute(sa.text("SELECT pg_notify('onceflow_runnable', '')"))
        return [row[0] for row in rows]


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
    from workflow_engine.errors import StepResultError

    try:
        data = orjson.dumps(value)
    except TypeError as exc:
        raise StepResultError(f"result is not JSON-serialisable: {exc}") from None
    if len(data) > max_bytes:
        raise StepResultError(f"result is {len(data)} bytes, over the {max_bytes}-byte limit")
    return data
