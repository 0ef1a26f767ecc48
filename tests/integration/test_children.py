"""Child workflows and gather on real PostgreSQL: started once (through the job-id
constraint, also when the parent replays after a SIGKILL), awaited durably, failures
raised in the parent, branches checkpointed once, the parent close policy, and two
engine processes sharing the work."""

from __future__ import annotations

import json
import os
import signal
import time
from collections import Counter

import pytest
import sqlalchemy as sa
from fastapi.testclient import TestClient

from console import create_app
from onceflow.vocabulary import InstanceStatus, ParentClosePolicy
from onceflow_cli.render import render_instance
from onceflow_tools.processes import ProcessGroup, free_port
from tests.conftest import settings_env
from tests.integration import child_workflows
from tests.integration.test_engine_durable import Harness as FakeClockHarness
from tests.integration.test_engine_durable import create, status, wait_for
from workflow_engine.clock import SystemClock
from workflow_engine.store import operations, writes
from workflow_engine.store.views import describe_instance, job_trace
from workflow_engine.store.writes import FinishInstance, Lease


class Harness(FakeClockHarness):
    """An in-process engine on the real clock: a child's finish and an event make their
    parent runnable at the database's now(), which a fake clock would lag behind."""

    def __init__(self, settings, db):
        super().__init__(settings, db)
        self.runner.clock = SystemClock()


def q(db, sql, **params):
    with db.connect() as conn:
        return conn.execute(sa.text(sql), params).all()


def children_of(db, parent):
    return q(
        db,
        "SELECT i.job_id, i.status, j.origin FROM onceflow_instances i"
        " JOIN onceflow_jobs j USING (job_id) WHERE i.parent_job_id = :p ORDER BY 1",
        p=parent,
    )


def test_child_result_is_returned_to_the_parent_and_the_tree_is_described(settings, db):
    create(db, "p1", "test-parent", {"child": {"amount": 7}})
    with Harness(settings, db) as h:
        wait_for(lambda: status(db, "p1") == "complete", "parent complete")
        # its run ends just after its final write commits: wait for it, not for luck
        wait_for(lambda: h.inflight() == 0, "no run left in flight")
    assert describe_instance(db, "p1").result["child"]["amount"] == 7
    assert children_of(db, "p1") == [("p1__charge", "complete", "child")]
    parent, kid = describe_instance(db, "p1"), describe_instance(db, "p1__charge")
    assert [(c.job_id, c.status) for c in parent.children] == [("p1__charge", "complete")]
    assert (kid.parent_job_id, kid.parent_close_policy, kid.provenance) == (
        "p1",
        "terminate",
        "child of p1",
    )
    assert "child 'charge': p1__charge (test-child) complete" in render_instance(parent)
    assert "parent: p1 (on parent close: terminate)" in render_instance(kid)
    events = [(e.event, e.detail) for e in job_trace(db, "p1")]
    assert ("child started", '"charge" p1__charge (workflow test-child)') in events
    assert ("child complete", '"charge" p1__charge') in events
    assert ("child result taken", '"charge" p1__charge') in events
    child_events = [(e.event, e.detail) for e in job_trace(db, "p1__charge")]
    assert child_events[0] == (
        "instance created",
        "workflow test-child, started by parent p1 (on parent close: terminate)",
    )
    assert not {"received", "enqueued"} & {event for event, _ in child_events}
    console = TestClient(create_app(settings, db), base_url="http://testserver")
    assert 'href="/instances/p1__charge"' in console.get("/instances/p1").text
    assert 'id="parent"><a href="/instances/p1"' in console.get("/instances/p1__charge").text


def test_a_child_of_a_fairness_keyed_workflow_gets_its_lane(settings, db):
    """Children are created by their own statement, not the worker's create path: they
    must still store the fairness lane the flow-controlled claim rotates over."""
    create(db, "fp", "test-fair-parent", {"tenants": ["acme", "globex"]})
    with Harness(settings, db):
        wait_for(lambda: status(db, "fp") == "complete", "parent complete")
    lanes = q(db, "SELECT job_id, flow_lane FROM onceflow_instances WHERE parent_job_id = 'fp'")
    assert sorted(lanes) == [("fp__acme", "acme"), ("fp__globex", "globex")]


