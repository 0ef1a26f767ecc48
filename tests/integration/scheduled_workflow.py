"""A workflow with a declared schedule, loaded by the subprocess engines of
test_schedules.py (``ONCEFLOW_WORKFLOW_MODULES``): a tick every second, every missed
tick run on recovery, ticks started even while the previous one runs."""

from datetime import timedelta

from onceflow.ticks import Schedule
from onceflow.vocabulary import CatchupPolicy, OverlapPolicy
from workflow_engine import workflow

NAME = "tick-workflow"


def effect(n: int) -> int:
    return n


@workflow(
    NAME,
    version="v1",
    schedule=Schedule(
        timedelta(seconds=1),
        catchup=CatchupPolicy.RUN_ALL,
        overlap=OverlapPolicy.ALLOW,
        params={"from": "schedule"},
    ),
)
async def ticked(ctx, params):
    await ctx.step("one", effect, 1)
    return {"params": params}
