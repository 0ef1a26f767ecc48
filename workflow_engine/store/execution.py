"""Every database operation of the engine runner.

The frequent lease-guarded writes (step started, step checkpoint, instance finished,
heartbeat; :mod:`workflow_engine.store.writes`) are batched: :func:`write_batch`
applies the pending writes of many instances in one transaction, one multi-row
statement per class of write. The rare ones (sleeps, event waits, suspension) are one
function and one round trip each.

All writes on behalf of a running instance are guarded by its lease: they lock the
instance row (``FOR SHARE``) and check ``lease_owner``, so an engine whose lease was
taken over can never write a checkpoint for an instance another engine now runs.
"""

from __future__ import annotations

import random
from collections.abc import Callable, Sequence
from dataclasses import dataclass, field
from datetime import datetime
from typing import Any

import orjson
import sqlalchemy as sa
from sqlalchemy.engine import Engine
from sqlalchemy.exc import IntegrityError

from onceflow.vocabulary import (
    RUNNABLE_STATUSES,
    AttemptOutcome,
    InstanceStatus,
    StepKind,
    StepStatus,
)
from workflow_engine.errors import (
    ControlRequested,
    LeaseLost,
    NonDeterminismError,
    StepResultError,
)
from workflow_engine.store import children
from workflow_engine.store.flow import FlowControl, claim_flow
from workflow_engine.store.instances import notify_runnable
from workflow_engine.store.writes import (
    Answer,
    FinishInstance,
    FinishStep,
    Heartbeat,
    StartStep,
    Write,
)


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


@dataclass(frozen=True, slots=True)
class RecordedStep:
    position: int
    name: str
    status: StepStatus
    attempts: int
    result: Any
    kind: StepKind = StepKind.STEP
    wake_at: datetime | None = None
    error: str | None = None


#: ``'queued', 'sleeping', 'waiting'`` spelled out in the SQL text, not passed as a
#: parameter: the planner matches the literal list against the partial index
#: ``onceflow_instances_runnable_idx``, which a parameter array would defeat.
_RUNNABLE = ", ".join(f"'{status}'" for status in sorted(RUNNABLE_STATUSES))

_NOW = "coalesce(CAST(:now AS timestamptz), now())"

_HAVE_VERSION = """
      -- only the definition versions this engine has (no version: created before
      -- versioning, any engine runs it)
      AND (version IS NULL OR (workflow, version) IN (
          SELECT * FROM unnest(CAST(:have_workflows AS text[]), CAST(:have_versions AS text[]))))
"""

