"""The frequent lease-guarded writes of the engine runner, batched.

The checkpoint writes (step started, step checkpoint, instance finished, heartbeat;
:mod:`workflow_engine.store.writes`) of many instances are applied by
:func:`write_batch` in one transaction, one multi-row statement per class of write.
Claiming is :mod:`workflow_engine.store.writes.claim`; the rare one-round-trip writes (sleeps,
event waits, markers, suspension) are :mod:`workflow_engine.store.writes.waits`.

All writes on behalf of a running instance are guarded by its lease: they lock the
instance row (``FOR SHARE``) and check ``lease_owner`` and ``claim_count`` (the
write's :class:`~workflow_engine.store.writes.Lease`), so neither an engine whose lease
was taken over nor an older run of a re-claimed instance can write a checkpoint.
"""

from __future__ import annotations

import re
from collections.abc import Callable, Sequence
from datetime import datetime
from typing import Any, cast

import orjson
import sqlalchemy as sa
from sqlalchemy.engine import Engine
from sqlalchemy.exc import IntegrityError

from onceflow.storable import storable_text
from onceflow.vocabulary import (
    AttemptOutcome,
    InstanceStatus,
    LifecycleEvent,
    StepStatus,
)
from workflow_engine.errors import (
    ControlRequested,
    DatabaseRefused,
    DeadlinePassed,
    LeaseLost,
    NonDeterminismError,
    StepResultError,
)
from workflow_engine.store.commands import (
    Answer,
    AppendValue,
    Chain,
    FinishInstance,
    FinishStep,
    Heartbeat,
    Started,
    StartStep,
    Write,
)
from workflow_engine.store.db import constraint_of, is_row_at_fault, refusal, retry_on_deadlock
from workflow_engine.store.fragments import held
from workflow_engine.store.fragments import json_text as _json_text
from workflow_engine.store.lifecycle import EVENTS_ON, LARGE_EXTRA_BYTES, ONE_EVENT, outbox_insert
from workflow_engine.store.prepared import execute_prepared
from workflow_engine.store.writes import children, stream_values

# --- lease-guarded writes, batched -------------------------------------------------
#
# The runner sends the checkpoint writes of all its in-flight instances through its
# group-commit writer (:mod:`workflow_engine.engine.batcher`), which applies everything pending
# in ONE transaction: one multi-row statement per class of write, one commit. Each
# instance has at most one write pending, so the rows of one batch never collide, nor
# do those of two batches in flight; the heartbeat, which touches every leased row,
# runs in a batch of its own, so an engine's own transactions never lock its instance
# rows in conflicting orders.

# One primary-key probe per job id of the batch, whatever the table's size and
# statistics: a lock inside a LATERAL subquery keeps the planner from flattening it into
# a join, which it may cost from stale estimates as a scan of every running (or every)
# instance per batch (tests/integration/test_engine_plans.py).
_LEASE_OF_INPUT = f"""
lease AS (
    SELECT l.* FROM input CROSS JOIN LATERAL (
        SELECT i.job_id, i.requested_action, i.workflow, i.version, i.event_seq, i.status,
               coalesce(i.deadline <= now(), false) AS overdue, i.run
        FROM onceflow_instances i
        WHERE i.job_id = input.job_id AND {held("i", "input.claim")}
        FOR SHARE OF i
    ) l
)"""

# Step events (step.completed, step.retrying, step.failed), one per checkpoint written.
# The instance rows are already locked FOR SHARE by the lease CTE, in this statement:
# the bump upgrades this transaction's own lock (no other transaction holds one that
# conflicts: an instance has one write pending at a time, and every other actor that
# locks the row, an operator, a finishing child, send_event, the worker's duplicate
# flags, takes FOR UPDATE, which the share lock already conflicted with). With events
# off, the bump selects nothing and no row is updated.
#
# A checkpoint whose instance finishes in the same transaction (a Chain ending in
# FinishInstance, ``deferred``) takes its number without the UPDATE: the row read under
# the lease's share lock, which no other transaction's bump can pass until this one
# commits, and the finish, next in this transaction, bumps the counter past both events
# (``pending``): one row version for the two instead of two (``write_batch`` rolls the
# batch back if that finish did not apply).
_BUMP_STEPPED = f"""
    UPDATE onceflow_instances i SET event_seq = i.event_seq + 1
    FROM step JOIN input USING (job_id)
    WHERE i.job_id = step.job_id AND NOT input.deferred AND {EVENTS_ON}
    RETURNING i.job_id, i.workflow, i.version, i.event_seq AS seq, i.status, i.run"""