def test_the_parent_waits_without_holding_a_worker_and_is_woken_by_the_child(settings, db):
    create(db, "p2", "test-parent", {"child": {"hold": True, "amount": 3}})
    with Harness(settings, db) as h:
        wait_for(lambda: status(db, "p2") == "waiting", "parent waiting for its child")
        wait_for(lambda: h.inflight() == 0, "no worker held")
        assert q(
            db, "SELECT status FROM onceflow_steps WHERE job_id = 'p2' AND kind = 'child'"
        ) == [("waiting",)]
        operations.send_event(db, "test-child", "p2__charge", "release", {})
        wait_for(lambda: status(db, "p2") == "complete", "parent woken and complete")
    assert describe_instance(db, "p2").result["child"]["amount"] == 3


def test_a_failed_child_raises_in_the_parent_which_may_catch_it(settings, db):
    create(db, "p3", "test-parent-catch")
    create(db, "p4", "test-parent", {"child": {"fail": True}})
    with Harness(settings, db):
        wait_for(lambda: status(db, "p3") == "complete", "catching parent complete")
        wait_for(lambda: status(db, "p4") == "errored", "uncaught failure errors the parent")
    assert describe_instance(db, "p3").result == {
        "caught": "card declined",
        "status": "errored",
        "child": "p3__charge",
    }
    assert describe_instance(db, "p4").error == "child p4__charge errored: card declined"


def test_a_terminated_child_raises_in_its_waiting_parent(settings, db):
    create(db, "p5", "test-parent", {"child": {"hold": True}})
    with Harness(settings, db):
        wait_for(lambda: status(db, "p5") == "waiting", "parent waiting")
        wait_for(lambda: status(db, "p5__charge") == "waiting", "child waiting")
        operations.terminate(db, "test-child", "p5__charge")
        wait_for(lambda: status(db, "p5") == "errored", "parent raised")
    assert describe_instance(db, "p5").error == (
        "child p5__charge terminated: terminated by operator"
    )


def test_gather_of_steps_checkpoints_each_branch_once_and_replays(settings, db):
    child_workflows.EFFECTS.clear()
    create(db, "g1", "test-gather-steps")
    with Harness(settings, db):
        wait_for(lambda: status(db, "g1") == "complete", "complete after a replay")
    assert describe_instance(db, "g1").result == {
        "branches": ["a", "b", ["c1", "c2"]],
        "after": "after",
    }
    steps = q(
        db,
        "SELECT s.name, s.position, s.status, count(a.*) FROM onceflow_steps s"
        " LEFT JOIN onceflow_step_attempts a USING (job_id, position)"
        " WHERE s.job_id = 'g1' GROUP BY 1, 2, 3 ORDER BY 2",
    )
    # gather at 0 with 3 branches: a=0, b=1, c1=2, c2=2+3; then the sleep at 0+3*2.
    assert steps == [
        ("a", 0, "complete", 1),
        ("b", 1, "complete", 1),
        ("c1", 2, "complete", 1),
        ("c2", 5, "complete", 1),
        ("pause", 6, "complete", 0),
        ("after", 7, "complete", 1),
    ]
    assert q(db, "SELECT max(claim_count) FROM onceflow_instances")[0][0] == 2  # replayed
    assert Counter(child_workflows.EFFECTS) == Counter(
        {("g1", n): 1 for n in ("a", "b", "c1", "c2", "after")}
    )


def test_gather_of_n_children(settings, db):
    create(db, "f1", "test-fanout", {"n": 8})
    with Harness(settings, db):
        wait_for(lambda: status(db, "f1") == "complete", "fan-in complete")
    assert describe_instance(db, "f1").result == {"total": sum(range(8)), "n": 8}
    kids = children_of(db, "f1")
    assert [k[0] for k in kids] == sorted(f"f1__c{i}" for i in range(8))
    assert {k[1] for k in kids} == {"complete"}
    entries = q(
        db,
        "SELECT count(*), count(DISTINCT child_job_id) FROM onceflow_steps"
        " WHERE job_id = 'f1' AND kind = 'child' AND status = 'complete'",
    )
    assert entries == [(8, 8)]


