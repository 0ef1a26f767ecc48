"""The ``ctx`` a workflow function receives: durable steps with replay.

Replay model: a workflow function runs from the top every time its instance is
claimed. ``ctx.step`` counts positions; a step already checkpointed at that position
returns its stored result without running again, so only unfinished work runs. If the
code now asks for a different step name than the one recorded at that position, the
instance fails with :class:`NonDeterminismError` instead of doing something wrong.

At-least-once steps: a step's side effect can happen more than once if the process
dies after the side effect and before its checkpoint is written. Pass
``current_step().idempotency_key`` (``{job_id}:{step name}``) to external systems so
they can drop the repeat.
"""

from __future__ import annotations

import asyncio
import contextvars
import inspect
import logging
import time
from collections.abc import Callable
from datetime import datetime, timedelta
from typing import Any

from onceflow.vocabulary import AttemptOutcome, InstanceStatus, StepKind, StepStatus
from workflow_engine.definitions import DEFAULT_RETRY, RetryPolicy
from workflow_engine.engine import tracing
from workflow_engine.engine.metrics import STEP_DURATION, STEPS, STEPS_STARTED
from workflow_engine.engine.runtime import Runtime
from workflow_engine.engine.tracing import JobSpans
from workflow_engine.errors import (
    EventTimeout,
    NonDeterminismError,
    NonRetryableError,
    StepFailed,
    Suspend,
)
from workflow_engine.steps import StepInfo, _current_step, idempotency_key
from workflow_engine.store import execution as store
from workflow_engine.store.writes import FinishStep, StartStep

log = logging.getLogger(__name__)