_NUMBERED_STEPS = f"""
    SELECT * FROM bumped
    UNION ALL
    SELECT lease.job_id, lease.workflow, lease.version, lease.event_seq + 1, lease.status,
           lease.run
    FROM step JOIN input USING (job_id) JOIN lease USING (job_id)
    WHERE input.deferred AND {EVENTS_ON}"""

_STEP_EVENTS = outbox_insert(
    "(SELECT b.*, step.position, step.name, input.attempt, input.outcome, input.error"
    " FROM numbered b JOIN step USING (job_id) JOIN input USING (job_id))",
    f"CASE e.outcome WHEN '{AttemptOutcome.COMPLETE}' THEN '{LifecycleEvent.STEP_COMPLETED}'"
    f" WHEN '{AttemptOutcome.RETRY}' THEN '{LifecycleEvent.STEP_RETRYING}'"
    f" ELSE '{LifecycleEvent.STEP_FAILED}' END",
    "jsonb_build_object('step', jsonb_build_object("
    "'position', e.position, 'name', e.name, 'attempt', e.attempt))"
    f" || CASE WHEN e.outcome = '{AttemptOutcome.COMPLETE}' THEN '{{}}'::jsonb"
    " ELSE jsonb_build_object('error', e.error) END",
)

# instance.complete (with the result as stored) or instance.errored (with the error).
_FINISH_EVENTS = outbox_insert(
    "done",
    "'instance.' || e.status",
    f"CASE WHEN e.status = '{InstanceStatus.COMPLETE}' THEN jsonb_build_object('result', e.result)"
    " ELSE jsonb_build_object('error', e.error) END"
    # the time limit that errored it (timed_out), if one did
    " || CASE WHEN e.timeout_kind IS NULL THEN '{}'::jsonb"
    " ELSE jsonb_build_object('timeout', e.timeout_kind) END",
    large=f"coalesce(pg_column_size(e.result), 0) > {LARGE_EXTRA_BYTES}",
)

_START_STEPS = sa.text(
    f"""
WITH input AS (
    SELECT * FROM unnest(CAST(:job_ids AS text[]), CAST(:claims AS int[]),
                         CAST(:positions AS int[]), CAST(:names AS text[]))
        AS t(job_id, claim, position, name)
),
{_LEASE_OF_INPUT},
step AS (
    INSERT INTO onceflow_steps AS s (job_id, position, name, status, attempts)
    SELECT input.job_id, input.position, input.name, '{StepStatus.RUNNING}', 1
    FROM input JOIN lease USING (job_id)
    -- an operator's request, or the execution deadline passed (migration 0023): the
    -- step does not start; the run stops at this boundary
    WHERE lease.requested_action IS NULL AND NOT lease.overdue
    ON CONFLICT ON CONSTRAINT onceflow_steps_pkey DO UPDATE
        SET attempts = s.attempts + 1, status = '{StepStatus.RUNNING}', error = NULL,
            finished_at = NULL
        WHERE s.name = EXCLUDED.name AND s.status <> '{StepStatus.COMPLETE}'
    RETURNING s.job_id, s.position, s.attempts, s.attempts - s.retry_base AS tries
),
abandoned AS (
    UPDATE onceflow_step_attempts a
    SET outcome = '{AttemptOutcome.ABANDONED}', finished_at = now()
    FROM step
    -- only a step started before can have an attempt its crashed engine left open
    WHERE step.attempts > 1
      AND a.job_id = step.job_id AND a.position = step.position AND a.finished_at IS NULL
),
attempt AS (
    INSERT INTO onceflow_step_attempts (job_id, position, attempt, engine_id)
    SELECT job_id, position, attempts, :owner FROM step
    RETURNING job_id, attempt, started_at
)
SELECT input.job_id, attempt.attempt, attempt.started_at, lease.requested_action,
       lease.job_id IS NOT NULL, step.tries, lease.overdue
FROM input LEFT JOIN lease USING (job_id) LEFT JOIN attempt USING (job_id)
     LEFT JOIN step USING (job_id)
"""
)

