"""Flow control in the claim (issue 13): per-key concurrency across engines and a
SIGKILL, rate limits, priority with aging, fairness, and why a queued instance waits.
Every limit is checked from the database, never from a process's memory."""

from __future__ import annotations

import asyncio
import itertools
import json
import signal
import threading
import time
import uuid
from datetime import timedelta

import httpx
import pytest
import sqlalchemy as sa

from onceflow.envelope import JobEnvelope
from onceflow.vocabulary import InstanceStatus
from onceflow_tools.processes import ProcessGroup, free_port
from onceflow_tools.stack import Stack
from tests.conftest import settings_env
from tests.integration import flow_workflows as wf
from workflow_engine.definitions import REGISTRY
from workflow_engine.engine.runner import EngineRunner
from workflow_engine.model import Delivery
from workflow_engine.store import operations, writes
from workflow_engine.store.fragments import in_index_order
from workflow_engine.store.views import describe_instance, job_trace
from workflow_engine.store.writes import Lease, create_instances
from workflow_engine.store.writes import flow as store_flow
from workflow_engine.store.writes.claim import _PICK

# The claim module (its statements), not the writes face's claim function of that name.

_OFFSETS = itertools.count()
MODULES = json.dumps(["onceflow_examples", "tests.integration.flow_workflows"])


def create(db, workflow, jobs, priority=3):
    """``jobs``: (job_id, params) pairs, created in one transaction."""
    create_instances(
        db,
        [
            Delivery(
                JobEnvelope(job_id, workflow, params, priority=priority),
                "t",
                0,
                next(_OFFSETS),
                lane_path=REGISTRY.lane_path(workflow),
            )
            for job_id, params in jobs
        ],
    )


def rows(db, sql, **params):
    with db.connect() as conn:
        return conn.execute(sa.text(sql), params).all()


def scalar(db, sql, **params):
    with db.connect() as conn:
        return conn.execute(sa.text(sql), params).scalar()


def claim(db, limit):
    """One claim by this process, with every test workflow's flow control."""
    return writes.claim(db, "test-owner", limit, 30, flows=REGISTRY.flows())


def run_until(settings, db, done, timeout=60.0, **overrides):
    """Run an in-process engine until ``done()`` holds (a deadline, no bare sleeps)."""

    async def main():
        runner = EngineRunner(
            settings.model_copy(update={"engine_poll_interval_seconds": 0.05, **overrides}),
            REGISTRY,
            db=db,
        )
        task = asyncio.create_task(runner.run())
        deadline = time.monotonic() + timeout
        try:
            while not await asyncio.to_thread(done):
                assert time.monotonic() < deadline, "the engine did not finish in time"
                await asyncio.sleep(0.02)
        finally:
            runner.stop()
            await task

    asyncio.run(main())


class RunningSampler(threading.Thread):
    """Polls ``count(*) ... status = 'running' GROUP BY key`` and keeps the maximum."""

    def __init__(self, db, workflow: str, key: str) -> None:
        super().__init__(daemon=True)
        self.db, self.workflow, self.key = db, workflow, key
        self.max_running = 0
        self.samples = 0
        self.halt = threading.Event()

    def run(self) -> None:
        sql = (
            "SELECT coalesce(max(n), 0) FROM (SELECT count(*) AS n FROM onceflow_instances"
            " WHERE workflow = :w AND status = 'running' GROUP BY params ->> :k) x"
        )
        while not self.halt.is_set():
            n = scalar(self.db, sql, w=self.workflow, k=self.key)
            self.max_running = max(self.max_running, n)
            self.samples += 1
            self.halt.wait(0.01)


