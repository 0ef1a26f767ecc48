"""How jobs ended, or that they have not yet: what a start-and-wait caller is answered
(``Prefer: wait``, ``GET /v1/jobs/{job_id}/result``; producers/waiters.py).

One statement for many job ids: the waiting requests of one ingest process share it
(their reads are batched), so 2,000 callers waiting at once cost a few short queries,
not 2,000 connections.

A submission of a job id whose instance may start a new run (id reuse) is answered with
the run *its record* belongs to, not with whatever run the id has now: its record's Kafka
position (:class:`Record`) is looked up where the worker writes it down, as the record
that started a run (``onceflow_runs``), the id's creating record (``onceflow_jobs``) or
a duplicate (``onceflow_duplicate_deliveries``). Until the worker has done one of those,
the id's outcome is *pending* (never final): run 1 already complete says nothing of the
run this record may yet start.
"""

from __future__ import annotations

from collections.abc import Mapping, Sequence
from dataclasses import dataclass, replace
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
    #: The submission's record (:class:`Record`) is not yet written down by the worker:
    #: this outcome is of a run the record may not belong to (never final). Not in the body.
    pending: bool = False

    @property
    def final(self) -> bool:
        """It will not change again (short of an operator's ``restart``)."""
        if self.pending:
            return False
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


@dataclass(frozen=True, slots=True)
class Record:
    """Where a submission's record is in Kafka (what ingest's producer was told)."""

    topic: str
    partition: int
    offset: int


# Where the worker wrote each record down, if it has: the run it started (with that run's
# outcome once it is archived), the id's creating record (run 1), or a duplicate.
_RECORDS = sa.text(
    """
SELECT p.job_id, r.run, r.status, r.result, r.error, r.version, r.finished_at,
       EXISTS (SELECT 1 FROM onceflow_jobs j
               WHERE j.job_id = p.job_id
                 AND (j.source_topic, j.source_partition, j.source_offset)
                     = (p.topic, p.part, p.off)) AS creating,
       EXISTS (SELECT 1 FROM onceflow_duplicate_deliveries d
               WHERE d.job_id = p.job_id
                 AND (d.source_topic, d.source_partition, d.source_offset)
                     = (p.topic, p.part, p.off)) AS duplicate
FROM unnest(CAST(:ids AS text[]), CAST(:topics AS text[]), CAST(:parts AS int[]),
            CAST(:offs AS bigint[])) AS p(job_id, topic, part, off)
LEFT JOIN onceflow_runs r
       ON (r.source_topic, r.source_partition, r.source_offset) = (p.topic, p.part, p.off)
      AND r.job_id = p.job_id
"""
)


def job_outcomes(
    db: Engine, job_ids: Sequence[str], records: Mapping[str, Record] | None = None
) -> dict[str, JobOutcome]:
    """The outcome of each of ``job_ids`` that has an instance or a task run (an id
    still in the queue, or unknown, is absent). One short statement (two when
    ``records`` names the submissions' records: see the module's docstring); the
    connection goes back to the pool at once."""
    if not job_ids:
        return {}
    with db.connect() as conn:
        rows = conn.execute(_OUTCOMES, {"ids": list(job_ids)}).all()
        outcomes = _outcomes(rows)
        wanted = {j: r for j, r in (records or {}).items() if j in outcomes}
        if wanted:
            found = conn.execute(
                _RECORDS,
                {
                    "ids": list(wanted),
                    "topics": [r.topic for r in wanted.values()],
                    "parts": [r.partition for r in wanted.values()],
                    "offs": [r.offset for r in wanted.values()],
                },
            ).all()
            for row in found:
                outcomes[row.job_id] = _of_record(outcomes[row.job_id], row)
    return outcomes


def _of_record(current: JobOutcome, row: Any) -> JobOutcome:
    """The outcome a submission's record is answered with, given where it was written
    down (``_RECORDS``' row) and the id's current outcome."""
    if row.run is not None and row.run != current.run:
        if row.status is None:  # cannot be: only the current run's row has no status
            return replace(current, pending=True)
        # the record started an earlier run, archived since: that run's outcome
        return JobOutcome(
            current.job_id,
            current.kind,
            current.workflow,
            row.status,
            row.result,
            row.error,
            row.version,
            row.finished_at,
            run=row.run,
        )
    if row.run is not None or row.creating or row.duplicate:
        # the current run: the one it started, or (a duplicate) the one it collapsed
        # into, unless another submission started a later run since (then that one)
        return current
    return replace(current, pending=True)


def _outcomes(rows: Sequence[Any]) -> dict[str, JobOutcome]:
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
