"""What step code may ask about the step it runs in: :func:`current_step`, and what it
may do from there: :func:`emit` a value to one of its instance's output streams.

Part of the definition API (user code imports it), so it lives below the engine: the
engine sets the context variable around each step; the worker around each task run.
"""

from __future__ import annotations

import contextvars
from dataclasses import dataclass
from typing import Any, Protocol


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


class StepOutput(Protocol):
    """The engine's side of :func:`emit` (``workflow_engine.engine.emits.StepOutput``)."""

    def emit_blocking(self, stream: Any, value: Any) -> int | None: ...


_step_output: contextvars.ContextVar[StepOutput | None] = contextvars.ContextVar(
    "onceflow_step_output", default=None
)


def emit(stream: str, value: Any) -> int | None:
    """Append ``value`` (JSON) to output stream ``stream`` of the instance this step
    belongs to, from sync step code run in a thread (the default for sync steps).
    Returns once the value is committed: its seq, the ``id`` readers see (``GET
    /v1/jobs/{id}/stream``). In the workflow body, and in async step code, use
    ``await ctx.emit(stream, value)``.

    Each attempt appends its own values: if a step is retried, or a crash cut its
    attempt off, readers see the earlier attempt's values, then the new attempt's
    (``current_step().attempt`` tells them apart if the values carry it). A completed
    step is never run again, so its values are never repeated.

    Raises ``StreamValueRefused`` for a bad name or value and ``StreamLimitReached``
    past the instance's bounds; both are ``NonRetryableError``: the step fails at once.
    """
    output = _step_output.get()
    if output is None:
        raise RuntimeError(
            "emit() called outside a workflow step; in the workflow body use"
            " `await ctx.emit(stream, value)`"
        )
    return output.emit_blocking(stream, value)
