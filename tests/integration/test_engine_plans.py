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
from workflow_engine.model import Delivery
from workflow_engine.store import fragments, prepared, writes
from workflow_engine.store.fragments import in_index_order
from workflow_engine.store.writes import create_instances
from workflow_engine.store.writes import execution as store
from workflow_engine.store.writes.claim import _PICK, _PICK_NO_FLOWS

# The claim module (its statements), not the writes face's claim function of that name.

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
    assert len(writes.claim(db, "o", RUNNING, 30)) == RUNNING

    batch = jobs[:BATCH]
    ints = [0] * BATCH
    texts = ["x"] * BATCH
    plans = {}
    with db.connect() as conn:
        plans["start"] = _plan(
            conn,
            store._START_STEPS,
            {
                "owner": "o",
                "job_ids": batch,
                "claims": [1] * BATCH,
                "positions": ints,
                "names": texts,
            },
        )
        plans["finish"] = _plan(
            conn,
            store._FINISH_STEPS,
            {
                "owner": "o",
                "job_ids": batch,
                "claims": [1] * BATCH,
                "positions": ints,
                "attempts": [1] * BATCH,
                "started": [datetime.now(UTC)] * BATCH,
                "statuses": ["complete"] * BATCH,
                "outcomes": ["complete"] * BATCH,
                "results": ["1"] * BATCH,
                "errors": [None] * BATCH,
                "deferred": [False] * BATCH,  # each checkpoint bumps its own event counter
            },
        )
        # The heartbeat reads its ids with = ANY: on a table of a few hundred rows a
        # scan is a fair choice (production tables are large), so only its choice
        # between indexes is tested. The lease checks above probe even a small table.
        conn.execute(sa.text("SET enable_seqscan = off"))
        plans["heartbeat"] = _plan(
            conn, store._HEARTBEAT, {"owner": "o", "ids": batch, "claims": [1] * BATCH, "lease": 30}
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


def _analysed_with_nothing_runnable(db) -> None:
    """Finish every instance, take the statistics then, and keep autovacuum from taking
    them again: the state a burst after a quiet spell meets until the next ANALYZE."""
    with db.begin() as conn:
        conn.execute(sa.text("ALTER TABLE onceflow_instances SET (autovacuum_enabled = false)"))
        conn.execute(
            sa.text(
                "UPDATE onceflow_instances SET status = 'complete', finished_at = now(),"
                " run_after = 'infinity'"
            )
        )
        conn.execute(sa.text("ANALYZE onceflow_instances"))


def _custom_plan(db, statement: sa.TextClause, params: dict[str, object]) -> str:
    with db.connect() as conn:
        explain = sa.text("EXPLAIN " + statement.text)
        return "\n".join(row[0] for row in in_index_order(conn, explain, params))


def _generic_plan(db, statement: sa.TextClause, params: dict[str, object]) -> str:
    """The plan of ``statement`` as the claim runs it: prepared, its generic plan (made
    with sorting priced out, ``fragments.in_index_order(prepared=True)``)."""
    with db.connect() as conn:
        in_index_order(conn, statement, params, prepared=True)  # PREPAREs it
        form = prepared._form(statement)
        execute = prepared._EXECUTES[form.name]
        conn.exec_driver_sql(fragments._GENERIC_SORT_OFF)
        rows = conn.execute(
            sa.text("EXPLAIN " + execute.text), {name: params[name] for name in form.params}
        )
        plan = "\n".join(row[0] for row in rows)
        conn.rollback()
        return plan


def test_the_claim_reads_the_queue_in_order_when_the_statistics_predate_a_burst(db):
    """Analysed while nothing was runnable, then a backlog queued: the claim still reads
    the claim-order indexes in order and stops at its limit, instead of sorting the
    whole backlog (155 ms a claim at 40,000 queued)."""
    quiet = [f"done_{i:03d}" for i in range(200)]
    create_instances(
        db, [Delivery(JobEnvelope(j, "noop-workflow", {}), "t", 0, n) for n, j in enumerate(quiet)]
    )
    _analysed_with_nothing_runnable(db)
    burst = [f"burst_{i:05d}" for i in range(5000)]
    for start in range(0, len(burst), 1000):
        create_instances(
            db,
            [
                Delivery(JobEnvelope(j, "noop-workflow", {}), "t", 0, 1000 + start + n)
                for n, j in enumerate(burst[start : start + 1000])
            ],
        )
    params = {
        "owner": "o",
        "lease": 30,
        "now": None,
        "inflight": [],
        "cutoff": None,
        "any_workflow": True,
        "have_workflows": ["noop-workflow"],
        "have_versions": ["v"],
        "limit": 32,
        "limited": [],
        "uncontrolled": ["noop-workflow"],
    }
    # both picks: with the flow-controlled workflows' locks, and without (no flow
    # control); planned for these values, and the one generic plan the claim runs
    for pick in (_PICK, _PICK_NO_FLOWS):
        for plan in (_custom_plan(db, pick, params), _generic_plan(db, pick, params)):
            assert "Index Scan using onceflow_instances_claim_order_idx" in plan, plan
            assert "Index Scan using onceflow_instances_lane_idx" in plan, plan
            assert "Sort" not in plan, plan
    # ... and a claim takes the oldest of the burst.
    claimed = writes.claim(db, "o", 32, 30)
    assert sorted(c.job_id for c in claimed) == burst[:32]


def test_the_flow_claim_reads_the_lanes_in_order_when_the_statistics_predate_a_burst(db):
    """The same for a flow-controlled workflow: the walk over its lanes and each lane's
    read are ordered probes of onceflow_instances_lane_idx, not a sort of the backlog
    per lane (654 ms a claim at 20,000 queued over 50 keys, 25 ms analysed)."""
    from tests.integration import flow_workflows as wf
    from tests.integration.test_flow_control import create as create_flow
    from workflow_engine.definitions import REGISTRY
    from workflow_engine.store.writes import flow as store_flow

    create_flow(db, wf.PER_KEY, [(f"quiet_{i}", {"customer": f"c{i % 50}"}) for i in range(100)])
    _analysed_with_nothing_runnable(db)
    for start in range(0, 3000, 1000):
        create_flow(
            db,
            wf.PER_KEY,
            [(f"burst_{i:05d}", {"customer": f"c{i % 50}"}) for i in range(start, start + 1000)],
        )
    flow = REGISTRY.flows()[wf.PER_KEY]
    base = {
        "owner": "o",
        "lease": 30,
        "now": None,
        "inflight": [],
        "cutoff": None,
        "any_workflow": True,
        "have_workflows": [],
        "have_versions": [],
    }
    values = store_flow.flow_params(wf.PER_KEY, flow, 32, base)
    with db.connect() as conn:
        plan = "\n".join(
            row[0]
            for row in in_index_order(
                conn, sa.text("EXPLAIN " + store_flow._FLOW_POOL.text), values
            )
        )
    assert "onceflow_instances_lane_idx" in plan, plan
    assert "Sort" not in plan, plan
    assert "onceflow_instances_runnable_idx" not in plan, plan
    # ... and a claim takes the oldest of the burst, two per customer (its limit).
    claimed = writes.claim(db, "o", 32, 30, flows=REGISTRY.flows())
    assert sorted(c.job_id for c in claimed) == [f"burst_{i:05d}" for i in range(32)]


def test_the_pick_tries_the_lock_only_of_a_limited_workflow_with_work_due(db):
    """The pick's ``locks``: a flow-controlled workflow's advisory lock is tried only
    when it has an instance due; one with nothing due is left unlocked, so another
    engine's claim of it, just then due, is not turned away (the planner ran the lock
    over every name before the test for work, found in review)."""
    create_instances(
        db,
        [Delivery(JobEnvelope(f"due_{i}", "noop-workflow", {}), "t", 0, i) for i in range(3)],
    )
    params = {
        "owner": "o",
        "now": None,
        "inflight": [],
        "any_workflow": True,
        "have_workflows": [],
        "have_versions": [],
        "limit": 32,
        "limited": ["noop-workflow", "idle-workflow", "another-idle-workflow"],
        "uncontrolled": [],
    }
    advisory = sa.text(
        "SELECT count(*) FROM pg_locks WHERE locktype = 'advisory' AND pid = pg_backend_pid()"
    )
    for generic in (False, True):  # planned for these values, and the generic plan
        with db.connect() as conn:
            rows = in_index_order(conn, _PICK, params, prepared=generic)
            assert [got for job, _, got in rows if job is None] == [["noop-workflow"]]
            assert conn.execute(advisory).scalar_one() == 1
            conn.rollback()
