"""A run that fails outside the workflow's code, for a reason that is not a database
outage, errors its instance once instead of staying running to crash on every lease."""

from __future__ import annotations

from onceflow import failpoints
from onceflow.envelope import JobEnvelope
from tests.integration.interleavings import EngineHarness, scalar, status, wait_for
from workflow_engine import workflow
from workflow_engine.model import Delivery
from workflow_engine.store.writes import create_instances


@workflow("test-crash-in-settle")
async def crash_in_settle(ctx, params):
    return await ctx.step("only", lambda: "done")


def test_a_run_that_crashes_while_settling_errors_its_instance_once(settings, db):
    create_instances(db, [Delivery(JobEnvelope("cr1", "test-crash-in-settle", {}), "t", 0, 0)])
    failpoints.arm("engine.before_finish", "raise", job_id="cr1")
    with EngineHarness(settings, db, engine_lease_seconds=30):
        wait_for(lambda: status(db, "cr1") == "errored", "errored, not left running", 10)
    error = scalar(db, "SELECT error FROM onceflow_instances WHERE job_id = 'cr1'")
    assert error.startswith("engine error while running it: FailpointError")
    assert scalar(db, "SELECT claim_count FROM onceflow_instances WHERE job_id = 'cr1'") == 1