@pytest.mark.timeout(240)
def test_per_key_limit_holds_across_two_engines_and_a_sigkill(settings, db, tmp_path):
    # ~3 s of work for 8 slots: the kill lands with most of it still queued, so the
    # survivor must take over (with 80 x 0.15 s a slow machine let the first engine
    # finish everything before the kill, and the survivor had nothing left to do).
    n = 120
    jobs = [(f"pk_{i:03d}", {"customer": f"c{i % 4}", "seconds": 0.2}) for i in range(n)]
    env = {
        **settings_env(settings),
        "ONCEFLOW_WORKFLOW_MODULES": MODULES,
        "ONCEFLOW_ENGINE_LEASE_SECONDS": "3",
        "ONCEFLOW_ENGINE_POLL_INTERVAL_SECONDS": "0.1",
    }

    def complete() -> int:
        return scalar(db, "SELECT count(*) FROM onceflow_instances WHERE status = 'complete'")

    def leaseholder_pid() -> int | None:
        # An engine that has run steps and holds a lease now: killing one that has only
        # just claimed its first instances (no attempt written yet) would leave the
        # other engine doing everything, and nothing would show a take-over.
        owner = scalar(
            db,
            "SELECT lease_owner FROM onceflow_instances WHERE status = 'running'"
            " AND lease_owner IN (SELECT engine_id FROM onceflow_step_attempts) LIMIT 1",
        )
        return int(owner.split(":")[1]) if owner else None

    sampler = RunningSampler(db, wf.PER_KEY, "customer")
    sampler.start()
    try:
        with ProcessGroup(env, tmp_path / "logs") as group:
            for name in ("engine-a", "engine-b"):
                port = free_port()
                group.start(name, "engine", env={"ONCEFLOW_ENGINE_METRICS_PORT": str(port)})
                group.wait_http(f"http://127.0.0.1:{port}/metrics")
            create(db, wf.PER_KEY, jobs)  # both engines are up
            deadline = time.monotonic() + 60
            while complete() < 10 or not (pid := leaseholder_pid()):
                assert time.monotonic() < deadline, f"only {complete()} complete"
                time.sleep(0.02)
            # SIGKILL the engine that holds running instances, mid-step
            victim = next(name for name, proc in group.procs.items() if proc.pid == pid)
            group.stop(victim, signal.SIGKILL)
            deadline = time.monotonic() + 120
            while complete() < n:
                assert time.monotonic() < deadline, f"only {complete()} of {n} complete"
                group.check_alive()
                time.sleep(0.1)
    finally:
        sampler.halt.set()
        sampler.join()
    engines = rows(db, "SELECT DISTINCT engine_id FROM onceflow_step_attempts")
    print(
        f"\nper-key limit 2: max running per key {sampler.max_running}, {sampler.samples} samples"
    )
    assert sampler.samples > 100
    assert sampler.max_running <= 2  # never exceeded, sampled from the database
    assert sampler.max_running == 2  # ... and the limit was used, not merely unreached
    assert len(engines) == 2  # the survivor took over from the killed engine
    assert scalar(db, "SELECT max(claim_count) FROM onceflow_instances") >= 2  # rescued
    # every instance ran its step once to completion
    assert scalar(db, "SELECT count(*) FROM onceflow_steps WHERE status = 'complete'") == n


def test_rate_limit_is_observed_in_the_start_times(settings, db):
    per_tenant = 12
    create(
        db,
        wf.RATE,
        [(f"rt_{t}_{i:02d}", {"tenant": t}) for t in ("a", "b") for i in range(per_tenant)],
    )

    def all_complete() -> bool:
        return scalar(db, "SELECT count(*) FROM onceflow_instances WHERE status <> 'complete'") == 0

    run_until(settings, db, all_complete)
    for tenant in ("a", "b"):
        starts = [
            r[0]
            for r in rows(
                db,
                "SELECT started_at FROM onceflow_instances WHERE params ->> 'tenant' = :t"
                " ORDER BY started_at",
                t=tenant,
            )
        ]
        # no window of one period holds more than 5 starts (the limit is 5 per second)
        worst = max(sum(1 for s in starts if t <= s < t + timedelta(seconds=1)) for t in starts)
        assert worst <= 5, f"tenant {tenant}: {worst} starts within one second"
        assert starts[-1] - starts[0] >= timedelta(seconds=2)  # 12 starts need 3 windows
        assert worst == 5  # the budget was used