_CLAIM_SQL = f"""
WITH plain AS (
    -- instances of workflows without flow control (no lane), priority first, aged by
    -- time waited (migration 0009): onceflow_instances_claim_order_idx
    SELECT job_id, onceflow_claim_order(run_after, priority) AS ord FROM onceflow_instances
    WHERE status IN ({_RUNNABLE}) AND run_after <= {_NOW} AND flow_lane IS NULL
      AND workflow <> ALL(:limited)
      {_HAVE_VERSION}
    ORDER BY onceflow_claim_order(run_after, priority)
    LIMIT :limit
    FOR UPDATE SKIP LOCKED
),
laned AS (
    -- instances given a lane while their workflow had flow control, which it has no
    -- longer: normally none (one probe of onceflow_instances_lane_idx per workflow)
    SELECT job_id, onceflow_claim_order(run_after, priority) AS ord FROM onceflow_instances
    WHERE status IN ({_RUNNABLE}) AND run_after <= {_NOW}
      AND workflow = ANY(CAST(:uncontrolled AS text[])) AND flow_lane IS NOT NULL
      {_HAVE_VERSION}
    LIMIT :limit
    FOR UPDATE SKIP LOCKED
),
candidates AS (
    SELECT job_id FROM (SELECT * FROM plain UNION ALL SELECT * FROM laned) AS both_kinds
    ORDER BY ord LIMIT :limit
),
claimed AS (
    UPDATE onceflow_instances i
    SET status = '{InstanceStatus.RUNNING}', lease_owner = :owner,
        lease_expires_at = now() + make_interval(secs => :lease),
        started_at = coalesce(i.started_at, now()), updated_at = now(),
        claim_count = i.claim_count + 1
    FROM candidates c, onceflow_jobs j
    WHERE i.job_id = c.job_id AND j.job_id = c.job_id
    RETURNING i.job_id, i.workflow, i.params, i.created_at, j.submitted_at, i.claim_count,
              j.traceparent, i.version
),
locks AS (
    -- the advisory locks of the flow-controlled workflows, tried in this round trip;
    -- their claims are the next statements, whose snapshots are taken after the locks
    SELECT array_agg(w) AS got FROM unnest(CAST(:limited AS text[])) AS w
    WHERE pg_try_advisory_xact_lock(hashtext('onceflow.limit.' || w))
)
SELECT c.*, CAST(NULL AS text[]) AS locked FROM claimed c
UNION ALL
SELECT NULL, NULL, NULL, NULL, NULL, NULL, NULL, NULL, got FROM locks
"""
_CLAIM_UNLIMITED = sa.text(_CLAIM_SQL)
_RUNNING_OF = sa.text(
    "SELECT count(*) FROM onceflow_instances"
    f" WHERE workflow = :workflow AND status = '{InstanceStatus.RUNNING}'"
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
    versions: dict[str, str] | None = None,
    flows: dict[str, FlowControl] | None = None,
) -> list[Claimed]:
    """Claim up to ``limit`` runnable instances of the workflow ``versions`` this engine
    has (``{workflow: version}``); instances without a recorded version are claimed by
    any engine. Higher priority first, aged by time waited (``onceflow_claim_order``).

    Workflows with flow control (``limits``: a concurrency limit; ``flows``: per-key
    limits, rate limits, fairness, :mod:`workflow_engine.store.flow`) are claimed under
    a per-workflow advisory lock held to commit, so that engines claiming at the same
    time cannot exceed a limit. Sleeping and waiting instances do not count toward a
    limit unless ``hold_while_waiting`` says so.
    """
    controlled = {w: FlowControl(concurrency=cap) for w, cap in (limits or {}).items()}
    controlled.update(flows or {})
    versions = versions or {}
    params = {
        "owner": owner,
        "lease": lease_seconds,
        "now": now,
        "have_workflows": list(versions),
        "have_versions": list(versions.values()),
    }
    with engine.begin() as conn:
        rows: list[Any] = []
        locked: list[str] = []
        for *row, got in conn.execute(
            _CLAIM_UNLIMITED,
            {
                **params,
                "limit": limit,
                "limited": list(controlled),
                "uncontrolled": [w for w in versions if w not in controlled],
            },
        ):
            if row[0] is None:
                locked = got or []
            else:
                rows.append(row)
        # The locks were only tried (a workflow another engine is claiming right now is
        # left to it), so two engines cannot deadlock on them; a random first workflow,
        # so one busy workflow does not always fill the batch.
        order = list(locked)
        start = random.randrange(len(order)) if order else 0
        for workflow in order[start:] + order[:start]:
            room = limit - len(rows)
            if room <= 0:
                break
            rows += _claim_controlled(conn, workflow, controlled[workflow], room, params)
        # The histories of everything claimed, in one query, in this transaction.
        history = load_steps(conn, [row[0] for row in rows])
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
            )
            for job_id, workflow, params, created, submitted, claims, tp, version in rows
        ]


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
    "SELECT job_id, position, name, status, attempts, result, kind, wake_at, error"
    " FROM onceflow_steps WHERE job_id = ANY(:job_ids) ORDER BY job_id, position"
)


def load_steps(conn: sa.Connection, job_ids: list[str]) -> dict[str, list[RecordedStep]]:
    """The recorded history of several instances, in one query."""
    history: dict[str, list[RecordedStep]] = {job: [] for job in job_ids}
    if job_ids:
        for job_id, position, name, status, attempts, result, kind, wake_at, error in conn.execute(
            _LOAD_STEPS, {"job_ids": job_ids}
        ):
            entry = RecordedStep(
                position, name, StepStatus(status), attempts, result, StepKind(kind), wake_at, error
            )
            history[job_id].append(entry)
    return history


_LEASE_CTE = f"""
lease AS (
    SELECT job_id, requested_action FROM onceflow_instances
    WHERE job_id = :job_id AND lease_owner = :owner AND status = '{InstanceStatus.RUNNING}'
    FOR SHARE
)"""


# --- lease-guarded writes, batched -------------------------------------------------
#
# The runner sends the checkpoint writes of all its in-flight instances through its
# group-commit writer (:mod:`workflow_engine.engine.batcher`), which applies everything pending
# in ONE transaction: one multi-row statement per class of write, one commit. Each
# instance has at most one write pending, so the rows of one batch never collide, nor
# do those of two batches in flight; the heartbeat, which touches every leased row,
# runs in a batch of its own, so an engine's own transactions never lock its instance
# rows in conflicting orders.

