"""Windows found by reading the engine's durable paths (review of issue 23's fixes).

Each test pauses the engine exactly where a decision taken in one place is acted on
later, lets the other actor in, and checks the invariants (``check_history``).
"""

from __future__ import annotations

import threading
from collections.abc import Iterator

import pytest

from onceflow import failpoints
from onceflow.envelope import JobEnvelope
from tests.integration.interleavings import (
    EngineHarness,
    Executions,
    check_history,
    status,
    wait_for,
)
from workflow_engine import workflow
from workflow_engine.store.instances import Delivery, create_instances

RAN = Executions()
GATE = threading.Event()


def charge(job_id: str) -> str:
    run = RAN.begin(job_id, "charge")
    try:
        GATE.wait(30)  # held here while the engine shuts down
        return "charged"
    finally:
        RAN.end(run)


@workflow("test-review-drain")
async def drained(ctx, params):
    return await ctx.step("charge", charge, ctx.job_id)


@pytest.fixture(autouse=True)
def _clean() -> Iterator[None]:
    RAN.clear()
    GATE.clear()
    yield
    GATE.set()
    failpoints.disarm_all()


def in_progress(job_id: str, step: str) -> int:
    return sum(1 for j, s, _, end in RAN.spans if (j, s) == (job_id, step) and end is None)


def test_a_draining_engine_does_not_give_back_a_run_whose_step_still_runs(settings, db):
    """SIGTERM: the drain waits half a lease, then cancels the runs still going and
    releases their leases. A run cancelled inside sync step code leaves that code running
    in its thread (a thread cannot be stopped), so the release handed the instance to
    the next engine while the step was still executing here: two executions of one step
    at once. The drain must give an instance back only once its step code has returned
    (the heartbeat keeps the lease meanwhile)."""
    create_instances(db, [Delivery(JobEnvelope("d1", "test-review-drain", {}), "t", 0, 0)])
    first = EngineHarness(settings, db, engine_lease_seconds=2.0).start()
    second = None
    try:
        wait_for(lambda: in_progress("d1", "charge") == 1, "the run inside its step")
        release = failpoints.arm("engine.before_release", "pause")
        first.loop.call_soon_threadsafe(first.runner.stop)  # SIGTERM
        # The drain's grace is half a lease (1 s): the run is cancelled after it.
        run = first.runner._inflight["d1"]
        wait_for(run.task.done, "the drain to cancel the run", timeout=10)
        if not release.reached.wait(3.0):
            GATE.set()  # the drain waits for the step code: let it return
            release.wait_reached()
        release.release()
        first.thread.join(30)  # the drain released what it gave back, and stopped
        second = EngineHarness(settings, db).start()
        wait_for(
            lambda: in_progress("d1", "charge") == 2 or status(db, "d1") == "complete",
            "the next engine to run the step (beside the first, if it was given back early)",
        )
        GATE.set()
        wait_for(lambda: status(db, "d1") == "complete", "the next engine to complete it")
    finally:
        GATE.set()
        failpoints.disarm_all()
        first.stop()
        if second is not None:
            second.stop()
    assert RAN.overlaps() == []
    assert check_history(db, RAN) == []