_FINISH_STEPS = sa.text(
    f"""
WITH input AS (
    SELECT * FROM unnest(CAST(:job_ids AS text[]), CAST(:claims AS int[]),
                         CAST(:positions AS int[]), CAST(:attempts AS int[]),
                         CAST(:started AS timestamptz[]), CAST(:statuses AS text[]),
                         CAST(:outcomes AS text[]), CAST(:results AS text[]),
                         CAST(:errors AS text[]), CAST(:deferred AS boolean[]))
        AS t(job_id, claim, position, attempt, started_at, status, outcome, result, error,
             deferred)
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
    RETURNING s.job_id, s.position, s.name
),
attempt AS (
    UPDATE onceflow_step_attempts a
    SET outcome = input.outcome, error = input.error, finished_at = now()
    FROM input JOIN step USING (job_id)
    -- started_at is the partition key: the update reads the attempt's partition only
    WHERE a.started_at = input.started_at
      AND a.job_id = input.job_id AND a.position = input.position AND a.attempt = input.attempt
),
bumped AS ({_BUMP_STEPPED}
),
numbered AS ({_NUMBERED_STEPS}
),
step_events AS ({_STEP_EVENTS}
)
SELECT job_id FROM step
"""
)

_FINISH_INSTANCES = sa.text(
    f"""
WITH input AS (
    SELECT * FROM unnest(CAST(:job_ids AS text[]), CAST(:claims AS int[]),
                         CAST(:statuses AS text[]), CAST(:results AS text[]),
                         CAST(:errors AS text[]), CAST(:failed_positions AS int[]),
                         CAST(:pending AS int[]), CAST(:timeouts AS text[]))
        AS t(job_id, claim, status, result, error, failed_position, pending, timeout)
),
done AS (
    UPDATE onceflow_instances i
    SET status = input.status, result = CAST(input.result AS jsonb), error = input.error,
        failed_position = input.failed_position, timeout_kind = input.timeout,
        finished_at = now(), updated_at = now(), lease_owner = NULL, lease_expires_at = NULL,
        -- a request that reached the run after its last step is void: the work is done,
        -- and a finished instance carries no request (it would never be applied)
        requested_action = NULL,
        -- pending: the deferred step event of this transaction (_BUMP_STEPPED)
        event_seq = i.event_seq + ({ONE_EVENT}) * (1 + input.pending)
    FROM input
    WHERE i.job_id = input.job_id AND {held("i", "input.claim")}
    RETURNING i.job_id, i.parent_job_id, i.workflow, i.version, i.event_seq AS seq, i.status,
              i.run, i.result, i.error, i.timeout_kind
),
finish_events AS ({_FINISH_EVENTS}
)
SELECT job_id, parent_job_id FROM done
"""
)

