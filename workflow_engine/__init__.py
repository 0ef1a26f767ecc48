"""The workflow engine: schema, the workflow definition API, the runner, control.

Public API::

    from workflow_engine import workflow, task, RetryPolicy, NonRetryableError, current_step
"""

from workflow_engine.clock import FakeClock, SystemClock
from workflow_engine.context import StepInfo, WorkflowContext, current_step
from workflow_engine.definitions import (
    RetryPolicy,
    registered_tasks,
    registered_workflows,
    task,
    workflow,
)
from workflow_engine.errors import (
    EventTimeout,
    NonDeterminismError,
    NonRetryableError,
    StepFailed,
    WorkflowError,
)
from workflow_engine.instances import CreateResult, Delivery, create_instances

__all__ = [
    "CreateResult",
    "Delivery",
    "EventTimeout",
    "FakeClock",
    "NonDeterminismError",
    "NonRetryableError",
    "RetryPolicy",
    "StepFailed",
    "StepInfo",
    "SystemClock",
    "WorkflowContext",
    "WorkflowError",
    "create_instances",
    "current_step",
    "registered_tasks",
    "registered_workflows",
    "task",
    "workflow",
]
