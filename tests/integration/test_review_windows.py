"""Windows found by reading the engine's durable paths (review of issue 23's fixes).

Each test pauses the engine exactly where a decision taken in one place is acted on
later, lets the other actor in, and checks the invariants (``check_history``).
"""

from __future__ import annotations

import contextlib
import threading
from collections.abc import Iterator

import pytest

from onceflow import failpoints
from onceflow.envelope import JobEnvelope
from tests.integration.interleavings import (
    EngineHarness,
    Executions,
    FlowingClock,
    check_history,
    scalar,
    status,
    wait_for,
)
from workflow_engine import RetryPolicy, StepFailed, workflow
from workflow_engine.model import Delivery
from workflow_engine.store.writes import create_instances

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


BAD_TEXT = {"nul": "\x00", "lone-surrogate": "\udcff"}


@workflow("test-review-bad-text")
async def bad_text(ctx, params):
    """A workflow error, and before it (``caught``) a caught step failure, whose
    messages hold text PostgreSQL cannot store (:data:`BAD_TEXT`)."""
    text = BAD_TEXT[params["text"]]  # not in params: jsonb would refuse them there

    def declined() -> str:
        RAN.end(RAN.begin(ctx.job_id, "charge"))
        raise RuntimeError(f"card {text} declined")

    if params["caught"]:
        with contextlib.suppress(StepFailed):
            await ctx.step("charge", declined, retries=RetryPolicy(limit=0))
    await ctx.sleep("nap", 0.3)  # a replay: the recorded failure again, no second charge
    raise RuntimeError(f"order {text} refused")


@pytest.mark.parametrize("caught", [False, True], ids=["workflow-error", "caught-step-failure"])
@pytest.mark.parametrize("text", sorted(BAD_TEXT))
def test_a_message_postgresql_cannot_hold_errors_the_instance_once(settings, db, text, caught):
    """PostgreSQL's text and jsonb hold no U+0000 nor a lone surrogate, and psycopg2
    refuses such a string itself (ValueError, UnicodeEncodeError: no SQLSTATE, so
    ``classify`` answers None): the finish carrying the workflow's error failed, the
    run "crashed", the instance stayed running until its lease expired, and every claim
    after the rescue failed the same way (five claims in ten seconds with a 2 s lease).
    A caught step failure's record (jsonb) was refused the same way: the workflow
    could not catch it, and errored with the driver's complaint instead."""
    create_instances(
        db,
        [
            Delivery(
                JobEnvelope("n1", "test-review-bad-text", {"text": text, "caught": caught}),
                "t",
                0,
                0,
            )
        ],
    )
    with EngineHarness(settings, db, FlowingClock(), engine_lease_seconds=2.0):
        wait_for(lambda: status(db, "n1") == "errored", "the instance errored", timeout=10)
    error = scalar(db, "SELECT error FROM onceflow_instances WHERE job_id = 'n1'")
    assert error.startswith("RuntimeError: order ") and error.endswith(" refused"), error
    assert scalar(db, "SELECT claim_count FROM onceflow_instances WHERE job_id = 'n1'") == 2
    assert RAN.count("n1", "charge") == (1 if caught else 0)
