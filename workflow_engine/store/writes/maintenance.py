"""Retention and figures that need a query (run periodically by every engine).

Retention in one round, under a session-level advisory lock so only one engine prunes
at a time (the others skip that round); each step is its own short transaction:

1. partitions are created ahead (:func:`.partitions.ensure_partitions`);
2. step-attempt partitions older than the instance retention are dropped whole;
3. finished instances (and task runs) past retention *plus one partition interval*
   are deleted - the extra interval means their attempt rows went with step 2's
   partitions, so the DELETE never cascades into the attempts table row by row - except
   a finished child whose parent is still live (:data:`_LIVE_PARENT`): the parent may
   not have taken its result yet, and would otherwise fail "child ... gone" although
   the child succeeded; it goes in the first round after its parent has finished;
4. duplicate-delivery partitions older than the job-id retention are dropped whole;
5. job-id records past theirs (plus one interval, for the same reason) are deleted (a
   batch's first member's only after its batch run's, :data:`_PRUNE_JOB_IDS`), and
   so are the earlier runs of reused job ids (``onceflow_runs``, migration 0027) that
   finished as long ago: an id reused again and again keeps a live instance, which
   step 3 never deletes, so its archived runs go on their own - on the job-id
   retention, not the instance's, because a run's row also holds the Kafka position of
   the record that started it, which keeps a redelivery of that record from starting
   another run for as long as a duplicate of the id collapses;
6. rows parked in a default partition whose step or job id is gone are deleted (the
   partitioned tables have no foreign key to cascade through);
7. the operators' audit trail (``onceflow_operator_actions``) older than its own
   retention is deleted.

An instance's webhook deliveries and their attempts (migration 0019) go with it in
step 3, by their foreign keys' ``ON DELETE CASCADE`` (an index on the job id each).
"""

from __future__ import annotations

from dataclasses import dataclass
from datetime import datetime, timedelta

import sqlalchemy as sa
from sqlalchemy.engine import Connection, Engine

from onceflow.ids import BATCH_SUFFIX
from onceflow.vocabulary import (
    RUNNABLE_STATUSES,
    TERMINAL_STATUSES,
    InstanceStatus,
    TaskRunStatus,
)
from workflow_engine.store import operator_audit, partitions

PRUNE_LOCK_KEY = 0x0CEF_2000
DAY = 86400.0
#: ``ONCEFLOW_RETENTION_OPERATOR_ACTIONS_SECONDS``' default.
OPERATOR_ACTIONS_RETENTION = 90 * DAY

#: A child instance whose parent has not finished: retention keeps it whatever its
#: age. The parent reads the child's row (status, result, error) when it collects it
#: (``store.children.collect``), and nothing else holds that result until then, so
#: "the child finished long ago" never means "nobody needs it" while the parent lives
#: (a parent paused, sleeping or waiting for months keeps its finished children).
#: One primary-key probe of the parent per candidate row.
_LIVE_PARENT = (
    "i.parent_job_id IS NOT NULL AND EXISTS (SELECT 1 FROM onceflow_instances p"
    " WHERE p.job_id = i.parent_job_id AND p.status <> ALL(:terminal))"
)


_TRY_PRUNE_LOCK = sa.text("SELECT pg_try_advisory_lock(:k)")
_PRUNE_UNLOCK = sa.text("SELECT pg_advisory_unlock(:k)")


def prune(
    db: Engine,
    instance_seconds: float,
    job_id_seconds: float,
    partition_seconds: float = DAY,
    partitions_ahead: int = 3,
    operator_action_seconds: float = OPERATOR_ACTIONS_RETENTION,
) -> dict[str, int]:
    """One retention round; returns what it removed or created, by kind.

    A job-id record outlives its instance so that a late duplicate still collapses;
    it is never deleted while its instance (or task run) exists. The operators' audit
    trail has its own retention (``operator_action_seconds``), whatever the instances'.
    """
    with db.connect() as conn:
        locked = conn.execute(_TRY_PRUNE_LOCK, {"k": PRUNE_LOCK_KEY}).scalar()
        conn.commit()
        if not locked:
            return {}
        try:
            return _prune_locked(
                conn,
                timedelta(seconds=instance_seconds),
                timedelta(seconds=max(job_id_seconds, instance_seconds)),
                timedelta(seconds=partition_seconds),
                partitions_ahead,
                timedelta(seconds=operator_action_seconds),
            )
        finally:
            conn.rollback()
            conn.execute(_PRUNE_UNLOCK, {"k": PRUNE_LOCK_KEY})
            conn.commit()


