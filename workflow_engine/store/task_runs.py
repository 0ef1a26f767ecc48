"""Run records of plain queue tasks (single-step jobs run by the streams worker).

The job-id registry (``onceflow_jobs``) makes a task run at most once per job id, like
a workflow instance; its run record says whether it succeeded, so that a redelivered
task that already succeeded is not run again.
"""

from __future__ import annotations

from collections.abc import Sequence
from dataclasses import dataclass
from typing import Any

import sqlalchemy as sa
from sqlalchemy.engine import Engine

from onceflow.vocabulary import TaskRunStatus

#: The outcome :func:`record_attempt` takes for a failed attempt that will be retried.
RETRY = "retry"


@dataclass(frozen=True, slots=True)
class PendingTask:
    job_id: str
    task: str
    params: dict[str, Any]
    attempts: int


def pending(engine: Engine, job_ids: Sequence[str]) -> list[PendingTask]:
    """The task runs among ``job_ids`` that still have to run (new or interrupted)."""
    if not job_ids:
        return []
    with engine.connect() as conn:
        rows = conn.execute(
            sa.text(
                "SELECT job_id, task, params, attempts FROM onceflow_task_runs"
                " WHERE job_id = ANY(:ids) AND status = :pending ORDER BY job_id"
            ),
            {"ids": list(job_ids), "pending": str(TaskRunStatus.PENDING)},
        )
        return [PendingTask(*row) for row in rows]


def record_attempt(
    engine: Engine,
    job_id: str,
    attempt: int,
    outcome: str,
    result_json: bytes | None = None,
    error: str | None = None,
) -> None:
    """Record attempt number ``attempt``: :data:`RETRY` (stays pending), or the run's
    final :class:`TaskRunStatus` (succeeded or dead_lettered).

    Idempotent, since the worker runs it again when a connection drops with the commit's
    outcome unknown: a second run of the same attempt finds it recorded (``attempts``
    already at ``attempt``, or the run no longer pending) and changes nothing."""
    status = TaskRunStatus.PENDING if outcome == RETRY else TaskRunStatus(outcome)
    with engine.begin() as conn:
        conn.execute(
            sa.text(
                "UPDATE onceflow_task_runs SET attempts = :attempt, status = :status,"
                " result = CAST(:result AS jsonb), error = :error,"
                " finished_at = CASE WHEN :status = :pending THEN NULL ELSE now() END"
                " WHERE job_id = :job_id AND status = :pending AND attempts < :attempt"
            ),
            {
                "job_id": job_id,
                "attempt": attempt,
                "status": str(status),
                "pending": str(TaskRunStatus.PENDING),
                "error": error,
                "result": result_json.decode() if result_json is not None else None,
            },
        )
