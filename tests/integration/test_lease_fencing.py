"""A lease is a fencing token: the claim number travels with every guarded write.

After a rescue re-queued an instance whose run goes on (cut off from the database past
its lease, or paused), the same engine must neither claim it again while that run is in
flight nor let that older run write once the instance is claimed anew (issue 23, case 2).
"""

from __future__ import annotations

import threading

from onceflow import failpoints
from onceflow.envelope import JobEnvelope
from onceflow.vocabulary import AttemptOutcome, InstanceStatus
from tests.integration.interleavings import (
    EngineHarness,
    Executions,
    check_history,
    rows,
    scalar,
    status,
    wait_for,
)
from workflow_engine import workflow
from workflow_engine.model import Delivery
from workflow_engine.store import writes
from workflow_engine.store.writes import FinishInstance, FinishStep, StartStep, create_instances

RAN = Executions()
GATE = threading.Event()


def charge(job_id: str) -> str:
    run = RAN.begin(job_id, "charge")
    try:
        GATE.wait(30)  # the first run waits here while the rescue happens
        return "charged"
    finally:
        RAN.end(run)


@workflow("test-fenced")
async def fenced(ctx, params):
    await ctx.step("charge", charge, ctx.job_id)
    return await ctx.step("ship", lambda: "shipped")


def create(db, job_id, name):
    create_instances(db, [Delivery(JobEnvelope(job_id, name, {}), "t", 0, 0)])


def expire_and_rescue(db, job_id):
    """What the rescuer does once the lease expired: run by hand, at once."""
    with db.begin() as conn:
        conn.exec_driver_sql(
            "UPDATE onceflow_instances SET lease_expires_at = now() - interval '1 second'"
            f" WHERE job_id = '{job_id}'"
        )
    assert writes.rescue_expired(db) == [job_id]


def test_an_older_claim_cannot_write_even_from_the_same_owner(db):
    create(db, "f1", "order-workflow")
    [first] = writes.claim(db, "E", 1, 30)
    [started] = writes.write_batch(db, "E", [StartStep("f1", first.claim_count, 0, "a")])
    expire_and_rescue(db, "f1")
    [second] = writes.claim(db, "E", 1, 30)  # the same owner string, a newer claim
    assert second.claim_count == first.claim_count + 1
    old = FinishStep("f1", first.claim_count, 0, 1, started.at, AttemptOutcome.COMPLETE, b"1")
    [answer] = writes.write_batch(db, "E", [old])
    assert type(answer).__name__ == "LeaseLost", answer
    [answer] = writes.write_batch(
        db, "E", [FinishInstance("f1", first.claim_count, InstanceStatus.COMPLETE, b"1")]
    )
    assert type(answer).__name__ == "LeaseLost", answer
    assert writes.release(db, "E", [("f1", first.claim_count)]) == 0
    assert status(db, "f1") == "running"  # the newer claim still holds it
    beat = writes.write_batch(
        db, "E", [store_heartbeat(("f1", first.claim_count), ("f1", second.claim_count))]
    )
    assert beat == [frozenset({("f1", second.claim_count)})]
    assert writes.release(db, "E", [("f1", second.claim_count)]) == 1


def store_heartbeat(*held):
    from workflow_engine.store.writes import Heartbeat

    return Heartbeat(tuple(held), 30.0)


def test_an_engine_does_not_reclaim_an_instance_it_still_runs(settings, db):
    """The run of claim 1 is inside its step when the rescue re-queues the instance;
    the engine's next claim round (paused at ``engine.after_claim`` to look) must not
    take it, the old run's checkpoint is refused, and the next claim replays it with
    one execution of the step at a time."""
    RAN.spans.clear()
    GATE.clear()
    create(db, "f2", "test-fenced")
    with EngineHarness(settings, db, engine_lease_seconds=30):
        wait_for(lambda: RAN.count("f2", "charge") == 1, "the first run inside its step")
        round_after_rescue = failpoints.arm("engine.after_claim", "pause")
        expire_and_rescue(db, "f2")
        round_after_rescue.wait_reached()
        claimed = scalar(db, "SELECT claim_count FROM onceflow_instances WHERE job_id = 'f2'")
        state = status(db, "f2")
        round_after_rescue.release()
        assert (state, claimed) == ("queued", 1), "re-claimed while its run was in flight"
        assert RAN.count("f2", "charge") == 1
        GATE.set()
        wait_for(lambda: status(db, "f2") == "complete", "complete")
    attempts = rows(
        db,
        "SELECT attempt, outcome FROM onceflow_step_attempts WHERE job_id = 'f2'"
        " AND position = 0 ORDER BY attempt",
    )
    assert [tuple(a) for a in attempts] == [(1, "abandoned"), (2, "complete")]
    assert scalar(db, "SELECT claim_count FROM onceflow_instances WHERE job_id = 'f2'") == 2
    assert RAN.overlaps() == []
    assert check_history(db, RAN) == []
