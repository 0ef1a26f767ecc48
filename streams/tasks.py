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
from sqlalchemy.engine import Engine

from streams.metrics import TASKS
from workflow_engine.definitions import TaskDef, get_task
from workflow_engine.errors import NonRetryableError
from workflow_engine.store.task_runs import PendingTask, record_attempt

log = logging.getLogger(__name__)


def run_task(
    engine: Engine,
    pending: PendingTask,
    dead_letter: Callable[[str, str], None],
    with_db_retry: Callable[..., Any],
) -> str:
    """Run one task to success or the dead-letter topic; return the outcome."""
    definition: TaskDef | None = get_task(pending.task)
    if definition is None:  # unregistered since it was accepted: nothing can run it here
        return _give_up(
            engine, pending, f"unknown task {pending.task!r}", dead_letter, with_db_retry
        )
    attempt = pending.attempts
    while True:
        attempt += 1
        try:
            value = _call(definition.fn, pending.params)
            encoded = orjson.dumps(value)
        except Exception as exc:
            error = f"{type(exc).__name__}: {exc}"[:2000]
            final = isinstance(exc, NonRetryableError | TypeError) or (
                attempt > definition.max_retries
            )
            if final:
                reason = f"task {pending.task!r} failed after {attempt} attempt(s): {error}"
                return _give_up(engine, pending, reason, dead_letter, with_db_retry)
            with_db_retry(record_attempt, engine, pending.job_id, "retry", None, error)
            TASKS.labels(pending.task, "retry").inc()
            log.warning(
                "task attempt %d failed: %s",
                attempt,
                error,
                extra={
                    "event": "task.retry",
                    "job_id": pending.job_id,
                    "task": pending.task,
                    "attempt": attempt,
                },
            )
            time.sleep(definition.delay)
            continue
        with_db_retry(record_attempt, engine, pending.job_id, "succeeded", encoded, None)
        TASKS.labels(pending.task, "succeeded").inc()
        log.info(
            "task succeeded",
            extra={
                "event": "task.succeeded",
                "job_id": pending.job_id,
                "task": pending.task,
                "attempt": attempt,
            },
        )
        return "succeeded"


def _give_up(engine, pending, reason, dead_letter, with_db_retry) -> str:
    dead_letter(pending.job_id, reason)
    with_db_retry(record_attempt, engine, pending.job_id, "dead_lettered", None, reason)
    TASKS.labels(pending.task, "dead_lettered").inc()
    log.warning(
        "task dead-lettered: %s",
        reason,
        extra={"event": "task.dead_lettered", "job_id": pending.job_id, "task": pending.task},
    )
    return "dead_lettered"


def _call(fn: Callable[[dict[str, Any]], Any], params: dict[str, Any]) -> Any:
    if inspect.iscoroutinefunction(fn):
        return asyncio.run(fn(params))
    return fn(params)