def test_higher_priority_first_and_waiting_ages_a_low_priority(db):
    create(db, wf.UNFAIR, [(f"p3_{i}", {}) for i in range(3)], priority=3)
    create(db, wf.UNFAIR, [("p5_old", {})], priority=5)
    create(db, wf.UNFAIR, [("p1_new", {})], priority=1)
    # p5_old became runnable 100 s ago: 4 levels (120 s) below p1 it still comes after it,
    # but it passes the priority-3 jobs, which became runnable just now (60 s of aging).
    with db.begin() as conn:
        conn.execute(
            sa.text(
                "UPDATE onceflow_instances SET run_after = now() - interval '100 seconds'"
                " WHERE job_id = 'p5_old'"
            )
        )
    order = [c.job_id for _ in range(5) for c in claim(db, 1)]
    assert order[:2] == ["p1_new", "p5_old"]
    assert sorted(order[2:]) == ["p3_0", "p3_1", "p3_2"]  # created together: equal rank
    # Anti-starvation: waited more than 120 s, the priority-5 job passes a fresh priority 1.
    create(db, wf.UNFAIR, [("p5_starved", {})], priority=5)
    create(db, wf.UNFAIR, [("p1_fresh", {})], priority=1)
    with db.begin() as conn:
        conn.execute(
            sa.text(
                "UPDATE onceflow_instances SET run_after = now() - interval '125 seconds'"
                " WHERE job_id = 'p5_starved'"
            )
        )
    assert [c.job_id for c in claim(db, 1)] == ["p5_starved"]
    assert [c.job_id for c in claim(db, 1)] == ["p1_fresh"]


def _small_tenant_rank(settings, db, workflow, burst):
    """Create a burst for tenant "big", then one job for "small"; run the engine until
    the small job is complete; return how many big jobs started before it."""
    create(db, workflow, [(f"{workflow}_big_{i:04d}", {"tenant": "big"}) for i in range(burst)])
    small = f"{workflow}_small"
    create(db, workflow, [(small, {"tenant": "small"})])

    def small_done() -> bool:
        return scalar(db, "SELECT status FROM onceflow_instances WHERE job_id = :j", j=small) == (
            InstanceStatus.COMPLETE
        )

    run_until(settings, db, small_done, engine_concurrency=8, engine_claim_batch=8)
    return scalar(
        db,
        "SELECT count(*) FROM onceflow_instances WHERE workflow = :w AND job_id <> :j"
        " AND started_at < (SELECT started_at FROM onceflow_instances WHERE job_id = :j)",
        w=workflow,
        j=small,
    )


def test_fairness_bounds_the_small_tenants_wait_behind_a_burst(settings, db):
    burst = 300
    fair = _small_tenant_rank(settings, db, wf.FAIR, burst)
    unfair = _small_tenant_rank(settings, db, wf.UNFAIR, burst)
    print(f"\nbig jobs started before the small tenant's: fair {fair}, FIFO {unfair} of {burst}")
    assert fair <= 8  # within the first claim batch, whatever the burst's size
    assert unfair >= burst - 8  # without fairness it waits for (nearly) the whole burst


def test_describe_and_trace_say_why_a_queued_instance_waits(db):
    create(db, wf.PER_KEY, [(f"why_pk_{i}", {"customer": "c1"}) for i in range(3)])
    assert len(claim(db, 10)) == 2
    view = describe_instance(db, "why_pk_2")
    assert view.status == InstanceStatus.QUEUED
    assert view.held_because == "per-key limit for key c1: 2 of 2 slots held"
    assert job_trace(db, "why_pk_2")[-1].event == "held back"

    create(db, wf.RATE, [(f"why_rt_{i}", {"tenant": "t9"}) for i in range(6)])
    assert len(claim(db, 10)) == 5
    queued = rows(
        db,
        "SELECT job_id FROM onceflow_instances WHERE workflow = :w AND status = 'queued'",
        w=wf.RATE,
    )
    reason = describe_instance(db, queued[0][0]).held_because
    assert reason.startswith("rate limit for key t9: 5 starts in the last 1.0 s")

    create(db, wf.UNFAIR, [("why_turn", {})], priority=2)
    assert describe_instance(db, "why_turn").held_because == "waiting for its turn (priority 2)"


