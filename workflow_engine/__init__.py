"""The workflow engine: schema, the workflow definition API, the runner, control.

Public API::

    from workflow_engine import workflow, RetryPolicy, NonRetryableError, current_step
"""

from workflow_engine.context import StepInfo, WorkflowContext, current_step
from workflow_engine.definitions import RetryPolicy, registered_workflows, workflow
from workflow_engine.errors import (
    NonDeterminismError,
    NonRetryableError,
    StepFailed,
    WorkflowError,
)
from workflow_engine.instances import CreateResult, Delivery, create_instances

__all__ = [
    "CreateResult",
    "Delivery",
    "NonDeterminismError",
    "NonRetryableError",
    "RetryPolicy",
    "StepFailed",
    "StepInfo",
    "WorkflowContext",
    "WorkflowError",
    "create_instances",
    "current_step",
    "registered_workflows",
    "workflow",
]
