"""What step code may ask about the step it runs in: :func:`current_step`.

Part of the definition API (user code imports it), so it lives below the engine: the
engine sets the context variable around each step; the worker around each task run.
"""

from __future__ import annotations

import contextvars
from dataclasses import dataclass


def idempotency_key(job_id: str, step_name: str) -> str:
    """The stable key step code passes to external systems: ``{job_id}:{step name}``."""
    return f"{job_id}:{step_name}"


@dataclass(frozen=True)
class StepInfo:
    job_id: str
    workflow: str
    name: str
    position: int
    attempt: int

    @property
    def idempotency_key(self) -> str:
        return idempotency_key(self.job_id, self.name)


_current_step: contextvars.ContextVar[StepInfo | None] = contextvars.ContextVar(
    "onceflow_current_step", default=None
)


def current_step() -> StepInfo:
    """The step being run (for step code: its idempotency key, attempt number)."""
    info = _current_step.get()
    if info is None:
        raise RuntimeError("current_step() called outside a workflow step")
    return info
