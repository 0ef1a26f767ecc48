"""The Registry: one definition per workflow, schedules one per name."""

from __future__ import annotations

from datetime import timedelta

from onceflow.ticks import Schedule
from workflow_engine.definitions import _declared_schedule
from workflow_engine.model import Registry, WorkflowDef


async def _a(ctx, params):
    return None


async def _b(ctx, params):
    return None


def test_two_workflows_declaring_one_schedule_name_keep_the_last_registered():
    """One schedule row has one workflow: the one registered last wins, as it did when
    the schedules were a dict by name (found in review: both upserted, each resetting
    the row's place on every engine start)."""
    every = Schedule(timedelta(minutes=5), name="nightly")
    registry = Registry()
    registry.add_workflow(
        WorkflowDef(_a, "wf-a", "v1", schedule=_declared_schedule("wf-a", every, "UTC"))
    )
    registry.add_workflow(
        WorkflowDef(_b, "wf-b", "v1", schedule=_declared_schedule("wf-b", every, "UTC"))
    )
    assert [(s.name, s.workflow) for s in registry.schedules()] == [("nightly", "wf-b")]
