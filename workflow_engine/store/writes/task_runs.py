"""Run records of plain queue tasks (single-step jobs run by the streams worker).

The job-id registry (``onceflow_jobs``) makes a task run at most once per job id, like
a workflow instance; its run record says whether it succeeded, so that a redelivered
task that already succeeded is not run again.

A dead-lettered run runs again only when it is re-driven: :func:`reopen` makes it
``pending`` (its attempts kept), and the re-driven record's delivery, which collapses on
the job id like any duplicate, then finds it pending and runs attempt ``attempts + 1``
(``store.redrives``). A plain redelivery of a dead-lettered task still runs nothing.
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


_PENDING = sa.text(
    "SELECT job_id, task, params, attempts FROM onceflow_task_runs"
    " WHERE job_id = ANY(:ids) AND status = :pending ORDER BY job_id"
)


def pending(db: Engine, job_ids: Sequence[str]) -> list[PendingTask]:
    """The task runs among ``job_ids`` that still have to run (new or interrupted)."""
    if not job_ids:
        return []
    with db.connect() as conn:
        rows = conn.execute(_PENDING, {"ids": list(job_ids), "pending": str(TaskRunStatus.PENDING)})
        return [PendingTask(*row) for row in rows]


@dataclass(frozen=True, slots=True)
class TaskRunState:
    """Where a task run stands: its status and the attempts it has made."""

    job_id: str
    task: str
    status: TaskRunStatus
    attempts: int


_STATES = sa.text(
    "SELECT job_id, task, status, attempts FROM onceflow_task_runs WHERE job_id = ANY(:ids)"
)


def states(db: Engine, job_ids: Sequence[str]) -> dict[str, TaskRunState]:
    """The task runs among ``job_ids``, by job id."""
    if not job_ids:
        return {}
    with db.connect() as conn:
        rows = conn.execute(_STATES, {"ids": list(job_ids)}).all()
    return {
        r.job_id: TaskRunState(r.job_id, r.task, TaskRunStatus(r.status), r.attempts) for r in rows
    }


_REOPEN = sa.text(
    "UPDATE onceflow_task_runs SET status = :pending, finished_at = NULL"
    " WHERE job_id = ANY(:ids) AND status = :dead"
    " RETURNING job_id, task, status, attempts"
)


def reopen(db: Engine, job_ids: Sequence[str]) -> dict[str, TaskRunState]:
    """Make the dead-lettered runs among ``job_ids`` pending again (a re-drive), their
    attempts and last error kept: the worker's next delivery of the job id runs attempt
    ``attempts + 1``. Returns the runs it reopened; one that was not dead-lettered is
    left as it is."""
    if not job_ids:
        return {}
    with db.begin() as conn:
        rows = conn.execute(
            _REOPEN,
            {
                "ids": sorted(set(job_ids)),
                "pending": str(TaskRunStatus.PENDING),
                "dead": str(TaskRunStatus.DEAD_LETTERED),
            },
        ).all()
    return {
        r.job_id: TaskRunState(r.job_id, r.task, TaskRunStatus(r.status), r.attempts) for r in rows
    }


# The guard (still pending, attempts below this one) makes a second run of the same
# attempt, after a commit whose outcome was unknown, change nothing.
_RECORD_ATTEMPT = sa.text(
    "UPDATE onceflow_task_runs SET attempts = :attempt, status = :status,"
    " result = CAST(:result AS jsonb), error = :error,"
    " finished_at = CASE WHEN :status = :pending THEN NULL ELSE now() END"
    " WHERE job_id = :job_id AND status = :pending AND attempts < :attempt"
)


def record_attempt(
    db: Engine,
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
    with db.begin() as conn:
        conn.execute(
            _RECORD_ATTEMPT,
            {
                "job_id": job_id,
                "attempt": attempt,
                "status": str(status),
                "pending": str(TaskRunStatus.PENDING),
                "error": error,
                "result": result_json.decode() if result_json is not None else None,
            },
        )
