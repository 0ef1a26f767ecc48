"""Figures about the store as a whole: how many instances in which status, how many
duplicates collapsed, what the timestamps say about latency and throughput.

The demo, the chaos run and the benchmarks read their proof and their measurements
here (and the tests that prove the same), so these reads live with the tools, not in
the product's store: no process of the runtime asks them. Every function is one
read-only round trip returning a frozen dataclass (or a plain number). The counts scan
the tables: they are for proofs and benchmarks, not for the hot path (the engines'
gauges use :func:`workflow_engine.store.writes.maintenance.status_counts`).
"""

from __future__ import annotations

from collections.abc import Mapping
from dataclasses import dataclass

import sqlalchemy as sa
from sqlalchemy.engine import Engine

from onceflow.vocabulary import TERMINAL_STATUSES, AttemptOutcome, InstanceStatus


@dataclass(frozen=True, slots=True)
class InstanceCounts:
    """Instances in the store, in all and per status."""

    total: int
    distinct_job_ids: int
    by_status: Mapping[InstanceStatus, int]

    def count(self, *statuses: InstanceStatus) -> int:
        return sum(self.by_status.get(s, 0) for s in statuses)

    @property
    def complete(self) -> int:
        return self.count(InstanceStatus.COMPLETE)

    @property
    def finished(self) -> int:
        """Instances in a terminal status (complete, errored or terminated)."""
        return self.count(*TERMINAL_STATUSES)


def instance_counts(db: Engine) -> InstanceCounts:
    with db.connect() as conn:
        rows = conn.execute(
            sa.text("SELECT status, count(*) FROM onceflow_instances GROUP BY status")
        ).all()
        distinct = conn.execute(
            sa.text("SELECT count(DISTINCT job_id) FROM onceflow_instances")
        ).scalar()
    by_status = {InstanceStatus(status): int(n) for status, n in rows}
    return InstanceCounts(
        total=sum(by_status.values()), distinct_job_ids=int(distinct or 0), by_status=by_status
    )


def count_instances(db: Engine, *statuses: InstanceStatus) -> int:
    """Instances in any of ``statuses`` (all instances if none is given): one count,
    cheap enough to poll while a benchmark runs."""
    with db.connect() as conn:
        if not statuses:
            n = conn.execute(sa.text("SELECT count(*) FROM onceflow_instances")).scalar()
        else:
            n = conn.execute(
                sa.text("SELECT count(*) FROM onceflow_instances WHERE status = ANY(:s)"),
                {"s": [str(s) for s in statuses]},
            ).scalar()
    return int(n or 0)


def instance_job_ids(db: Engine) -> frozenset[str]:
    """The job id of every instance in the store."""
    with db.connect() as conn:
        return frozenset(conn.execute(sa.text("SELECT job_id FROM onceflow_instances")).scalars())


@dataclass(frozen=True, slots=True)
class DuplicateCounts:
    """Deliveries of an already-known job id, collapsed into audit rows."""

    total: int
    redeliveries: int  # the same Kafka record again (a consumer restart, a rebalance)
    mismatches: int  # a resubmission whose params differ from the first one's


def duplicate_counts(db: Engine) -> DuplicateCounts:
    with db.connect() as conn:
        row = conn.execute(
            sa.text(
                "SELECT count(*), count(*) FILTER (WHERE redelivery),"
                " count(*) FILTER (WHERE NOT params_match)"
                " FROM onceflow_duplicate_deliveries"
            )
        ).one()
    return DuplicateCounts(*(int(v) for v in row))


@dataclass(frozen=True, slots=True)
class Consumption:
    """What the streams workers have written: every consumed workflow record is an
    instance or a collapsed duplicate."""

    instances: int
    duplicates: int

    @property
    def records(self) -> int:
        return self.instances + self.duplicates


def consumption(db: Engine) -> Consumption:
    with db.connect() as conn:
        row = conn.execute(
            sa.text(
                "SELECT (SELECT count(*) FROM onceflow_instances),"
                " (SELECT count(*) FROM onceflow_duplicate_deliveries)"
            )
        ).one()
    return Consumption(int(row[0]), int(row[1]))


def checkpoints_written_twice(db: Engine) -> int:
    """Step positions with more than one completed attempt (must be 0: a step's
    checkpoint is written once)."""
    with db.connect() as conn:
        n = conn.execute(
            sa.text(
                "SELECT count(*) FROM (SELECT job_id, position FROM onceflow_step_attempts"
                " WHERE outcome = :complete GROUP BY 1, 2 HAVING count(*) > 1) x"
            ),
            {"complete": str(AttemptOutcome.COMPLETE)},
        ).scalar()
    return int(n or 0)