@pytest.mark.parametrize("workflow", [wf.FAIR_PER_KEY, wf.FAIR_RATED])
def test_a_held_key_at_the_head_of_a_lane_does_not_block_the_lane(db, workflow):
    """Fairness on the tenant, one running (or one start a minute) per customer: the
    tenant's first 30 jobs are customer c1's, its other customers' jobs come after them.
    The claim looks past c1's held-back jobs (the lane mixes customers)."""
    create(
        db,
        workflow,
        [(f"hol_c1_{i:02d}", {"tenant": "acme", "customer": "c1"}) for i in range(30)],
    )
    create(
        db, workflow, [(f"hol_c{c}", {"tenant": "acme", "customer": f"c{c}"}) for c in range(2, 7)]
    )
    got = claim(db, 10)
    assert sorted(c.params["customer"] for c in got) == ["c1", "c2", "c3", "c4", "c5", "c6"]
    assert claim(db, 10) == []  # every customer's slot (or start) is used: c1's others wait
    assert scalar(db, "SELECT count(*) FROM onceflow_instances WHERE status = 'queued'") == 29


def test_hold_while_waiting_keeps_the_slot_of_a_sleeping_instance(db):
    create(db, wf.HOLDING, [(f"hold_{i}", {"customer": "c1"}) for i in range(2)])
    first = claim(db, 10)
    assert len(first) == 1
    writes.suspend(
        db, Lease("test-owner", 1), first[0].job_id, InstanceStatus.SLEEPING, None, delay=60
    )
    assert claim(db, 10) == []  # the sleeper holds the key's one slot
    held = describe_instance(db, "hold_1" if first[0].job_id == "hold_0" else "hold_0")
    assert held.held_because == "per-key limit for key c1: 1 of 1 slots held"


def test_a_restart_between_the_claims_two_statements_does_not_exceed_a_key(db, monkeypatch):
    """The claim reads its pool, then counts slots and starts in a later snapshot. A
    sleeper due to resume holds its key's one slot; restarted by an operator between
    the two statements, it becomes a queued start that needs the slot again: only one of
    the key's instances may be claimed, as if the two statements were one."""
    create(db, wf.HOLDING, [("due_sleeper", {"customer": "c1"}), ("queued", {"customer": "c1"})])
    with db.begin() as conn:
        conn.execute(
            sa.text(
                "UPDATE onceflow_instances SET status = 'sleeping', started_at = now(),"
                " run_after = now() - interval '1 second' WHERE job_id = 'due_sleeper'"
            )
        )
    read_pool = store_flow.in_index_order

    def pool_then_restart(conn, statement, params):
        rows = read_pool(conn, statement, params)
        if params["workflow"] != wf.HOLDING:  # the claim reads every flow workflow's pool
            return rows
        assert operations.restart(db, wf.HOLDING, "due_sleeper").status == InstanceStatus.QUEUED
        with db.begin() as other:  # as if the restart's transaction began before the claim's
            other.execute(
                sa.text(
                    "UPDATE onceflow_instances SET run_after = now() - interval '1 second'"
                    " WHERE job_id = 'due_sleeper'"
                )
            )
        return rows

    monkeypatch.setattr(store_flow, "in_index_order", pool_then_restart)
    assert len(claim(db, 10)) == 1
    running = "SELECT count(*) FROM onceflow_instances WHERE status = 'running'"
    assert scalar(db, running) == 1


@pytest.mark.timeout(180)
def test_a_priority_submitted_over_http_reaches_the_instance(base_settings, tmp_path):
    stack = Stack(base_settings, f"prio-{uuid.uuid4().hex[:8]}", tmp_path / "run").prepare()
    try:
        stack.start_ingest()
        stack.start_worker()
        url = f"{stack.ingest_url}/v1/jobs"
        single = {"job_id": "prio_single", "workflow": "order-workflow", "priority": 1}
        assert httpx.post(url, json=single, headers=stack.auth_headers).status_code == 202
        batch = {
            "jobs": [
                {"job_id": "prio_batch_5", "workflow": "order-workflow", "priority": 5},
                {"job_id": "prio_batch_default", "workflow": "order-workflow"},
            ]
        }
        assert httpx.post(url, json=batch, headers=stack.auth_headers).status_code == 202
        bad = httpx.post(
            url, json={"workflow": "order-workflow", "priority": 6}, headers=stack.auth_headers
        )
        assert bad.status_code == 422
        body = bad.json()
        assert body["error"] == "invalid_request"
        assert body["fields"][0]["field"] == "priority"
        stack.wait_for(
            lambda: stack.scalar("SELECT count(*) FROM onceflow_instances") == 3, 60, "instances"
        )
        got = dict(rows(stack.db, "SELECT job_id, priority FROM onceflow_instances"))
        assert got == {"prio_single": 1, "prio_batch_5": 5, "prio_batch_default": 3}
    finally:
        stack.close()