_HEARTBEAT = sa.text(
    f"""
UPDATE onceflow_instances i SET lease_expires_at = now() + make_interval(secs => :lease)
FROM unnest(CAST(:ids AS text[]), CAST(:claims AS int[])) AS input(job_id, claim)
WHERE i.job_id = input.job_id AND {held("i", "input.claim")}
RETURNING i.job_id, i.claim_count
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
    rows = execute_prepared(
        conn,
        _START_STEPS,
        {
            "owner": owner,
            "job_ids": [w.job_id for w in writes],
            "claims": [w.claim for w in writes],
            "positions": [w.position for w in writes],
            "names": [w.name for w in writes],
        },
    )
    found = {job_id: rest for job_id, *rest in rows}
    return [_start_answer(w, *found[w.job_id]) for w in writes]


def _start_answer(
    w: StartStep,
    attempt: int | None,
    at: datetime | None,
    action: str | None,
    leased: bool,
    tries: int | None,
    overdue: bool | None,
) -> Answer:
    if not leased:
        return LeaseLost(f"lease on {w.job_id} lost before step {w.name!r}")
    if action is not None:
        return ControlRequested(action)
    if overdue:
        return DeadlinePassed(f"execution deadline passed before step {w.name!r}")
    if attempt is None or at is None:
        return NonDeterminismError(
            f"step {w.name!r} at position {w.position} does not match history"
        )
    return Started(int(attempt), at, int(tries if tries is not None else attempt))


def _guarded(
    conn: sa.Connection,
    sql: sa.TextClause,
    params: dict[str, Any],
    job_ids: list[str],
    lost: list[str],
) -> list[Answer]:
    """Run a batched guarded write returning the job ids it wrote; a write whose row
    was not written lost its lease (``lost`` says what it could not do)."""
    written = set(execute_prepared(conn, sql, {"job_ids": job_ids, **params}).scalars())
    return [
        None if job in written else LeaseLost(why) for job, why in zip(job_ids, lost, strict=True)
    ]


def _finish_steps(
    conn: sa.Connection, owner: str, writes: list[FinishStep], deferred: Sequence[bool] = ()
) -> list[Answer]:
    """``deferred``: per write, whether its instance's finish follows in this transaction
    and bumps the event counter for both (``_BUMP_STEPPED``)."""
    params = {
        "deferred": list(deferred) or [False] * len(writes),
        "owner": owner,
        "claims": [w.claim for w in writes],
        "positions": [w.position for w in writes],
        "attempts": [w.attempt for w in writes],
        "started": [w.started_at for w in writes],
        "statuses": [_STEP_STATUS[w.outcome].value for w in writes],
        "outcomes": [w.outcome.value for w in writes],
        "results": [_json_text(w.result) for w in writes],
        "errors": [_error_text(w.error) for w in writes],
    }
    lost = [f"lease on {w.job_id} lost before checkpointing step {w.position}" for w in writes]
    return _guarded(conn, _FINISH_STEPS, params, [w.job_id for w in writes], lost)


def _finish_instances(
    conn: sa.Connection, owner: str, writes: list[FinishInstance], pending: Sequence[int] = ()
) -> list[Answer]:
    """``pending``: per write, the events its checkpoint wrote in this transaction without
    bumping the counter (0 or 1, ``_BUMP_STEPPED``)."""
    params = {
        "pending": list(pending) or [0] * len(writes),
        "owner": owner,
        "claims": [w.claim for w in writes],
        "statuses": [w.status.value for w in writes],
        "results": [_json_text(w.result) for w in writes],
        "errors": [_error_text(w.error) for w in writes],
        "failed_positions": [w.failed_position for w in writes],
        "timeouts": [w.timeout.value if w.timeout else None for w in writes],
    }
    job_ids = [w.job_id for w in writes]
    rows = execute_prepared(conn, _FINISH_INSTANCES, {"job_ids": job_ids, **params}).all()
    # Children finished here: wake their parents that await them, in this transaction.
    children.wake_parents(conn, [(parent, job) for job, parent in rows if parent is not None])
    written = {job_id for job_id, _ in rows}
    return [
        None
        if w.job_id in written
        else LeaseLost(f"lease on {w.job_id} lost before it could be marked {w.status}")
        for w in writes
    ]


def _error_text(error: str | None) -> str | None:
    """An error as the ``error`` columns can hold it: the workflow's or step's own
    message, which may carry a NUL or a lone surrogate the driver refuses outright (no
    SQLSTATE): written as given, the finish failed on every claim of its instance."""
    return None if error is None else storable_text(error)


def _heartbeats(conn: sa.Connection, owner: str, writes: list[Heartbeat]) -> list[Answer]:
    answers: list[Answer] = []
    for w in writes:
        if not w.held:
            answers.append(frozenset())
            continue
        params = {
            "owner": owner,
            "ids": [job_id for job_id, _ in w.held],
            "claims": [claim for _, claim in w.held],
            "lease": w.lease_seconds,
        }
        answers.append(
            frozenset((job, claim) for job, claim in execute_prepared(conn, _HEARTBEAT, params))
        )
    return answers


_Apply = Callable[[sa.Connection, str, list[Any]], list[Answer]]
_APPLY: dict[type[Write[Any]], _Apply] = {
    Heartbeat: _heartbeats,
    StartStep: _start_steps,
    FinishStep: _finish_steps,
    FinishInstance: _finish_instances,
    AppendValue: stream_values.append_values,
}


@retry_on_deadlock
def write_batch(db: Engine, owner: str, writes: Sequence[Write[Any]]) -> list[Answer]:
    """Apply lease-guarded writes of several instances in one transaction.

    A batch PostgreSQL picks as a deadlock's victim was rolled back, so it runs again
    (``retry_on_deadlock``) instead of failing every run it carries: treated as a lost
    connection, its runs would be given back and their held checkpoints' steps run
    again.

    Returns one answer per write, in order: its value, or the exception it should raise
    in its instance (``LeaseLost``, ``ControlRequested``, ``NonDeterminismError``).
    A database error aborts the whole batch and propagates; :func:`write_each` then
    isolates the write that caused it.

    Two phases: every checkpoint (plain ``FinishStep`` writes and the heads of
    :class:`Chain` writes, one statement) first, then everything else, one statement per
    class; the second half of a chain whose checkpoint could not apply is skipped, so a
    lost lease never finishes an instance whose last step was not recorded.
    """
    answers: list[Answer] = [None] * len(writes)
    with db.begin() as conn:
        heads = [
            (i, w.first if isinstance(w, Chain) else w)
            for i, w in enumerate(writes)
            if isinstance(w, Chain | FinishStep)
        ]
        if heads:
            deferred = [_finishes(writes[i]) for i, _ in heads]
            applied = _finish_steps(conn, owner, [w for _, w in heads], deferred)
            for (index, _), answer in zip(heads, applied, strict=True):
                answers[index] = answer
        rest: dict[type[Write[Any]], list[tuple[int, Write[Any]]]] = {}
        for index, write in enumerate(writes):
            if isinstance(write, Chain) and answers[index] is None:
                rest.setdefault(type(write.then), []).append((index, write.then))
            elif not isinstance(write, Chain | FinishStep):
                rest.setdefault(type(write), []).append((index, write))
        for cls, items in rest.items():
            if cls is FinishInstance:
                applied = _finish_chained(conn, owner, writes, items)
            else:
                applied = _APPLY[cls](conn, owner, [w for _, w in items])
            for (index, _), answer in zip(items, applied, strict=True):
                answers[index] = answer
    return answers


def _finishes(write: Write[Any]) -> bool:
    """A chain whose checkpoint's event is numbered by its instance's finish."""
    return isinstance(write, Chain) and isinstance(write.then, FinishInstance)


def _finish_chained(
    conn: sa.Connection,
    owner: str,
    writes: Sequence[Write[Any]],
    items: list[tuple[int, Write[Any]]],
) -> list[Answer]:
    """The finishes of a batch, those after their checkpoint bumping the counter for its
    event too. A finish that did not apply after a checkpoint that did (it cannot: the
    checkpoint's statement holds the row under the same lease) would leave that event's
    number unreserved: the batch is rolled back instead, and applied one by one."""
    pending = [1 if _finishes(writes[i]) else 0 for i, _ in items]
    applied = _finish_instances(conn, owner, [cast(FinishInstance, w) for _, w in items], pending)
    if any(n and a is not None for n, a in zip(pending, applied, strict=True)):
        raise RuntimeError("an instance's finish did not apply after its checkpoint")
    return applied


def write_each(db: Engine, owner: str, writes: Sequence[Write[Any]]) -> list[Answer]:
    """Apply writes one transaction each (after a batch failed): one bad write (a step
    name used twice in a run, a value the database refuses) fails only its own
    instance. A chain's checkpoint commits on its own first, so the step it records
    stays recorded even when what follows it is refused."""
    answers: list[Answer] = []
    for write in writes:
        if isinstance(write, Chain):
            head = _apply_one(db, owner, write.first)
            answers.append(head if head is not None else _after_checkpoint(db, owner, write))
        else:
            answers.append(_apply_one(db, owner, write))
    return answers


def _after_checkpoint(db: Engine, owner: str, chain: Chain[Any]) -> Answer:
    """The second half of a chain whose checkpoint committed: a refusal says so, so the
    instance knows its last step stays recorded."""
    answer = _apply_one(db, owner, chain.then)
    if isinstance(answer, DatabaseRefused):
        return DatabaseRefused(str(answer), checkpoint_committed=True)
    return answer


def _apply_one(db: Engine, owner: str, write: Write[Any]) -> Answer:
    try:
        return write_batch(db, owner, [write])[0]
    except Exception as exc:
        return error_answer(write, exc)


def error_answer(write: Write[Any], exc: BaseException) -> Answer:
    """What a write that failed alone answers its instance. A step name used twice is
    the workflow's nondeterminism; what else the database refuses for good (by
    SQLSTATE: a value too large for its index, data it cannot store) fails the instance
    with the reason, once, instead of being taken for an outage (which gives the run
    back, to be claimed and refused again). Anything else (the database unreachable) is
    the error itself."""
    if isinstance(exc, IntegrityError):
        answer = _integrity_answer(write, exc)
        if answer is not exc:
            return answer
    if is_row_at_fault(exc):
        return DatabaseRefused(f"the database refused {_what(write)}: {refusal(exc)}")
    return exc


def _integrity_answer(write: Write[Any], exc: IntegrityError) -> Answer:
    if constraint_of(exc) == "onceflow_steps_name_key":
        name = write.name if isinstance(write, StartStep) else "?"
        return NonDeterminismError(f"step name {name!r} is used twice in one workflow run")
    return exc


def _what(write: Write[Any]) -> str:
    """The refused write, for its instance's error (a name cut short: it may be huge)."""
    match write:
        case StartStep(position=position, name=name):
            shown = name if len(name) <= 60 else f"{name[:60]}... ({len(name)} characters)"
            return f"the start of step {shown!r} at position {position}"
        case FinishStep(position=position):
            return f"the checkpoint of the step at position {position}"
        case FinishInstance(status=status):
            return f"the instance's final status ({status})"
        case AppendValue(stream=stream):
            return f"a value emitted to stream {stream!r}"
        case _:
            return f"a write ({type(write).__name__})"


def encode_result(value: Any, max_bytes: int) -> bytes:
    """JSON-encode a step or workflow result, enforcing the size bound."""
    try:
        data = orjson.dumps(value)
    except TypeError as exc:
        raise StepResultError(f"result is not JSON-serialisable: {exc}") from None
    if len(data) > max_bytes:
        raise StepResultError(f"result is {len(data)} bytes, over the {max_bytes}-byte limit")
    if b"\\u0000" in data and _NUL_ESCAPE.search(data):
        # PostgreSQL's jsonb cannot store U+0000; refused here, as a clear step error,
        # instead of failing the checkpoint (and every replay's) in the database.
        raise StepResultError("result contains a NUL character (\\u0000), which cannot be stored")
    return data


#: ``\u0000`` escaped by the JSON encoder (an odd run of backslashes before ``u0000``;
#: an even run is a literal backslash followed by the text "u0000").
_NUL_ESCAPE = re.compile(rb"(?<!\\)(?:\\\\)*\\u0000")