def running_by_owner(db: Engine) -> dict[str, int]:
    """Running instances per lease owner (an engine's id, ``host:pid:suffix``): the chaos
    run stops an engine while it holds work, so that it wakes up as a zombie."""
    with db.connect() as conn:
        rows = conn.execute(
            sa.text(
                "SELECT lease_owner, count(*) FROM onceflow_instances"
                " WHERE status = :running AND lease_owner IS NOT NULL GROUP BY 1"
            ),
            {"running": str(InstanceStatus.RUNNING)},
        ).all()
    return {owner: int(n) for owner, n in rows}


@dataclass(frozen=True, slots=True)
class Latency:
    """Submit-to-first-step and submit-to-complete percentiles (ms) of complete jobs."""

    jobs: float
    first_step_p50_ms: float
    first_step_p99_ms: float
    complete_p50_ms: float
    complete_p99_ms: float
    complete_max_ms: float
    # the first step's path in parts (issue 27, target 4): submit -> the Kafka record's
    # timestamp (ingest, up to its produce call), -> the worker's creating transaction
    # (linger, the broker's acks, the fetch, the worker's batch), -> the first step
    # (the commit, the engine's wake-up and claim)
    to_kafka_p50_ms: float = 0.0
    to_kafka_p99_ms: float = 0.0
    to_worker_p50_ms: float = 0.0
    to_worker_p99_ms: float = 0.0
    to_step_p50_ms: float = 0.0
    to_step_p99_ms: float = 0.0


_LATENCY_SQL = sa.text(
    """
SELECT count(*),
       percentile_cont(0.5) WITHIN GROUP (ORDER BY first_step),
       percentile_cont(0.99) WITHIN GROUP (ORDER BY first_step),
       percentile_cont(0.5) WITHIN GROUP (ORDER BY complete),
       percentile_cont(0.99) WITHIN GROUP (ORDER BY complete),
       max(complete),
       percentile_cont(0.5) WITHIN GROUP (ORDER BY to_kafka),
       percentile_cont(0.99) WITHIN GROUP (ORDER BY to_kafka),
       percentile_cont(0.5) WITHIN GROUP (ORDER BY to_worker),
       percentile_cont(0.99) WITHIN GROUP (ORDER BY to_worker),
       percentile_cont(0.5) WITHIN GROUP (ORDER BY first_step - received),
       percentile_cont(0.99) WITHIN GROUP (ORDER BY first_step - received)
FROM (
    SELECT 1000 * extract(epoch FROM
               (SELECT min(a.started_at) FROM onceflow_step_attempts a
                WHERE a.job_id = j.job_id) - j.submitted_at) AS first_step,
           1000 * extract(epoch FROM i.finished_at - j.submitted_at) AS complete,
           1000 * extract(epoch FROM j.enqueued_at - j.submitted_at) AS to_kafka,
           1000 * extract(epoch FROM j.received_at - j.enqueued_at) AS to_worker,
           1000 * extract(epoch FROM j.received_at - j.submitted_at) AS received
    FROM onceflow_jobs j JOIN onceflow_instances i USING (job_id)
    WHERE i.status = :complete AND j.job_id LIKE :pattern
) x
"""
)


def _like_prefix(prefix: str) -> str:
    return prefix.replace("\\", "\\\\").replace("%", "\\%").replace("_", "\\_") + "%"


def latency(db: Engine, job_id_prefix: str = "") -> Latency:
    """End-to-end latency of the complete jobs whose id starts with ``job_id_prefix``,
    from the database's own timestamps (one clock for every process)."""
    with db.connect() as conn:
        row = conn.execute(
            _LATENCY_SQL,
            {"complete": str(InstanceStatus.COMPLETE), "pattern": _like_prefix(job_id_prefix)},
        ).one()
    return Latency(*(float(v or 0) for v in row))


def _seconds(db: Engine, sql: str) -> float:
    with db.connect() as conn:
        return float(conn.execute(sa.text(sql)).scalar() or 0.0)


def run_span_seconds(db: Engine) -> float:
    """From the first instance started to the last one finished."""
    return _seconds(
        db,
        "SELECT extract(epoch FROM max(finished_at) - min(started_at)) FROM onceflow_instances",
    )


def receipt_span_seconds(db: Engine) -> float:
    """From the first record consumed to the last one (first deliveries and duplicates)."""
    return _seconds(
        db,
        "SELECT extract(epoch FROM max(t) - min(t)) FROM (SELECT received_at AS t"
        " FROM onceflow_jobs UNION ALL"
        " SELECT received_at FROM onceflow_duplicate_deliveries) x",
    )


_FIRST_STEP = sa.text(
    """
SELECT extract(epoch FROM min(a.started_at) - j.submitted_at)
FROM onceflow_jobs j JOIN onceflow_step_attempts a USING (job_id)
WHERE j.job_id = :job_id GROUP BY j.submitted_at
"""
)


def submit_to_first_step_seconds(db: Engine, job_id: str) -> float | None:
    """From a job's submission to its first step attempt (None: no step yet); the
    fairness bench's figure."""
    with db.connect() as conn:
        value = conn.execute(_FIRST_STEP, {"job_id": job_id}).scalar()
    return None if value is None else float(value)