_LEASE_OF_INPUT = f"""
lease AS (
    SELECT i.job_id, i.requested_action FROM onceflow_instances i JOIN input USING (job_id)
    WHERE i.lease_owner = :owner AND i.status = '{InstanceStatus.RUNNING}'
    FOR SHARE OF i
)"""

_START_STEPS = sa.text(
    f"""
WITH input AS (
    SELECT * FROM unnest(CAST(:job_ids AS text[]), CAST(:positions AS int[]),
                         CAST(:names AS text[])) AS t(job_id, position, name)
),
{_LEASE_OF_INPUT},
step AS (
    INSERT INTO onceflow_steps AS s (job_id, position, name, status, attempts)
    SELECT input.job_id, input.position, input.name, '{StepStatus.RUNNING}', 1
    FROM input JOIN lease USING (job_id) WHERE lease.requested_action IS NULL
    ON CONFLICT ON CONSTRAINT onceflow_steps_pkey DO UPDATE
        SET attempts = s.attempts + 1, status = '{StepStatus.RUNNING}', error = NULL,
            finished_at = NULL
        WHERE s.name = EXCLUDED.name AND s.status <> '{StepStatus.COMPLETE}'
    RETURNING s.job_id, s.position, s.attempts
),
abandoned AS (
    UPDATE onceflow_step_attempts a
    SET outcome = '{AttemptOutcome.ABANDONED}', finished_at = now()
    FROM step
    WHERE a.job_id = step.job_id AND a.position = step.position AND a.finished_at IS NULL
),
attempt AS (
    INSERT INTO onceflow_step_attempts (job_id, position, attempt, engine_id)
    SELECT job_id, position, attempts, :owner FROM step
    RETURNING job_id, attempt
)
SELECT input.job_id, attempt.attempt, lease.requested_action, lease.job_id IS NOT NULL
FROM input LEFT JOIN lease USING (job_id) LEFT JOIN attempt USING (job_id)
"""
)

_FINISH_STEPS = sa.text(
    f"""
WITH input AS (
    SELECT * FROM unnest(CAST(:job_ids AS text[]), CAST(:positions AS int[]),
                         CAST(:attempts AS int[]), CAST(:statuses AS text[]),
                         CAST(:outcomes AS text[]), CAST(:results AS text[]),
                         CAST(:errors AS text[]))
        AS t(job_id, position, attempt, status, outcome, result, error)
),
{_LEASE_OF_INPUT},
step AS (
    UPDATE onceflow_steps s
    SET status = input.status,
        result = CAST(input.result AS jsonb),
        error = input.error,
        finished_at = CASE WHEN input.status = '{StepStatus.RUNNING}' THEN NULL ELSE now() END
    FROM input JOIN lease USING (job_id)
    -- running only: a checkpoint can never be written twice (the second finds no row)
    WHERE s.job_id = input.job_id AND s.position = input.position
      AND s.status = '{StepStatus.RUNNING}'
    RETURNING s.job_id
),
attempt AS (
    UPDATE onceflow_step_attempts a
    SET outcome = input.outcome, error = input.error, finished_at = now()
    FROM input JOIN step USING (job_id)
    WHERE a.job_id = input.job_id AND a.position = input.position AND a.attempt = input.attempt
)
SELECT job_id FROM step
"""
)

_FINISH_INSTANCES = sa.text(
    f"""
WITH input AS (
    SELECT * FROM unnest(CAST(:job_ids AS text[]), CAST(:statuses AS text[]),
                         CAST(:results AS text[]), CAST(:errors AS text[]))
        AS t(job_id, status, result, error)
)
UPDATE onceflow_instances i
SET status = input.status, result = CAST(input.result AS jsonb), error = input.error,
    finished_at = now(), updated_at = now(), lease_owner = NULL, lease_expires_at = NULL
FROM input
WHERE i.job_id = input.job_id AND i.lease_owner = :owner AND i.status = '{InstanceStatus.RUNNING}'
RETURNING i.job_id, i.parent_job_id
"""
)

_HEARTBEAT = sa.text(
    f"""
UPDATE onceflow_instances SET lease_expires_at = now() + make_interval(secs => :lease)
WHERE lease_owner = :owner AND status = '{InstanceStatus.RUNNING}' AND job_id = ANY(:ids)
RETURNING job_id
"""
)

_STEP_STATUS = {
    AttemptOutcome.COMPLETE: StepStatus.COMPLETE,
    AttemptOutcome.RETRY: StepStatus.RUNNING,  # the step runs again
    AttemptOutcome.FAILED: StepStatus.FAILED,
}

