"""Running plain queue tasks inside the streams worker ("don't orchestrate the trivial").

A task runs in a worker thread, within the batch that delivered it, so its record's
offset is committed only after the task succeeded or was dead-lettered. Failures are
retried ``max_retries`` times, ``delay`` seconds apart (the queue's own retries); then
the record goes to the dead-letter topic with the reason in its headers.
"""

from __future__ import annotations

import asyncio
import inspect
import logging
import time
from collections.abc import Callable
from typing import Any

import orjson
import sqlalchemy.exc as sa_exc
from sqlalchemy.engine import Engine

from onceflow.storable import storable_text
from onceflow.vocabulary import DeadLetterReason, TaskRunStatus
from streams.metrics import TASKS
from workflow_engine.errors import NonRetryableError
from workflow_engine.model import TaskDef
from workflow_engine.store import refusal
from workflow_engine.store.writes import RETRY, PendingTask, record_attempt

log = logging.getLogger(__name__)


def run_task(
    db: Engine,
    definition: TaskDef | None,
    pending: PendingTask,
    dead_letter: Callable[[str, DeadLetterReason, str], None],
    with_db_retry: Callable[..., Any],
) -> str:
    """Run one task (``definition``: its registered definition, None if there is none)
    to success or the dead-letter topic; return the outcome."""
    if definition is None:  # unregistered since it was accepted: nothing can run it here
        unknown = (DeadLetterReason.UNKNOWN_TYPE, f"unknown task {pending.task!r}")
        return _give_up(db, pending, pending.attempts + 1, unknown, dead_letter, with_db_retry)
    attempt = pending.attempts
    while True:
        attempt += 1
        try:
            encoded = orjson.dumps(_call(definition.fn, pending.params))
        except Exception as exc:
            error = storable_text(f"{type(exc).__name__}: {exc}")[:2000]
            final = isinstance(exc, NonRetryableError | TypeError) or (
                attempt > definition.max_retries
            )
            if final:
                detail = f"task {pending.task!r} failed after {attempt} attempt(s): {error}"
                failed = (DeadLetterReason.TASK_FAILED, detail)
                return _give_up(db, pending, attempt, failed, dead_letter, with_db_retry)
            with_db_retry(record_attempt, db, pending.job_id, attempt, RETRY, None, error)
            _report(pending, attempt, RETRY, error)
            time.sleep(definition.delay)
            continue
        succeeded = TaskRunStatus.SUCCEEDED
        try:
            with_db_retry(record_attempt, db, pending.job_id, attempt, succeeded, encoded, None)
        except sa_exc.DBAPIError as exc:
            # Refused for good (with_db_retry retries the rest): a result jsonb cannot
            # hold, say. Raised from here it stopped the batch, and every restart ran
            # the task again; dead-lettered, the partition moves on.
            detail = f"task {pending.task!r} ran, but the database refused its result: "
            refused = (DeadLetterReason.DATABASE_REFUSED, detail + refusal(exc))
            return _give_up(db, pending, attempt, refused, dead_letter, with_db_retry)
        _report(pending, attempt, succeeded)
        return succeeded


def _report(pending: PendingTask, attempt: int, outcome: str, error: str | None = None) -> None:
    TASKS.labels(pending.task, outcome).inc()
    extra = {
        "event": f"task.{outcome}",
        "job_id": pending.job_id,
        "task": pending.task,
        "attempt": attempt,
    }
    if error is None:
        log.info("task %s", outcome, extra=extra)
    else:
        log.warning("task attempt %d failed: %s", attempt, error, extra=extra)


def _give_up(
    db, pending, attempt: int, why: tuple[DeadLetterReason, str], dead_letter, with_db_retry
) -> str:
    reason, detail = why
    dead_letter(pending.job_id, reason, detail)
    dead = TaskRunStatus.DEAD_LETTERED
    with_db_retry(record_attempt, db, pending.job_id, attempt, dead, None, detail)
    TASKS.labels(pending.task, dead).inc()
    log.warning(
        "task dead-lettered: %s",
        detail,
        extra={
            "event": "task.dead_lettered",
            "job_id": pending.job_id,
            "task": pending.task,
            "reason": str(reason),
        },
    )
    return dead


def _call(fn: Callable[[dict[str, Any]], Any], params: dict[str, Any]) -> Any:
    if inspect.iscoroutinefunction(fn):
        return asyncio.run(fn(params))
    return fn(params)