def test_terminate_policy_terminates_children_and_abandon_leaves_them(settings, db):
    create(db, "c1", "test-parent-close")
    with Harness(settings, db):
        wait_for(lambda: status(db, "c1") == "waiting", "parent waiting")
        wait_for(
            lambda: status(db, "c1__doomed") == "waiting" and status(db, "c1__spared") == "waiting",
            "children waiting",
        )
        operations.terminate(db, "test-parent-close", "c1")
        assert status(db, "c1__doomed") == "terminated"  # in the same transaction
        assert status(db, "c1__spared") == "waiting"
        operations.send_event(db, "test-child", "c1__spared", "release", {})
        wait_for(lambda: status(db, "c1__spared") == "complete", "abandoned child finishes")
    assert status(db, "c1") == "terminated"


def test_terminate_policy_reaches_a_running_child_through_its_engine(settings, db):
    create(db, "c2", "test-parent", {"child": {"step_seconds": 1.0, "then_more": True}})
    with Harness(settings, db):
        wait_for(lambda: status(db, "c2__charge") == "running", "child running its step")
        wait_for(lambda: status(db, "c2") == "waiting", "parent waiting")
        operations.terminate(db, "test-parent", "c2")
        wait_for(lambda: status(db, "c2__charge") == "terminated", "child terminated by its engine")


def _engine_env(settings, tmp_path):
    modules = [*settings.workflow_modules, "tests.integration.child_workflows"]
    return {
        **settings_env(settings),
        "ONCEFLOW_WORKFLOW_MODULES": json.dumps(modules),
        "ONCEFLOW_ENGINE_LEASE_SECONDS": "3",
        "ONCEFLOW_ENGINE_POLL_INTERVAL_SECONDS": "0.2",
    }


def _start_engine(group, name):
    port = free_port()
    group.start(name, "engine", env={"ONCEFLOW_ENGINE_METRICS_PORT": str(port)})
    group.wait_http(f"http://127.0.0.1:{port}/metrics")


def _until(predicate, what, group, timeout=60.0):
    deadline = time.monotonic() + timeout
    while not predicate():
        assert time.monotonic() < deadline, f"timed out waiting for {what}"
        group.check_alive()
        time.sleep(0.05)


@pytest.mark.timeout(150)
def test_a_child_starts_once_when_the_parent_replays_after_a_sigkill(settings, db, tmp_path):
    """SIGKILL the engine after start_child committed and before the child finished (the
    parent is in its slow 'meanwhile' step, the child in its slow 'charge'); a second
    engine replays the parent from its history: still exactly one child."""
    create(
        db,
        "k1",
        "test-parent",
        {"child": {"amount": 4, "step_seconds": 2.0}, "meanwhile_seconds": 2.0},
    )

    def entry_running():
        rows = q(db, "SELECT status FROM onceflow_steps WHERE job_id = 'k1' AND name = 'meanwhile'")
        return rows == [("running",)] and status(db, "k1__charge") == "running"

    with ProcessGroup(_engine_env(settings, tmp_path), tmp_path / "logs") as group:
        _start_engine(group, "engine-1")
        _until(entry_running, "parent in 'meanwhile' and child running", group)
        group.stop("engine-1", signal.SIGKILL)
        assert status(db, "k1") == "running" and status(db, "k1__charge") == "running"
        _start_engine(group, "engine-2")
        _until(lambda: status(db, "k1") == "complete", "parent complete on engine-2", group)
    assert children_of(db, "k1") == [("k1__charge", "complete", "child")]
    assert q(db, "SELECT count(*) FROM onceflow_jobs WHERE job_id LIKE 'k1%'") == [(2,)]
    assert q(db, "SELECT claim_count FROM onceflow_instances WHERE job_id = 'k1'")[0][0] >= 2
    assert describe_instance(db, "k1").result["child"]["amount"] == 4


