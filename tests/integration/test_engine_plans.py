"""The plans PostgreSQL picks for the engine's batched checkpoint statements.

Every checkpoint write first locks its instance rows by job id. When the table's
statistics were taken while few instances ran (an idle system, a backlog just queued)
and a burst then runs hundreds, the lease check must still probe the primary key per
job id: a plan built on the stale "almost nothing runs" estimate reads every running
instance (or, on a small table, every instance) for each batch: measured at 512
workflows in flight, 15 ms per statement instead of 3, and PostgreSQL's CPU per
workflow up to 2-3 times (BENCHMARKS.md, "Lease checks by job id").
"""

from __future__ import annotations

from datetime import UTC, datetime

import sqlalchemy as sa

from onceflow.envelope import JobEnvelope
from workflow_engine.store import claim as claims
from workflow_engine.store import execution as store
from workflow_engine.store.instances import Delivery, create_instances

RUNNING = 600
BATCH = 96


def _plan(conn: sa.Connection, statement: sa.TextClause, params: dict[str, object]) -> str:
    return "\n".join(row[0] for row in conn.execute(sa.text("EXPLAIN " + statement.text), params))


def test_the_lease_checks_probe_job_ids_when_the_statistics_predate_a_burst(db):
    jobs = [f"plan_{i:04d}" for i in range(RUNNING)]
    create_instances(
        db, [Delivery(JobEnvelope(j, "noop-workflow", {}), "t", 0, n) for n, j in enumerate(jobs)]
    )
    with db.begin() as conn:
        # Statistics of an all-queued table, and no autovacuum to refresh them: the
        # state a burst meets until the next ANALYZE.
        conn.execute(sa.text("ALTER TABLE onceflow_instances SET (autovacuum_enabled = false)"))
        conn.execute(sa.text("ANALYZE onceflow_instances"))
    assert len(claims.claim(db, "o", RUNNING, 30)) == RUNNING

    batch = jobs[:BATCH]
    ints = [0] * BATCH
    texts = ["x"] * BATCH
    plans = {}
    with db.connect() as conn:
        plans["start"] = _plan(
            conn,
            store._START_STEPS,
            {"owner": "o", "job_ids": batch, "positions": ints, "names": texts},
        )
        plans["finish"] = _plan(
            conn,
            store._FINISH_STEPS,
            {
                "owner": "o",
                "job_ids": batch,
                "positions": ints,
                "attempts": [1] * BATCH,
                "started": [datetime.now(UTC)] * BATCH,
                "statuses": ["complete"] * BATCH,
                "outcomes": ["complete"] * BATCH,
                "results": ["1"] * BATCH,
                "errors": [None] * BATCH,
            },
        )
        # The heartbeat reads its ids with = ANY: on a table of a few hundred rows a
        # scan is a fair choice (production tables are large), so only its choice
        # between indexes is tested. The lease checks above probe even a small table.
        conn.execute(sa.text("SET enable_seqscan = off"))
        plans["heartbeat"] = _plan(
            conn, store._HEARTBEAT, {"owner": "o", "ids": batch, "lease": 30}
        )
    for name, plan in plans.items():
        instance_scans = [
            line
            for line in plan.splitlines()
            if "Scan" in line and "on onceflow_instances " in line
        ]
        assert instance_scans, f"{name}: no read of onceflow_instances in\n{plan}"
        assert all("onceflow_instances_job_id_key" in line for line in instance_scans), (
            f"{name} reads instances other than by job id:\n{plan}"
        )
