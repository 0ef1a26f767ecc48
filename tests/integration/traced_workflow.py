"""``test-traced``, loaded by the processes of test_tracing.py (``ONCEFLOW_WORKFLOW_MODULES``):
a step that fails once and retries after a delay, a durable sleep, a step, an event wait
that times out, a last step. The instance is claimed five times; every claim replays
the steps before it, which must add no span."""

import contextlib

from workflow_engine import workflow
from workflow_engine.definitions import RetryPolicy
from workflow_engine.errors import EventTimeout
from workflow_engine.steps import current_step

NAME = "test-traced"
RETRY = RetryPolicy(limit=2, delay=0.3)


def flaky(label: str) -> str:
    if current_step().attempt == 1:
        raise RuntimeError("first attempt fails")
    return label


def effect(label: str) -> str:
    return label


@workflow(NAME)
async def traced(ctx, params):
    await ctx.step("prepare", flaky, "prepared", retries=RETRY)  # 2 attempts, 2 claims
    await ctx.sleep("cool off", 0.5)  # a third claim
    await ctx.step("work", effect, "worked")
    with contextlib.suppress(EventTimeout):  # times out: a fourth claim
        await ctx.wait_for_event("approval", type="approved", timeout=0.5)
    return {"done": await ctx.step("finish", effect, "finished")}
