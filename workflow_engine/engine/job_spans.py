"""The engine's spans, all children of the job's stored ``traceparent``.

* ``step <name>``: one per attempt (``onceflow.attempt``), current while the step code
  runs, so spans the step code makes nest under it; an error status when it failed.
* ``sleep <name>`` and ``wait <name>``: one each, recorded when the sleep or the wait
  ends (a run that suspends on it records nothing yet, so a wait that spans two
  claims is still one span).
* ``instance <status>``: the instance finished (complete, errored).

Replay is silent: a completed step, sleep or wait returns from its recorded history
before any of this is reached (DESIGN.md: a replayed completed step emits no span).
Built only when tracing is on and the job has a ``traceparent``.
"""

from __future__ import annotations

import contextlib
import time
from datetime import datetime

from opentelemetry import trace
from opentelemetry.context import Context
from opentelemetry.trace import Span, Status, StatusCode

from onceflow import tracing

_tracer = tracing.tracer("onceflow.engine")


class JobSpans:
    """Makes the spans of one claimed run of one job."""

    __slots__ = ("_attrs", "_parent")

    def __init__(self, parent: Context, job_id: str, workflow: str, claim: int) -> None:
        self._parent = parent
        self._attrs: dict[str, str | int] = {
            tracing.JOB_ID: job_id,
            tracing.WORKFLOW: workflow,
            "onceflow.claim": claim,
        }

    @classmethod
    def of(cls, traceparent: str | None, job_id: str, workflow: str, claim: int) -> JobSpans | None:
        parent = tracing.context_from_traceparent(traceparent)
        return cls(parent, job_id, workflow, claim) if parent is not None else None

    def step(self, name: str, position: int, attempt: int) -> Span:
        return _tracer.start_span(
            f"step {name}",
            context=self._parent,
            attributes={
                **self._attrs,
                tracing.STEP: name,
                "onceflow.position": position,
                tracing.ATTEMPT: attempt,
            },
        )

    def cut_off(self, name: str, position: int, attempt: int) -> None:
        """Record an attempt whose run ended before its checkpoint (its engine was
        killed, or lost the database or its lease): it left no span of its own, since
        the process that ran it never ended one. Found by the replay that runs the step
        again, so the trace shows the crash and the attempt it cost."""
        span = self.step(name, position, attempt)
        span.set_attribute("onceflow.cut_off", True)
        why = "cut off before its checkpoint (engine died or lost its lease)"
        span.set_status(Status(StatusCode.ERROR, why))
        span.end()

    def waited(
        self,
        kind: str,
        name: str,
        position: int,
        start_ns: int,
        event: str | None = None,
        timed_out: str | None = None,
    ) -> None:
        """Record a sleep or an event wait that has just ended (``timed_out``: the
        event type whose wait timed out)."""
        span = _tracer.start_span(
            f"{kind} {name}",
            context=self._parent,
            start_time=start_ns,
            attributes={**self._attrs, tracing.STEP: name, "onceflow.position": position},
        )
        if event or timed_out:
            span.set_attribute("onceflow.event_type", event or timed_out or "")
        if timed_out:
            span.set_status(Status(StatusCode.ERROR, f"timed out waiting for {timed_out!r}"))
        span.end()

    def finished(self, status: str, error: str | None) -> None:
        span = _tracer.start_span(
            f"instance {status}",
            context=self._parent,
            attributes={**self._attrs, "onceflow.status": status},
        )
        if error:
            span.set_status(Status(StatusCode.ERROR, error[:500]))
        span.end()


def active(span: Span | None) -> contextlib.AbstractContextManager[object]:
    """Make ``span`` current (step code's own spans nest under it); no-op for None."""
    if span is None:
        return contextlib.nullcontext()
    return trace.use_span(span, end_on_exit=False, record_exception=False)


def end(span: Span | None, exc: BaseException | None = None) -> None:
    if span is None:
        return
    if exc is not None:
        span.record_exception(exc)
        span.set_status(Status(StatusCode.ERROR, f"{type(exc).__name__}: {exc}"[:500]))
    span.end()


def sleep_start_ns(wake: datetime | None, delay: float | None) -> int:
    """When a sleep began: its wake time less its duration (now, if not known)."""
    if wake is not None and delay is not None:
        return int((wake.timestamp() - delay) * 1e9)
    return time.time_ns()
