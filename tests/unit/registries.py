"""Small registries for tests that need a process's definitions but no real workflow."""

from __future__ import annotations

from collections.abc import Iterable, Mapping

from workflow_engine.model import Registry, TaskDef, WorkflowDef


async def _nothing(ctx, params):
    return None


def registry_of(workflows: Mapping[str, str] | None = None, tasks: Iterable[str] = ()) -> Registry:
    """A registry holding ``workflows`` (name -> version), which do nothing, and
    ``tasks`` (names), which do nothing either."""
    registry = Registry()
    for name, version in (workflows or {}).items():
        registry.add_workflow(WorkflowDef(_nothing, name, version))
    for name in tasks:
        registry.add_task(TaskDef(name, lambda params: None))
    return registry
