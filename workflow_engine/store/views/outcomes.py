"""How jobs ended, or that they have not yet: what a start-and-wait caller is answered
(``Prefer: wait``, ``GET /v1/jobs/{job_id}/result``; producers/waiters.py).

One statement for many job ids: the waiting requests of one ingest process share it
(their reads are batched), so 2,000 callers waiting at once cost a few short queries,
not 2,000 connections.
"""

from __future__ import annotations

from collections.abc import Sequence
from dataclasses import dataclass
from datetime import datetime
from typing import Any

import sqlalchemy as sa
from sqlalchemy.engine import Engine

from onceflow.vocabulary import TERMINAL_STATUSES, JobKind, TaskRunStatus

_TASK_FINAL = frozenset({TaskRunStatus.SUCCEEDED, TaskRunStatus.DEAD_LETTERED})


@dataclass(frozen=True, slots=True)
class JobOutcome:
    """A job's status as far as a waiting caller cares: the fields of
    ``GET /v1/jobs/{job_id}``'s body that say how it ended (same names, same values)."""

    job_id: str
    kind: JobKind
    #: The workflow's (or the plain task's) name.
    workflow: str
    status: str
    result: Any = None
    error: str | None = None
    version: str | None = None
    finished_at: datetime | str | None = None
    #: ``onceflow_instances.restart_count`` (0 for a task run or an outcome read from an
    #: event): above 0, a final event of an earlier run may still be delivered (the
    #: relay publishes at least once), so a waiter checks a final event against the
    #: status instead of taking its data (producers/waiters.py). Not part of the body.
    restarts: int = 0
    #: The instance's run (id reuse, migration 0027; 1 for a task run). In the body.
    run: int = 1

    @property
    def final(self) -> bool:
        """It will not change again (short of an operator's ``restart``)."""
        if self.kind is JobKind.TASK:
            return self.status in _TASK_FINAL
        return self.status in TERMINAL_STATUSES

    def to_dict(self) -> dict[str, Any]:
        doc: dict[str, Any] = {
            "kind": str(self.kind),
            "job_id": self.job_id,
            "workflow": self.workflow,
            "status": self.status,
            "result": self.result,
            "error": self.error,
            "version": self.version,
            "finished_at": self.finished_at,
            "run": self.run,
        }
        if self.kind is JobKind.TASK:
            doc["task"] = doc.pop("workflow")
            del doc["result"], doc["version"], doc["run"]
        return doc


# Both tables in one round trip; a job id is one or the other (onceflow_jobs.kind).
_OUTCOMES = sa.text(
    """
SELECT i.job_id, 'workflow' AS kind, i.workflow, i.status, i.result, i.error, i.version,
       -- a later run, like a restart: an earlier run's final event may still come
       i.finished_at, i.restart_count + i.run - 1 AS restart_count, i.run
FROM onceflow_instances i WHERE i.job_id = ANY(:ids)
UNION ALL
SELECT t.job_id, 'task', t.task, t.status, NULL, t.error, NULL, t.finished_at, 0, 1
FROM onceflow_task_runs t WHERE t.job_id = ANY(:ids)
"""
)


def job_outcomes(db: Engine, job_ids: Sequence[str]) -> dict[str, JobOutcome]:
    """The outcome of each of ``job_ids`` that has an instance or a task run (an id
    still in the queue, or unknown, is absent). One short statement; the connection
    goes back to the pool at once."""
    if not job_ids:
        return {}
    with db.connect() as conn:
        rows = conn.execute(_OUTCOMES, {"ids": list(job_ids)}).all()
    return {
        r.job_id: JobOutcome(
            r.job_id,
            JobKind(r.kind),
            r.workflow,
            r.status,
            r.result,
            r.error,
            r.version,
            r.finished_at,
            r.restart_count,
            r.run,
        )
        for r in rows
    }
