"""Exceptions of the workflow engine."""

from onceflow.errors import OnceflowError


class WorkflowError(OnceflowError):
    """Base class of engine errors."""


class NonRetryableError(WorkflowError):
    """Raise from step code to fail the step and the instance at once, without retries."""


class StepFailed(WorkflowError):
    """A step exhausted its retries; the instance errors with this message."""


class NonDeterminismError(WorkflowError):
    """On replay the workflow asked for a different step than the one recorded there."""


class StepResultError(NonRetryableError):
    """A step returned something that is not JSON-serialisable or is too large."""


class LeaseLost(WorkflowError):
    """This engine no longer holds the instance's lease; another engine owns it now."""


class UnknownWorkflow(WorkflowError):
    """No workflow with this name is registered in this engine process."""