@pytest.mark.timeout(180)
def test_two_engines_fan_out_and_in_with_a_sigkill(settings, db, tmp_path, capsys):
    # ONCEFLOW_TEST_CHILDREN_SCALE=k: k times the parents and the children (a soak run).
    scale = int(os.environ.get("ONCEFLOW_TEST_CHILDREN_SCALE", "1"))
    parents, n = 6 * scale, 5 * scale
    with ProcessGroup(_engine_env(settings, tmp_path), tmp_path / "logs") as group:
        _start_engine(group, "engine-a")
        _start_engine(group, "engine-b")
        for p in range(parents):
            create(db, f"t{p}", "test-fanout", {"n": n, "step_seconds": 1.0})

        def held_by_a():
            pid = group.procs["engine-a"].pid
            return {
                job
                for (job,) in q(
                    db,
                    "SELECT job_id FROM onceflow_instances WHERE lease_owner LIKE :o",
                    o=f"%:{pid}:%",
                )
            }

        _until(lambda: len(held_by_a()) >= 3, "engine-a running children", group)
        cut_off = held_by_a()
        group.stop("engine-a", signal.SIGKILL)
        _until(
            lambda: (
                q(
                    db,
                    "SELECT count(*) FROM onceflow_instances WHERE workflow = 'test-fanout'"
                    " AND status = 'complete'",
                )[0][0]
                == parents
            ),
            "every parent complete on engine-b",
            group,
            timeout=120,
        )
    for p in range(parents):
        assert describe_instance(db, f"t{p}").result == {"total": sum(range(n)), "n": n}
    kids = q(
        db,
        "SELECT count(*), count(DISTINCT job_id), count(*) FILTER (WHERE status = 'complete')"
        " FROM onceflow_instances WHERE parent_job_id IS NOT NULL",
    )
    assert kids == [(parents * n, parents * n, parents * n)]
    jobs = q(db, "SELECT count(*) FROM onceflow_jobs WHERE origin = 'child'")
    assert jobs == [(parents * n,)]
    # A checkpointed child step never ran again; only steps cut off by the kill did.
    repeated = q(
        db,
        "SELECT count(*) FROM onceflow_step_attempts WHERE attempt > 1"
        " AND outcome IS DISTINCT FROM 'abandoned'",
    )
    assert repeated[0][0] <= n * parents
    logs = "".join(p.read_text() for p in (tmp_path / "logs").glob("*.log"))
    taken_over = q(db, "SELECT count(*) FROM onceflow_instances WHERE claim_count > 1")[0][0]
    assert cut_off, "engine-a held nothing when it was killed"
    claims = dict(
        q(
            db,
            "SELECT job_id, claim_count FROM onceflow_instances WHERE job_id = ANY(:ids)",
            ids=sorted(cut_off),
        )
    )
    assert all(claims[job] >= 2 for job in cut_off)  # taken over by engine-b, and finished
    with capsys.disabled():
        print(
            f"\n{parents} parents x {n} children on two engines (one SIGKILLed):"
            f" {repeated[0][0]} repeated attempts, {logs.count('deadlock detected')} deadlocks,"
            f" {logs.count('engine.gave_back')} runs given back,"
            f" {taken_over} instances claimed more than once"
        )


# --- the wake-up cannot be lost: both orders of "child finishes" and "parent suspends" --


def _parent_awaiting_its_child(db, parent):
    """A parent leased by engine A that started a child (leased by engine B) and marked
    it awaited, as ``ctx.child_result`` does, but has not suspended yet."""
    create(db, parent, "test-parent")
    assert [c.job_id for c in writes.claim(db, "A", 1, 30)] == [parent]
    child = writes.child_job_id(parent, "charge")
    start = writes.StartChild(
        parent, 0, "charge", child, "test-child", {}, ParentClosePolicy.TERMINATE, None
    )
    assert writes.start_children(db, Lease("A", 1), [start]) == [True]
    assert status(db, child) == "queued"
    assert [c.job_id for c in writes.claim(db, "B", 1, 30)] == [child]
    awaited = [writes.Awaited(0, child)]
    assert writes.collect(db, Lease("A", 1), parent, awaited) == [None]  # not finished: awaited
    return child


def _runnable_now(db, job_id):
    return q(
        db,
        "SELECT status = 'waiting' AND run_after <= now() FROM onceflow_instances"
        " WHERE job_id = :j",
        j=job_id,
    ) == [(True,)]


def test_a_child_finishing_before_its_parent_suspends_still_wakes_it(db):
    child = _parent_awaiting_its_child(db, "r1")
    writes.write_batch(db, "B", [FinishInstance(child, 1, InstanceStatus.COMPLETE, b"1")])
    assert status(db, "r1") == "running"  # the finish found the parent still running
    writes.suspend(db, Lease("A", 1), "r1", InstanceStatus.WAITING, None)
    assert _runnable_now(db, "r1")  # the suspend saw the finished child