def test_the_claims_are_served_by_the_claim_order_indexes(db):
    """The plain claim reads onceflow_instances_claim_order_idx in claim order (no sort
    of the runnable set); the flow-controlled claim reads the lane index."""
    create(db, wf.UNFAIR, [(f"ix_u_{i}", {}) for i in range(2000)])
    create(db, wf.PER_KEY, [(f"ix_k_{i}", {"customer": f"c{i % 50}"}) for i in range(2000)])
    with db.begin() as conn:
        conn.execute(sa.text("ANALYZE onceflow_instances"))
    params = {
        "owner": "o",
        "lease": 30,
        "now": None,
        "inflight": [],
        "cutoff": None,
        "any_workflow": True,
        "have_workflows": [],
        "have_versions": [],
        "limit": 32,
        "limited": [wf.PER_KEY],
        "uncontrolled": [wf.UNFAIR],
    }
    with db.connect() as conn:
        conn.execute(sa.text("SET enable_seqscan = off"))
        plan = "\n".join(
            row[0] for row in in_index_order(conn, sa.text("EXPLAIN " + _PICK.text), params)
        )
        assert "Index Scan using onceflow_instances_claim_order_idx" in plan
        assert "Seq Scan on onceflow_instances" not in plan
        flow = REGISTRY.flows()[wf.PER_KEY]
        plan = "\n".join(
            row[0]
            for row in in_index_order(
                conn,
                sa.text("EXPLAIN " + store_flow._FLOW_POOL.text),
                {
                    **params,
                    "workflow": wf.PER_KEY,
                    "min_per_lane": 2,
                    "depth": store_flow.LOOKAHEAD,  # the deepest read
                    "lone_depth": store_flow.LOOKAHEAD,
                    "ckey": list(flow.concurrency_key or ()),
                    "max_per_key": 2,
                    "hold": False,
                    "holding": ["running"],
                    "rkey": None,
                    "rate_limit": None,
                    "period": 1.0,
                    "fair": False,
                    "spec": "{}",
                },
            )
        )
        assert "onceflow_instances_lane_idx" in plan
        assert "Seq Scan on onceflow_instances" not in plan


def test_a_workflow_without_flow_control_is_claimed_with_or_without_a_lane(db):
    """The plain claim reads only instances without a lane, plus (one index probe) those
    that got a lane while their workflow had flow control that it no longer has."""
    create(db, wf.UNFAIR, [("no_lane", {})])
    create_instances(
        db,
        [
            Delivery(
                JobEnvelope("had_a_lane", wf.UNFAIR, {"tenant": "x"}),
                "t",
                0,
                next(_OFFSETS),
                lane_path=("tenant",),
            )
        ],
    )
    assert rows(db, "SELECT job_id, flow_lane FROM onceflow_instances ORDER BY 1") == [
        ("had_a_lane", "x"),
        ("no_lane", None),
    ]
    got = writes.claim(db, "o", 10, 30, versions={wf.UNFAIR: "any"}, flows=REGISTRY.flows())
    assert sorted(c.job_id for c in got) == ["had_a_lane", "no_lane"]


def test_flow_control_without_a_key_gives_the_empty_lane(db):
    create(db, wf.CAPPED, [("capped_1", {})])
    assert rows(db, "SELECT flow_lane FROM onceflow_instances") == [("",)]
    assert [c.job_id for c in claim(db, 10)] == ["capped_1"]
    assert claim(db, 10) == []  # concurrency=1 is full
