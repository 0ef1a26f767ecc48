"""One claim order across plain and flow-controlled workflows (issue 23, case 4), and
unversioned instances claimed only by an engine that has their workflow."""

from __future__ import annotations

import itertools

import sqlalchemy as sa

from onceflow.envelope import JobEnvelope
from tests.integration import flow_workflows as wf
from workflow_engine.definitions import REGISTRY
from workflow_engine.model import Delivery
from workflow_engine.store import writes
from workflow_engine.store.writes import create_instances

_OFFSETS = itertools.count()


def create(db, workflow, job_ids, priority=3, params=None, laned=True):
    create_instances(
        db,
        [
            Delivery(
                JobEnvelope(job_id, workflow, params or {"customer": "c1"}, priority=priority),
                "t",
                0,
                next(_OFFSETS),
                lane_path=REGISTRY.lane_path(workflow) if laned else None,
            )
            for job_id in job_ids
        ],
    )


def claim(db, limit):
    return [c.job_id for c in writes.claim(db, "E", limit, 30, flows=REGISTRY.flows())]


def age(db, job_id, seconds):
    with db.begin() as conn:
        conn.execute(
            sa.text(
                "UPDATE onceflow_instances SET run_after = now() - make_interval(secs => :s)"
                " WHERE job_id = :j"
            ),
            {"s": seconds, "j": job_id},
        )


def test_a_high_priority_limited_job_is_not_starved_by_a_plain_backlog(db):
    create(db, wf.UNFAIR, [f"plain_{i:03d}" for i in range(200)], priority=5)
    create(db, wf.PER_KEY, ["limited_p1"], priority=1)
    assert "limited_p1" in claim(db, 32)  # 120 s ahead in claim order: the first batch


def test_claim_order_holds_across_both_kinds(db):
    create(db, wf.UNFAIR, ["plain_old"], priority=3)
    create(db, wf.PER_KEY, ["limited_new"], priority=3)
    age(db, "plain_old", 10)
    assert claim(db, 1) == ["plain_old"]  # same priority: the one waiting longer
    create(db, wf.PER_KEY, ["limited_starved"], priority=5)
    create(db, wf.UNFAIR, ["plain_fresh"], priority=1)
    age(db, "limited_starved", 125)  # waited past 4 levels of aging (120 s)
    assert claim(db, 1) == ["limited_starved"]
    assert claim(db, 1) == ["plain_fresh"]
    assert claim(db, 1) == ["limited_new"]


def test_limits_still_hold_when_limited_jobs_come_first(db):
    create(db, wf.PER_KEY, [f"lim_{i}" for i in range(10)], priority=1)  # max 2 per key
    create(db, wf.UNFAIR, [f"pl_{i}" for i in range(10)], priority=5)
    got = claim(db, 8)
    assert sorted(j for j in got if j.startswith("lim_")) == ["lim_0", "lim_1"]
    assert len(got) == 8  # the plain ones fill the rest of the batch


def test_an_unversioned_instance_is_claimed_only_by_an_engine_that_has_its_workflow(db):
    create(db, wf.UNFAIR, ["old_one"])  # created with no version recorded
    with db.begin() as conn:
        conn.execute(sa.text("UPDATE onceflow_instances SET version = NULL"))
    lacking = writes.claim(db, "A", 5, 30, versions={"some-other-workflow": "v1"})
    assert lacking == []
    having = writes.claim(db, "B", 5, 30, versions={wf.UNFAIR: "v9"})
    assert [c.job_id for c in having] == ["old_one"]


def test_a_limited_workflow_whose_instances_have_no_lane_is_claimed_beside_a_plain_backlog(db):
    """Instances created before their workflow had flow control store no lane: the
    claim must still see that the workflow has work due."""
    create(db, wf.UNFAIR, [f"pl_{i}" for i in range(40)], priority=5)
    create(db, wf.CAPPED, ["capped_a", "capped_b"], priority=1, laned=False)  # concurrency=1
    got = claim(db, 32)
    assert [j for j in got if j.startswith("capped_")] == ["capped_a"]