def test_a_child_finishing_after_its_parent_suspended_wakes_it(db):
    child = _parent_awaiting_its_child(db, "r2")
    writes.suspend(db, Lease("A", 1), "r2", InstanceStatus.WAITING, None)
    assert not _runnable_now(db, "r2")  # waits, forever unless woken
    writes.write_batch(db, "B", [FinishInstance(child, 1, InstanceStatus.ERRORED, None, "no")])
    assert _runnable_now(db, "r2")


def test_a_parent_waiting_for_an_event_is_not_woken_by_a_child_it_does_not_await(db):
    create(db, "r3", "test-parent")
    writes.claim(db, "A", 1, 30)
    child = writes.child_job_id("r3", "charge")
    start = writes.StartChild(
        "r3", 0, "charge", child, "test-child", {}, ParentClosePolicy.ABANDON, None
    )
    writes.start_children(db, Lease("A", 1), [start])
    writes.claim(db, "B", 1, 30)
    writes.suspend(db, Lease("A", 1), "r3", InstanceStatus.WAITING, None)
    writes.write_batch(db, "B", [FinishInstance(child, 1, InstanceStatus.COMPLETE, b"1")])
    assert not _runnable_now(db, "r3")  # no spurious replay


def test_the_checkout_sample_fans_out_and_compensates_a_declined_card(settings, db):
    import onceflow_examples.checkout  # noqa: F401  (registers the sample in this process)

    items = [{"amount": 1200}, {"amount": 300}]
    create(db, "cart_1", "checkout-workflow", {"items": items})
    create(db, "cart_2", "checkout-workflow", {"items": [*items, {"amount": 5, "declined": True}]})
    with Harness(settings, db):
        wait_for(lambda: status(db, "cart_1") == "complete", "paid")
        wait_for(lambda: status(db, "cart_2") == "complete", "declined and refunded")
    assert describe_instance(db, "cart_1").result == {"status": "paid", "total": 1500}
    assert describe_instance(db, "cart_2").result == {"status": "declined", "refunded": 2}
    assert [c.status for c in describe_instance(db, "cart_2").children] == [
        "complete",
        "complete",
        "errored",
    ]
    refunds = q(
        db, "SELECT count(*) FROM onceflow_steps WHERE job_id = 'cart_2' AND name LIKE 'refund %'"
    )
    assert refunds == [(2,)]


def test_restarting_a_parent_reuses_its_children(settings, db):
    create(db, "rs1", "test-parent", {"child": {"amount": 2}})
    with Harness(settings, db):
        wait_for(lambda: status(db, "rs1") == "complete", "parent complete")
        operations.restart(db, "test-parent", "rs1")
        wait_for(lambda: status(db, "rs1") == "complete", "parent complete again")
    assert q(db, "SELECT restart_count FROM onceflow_instances WHERE job_id = 'rs1'") == [(1,)]
    assert children_of(db, "rs1") == [("rs1__charge", "complete", "child")]  # not re-run
    assert describe_instance(db, "rs1").result["child"]["amount"] == 2


def test_a_child_id_taken_by_a_clients_job_fails_the_parent(settings, db):
    create(db, "ct__charge", "test-child", {"amount": 1})  # submitted over HTTP, say
    create(db, "ct", "test-parent")
    with Harness(settings, db):
        wait_for(lambda: status(db, "ct") == "errored", "parent refused the stranger")
    assert "is already the id of a job that is not a child of 'ct'" in (
        describe_instance(db, "ct").error
    )
    assert children_of(db, "ct") == []  # nothing adopted, nothing recorded


def test_a_restarted_parent_whose_child_was_pruned_gets_a_clear_failure(settings, db):
    create(db, "rp", "test-parent")
    with Harness(settings, db):
        wait_for(lambda: status(db, "rp") == "complete", "parent complete")
        with db.begin() as conn:  # what retention does to a finished child
            conn.execute(sa.text("DELETE FROM onceflow_instances WHERE job_id = 'rp__charge'"))
        operations.restart(db, "test-parent", "rp")
        wait_for(lambda: status(db, "rp") == "errored", "parent errored")
    assert describe_instance(db, "rp").error == (
        "child rp__charge gone: the child instance no longer exists"
    )