# Each class of write has a function that runs its statement for all writes of that
# class in a batch and answers each write: its value (``Write[T]``'s ``T``), or the
# exception its instance should raise.


def _start_steps(conn: sa.Connection, owner: str, writes: list[StartStep]) -> list[Answer]:
    rows = conn.execute(
        _START_STEPS,
        {
            "owner": owner,
            "job_ids": [w.job_id for w in writes],
            "positions": [w.position for w in writes],
            "names": [w.name for w in writes],
        },
    )
    found = {job_id: (attempt, action, leased) for job_id, attempt, action, leased in rows}
    return [_start_answer(w, *found[w.job_id]) for w in writes]


def _start_answer(w: StartStep, attempt: int | None, action: str | None, leased: bool) -> Answer:
    if not leased:
        return LeaseLost(f"lease on {w.job_id} lost before step {w.name!r}")
    if action is not None:
        return ControlRequested(action)
    if attempt is None:
        return NonDeterminismError(
            f"step {w.name!r} at position {w.position} does not match history"
        )
    return int(attempt)


def _guarded(
    conn: sa.Connection,
    sql: sa.TextClause,
    params: dict[str, Any],
    job_ids: list[str],
    lost: list[str],
) -> list[Answer]:
    """Run a batched guarded write returning the job ids it wrote; a write whose row
    was not written lost its lease (``lost`` says what it could not do)."""
    written = set(conn.execute(sql, {"job_ids": job_ids, **params}).scalars())
    return [
        None if job in written else LeaseLost(why) for job, why in zip(job_ids, lost, strict=True)
    ]


def _finish_steps(conn: sa.Connection, owner: str, writes: list[FinishStep]) -> list[Answer]:
    params = {
        "owner": owner,
        "positions": [w.position for w in writes],
        "attempts": [w.attempt for w in writes],
        "statuses": [_STEP_STATUS[w.outcome].value for w in writes],
        "outcomes": [w.outcome.value for w in writes],
        "results": [_json_text(w.result) for w in writes],
        "errors": [w.error for w in writes],
    }
    lost = [f"lease on {w.job_id} lost before checkpointing step {w.position}" for w in writes]
    return _guarded(conn, _FINISH_STEPS, params, [w.job_id for w in writes], lost)


def _finish_instances(
    conn: sa.Connection, owner: str, writes: list[FinishInstance]
) -> list[Answer]:
    params = {
        "owner": owner,
        "statuses": [w.status.value for w in writes],
        "results": [_json_text(w.result) for w in writes],
        "errors": [w.error for w in writes],
    }
    job_ids = [w.job_id for w in writes]
    rows = conn.execute(_FINISH_INSTANCES, {"job_ids": job_ids, **params}).all()
    # Children finished here: wake their parents that await them, in this transaction.
    children.wake_parents(conn, [(parent, job) for job, parent in rows if parent is not None])
    written = {job_id for job_id, _ in rows}
    return [
        None
        if w.job_id in written
        else LeaseLost(f"lease on {w.job_id} lost before it could be marked {w.status}")
        for w in writes
    ]


def _heartbeats(conn: sa.Connection, owner: str, writes: list[Heartbeat]) -> list[Answer]:
    answers: list[Answer] = []
    for w in writes:
        if not w.job_ids:
            answers.append(frozenset())
            continue
        params = {"owner": owner, "ids": list(w.job_ids), "lease": w.lease_seconds}
        answers.append(frozenset(conn.execute(_HEARTBEAT, params).scalars()))
    return answers


_Apply = Callable[[sa.Connection, str, list[Any]], list[Answer]]
_APPLY: dict[type[Write[Any]], _Apply] = {
    Heartbeat: _heartbeats,
    StartStep: _start_steps,
    FinishStep: _finish_steps,
    FinishInstance: _finish_instances,
}


def write_batch(engine: Engine, owner: str, writes: Sequence[Write[Any]]) -> list[Answer]:
    """Apply lease-guarded writes of several instances in one transaction.

    Returns one answer per write, in order: its value, or the exception it should raise
    in its instance (``LeaseLost``, ``ControlRequested``, ``NonDeterminismError``).
    A database error aborts the whole batch and propagates; :func:`write_each` then
    isolates the write that caused it.
    """
    by_class: dict[type[Write[Any]], list[int]] = {}
    for index, write in enumerate(writes):
        by_class.setdefault(type(write), []).append(index)
    answers: list[Answer] = [None] * len(writes)
    with engine.begin() as conn:
        for cls, indexes in by_class.items():
            applied = _APPLY[cls](conn, owner, [writes[i] for i in indexes])
            for index, answer in zip(indexes, applied, strict=True):
                answers[index] = answer
    return answers


