"""A step failure the workflow caught is replayed from the history, never run again
(issue 23, case 5).

The workflow catches the failure of "charge", compensates, and sleeps; the sleep ends
the claim, so the rest runs on a replay from the top. Replay raises the recorded error
again at "charge" and the workflow takes the same branch: "charge" (which would succeed
the second time, as the customer's card network came back) ran exactly once.
"""

from __future__ import annotations

import pytest

from onceflow.envelope import JobEnvelope
from tests.integration.interleavings import (
    EngineHarness,
    Executions,
    check_history,
    rows,
    status,
    wait_for,
)
from workflow_engine import NonRetryableError, RetryPolicy, StepFailed, workflow
from workflow_engine.model import Delivery
from workflow_engine.store.views import describe_instance
from workflow_engine.store.writes import create_instances

RAN = Executions()


class CardDeclined(NonRetryableError):
    """The step's own error for a card that will not go through."""


def charge(job_id: str, fail_with: str) -> str:
    """Fails its first execution (a NonRetryableError or an error that exhausts its one
    attempt), succeeds after: a second run would charge the customer."""
    run = RAN.begin(job_id, "charge")
    try:
        if RAN.count(job_id, "charge") == 1:
            raise CardDeclined("card declined") if fail_with == "declined" else OSError("down")
        return "charged"
    finally:
        RAN.end(run)


def refund(job_id: str) -> str:
    run = RAN.begin(job_id, "refund")
    RAN.end(run)
    return "refunded"


@workflow("test-caught-failure")
async def caught_failure(ctx, params):
    try:
        charged = await ctx.step(
            "charge", charge, ctx.job_id, params["fail_with"], retries=RetryPolicy(limit=0)
        )
    except (StepFailed, CardDeclined) as exc:
        charged = f"{type(exc).__name__}: {exc}"
        await ctx.step("refund", refund, ctx.job_id)
    await ctx.sleep("cool down", 60)
    return {"charge": charged, "notified": await ctx.step("notify", lambda: "sent")}


@pytest.mark.parametrize(
    ("fail_with", "seen"),
    [
        ("declined", "CardDeclined: card declined"),
        ("error", "StepFailed: step 'charge' failed after 1 attempts: OSError: down"),
    ],
)
def test_a_caught_step_failure_is_not_run_again_after_a_sleep(settings, db, fail_with, seen):
    job_id = f"cf_{fail_with}"
    envelope = JobEnvelope(job_id, "test-caught-failure", {"fail_with": fail_with})
    create_instances(db, [Delivery(envelope, "t", 0, 0)])
    with EngineHarness(settings, db) as engine:
        wait_for(lambda: status(db, job_id) == "sleeping", "the sleep")
        engine.clock.advance(61)
        wait_for(lambda: status(db, job_id) in ("complete", "errored"), "the end of the run")
    view = describe_instance(db, job_id)
    assert view.status == "complete", view.error
    assert view.result == {"charge": seen, "notified": "sent"}
    assert (RAN.count(job_id, "charge"), RAN.count(job_id, "refund")) == (1, 1)
    attempts = rows(
        db,
        "SELECT a.outcome FROM onceflow_step_attempts a JOIN onceflow_steps s"
        " USING (job_id, position) WHERE s.job_id = :j AND s.name = 'charge'",
        j=job_id,
    )
    assert [outcome for (outcome,) in attempts] == ["failed"]
    assert check_history(db) == []
