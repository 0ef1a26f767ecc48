"""How jobs ended, or that they have not yet: what a start-and-wait caller is answered
(``Prefer: wait``, ``GET /v1/jobs/{job_id}/result``; producers/waiters.py).

One statement for many job ids: the waiting requests of one ingest process share it
(their reads are batched), so 2,000 callers waiting at once cost a few short queries,
not 2,000 connections.

A submission of a job id whose instance may start a new run (id reuse) is answered with
the run *its record* belongs to, not with whatever run the id has now: its record's Kafka
position (:class:`Record`) is looked up where the worker writes it down, as the record
that started a run (``onceflow_runs``), the id's creating record (``onceflow_jobs``) or
a duplicate (``onceflow_duplicate_deliveries``, which names the run it collapsed into).
Until the worker has done one of those, the id's outcome is *pending* (never final): run
1 already complete says nothing of the run this record may yet start.
"""

from __future__ import annotations

from collections.abc import Collection, Sequence
from dataclasses import dataclass, replace
from datetime import datetime
from typing import Any

import sqlalchemy as sa
from sqlalchemy.engine import Engine

from onceflow import failpoints
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


# Where the worker wrote each record down, if it has: as the record that started a run,
# as the id's creating record (run 1), or as a duplicate (naming the run it collapsed
# into, migration 0031); and that run's outcome once it is archived (a later run began).
_RECORDS = sa.text(
    """
SELECT p.job_id, p.topic, p.part, p.off,
       r.run IS NOT NULL AS started,
       EXISTS (SELECT 1 FROM onceflow_jobs j
               WHERE j.job_id = p.job_id
                 AND (j.source_topic, j.source_partition, j.source_offset)
                     = (p.topic, p.part, p.off)) AS creating,
       d.job_id IS NOT NULL AS duplicate,
       coalesce(r.run, d.run) AS run, a.status, a.result, a.error, a.version, a.finished_at
FROM unnest(CAST(:ids AS text[]), CAST(:topics AS text[]), CAST(:parts AS int[]),
            CAST(:offs AS bigint[])) AS p(job_id, topic, part, off)
LEFT JOIN onceflow_runs r
       ON (r.source_topic, r.source_partition, r.source_offset) = (p.topic, p.part, p.off)
      AND r.job_id = p.job_id
LEFT JOIN LATERAL (
    SELECT d.job_id, d.run FROM onceflow_duplicate_deliveries d
    WHERE d.job_id = p.job_id
      AND (d.source_topic, d.source_partition, d.source_offset) = (p.topic, p.part, p.off)
    LIMIT 1
) d ON true
LEFT JOIN onceflow_runs a ON a.job_id = p.job_id AND a.run = coalesce(r.run, d.run)
"""
)

#: A submission: its job id and where its record is.
Submission = tuple[str, Record]


def job_outcomes(db: Engine, job_ids: Sequence[str]) -> dict[str, JobOutcome]:
    """The outcome of each of ``job_ids`` that has an instance or a task run (an id
    still in the queue, or unknown, is absent). One short statement; the connection
    goes back to the pool at once."""
    return submission_outcomes(db, job_ids, ())[0]


def submission_outcomes(
    db: Engine, job_ids: Sequence[str], submissions: Collection[Submission]
) -> tuple[dict[str, JobOutcome], dict[Submission, JobOutcome]]:
    """:func:`job_outcomes` of ``job_ids``, and the outcome each of ``submissions``
    (an id with its record: see the module's docstring) is answered with, for those
    whose id has an instance. Several submissions of one id (a client's retries) are
    answered each by its own record, from one statement.

    The two statements read one snapshot (REPEATABLE READ): read apart, the worker's
    commit that starts run N+1 and records a second record of the id as its duplicate
    could land between them, and that duplicate would be answered run N's end (found in
    review)."""
    if not job_ids:
        return {}, {}
    with db.connect() as conn:
        if not submissions:
            return _outcomes(conn.execute(_OUTCOMES, {"ids": list(job_ids)}).all()), {}
        conn = conn.execution_options(isolation_level="REPEATABLE READ")
        with conn.begin():
            outcomes = _outcomes(conn.execute(_OUTCOMES, {"ids": list(job_ids)}).all())
            wanted = [(j, r) for j, r in submissions if j in outcomes]
            failpoints.hit("outcomes.between_reads", wanted[0][0] if wanted else None)
            found: Sequence[Any] = ()
            if wanted:
                found = conn.execute(
                    _RECORDS,
                    {
                        "ids": [j for j, _ in wanted],
                        "topics": [r.topic for _, r in wanted],
                        "parts": [r.partition for _, r in wanted],
                        "offs": [r.offset for _, r in wanted],
                    },
                ).all()
    answered = {
        (row.job_id, Record(row.topic, row.part, row.off)): _of_record(outcomes[row.job_id], row)
        for row in found
    }
    return outcomes, answered


def _of_record(current: JobOutcome, row: Any) -> JobOutcome:
    """The outcome a submission's record is answered with, given where it was written
    down (``_RECORDS``' row) and the id's current outcome: the run it started or
    collapsed into, from its archive when a later run has begun since (a duplicate row
    from before migration 0031 names none: the current run); pending while it is not
    written down."""
    if not (row.started or row.creating or row.duplicate):
        return replace(current, pending=True)
    if row.run is None or row.run == current.run or row.status is None:
        return current
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