def write_each(engine: Engine, owner: str, writes: Sequence[Write[Any]]) -> list[Answer]:
    """Apply writes one transaction each (after a batch failed): one bad write (a step
    name used twice in a run, say) fails only its own instance."""
    answers: list[Answer] = []
    for write in writes:
        try:
            answers.append(write_batch(engine, owner, [write])[0])
        except IntegrityError as exc:
            answers.append(_integrity_answer(write, exc))
        except Exception as exc:
            answers.append(exc)
    return answers


def _integrity_answer(write: Write[Any], exc: IntegrityError) -> Answer:
    diag = getattr(exc.orig, "diag", None)
    if getattr(diag, "constraint_name", None) == "onceflow_steps_name_key":
        name = write.name if isinstance(write, StartStep) else "?"
        return NonDeterminismError(f"step name {name!r} is used twice in one workflow run")
    return exc


_RESCUE = sa.text(
    f"""
UPDATE onceflow_instances
SET status = '{InstanceStatus.QUEUED}', lease_owner = NULL, lease_expires_at = NULL,
    updated_at = now()
WHERE status = '{InstanceStatus.RUNNING}' AND lease_expires_at < now()
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
    f"""
UPDATE onceflow_instances
SET status = '{InstanceStatus.QUEUED}', lease_owner = NULL, lease_expires_at = NULL,
    updated_at = now()
WHERE lease_owner = :owner AND status = '{InstanceStatus.RUNNING}' AND job_id = ANY(:ids)
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
    kind: StepKind,
    now: datetime | None,
    delay: float | None = None,
    wake_at: datetime | None = None,
    event_type: str | None = None,
) -> tuple[datetime | None, bool]:
    """Record a sleep or event wait (once); return (its wake time, whether it is due)."""
    status = StepStatus.SLEEPING if kind == StepKind.SLEEP else StepStatus.WAITING
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


def record_marker(engine: Engine, owner: str, job_id: str, position: int, name: str) -> None:
    """Record a ``ctx.patched()`` marker at ``position`` (lease-guarded, once)."""
    try:
        with engine.begin() as conn:
            leased, action, written = conn.execute(
                _RECORD_MARKER,
                {"owner": owner, "job_id": job_id, "position": position, "name": name},
            ).one()
    except IntegrityError as exc:
        if getattr(getattr(exc.orig, "diag", None), "constraint_name", None) == (
            "onceflow_steps_name_key"
        ):
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
    engine: Engine,
    owner: str,
    job_id: str,
    position: int,
    status: StepStatus,
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
WHERE job_id = :job_id AND lease_owner = :owner AND status = '{InstanceStatus.RUNNING}'
"""
)


def suspend(
    engine: Engine,
    owner: str,
    job_id: str,
    status: InstanceStatus,
    now: datetime | None,
    wake_at: datetime | None = None,
    delay: float | None = None,
) -> None:
    """Release the instance until ``wake_at`` / ``now + delay`` (forever if neither).

    Statuses: sleeping (a sleep or a retry delay), waiting (an event, a child),
    paused. A waiting instance whose awaited child finished meanwhile is made runnable
    in the same transaction (:mod:`workflow_engine.store.children`).
    """
    params = {
        "owner": owner,
        "job_id": job_id,
        "status": status,
        "wake_at": wake_at,
        "delay": delay,
        "now": now,
    }
    with engine.begin() as conn:
        if conn.execute(_SUSPEND, params).rowcount != 1:
            raise LeaseLost(f"lease on {job_id} lost before it could be suspended")
        if status == InstanceStatus.WAITING and children.wake_if_children_done(conn, job_id):
            notify_runnable(conn)


_NEXT_DUE = sa.text(
    f"""
SELECT extract(epoch FROM min(run_after) - {_NOW}) FROM onceflow_instances
WHERE status IN ({_RUNNABLE}) AND run_after <> 'infinity'
"""
)


def seconds_until_next_due(engine: Engine, now: datetime | None) -> float | None:
    """Seconds until the earliest timer (sleep, retry delay, event timeout) falls due."""
    with engine.connect() as conn:
        value = conn.execute(_NEXT_DUE, {"now": now}).scalar()
    return None if value is None else float(value)