#: A batch run that a member row still names: retention keeps it until its members
#: have gone (they finished with it, so they go in the same round; the run in the next),
#: so a member's ``batch_id`` always leads to its run (describe, the console).
_NAMED_BY_MEMBER = (
    "i.batch_size IS NOT NULL AND EXISTS (SELECT 1 FROM onceflow_instances m"
    " WHERE m.batch_id = i.job_id)"
)

_NOW = sa.text("SELECT now()")
_PRUNE_INSTANCES = sa.text(
    "DELETE FROM onceflow_instances i"
    " WHERE i.status = ANY(:terminal) AND i.finished_at < :before"
    f" AND NOT ({_LIVE_PARENT}) AND NOT ({_NAMED_BY_MEMBER})"
)
_PRUNE_TASK_RUNS = sa.text(
    "DELETE FROM onceflow_task_runs WHERE status <> :pending AND finished_at < :before"
)
# An earlier run of a reused id (archived: its status set), finished before the cut.
_PRUNE_EARLIER_RUNS = sa.text(
    "DELETE FROM onceflow_runs WHERE status IS NOT NULL AND finished_at < :before"
)
# A job-id record goes only once its instance or task run has gone, and a batch member's
# only once its batch run's record has (``<member>~batch``, received when the batch was
# formed, so it can outlive the member's): the same id submitted again collapses as a
# duplicate until then, instead of becoming a member whose batch run's id is taken (the
# former would refuse its pool's every batch). One primary-key probe per candidate.
_PRUNE_JOB_IDS = sa.text(
    "DELETE FROM onceflow_jobs j WHERE j.received_at < :before"
    " AND NOT EXISTS (SELECT 1 FROM onceflow_instances i WHERE i.job_id = j.job_id)"
    " AND NOT EXISTS (SELECT 1 FROM onceflow_task_runs t WHERE t.job_id = j.job_id)"
    f" AND NOT EXISTS (SELECT 1 FROM onceflow_jobs b WHERE b.job_id = j.job_id || '{BATCH_SUFFIX}')"
)


def _prune_locked(
    conn: Connection,
    instance_retention: timedelta,
    job_id_retention: timedelta,
    interval: timedelta,
    ahead: int,
    operator_action_retention: timedelta,
) -> dict[str, int]:
    now: datetime = conn.execute(_NOW).scalar_one()
    conn.commit()
    created = partitions.ensure_partitions(conn, now, interval, ahead)
    attempts = partitions.retire_expired(conn, partitions.STEP_ATTEMPTS, now - instance_retention)
    with conn.begin():
        instances = conn.execute(
            _PRUNE_INSTANCES,
            {"before": now - instance_retention - interval, "terminal": sorted(TERMINAL_STATUSES)},
        ).rowcount
        tasks = conn.execute(
            _PRUNE_TASK_RUNS,
            {"before": now - instance_retention - interval, "pending": str(TaskRunStatus.PENDING)},
        ).rowcount
    duplicates = partitions.retire_expired(
        conn, partitions.DUPLICATE_DELIVERIES, now - job_id_retention
    )
    with conn.begin():
        job_ids = conn.execute(
            _PRUNE_JOB_IDS, {"before": now - job_id_retention - interval}
        ).rowcount
        runs = conn.execute(
            _PRUNE_EARLIER_RUNS, {"before": now - job_id_retention - interval}
        ).rowcount
    orphans = sum(partitions.delete_orphans(conn, t) for t in partitions.PARTITIONED_TABLES)
    with conn.begin():
        actions = operator_audit.delete_older_than(conn, now - operator_action_retention)
    return {
        "instances": instances,
        "task_runs": tasks,
        "job_ids": job_ids,
        "earlier_runs": runs,
        "partitions_created": len(created),
        "partitions_dropped": len(attempts.dropped) + len(duplicates.dropped),
        "partition_rows_kept": attempts.kept_rows + duplicates.kept_rows,
        "partition_rows_orphaned": orphans,
        "operator_actions": actions,
    }


@dataclass(frozen=True, slots=True)
class StatusCounts:
    """Instances per (workflow, status), and how many are due to run now."""

    by_workflow_status: dict[tuple[str, InstanceStatus], int]
    runnable_due: int


_COUNTS = sa.text("SELECT workflow, status, count(*) FROM onceflow_instances GROUP BY 1, 2")
_RUNNABLE_DUE = sa.text(
    "SELECT count(*) FROM onceflow_instances WHERE status = ANY(:runnable) AND run_after <= now()"
)


def status_counts(db: Engine) -> StatusCounts:
    with db.connect() as conn:
        counts = conn.execute(_COUNTS).all()
        backlog = conn.execute(_RUNNABLE_DUE, {"runnable": sorted(RUNNABLE_STATUSES)}).scalar()
    return StatusCounts(
        {(workflow, InstanceStatus(status)): n for workflow, status, n in counts}, backlog or 0
    )