class WorkflowContext:
    #: Set by the runner when tracing is on (workflow_engine/engine/tracing.py).
    spans: JobSpans | None = None

    def __init__(
        self,
        runtime: Runtime,
        job_id: str,
        workflow: str,
        recorded: list[store.RecordedStep],
        version: str | None = None,
        engine_version: str | None = None,
    ) -> None:
        self._rt = runtime
        self.job_id = job_id
        self.workflow = workflow
        self.version = version  # what the instance was created with
        self.engine_version = engine_version  # what this engine's definition is
        self._recorded = {s.position: s for s in recorded}
        self._position = 0
        self._patches: dict[str, bool] = {}

    def idempotency_key(self, step_name: str) -> str:
        return idempotency_key(self.job_id, step_name)

    def _next(self, name: str, kind: StepKind) -> tuple[int, store.RecordedStep | None]:
        """The next history position, checked against what was recorded there."""
        position = self._position
        self._position += 1
        recorded = self._recorded.get(position)
        if recorded is not None and (recorded.name != name or recorded.kind != kind):
            raise NonDeterminismError(
                f"workflow {self.workflow!r} asked for {kind} {name!r} at position {position},"
                f" but the history has {recorded.kind} {recorded.name!r} there"
                f" (instance created with version {self.version or '(none)'},"
                f" this engine has version {self.engine_version or '(none)'});"
                " the instance is stopped and no completed step runs again"
            )
        return position, recorded

    async def patched(self, patch_id: str) -> bool:
        """Whether this instance takes the code of patch ``patch_id`` (Temporal's
        ``patched``): at a fresh history position it records a marker and answers True;
        on replay it answers True iff the marker is recorded at this position (an
        instance that ran past this point on the old code answers False, and the marker
        takes no position). The answer is remembered for the rest of the run."""
        if patch_id in self._patches:
            return self._patches[patch_id]
        recorded = self._recorded.get(self._position)
        if recorded is not None:
            taken = recorded.kind == StepKind.PATCH and recorded.name == patch_id
            if taken:
                self._position += 1
        else:
            await self._rt.db(
                store.record_marker, self._rt.owner, self.job_id, self._position, patch_id
            )
            self._position += 1
            taken = True
        self._patches[patch_id] = taken
        return taken

    async def deprecate_patch(self, patch_id: str) -> None:
        """Retire ``patched(patch_id)`` once no instance without its marker is left:
        consumes the marker where the history has one, records nothing otherwise."""
        recorded = self._recorded.get(self._position)
        if recorded is not None and recorded.kind == StepKind.PATCH and recorded.name == patch_id:
            self._position += 1

    async def step(
        self,
        name: str,
        fn: Callable[..., Any],
        *args: Any,
        retries: RetryPolicy | None = None,
        timeout: float | None = None,
        **kwargs: Any,
    ) -> Any:
        """Run ``fn(*args, **kwargs)`` once, durably; return its (JSON) result.

        A failed attempt is retried per ``retries`` after a delay during which the
        instance sleeps durably (no worker is held); ``NonRetryableError`` fails the
        instance at once.
        """
        position, recorded = self._next(name, StepKind.STEP)
        if recorded is not None and recorded.status == StepStatus.COMPLETE:
            return recorded.result
        policy = retries or self._rt.default_retry or DEFAULT_RETRY
        while True:
            attempt = await self._rt.write(StartStep(self.job_id, position, name))
            STEPS_STARTED.labels(self.workflow).inc()
            token = _current_step.set(StepInfo(self.job_id, self.workflow, name, position, attempt))
            span = self.spans.step(name, position, attempt) if self.spans else None
            started = time.perf_counter()
            try:
                with tracing.active(span):
                    value = await self._invoke(fn, args, kwargs, timeout)
                encoded = store.encode_result(value, self._rt.max_result_bytes)
            except NonRetryableError as exc:
                tracing.end(span, exc)
                await self._finish(position, attempt, AttemptOutcome.FAILED, error=_describe(exc))
                STEPS.labels(self.workflow, AttemptOutcome.FAILED).inc()
                raise
            except Exception as exc:  # step code may raise anything: that is a failed attempt
                tracing.end(span, exc)
                await self._attempt_failed(name, position, attempt, policy, exc)
                continue
            finally:
                _current_step.reset(token)
            await self._attempt_complete(name, position, attempt, encoded, started)
            tracing.end(span)
            return value

    async def _attempt_failed(
        self, name: str, position: int, attempt: int, policy: RetryPolicy, exc: Exception
    ) -> None:
        """Record a failed attempt. Raises ``StepFailed`` once retries are spent and
        ``Suspend`` for a retry delay; returns when the step should run again at once."""
        final = attempt > policy.limit
        outcome = AttemptOutcome.FAILED if final else AttemptOutcome.RETRY
        await self._finish(position, attempt, outcome, error=_describe(exc))
        STEPS.labels(self.workflow, outcome).inc()
        delay = 0.0 if final else policy.delay_for(exc, attempt)
        log.warning(
            "step %r attempt %d failed: %s",
            name,
            attempt,
            exc,
            extra={
                "event": "step.failed" if final else "step.retry",
                "job_id": self.job_id,
                "step": name,
                "attempt": attempt,
                "retry_in": delay,
            },
        )
        if final:
            raise StepFailed(
                f"step {name!r} failed after {attempt} attempts: {_describe(exc)}"
            ) from exc
        if delay > 0:
            raise Suspend(InstanceStatus.SLEEPING, None, delay=delay) from None

    async def _attempt_complete(
        self, name: str, position: int, attempt: int, encoded: bytes, started: float
    ) -> None:
        await self._finish(position, attempt, AttemptOutcome.COMPLETE, result=encoded)
        STEPS.labels(self.workflow, AttemptOutcome.COMPLETE).inc()
        STEP_DURATION.labels(self.workflow).observe(time.perf_counter() - started)
        log.info(
            "step %r complete",
            name,
            extra={
                "event": "step.complete",
                "job_id": self.job_id,
                "step": name,
                "attempt": attempt,
            },
        )

    async def sleep(self, name: str, duration: float | timedelta) -> None:
        """Sleep durably: the instance is released and claimed again when it is due."""
        seconds = duration.total_seconds() if isinstance(duration, timedelta) else duration
        await self._sleep(name, delay=max(0.0, float(seconds)))

    async def sleep_until(self, name: str, when: datetime) -> None:
        """Sleep durably until ``when`` (timezone-aware)."""
        if when.tzinfo is None:
            raise ValueError("sleep_until needs a timezone-aware datetime")
        await self._sleep(name, wake_at=when)

    async def _sleep(
        self, name: str, delay: float | None = None, wake_at: datetime | None = None
    ) -> None:
        position, recorded = self._next(name, StepKind.SLEEP)
        if recorded is not None and recorded.status == StepStatus.COMPLETE:
            return
        wake, due = await self._rt.db(
            store.begin_wait,
            self._rt.owner,
            self.job_id,
            position,
            name,
            StepKind.SLEEP,
            self._rt.clock.db_now(),
            delay,
            wake_at,
        )
        if not due:
            raise Suspend(InstanceStatus.SLEEPING, wake)
        await self._rt.db(
            store.close_entry, self._rt.owner, self.job_id, position, StepStatus.COMPLETE, b"null"
        )
        if self.spans:
            self.spans.waited("sleep", name, position, tracing.sleep_start_ns(wake, delay))

    async def wait_for_event(
        self, name: str, type: str, timeout: float | timedelta | None = None
    ) -> Any:
        """Wait durably for an event of ``type``; return its payload.

        Events sent before the wait is reached are kept and consumed in order. Raises
        :class:`EventTimeout` if ``timeout`` passes first (the workflow may catch it).
        """
        position, recorded = self._next(name, StepKind.EVENT)
        if recorded is not None and recorded.status == StepStatus.COMPLETE:
            return recorded.result
        if recorded is not None and recorded.status == StepStatus.FAILED:
            raise EventTimeout(recorded.error or f"timed out waiting for event {type!r}")
        seconds = timeout.total_seconds() if isinstance(timeout, timedelta) else timeout
        rt = self._rt
        reached_ns = time.time_ns()
        wake, due = await rt.db(
            store.begin_wait,
            rt.owner,
            self.job_id,
            position,
            name,
            StepKind.EVENT,
            rt.clock.db_now(),
            seconds,
            None,
            type,
        )
        found, payload = await rt.db(store.consume_event, rt.owner, self.job_id, position)
        if found:
            if self.spans:
                self.spans.waited("wait", name, position, reached_ns, event=type)
            return payload
        if due:
            message = f"timed out waiting for event {type!r} ({name!r})"
            await rt.db(
                store.close_entry, rt.owner, self.job_id, position, StepStatus.FAILED, None, message
            )
            if self.spans:
                self.spans.waited("wait", name, position, reached_ns, timed_out=type)
            raise EventTimeout(message)
        raise Suspend(InstanceStatus.WAITING, wake)

    async def _invoke(
        self, fn: Callable[..., Any], args: tuple, kwargs: dict, timeout: float | None
    ) -> Any:
        if inspect.iscoroutinefunction(fn):
            call = fn(*args, **kwargs)
        else:
            # Run sync step code in a thread that carries this step's context.
            ctx = contextvars.copy_context()
            call = asyncio.to_thread(ctx.run, fn, *args, **kwargs)
        return await asyncio.wait_for(call, timeout) if timeout else await call

    async def _finish(
        self,
        position: int,
        attempt: int,
        outcome: AttemptOutcome,
        result: bytes | None = None,
        error: str | None = None,
    ) -> None:
        await self._rt.write(FinishStep(self.job_id, position, attempt, outcome, result, error))


def _describe(exc: BaseException) -> str:
    text = str(exc) or type(exc).__name__
    return f"{type(exc).__name__}: {text}"[:2000]
