"""Retention and figures that need a query (run periodically by every engine).

Pruning takes a transaction-level advisory lock with ``pg_try_advisory_xact_lock`` so
only one engine prunes at a time; the others skip that round.
"""

from __future__ import annotations

from dataclasses import dataclass

import sqlalchemy as sa
from sqlalchemy.engine import Engine

from onceflow.vocabulary import (
    RUNNABLE_STATUSES,
    TERMINAL_STATUSES,
    InstanceStatus,
    TaskRunStatus,
)

PRUNE_LOCK_KEY = 0x0CEF_2000


def prune(engine: Engine, instance_seconds: float, job_id_seconds: float) -> dict[str, int]:
    """Delete finished instances past retention, then job-id records past theirs.

    A job-id record outlives its instance so that a late duplicate still collapses;
    it is never deleted while its instance (or task run) exists.
    """
    with engine.begin() as conn:
        if not conn.execute(
            sa.text("SELECT pg_try_advisory_xact_lock(:k)"), {"k": PRUNE_LOCK_KEY}
        ).scalar():
            return {}
        instances = conn.execute(
            sa.text(
                "DELETE FROM onceflow_instances"
                " WHERE status = ANY(:terminal)"
                " AND finished_at < now() - make_interval(secs => :s)"
            ),
            {"s": instance_seconds, "terminal": sorted(TERMINAL_STATUSES)},
        ).rowcount
        tasks = conn.execute(
            sa.text(
                "DELETE FROM onceflow_task_runs WHERE status <> :pending"
                " AND finished_at < now() - make_interval(secs => :s)"
            ),
            {"s": instance_seconds, "pending": str(TaskRunStatus.PENDING)},
        ).rowcount
        job_ids = conn.execute(
            sa.text(
                "DELETE FROM onceflow_jobs j"
                " WHERE j.received_at < now() - make_interval(secs => :s)"
                " AND NOT EXISTS (SELECT 1 FROM onceflow_instances i WHERE i.job_id = j.job_id)"
                " AND NOT EXISTS (SELECT 1 FROM onceflow_task_runs t WHERE t.job_id = j.job_id)"
            ),
            {"s": max(job_id_seconds, instance_seconds)},
        ).rowcount
    return {"instances": instances, "task_runs": tasks, "job_ids": job_ids}


@dataclass(frozen=True, slots=True)
class StatusCounts:
    """Instances per (workflow, status), and how many are due to run now."""

    by_workflow_status: dict[tuple[str, InstanceStatus], int]
    runnable_due: int


def status_counts(engine: Engine) -> StatusCounts:
    with engine.connect() as conn:
        counts = conn.execute(
            sa.text("SELECT workflow, status, count(*) FROM onceflow_instances GROUP BY 1, 2")
        ).all()
        backlog = conn.execute(
            sa.text(
                "SELECT count(*) FROM onceflow_instances"
                " WHERE status = ANY(:runnable) AND run_after <= now()"
            ),
            {"runnable": sorted(RUNNABLE_STATUSES)},
        ).scalar()
    return StatusCounts(
        {(workflow, InstanceStatus(status)): n for workflow, status, n in counts}, backlog or 0
    )
