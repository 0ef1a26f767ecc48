"""The workflow engine: the definition API, the engine process, and the PostgreSQL layer.

Public API::

    from workflow_engine import workflow, task, RetryPolicy, NonRetryableError, current_step, emit

Sub-packages: :mod:`workflow_engine.store` (the one owner of the database) and
:mod:`workflow_engine.engine` (the engine process). The names below are resolved
lazily (PEP 562), so that a process importing only the store or the definitions — the
streams worker, ingest — does not load the engine runtime and register its metrics.
"""

from __future__ import annotations

from importlib import import_module
from typing import TYPE_CHECKING, Any

_EXPORTS = {
    "FakeClock": "workflow_engine.clock",
    "SystemClock": "workflow_engine.clock",
    "ChildHandle": "workflow_engine.definitions",
    "Context": "workflow_engine.definitions",
    "Debounce": "workflow_engine.model",
    "RetryPolicy": "workflow_engine.definitions",
    "Batch": "workflow_engine.model",
    "RateLimit": "workflow_engine.model",
    "Singleton": "workflow_engine.model",
    "WebhookSubscription": "workflow_engine.model",
    "Schedule": "onceflow.ticks",
    "registered_tasks": "workflow_engine.definitions",
    "registered_versions": "workflow_engine.definitions",
    "registered_workflows": "workflow_engine.definitions",
    "task": "workflow_engine.definitions",
    "workflow": "workflow_engine.definitions",
    "ChildWorkflowFailed": "workflow_engine.errors",
    "EventTimeout": "workflow_engine.errors",
    "NonDeterminismError": "workflow_engine.errors",
    "NonRetryableError": "workflow_engine.errors",
    "StepFailed": "workflow_engine.errors",
    "StreamLimitReached": "workflow_engine.errors",
    "StreamValueRefused": "workflow_engine.errors",
    "WorkflowError": "workflow_engine.errors",
    "StepInfo": "workflow_engine.steps",
    "current_step": "workflow_engine.steps",
    "emit": "workflow_engine.steps",
    "WorkflowContext": "workflow_engine.engine.context",
    "CreateResult": "workflow_engine.model",
    "Delivery": "workflow_engine.model",
    "Registry": "workflow_engine.model",
    "REGISTRY": "workflow_engine.definitions",
    "create_instances": "workflow_engine.store.writes",
}

__all__ = [
    "REGISTRY",
    "Batch",
    "ChildHandle",
    "ChildWorkflowFailed",
    "Context",
    "CreateResult",
    "Debounce",
    "Delivery",
    "EventTimeout",
    "FakeClock",
    "NonDeterminismError",
    "NonRetryableError",
    "RateLimit",
    "Registry",
    "RetryPolicy",
    "Schedule",
    "Singleton",
    "StepFailed",
    "StepInfo",
    "StreamLimitReached",
    "StreamValueRefused",
    "SystemClock",
    "WebhookSubscription",
    "WorkflowContext",
    "WorkflowError",
    "create_instances",
    "current_step",
    "emit",
    "registered_tasks",
    "registered_versions",
    "registered_workflows",
    "task",
    "workflow",
]

if TYPE_CHECKING:
    from onceflow.ticks import Schedule
    from workflow_engine.clock import FakeClock, SystemClock
    from workflow_engine.definitions import (
        REGISTRY,
        ChildHandle,
        Context,
        RetryPolicy,
        registered_tasks,
        registered_versions,
        registered_workflows,
        task,
        workflow,
    )
    from workflow_engine.engine.context import WorkflowContext
    from workflow_engine.errors import (
        ChildWorkflowFailed,
        EventTimeout,
        NonDeterminismError,
        NonRetryableError,
        StepFailed,
        StreamLimitReached,
        StreamValueRefused,
        WorkflowError,
    )
    from workflow_engine.model import (
        Batch,
        CreateResult,
        Debounce,
        Delivery,
        RateLimit,
        Registry,
        Singleton,
        WebhookSubscription,
    )
    from workflow_engine.steps import StepInfo, current_step, emit
    from workflow_engine.store.writes import create_instances


def __getattr__(name: str) -> Any:
    module = _EXPORTS.get(name)
    if module is None:
        raise AttributeError(f"module 'workflow_engine' has no attribute {name!r}")
    value = getattr(import_module(module), name)
    globals()[name] = value
    return value
