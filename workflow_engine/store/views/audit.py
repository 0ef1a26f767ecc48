"""The database side of ``onceflow audit``: which job ids became what.

The audit (``onceflow_cli.audit``) reads the topics itself and compares them with
these sets; a job id in both sets is one job that became two things.
"""

from __future__ import annotations

from dataclasses import dataclass

import sqlalchemy as sa
from sqlalchemy.engine import Engine

from onceflow.vocabulary import Origin


@dataclass(frozen=True, slots=True)
class StoredJobIds:
    """The job ids that have a workflow instance, and those that have a task run."""

    instances: frozenset[str]
    task_runs: frozenset[str]
    #: Instances no record of the topic asked for: a schedule's ticks, parents' children,
    #: batch runs (their members each have their record).
    started_inside: frozenset[str] = frozenset()

    @property
    def all(self) -> frozenset[str]:
        return self.instances | self.task_runs

    @property
    def doubled(self) -> frozenset[str]:
        """Job ids with both an instance and a task run (must be none)."""
        return self.instances & self.task_runs


_INSTANCE_IDS = sa.text("SELECT job_id FROM onceflow_instances")
_TASK_RUN_IDS = sa.text("SELECT job_id FROM onceflow_task_runs")
_INSIDE_IDS = sa.text(
    "SELECT job_id FROM onceflow_jobs WHERE origin IN (:schedule, :child, :batch)"
)


def stored_job_ids(db: Engine) -> StoredJobIds:
    """Both sets, read in one transaction (a consistent snapshot)."""
    with db.connect().execution_options(isolation_level="REPEATABLE READ") as conn:
        instances = conn.execute(_INSTANCE_IDS).scalars()
        instance_ids = frozenset(instances)
        tasks = conn.execute(_TASK_RUN_IDS).scalars()
        task_ids = frozenset(tasks)
        inside = conn.execute(
            _INSIDE_IDS,
            {
                "schedule": Origin.SCHEDULE.value,
                "child": Origin.CHILD.value,
                "batch": Origin.BATCH.value,
            },
        ).scalars()
        inside_ids = frozenset(inside) & instance_ids
    return StoredJobIds(instance_ids, task_ids, inside_ids)


_MISMATCH_IDS = sa.text(
    "SELECT DISTINCT job_id FROM onceflow_duplicate_deliveries WHERE workflow_match IS FALSE"
)


def workflow_mismatch_job_ids(db: Engine) -> frozenset[str]:
    """Job ids delivered again under another workflow (or task) type: the first type
    won and the other delivery started nothing - reported, not a violation."""
    with db.connect() as conn:
        rows = conn.execute(_MISMATCH_IDS)
        return frozenset(rows.scalars())
