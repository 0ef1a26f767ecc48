"""The ``ctx`` a workflow function receives: durable steps with replay.

Replay model: a workflow function runs from the top every time its instance is
claimed. ``ctx.step`` counts positions; a step already checkpointed at that position
returns its stored result without running again, and one whose final failure is
recorded raises that error again (:mod:`workflow_engine.engine.replay`), so only
unfinished work runs. If the code now asks for a different step name than the one
recorded at that position, the instance fails with :class:`NonDeterminismError`
instead of doing something wrong.

Concurrent branches (``ctx.gather``) each take positions from their own cursor
(:mod:`workflow_engine.engine.branches`), so replay matches whatever order they ran
in; their checkpoint writes go one at a time per instance (the group-commit writer's
rule: an instance has at most one write pending), while their step code runs at once.

Output streams (``ctx.emit``, and ``emit()`` in step code) append values readers follow
over Server-Sent Events; each append is keyed by where in the code it was made, so a
replay's emits collapse (:mod:`workflow_engine.engine.emits`).

Child workflows (``ctx.start_child`` / ``ctx.child_result``) are entries of kind
``child`` in the history (:mod:`workflow_engine.store.writes.children`): started once, and
awaited without holding a worker.

At-least-once steps: a step's side effect can happen more than once if the process
dies after the side effect and before its checkpoint is written. Pass
``current_step().idempotency_key`` (``{job_id}:{step name}``) to external systems so
they can drop the repeat.
"""

from __future__ import annotations

import asyncio
import concurrent.futures
import contextvars
import dataclasses
import inspect
import logging
import time
from collections.abc import Awaitable, Callable
from dataclasses import dataclass
from datetime import UTC, datetime, timedelta
from typing import Any, Concatenate, Literal, ParamSpec, TypeVar, cast

from sqlalchemy.engine import Engine

from onceflow import failpoints
from onceflow.vocabulary import (
    AttemptOutcome,
    InstanceStatus,
    ParentClosePolicy,
    StepKind,
    StepStatus,
)
from workflow_engine.definitions import (
    DEFAULT_RETRY,
    ChildHandle,
    RetryPolicy,
    check_name,
)
from workflow_engine.engine import branches, emits, job_spans, replay
from workflow_engine.engine.job_spans import JobSpans
from workflow_engine.engine.metrics import (
    INLINE_SLOW,
    STEP_DURATION,
    STEPS,
    STEPS_STARTED,
    labelled,
)
from workflow_engine.engine.runtime import Runtime
from workflow_engine.errors import (
    ChildWorkflowFailed,
    ControlRequested,
    DatabaseRefused,
    EventTimeout,
    NonDeterminismError,
    NonRetryableError,
    StepFailed,
    StreamLimitReached,
    Suspend,
    at_step,
    rebase_step_failure,
)
from workflow_engine.model import RecordedStep
from workflow_engine.steps import StepInfo, _current_step, _step_output, idempotency_key
from workflow_engine.store import writes
from workflow_engine.store.writes import (
    AppendValue,
    Chain,
    FinishInstance,
    FinishStep,
    Lease,
    StartStep,
    Write,
)

log = logging.getLogger(__name__)
T = TypeVar("T")
P = ParamSpec("P")

#: An inline step that keeps the event loop longer than this is counted and logged.
INLINE_SLOW_SECONDS = 0.05
#: At most one ``step.inline_slow`` line per workflow and step name in this interval.
INLINE_SLOW_LOG_SECONDS = 60.0
_inline_slow_logged: dict[tuple[str, str], float] = {}
#: What an attempt returns when the step should run again at once (its value may be None).
_AGAIN: Any = object()


@dataclass(frozen=True, slots=True)
class _Tried:
    """One attempt of a step: its number, its try within the step's retry budget, and
    its row's ``started_at`` (the attempts table's partition key)."""

    attempt: int
    tries: int
    started_at: datetime


@dataclass(frozen=True, slots=True)
class _Held:
    """A completed step's checkpoint, not yet written: it goes with the instance's next
    write (see ``WorkflowContext._write``)."""

    write: FinishStep
    name: str
    took: float  # seconds the step's code ran
    span: Any  # its trace span (ended once the checkpoint commits), or None


class WorkflowContext:
    #: Set by the runner when tracing is on (workflow_engine/engine/job_spans.py).
    spans: JobSpans | None = None

    def __init__(
        self,
        runtime: Runtime,
        lease: Lease,
        job_id: str,
        workflow: str,
        recorded: list[RecordedStep],
        version: str | None = None,
        engine_version: str | None = None,
        inline_steps: bool = False,
        run: int = 1,
    ) -> None:
        self._rt = runtime
        #: The job id's run (id reuse): a later run's children are its own.
        self.run = run
        #: The claim this run holds: every write it makes names it (a fencing token).
        self.lease = lease
        self.inline_steps = inline_steps  # the workflow's default for sync steps
        self.job_id = job_id
        self.workflow = workflow
        self.version = version  # what the instance was created with
        self.engine_version = engine_version  # what this engine's definition is
        self._recorded = {s.position: s for s in recorded}
        # The furthest position the history reached: on the main line, where positions
        # follow the program's order, anything recorded past a position means the
        # instance ran past it (``patched``).
        self._furthest = max(self._recorded, default=-1)
        self._main = branches.Cursor()
        self._patches: dict[str, bool] = {}
        # One write of this instance at a time (concurrent gather branches).
        self._writing = asyncio.Lock()
        # The main line's last completed step, checkpointed with the next write.
        self._held: _Held | None = None
        # Set when a write carrying a held checkpoint failed with its fate unknown (a
        # lost connection, a lost lease): every later write raises it again, so the run
        # ends even if workflow code catches it, and replay decides what committed.
        self._broken: BaseException | None = None
        # The children one gather starts (or awaits): one transaction for all of them.
        self._starts: branches.Coalescer[writes.StartChild, bool] = branches.Coalescer()
        self._collects: branches.Coalescer[writes.Awaited, writes.ChildOutcome | None] = (
            branches.Coalescer()
        )
        # Threads running this run's sync step code (``_invoke``).
        self._threads: list[concurrent.futures.Future[Any]] = []

    def _cursor(self) -> branches.Cursor:
        """The cursor of the branch this code runs in (the main line outside gathers)."""
        current = branches.BRANCH.get()
        return current[1] if current is not None and current[0] is self else self._main

    async def _write(self, write: Write[T]) -> T:
        """One lease-guarded write of this instance. A held checkpoint goes first, in the
        same transaction (:class:`~workflow_engine.store.writes.Chain`): one commit per
        step, and still nothing runs before the checkpoint before it is committed."""
        async with self._writing:
            self._check_broken()
            held, self._held = self._held, None
            if held is None:
                return await self._rt.write(write)
            return await self._carrying(held, Chain(held.write, write))

    async def commit(self, write: Write[T]) -> T:
        """The runner's last write of a run (the instance's finish), after the held
        checkpoint if any. A run whose checkpoint the database refused for good ends
        errored with that reason, whatever the workflow did after it: a refusal is a
        known outcome (nothing of that write committed, and it never will), not a lost
        connection's unknown one, so its instance is finished rather than left to a
        lease expiry, a rescue and the same refusal again."""
        refused = self._broken
        if isinstance(refused, DatabaseRefused) and isinstance(write, FinishInstance):
            self._broken = None
            errored = dataclasses.replace(
                write,
                status=InstanceStatus.ERRORED,
                result=None,
                error=str(refused),
                failed_position=None,
            )
            return cast(T, await self._write(errored))
        return await self._write(write)

    async def flush(self) -> None:
        """Write the held checkpoint now: before a write that cannot carry it (a sleep,
        a wait, a child, a gather's branches, a suspension)."""
        async with self._writing:
            self._check_broken()
            held, self._held = self._held, None
            if held is not None:
                await self._carrying(held, held.write)

    async def _carrying(self, held: _Held, write: Write[T]) -> T:
        """Send ``write``, which carries ``held``'s checkpoint, and settle the checkpoint
        by how it went."""
        try:
            answer = await self._rt.write(write)
        except (ControlRequested, NonDeterminismError, StreamLimitReached):
            self._checkpointed(held)  # refused after the checkpoint, which committed
            raise
        except DatabaseRefused as exc:
            if exc.checkpoint_committed:  # what followed the checkpoint was refused
                self._checkpointed(held)
            else:  # the checkpoint itself: the run ends errored (see commit)
                self._lost(held, exc)
            raise
        except BaseException as exc:
            self._lost(held, exc)
            raise
        self._checkpointed(held)
        return answer

    def _check_broken(self) -> None:
        if self._broken is not None:
            raise self._broken

    def _lost(self, held: _Held, exc: BaseException) -> None:
        """A write carrying ``held`` failed: whether the checkpoint committed is not
        known here, so nothing more of this run may be written."""
        self._broken = exc
        job_spans.end(held.span, exc)

    async def _db(
        self, fn: Callable[Concatenate[Engine, P], T], *args: P.args, **kwargs: P.kwargs
    ) -> T:
        await self.flush()
        async with self._writing:
            return await self._rt.call_db(fn, *args, **kwargs)

    def idempotency_key(self, step_name: str) -> str:
        return idempotency_key(self.job_id, step_name)

    def _next(self, name: str, kind: StepKind) -> tuple[int, RecordedStep | None]:
        """The next history position, checked against what was recorded there."""
        position = self._cursor().take()
        recorded = self._recorded.get(position)
        if recorded is None:  # a new entry: bounded before it reaches an index
            check_name(f"{kind} name", name)
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
        ``patched``). The answer is what the history can prove, remembered for the rest
        of the run:

        * a marker of ``patch_id`` at this position: True (it took the patch before);
        * another entry here: False (it ran past this point on the old code), and the
          marker takes no position;
        * nothing here, on the main line: True, recording the marker, if nothing is
          recorded further on either; False if something is (main-line positions follow
          the program's order, so a later entry was made after this point: e.g. by a
          gather whose first branch recorded nothing at its base position);
        * nothing here, inside a gather branch: :class:`~.branches.PatchedInBranch`.
          A branch's positions are sparse and the main line goes on at positions that
          look like a branch's, so "empty" may mean "the branch ended before this point
          on the old code"; True would add a step to an instance past its gather.
        """
        if patch_id in self._patches:
            return self._patches[patch_id]
        cursor = self._cursor()
        position = cursor.peek()
        recorded = self._recorded.get(position)
        if recorded is not None:
            taken = recorded.kind == StepKind.PATCH and recorded.name == patch_id
            if taken:
                cursor.take()
        elif cursor is not self._main:
            raise branches.PatchedInBranch(patch_id)
        elif position < self._furthest:
            taken = False
        else:
            check_name("patch name", patch_id)  # a new marker: bounded before its index
            cursor.take()
            await self._db(writes.record_marker, self.lease, self.job_id, position, patch_id)
            taken = True
        self._patches[patch_id] = taken
        return taken

    async def set_attributes(self, update: dict[str, Any]) -> None:
        """Merge ``update`` into the instance's searchable attributes (a key set to None
        is removed), durably: an ``attributes`` entry of the history, written with the
        change in one transaction (:mod:`workflow_engine.store.writes.attributes`), so a
        replay applies each update once and a crash loses none that returned. The merged
        result must fit the submit rule (:func:`onceflow.envelope.check_attributes`), else
        :class:`~workflow_engine.errors.InvalidAttributes` and nothing is written."""
        name = f"set_attributes#{self._cursor().peek()}"
        position, recorded = self._next(name, StepKind.ATTRIBUTES)
        if recorded is not None:
            return  # applied when it was recorded: the instance has it already
        # a copy (code may change its dict while the write waits); anything else is
        # refused by the rule, never turned into a dict (pairs, a mapping of another kind)
        given = dict(update) if isinstance(update, dict) else update
        await self._db(writes.set_attributes, self.lease, self.job_id, position, name, given)

    async def deprecate_patch(self, patch_id: str) -> None:
        """Retire ``patched(patch_id)`` once no instance without its marker is left:
        consumes the marker where the history has one, records nothing otherwise."""
        cursor = self._cursor()
        recorded = self._recorded.get(cursor.peek())
        if recorded is not None and recorded.kind == StepKind.PATCH and recorded.name == patch_id:
            cursor.take()

    async def step(
        self,
        name: str,
        fn: Callable[..., Any],
        *args: Any,
        retries: RetryPolicy | None = None,
        timeout: float | None = None,
        inline: bool | None = None,
        **kwargs: Any,
    ) -> Any:
        """Run ``fn(*args, **kwargs)`` once, durably; return its (JSON) result.

        A failed attempt is retried per ``retries`` after a delay during which the
        instance sleeps durably (no worker is held); ``NonRetryableError`` fails the
        instance at once.

        A sync ``fn`` runs in a thread, unless ``inline`` (default: the workflow's
        ``inline_steps``) runs it on the engine's event loop: no thread hop, for quick
        CPU-light steps only, since it stalls every instance of the engine while it
        runs. A step with a ``timeout`` always runs in a thread (inline code cannot be
        interrupted).
        """
        position, recorded = self._next(name, StepKind.STEP)
        if recorded is not None and recorded.status == StepStatus.COMPLETE:
            return recorded.result
        if recorded is not None and recorded.status == StepStatus.FAILED:
            # The workflow caught this failure before: the same error, not a second run.
            failure = replay.replayed_failure(self.job_id, recorded)
            raise at_step(failure, position, self._cursor())
        if self.spans and _cut_off(recorded):
            assert recorded is not None
            self.spans.cut_off(name, position, recorded.attempts)
        policy = retries or self._rt.default_retry or DEFAULT_RETRY
        while True:
            value = await self._attempt(name, position, policy, fn, args, kwargs, timeout, inline)
            if value is not _AGAIN:
                return value

    async def _attempt(
        self,
        name: str,
        position: int,
        policy: RetryPolicy,
        fn: Callable[..., Any],
        args: tuple[Any, ...],
        kwargs: dict[str, Any],
        timeout: float | None,
        inline: bool | None,
    ) -> Any:
        """One attempt of a step: record its start, run its code, then hold its
        checkpoint (or write it). Returns the step's value, or ``_AGAIN`` when the
        attempt failed and the step should run again at once."""
        await failpoints.hit_async("engine.before_step_start", self.job_id)
        start = StartStep(self.job_id, self.lease.claim, position, name)
        attempt, started_at, tries = await self._write(start)
        labelled(STEPS_STARTED, self.workflow).inc()
        token = _current_step.set(StepInfo(self.job_id, self.workflow, name, position, attempt))
        output = _step_output.set(self._step_output(position, attempt))
        span = self.spans.step(name, position, attempt) if self.spans else None
        started = time.perf_counter()
        try:
            with job_spans.active(span):
                value = await self._invoke(fn, args, kwargs, timeout, inline)
            encoded = writes.encode_result(value, self._rt.max_result_bytes)
        except NonRetryableError as exc:
            await self._failed_for_good(position, attempt, started_at, span, exc)
            at_step(exc, position, self._cursor())
            raise
        except Exception as exc:  # step code may raise anything: that is a failed attempt
            job_spans.end(span, exc)
            tried = _Tried(attempt, tries, started_at)
            await self._attempt_failed(name, position, tried, policy, exc)
            return _AGAIN
        finally:
            _current_step.reset(token)
            _step_output.reset(output)
        await failpoints.hit_async("engine.after_step_run", self.job_id)
        checkpoint = FinishStep(
            self.job_id,
            self.lease.claim,
            position,
            attempt,
            started_at,
            AttemptOutcome.COMPLETE,
            encoded,
        )
        done = _Held(checkpoint, name, time.perf_counter() - started, span)
        if self._cursor() is self._main and self._held is None:
            self._held = done  # goes with the next write
        else:
            # A gather branch (its steps run at once), or a second main-line step
            # run concurrently without gather: written now, not held.
            await self._write(checkpoint)
            self._checkpointed(done)
        return value

    async def _failed_for_good(
        self, position: int, attempt: int, started_at: datetime, span: Any, exc: NonRetryableError
    ) -> None:
        """Record the attempt that raised ``NonRetryableError``: the step failed, with that
        error (the caller raises it again)."""
        job_spans.end(span, exc)
        await self._finish(
            position,
            attempt,
            started_at,
            AttemptOutcome.FAILED,
            replay.step_failure(exc),
            _describe(exc),
        )
        labelled(STEPS, self.workflow, AttemptOutcome.FAILED).inc()

    async def _attempt_failed(
        self,
        name: str,
        position: int,
        tried: _Tried,
        policy: RetryPolicy,
        exc: Exception,
    ) -> None:
        """Record a failed attempt. Raises ``StepFailed`` once retries are spent and
        ``Suspend`` for a retry delay; returns when the step should run again at once.
        The policy counts the tries of the step's budget, which an operator's retry
        starts again (``tried.tries``); the attempt numbers go on."""
        attempt, tries = tried.attempt, tried.tries
        final = tries > policy.limit
        outcome = AttemptOutcome.FAILED if final else AttemptOutcome.RETRY
        failed = None
        if final:  # recorded with the entry, so that replay raises it again
            failed = StepFailed(
                f"step {name!r} failed after {tries} attempts: {_describe(exc)}",
                cause_type=replay.type_name(type(exc)),
            )
        record = replay.step_failure(failed) if failed is not None else None
        await self._finish(position, attempt, tried.started_at, outcome, record, _describe(exc))
        labelled(STEPS, self.workflow, outcome).inc()
        delay = 0.0 if final else policy.delay_for(exc, tries)
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
        if failed is not None:
            raise at_step(failed, position, self._cursor()) from exc
        if delay > 0:
            raise Suspend(InstanceStatus.SLEEPING, None, delay=delay) from None

    def _checkpointed(self, held: _Held) -> None:
        """A step's checkpoint has committed: count it, end its span, log it."""
        labelled(STEPS, self.workflow, AttemptOutcome.COMPLETE).inc()
        labelled(STEP_DURATION, self.workflow).observe(held.took)
        job_spans.end(held.span)
        log.info(
            "step %r complete",
            held.name,
            extra={
                "event": "step.complete",
                "job_id": self.job_id,
                "step": held.name,
                "attempt": held.write.attempt,
            },
        )

    async def emit(self, stream: str, value: Any) -> int | None:
        """Append ``value`` (JSON) to this instance's output stream ``stream``; return
        once it is committed, with its seq (the SSE ``id`` readers of ``GET
        /v1/jobs/{id}/stream`` see), or None when a replay emitted it again.

        In the workflow body an emit is keyed by where it is (branch, history position,
        index), so replay, which runs the body again, appends nothing twice; in async
        step code (``await ctx.emit`` while a step runs) it belongs to the step's
        attempt, like ``emit()`` in sync step code (:func:`workflow_engine.steps.emit`).
        Raises ``StreamValueRefused`` (a bad name or value) or ``StreamLimitReached``
        (past the instance's bounds), both ``NonRetryableError``s: nothing is written.
        """
        output = _step_output.get()
        if isinstance(output, emits.StepOutput) and output.job_id == self.job_id:
            return await output.emit_async(stream, value)
        name, data = emits.checked(stream, value, self._rt.stream_limits.value_max_bytes)
        key = emits.bounded_key("b" + self._cursor().emit_slot())
        return await self._append(name, data, key)

    async def _append(self, stream: str, data: bytes, key: str) -> int | None:
        """One append, through the instance's writes (after a held checkpoint, in its
        transaction): committed when this returns."""
        limits = self._rt.stream_limits
        write = AppendValue(
            self.job_id, self.lease.claim, key, stream, data, limits.max_values, limits.max_bytes
        )
        return (await self._write(write)).seq

    def _step_output(self, position: int, attempt: int) -> emits.StepOutput:
        return emits.StepOutput(
            self.job_id,
            position,
            attempt,
            asyncio.get_running_loop(),
            self._append,
            self._stream_limits,
        )

    def _stream_limits(self) -> emits.StreamLimits:
        return self._rt.stream_limits

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
        wake, due = await self._db(
            writes.begin_wait,
            self.lease,
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
        await self._db(
            writes.close_entry, self.lease, self.job_id, position, StepStatus.COMPLETE, b"null"
        )
        if self.spans:
            self.spans.waited("sleep", name, position, job_spans.sleep_start_ns(wake, delay))

    async def wait_for_event(
        self, name: str, type: str, timeout: float | timedelta | None = None
    ) -> Any:
        """Wait durably for an event of ``type``; return its payload.

        Events sent before the wait is reached are kept and consumed in order. Raises
        :class:`EventTimeout` if ``timeout`` passes first (the workflow may catch it).
        """
        position, recorded = self._next(name, StepKind.EVENT)
        if recorded is None:
            check_name("event type", type)  # one the admin API could never send waits forever
        if recorded is not None and recorded.status == StepStatus.COMPLETE:
            return recorded.result
        if recorded is not None and recorded.status == StepStatus.FAILED:
            raise replay.replayed_failure(self.job_id, recorded)  # it timed out
        seconds = timeout.total_seconds() if isinstance(timeout, timedelta) else timeout
        rt = self._rt
        reached_ns = time.time_ns()
        wake, due = await self._db(
            writes.begin_wait,
            self.lease,
            self.job_id,
            position,
            name,
            StepKind.EVENT,
            rt.clock.db_now(),
            seconds,
            None,
            type,
        )
        found, payload = await self._db(writes.consume_event, self.lease, self.job_id, position)
        if found:
            if self.spans:
                self.spans.waited("wait", name, position, reached_ns, event=type)
            return payload
        # "No event yet" is only what this transaction saw: one sent from here on is
        # caught by the suspend's re-check under the row lock (writes.suspend).
        await failpoints.hit_async("engine.after_consume_event", self.job_id)
        if due:
            message = f"timed out waiting for event {type!r} ({name!r})"
            await self._db(
                writes.close_entry,
                self.lease,
                self.job_id,
                position,
                StepStatus.FAILED,
                None,
                message,
            )
            if self.spans:
                self.spans.waited("wait", name, position, reached_ns, timed_out=type)
            raise EventTimeout(message)
        raise Suspend(InstanceStatus.WAITING, wake)

    async def start_child(
        self,
        workflow: str,
        name: str,
        params: dict[str, Any] | None = None,
        on_parent_close: Literal["terminate", "abandon"] = "terminate",
    ) -> ChildHandle:
        """Start the child workflow ``workflow`` called ``name`` (once: its job id is
        ``<this job id>__<name>``, ``~run<N>`` after it from this id's run 2 on, created
        through the job-id constraint and recorded in this history in one transaction,
        so replay never starts a second; replay takes the child its entry names). Returns at
        once; ``child_result`` awaits it. ``on_parent_close``: when this instance is
        terminated, terminate the child too, or abandon it (let it run)."""
        policy = ParentClosePolicy(on_parent_close)
        child_id = writes.child_job_id(self.job_id, name, self.run)
        position, recorded = self._next(name, StepKind.CHILD)
        if recorded is not None:
            # the child it was started with (the history decides)
            return ChildHandle(recorded.child_job_id or child_id, name, workflow, position)
        handle = ChildHandle(child_id, name, workflow, position)
        if self._rt.registry.batch_key(workflow) is not None:
            # a member waits for a batch; a child's parent awaits the child itself
            raise NonRetryableError(
                f"workflow {workflow!r} runs its jobs in batches: it cannot be started as a child"
            )
        child_params = params or {}
        writes.encode_result(child_params, self._rt.max_result_bytes)  # JSON, bounded
        start = writes.StartChild(
            self.job_id,
            position,
            name,
            child_id,
            workflow,
            child_params,
            policy,
            self._rt.registry.version(workflow),
            self._rt.registry.lane_path(workflow),
        )
        created = await self._starts.submit(start, self._start_children)
        log.info(
            "child %r started",
            name,
            extra={
                "event": "child.started" if created else "child.exists",
                "job_id": self.job_id,
                "child_job_id": child_id,
                "workflow": workflow,
            },
        )
        return handle

    async def child_result(self, handle: ChildHandle) -> Any:
        """The child's result, once it has finished; until then the instance waits
        durably (no worker held) and is woken when the child finishes. A child that
        errored or was terminated raises :class:`ChildWorkflowFailed` (catchable)."""
        recorded = self._recorded.get(handle.position)
        if recorded is not None and recorded.kind == StepKind.CHILD:
            if recorded.status == StepStatus.COMPLETE:
                return recorded.result
            if recorded.status == StepStatus.FAILED:
                raise replay.replayed_failure(self.job_id, recorded)
        outcome = await self._collects.submit(
            writes.Awaited(handle.position, handle.job_id), self._collect_children
        )
        if outcome is None:
            raise Suspend(InstanceStatus.WAITING, None)
        if outcome.status == StepStatus.FAILED:
            raise ChildWorkflowFailed(handle.job_id, outcome.child_status, outcome.error or "")
        return outcome.result

    async def _start_children(self, starts: list[writes.StartChild]) -> list[bool]:
        return await self._db(writes.start_children, self.lease, starts)

    async def _collect_children(
        self, awaited: list[writes.Awaited]
    ) -> list[writes.ChildOutcome | None]:
        await failpoints.hit_async("engine.before_children_collect", self.job_id)
        return await self._db(writes.collect, self.lease, self.job_id, awaited)

    async def gather(self, *awaitables: Awaitable[Any]) -> list[Any]:
        """Run branches concurrently; their results in order. Pass coroutines (``ctx``
        calls, or async functions making several): each branch takes history positions
        from its own cursor, so replay matches however the branches interleaved, and
        each branch's steps are checkpointed once. All branches settle first; then the
        first error is raised, or, if any branch waits (a sleep, event, child, retry
        delay), the instance suspends until the earliest wake-up and replays."""
        if not awaitables:
            return []
        await self.flush()  # branches write on their own; the main line's step first
        cursor = self._cursor()
        cursors = cursor.split(len(awaitables))
        outcomes = await asyncio.gather(
            *(branches.run_branch(self, c, a) for c, a in zip(cursors, awaitables, strict=True))
        )
        cursor.join(cursors)
        try:
            return branches.settle(outcomes, self._rt.clock.db_now() or datetime.now(UTC))
        except Exception as exc:  # a branch's failure goes on on this cursor
            rebase_step_failure(exc, cursor)
            raise

    async def _invoke(
        self,
        fn: Callable[..., Any],
        args: tuple,
        kwargs: dict,
        timeout: float | None,
        inline: bool | None,
    ) -> Any:
        if inspect.iscoroutinefunction(fn):
            call = fn(*args, **kwargs)
        elif timeout is None and (self.inline_steps if inline is None else inline):
            return self._run_inline(fn, args, kwargs)
        else:
            # Run sync step code in a thread that carries this step's context. If this
            # await ends before the code returns (a timeout, or the run cancelled with its
            # lease lost), the thread's own (concurrent) future is kept: the thread cannot
            # be stopped, and the runner keeps the id in flight until it returns
            # (``step_threads``), so no second run of the step starts beside it. A thread
            # that returned is not kept (nothing needs it, and keeping it kept each
            # step's futures alive for the whole run). (This is what
            # ``loop.run_in_executor`` does, plus keeping the future; a second asyncio
            # future or ``asyncio.shield`` costs a measurable share of the engine's time
            # on quick steps: BENCHMARKS.md, "The engine before and after issue 23".)
            ctx = contextvars.copy_context()
            thread = self._rt.step_executor.submit(ctx.run, fn, *args, **kwargs)
            try:
                call = asyncio.wrap_future(thread)
                return await asyncio.wait_for(call, timeout) if timeout else await call
            except BaseException:
                if not thread.done():
                    self._threads.append(thread)
                raise
        return await asyncio.wait_for(call, timeout) if timeout else await call

    def step_threads(self) -> list[asyncio.Future[Any]]:
        """The threads of step code that have not returned yet (awaitable)."""
        return [asyncio.wrap_future(t) for t in self._threads if not t.done()]

    def steps_returned(self) -> bool:
        """Whether every thread of this run's step code has returned."""
        return all(t.done() for t in self._threads)

    def _run_inline(self, fn: Callable[..., Any], args: tuple, kwargs: dict) -> Any:
        started = time.perf_counter()
        try:
            return fn(*args, **kwargs)
        finally:
            took = time.perf_counter() - started
            if took > INLINE_SLOW_SECONDS:
                self._inline_slow(took)

    def _inline_slow(self, took: float) -> None:
        INLINE_SLOW.labels(self.workflow).inc()
        step = _current_step.get()
        key = (self.workflow, step.name if step else "?")
        now = time.monotonic()
        if now - _inline_slow_logged.get(key, -INLINE_SLOW_LOG_SECONDS) < INLINE_SLOW_LOG_SECONDS:
            return
        if len(_inline_slow_logged) > 1000:  # dynamic step names: keep the map bounded
            _inline_slow_logged.clear()
        _inline_slow_logged[key] = now
        log.warning(
            "inline step %r held the event loop for %.0f ms; run it in a thread (inline=False)",
            key[1],
            took * 1000,
            extra={
                "event": "step.inline_slow",
                "job_id": self.job_id,
                "workflow": self.workflow,
                "step": key[1],
            },
        )

    async def _finish(
        self,
        position: int,
        attempt: int,
        started_at: datetime,
        outcome: AttemptOutcome,
        result: bytes | None = None,
        error: str | None = None,
    ) -> None:
        await self._write(
            FinishStep(
                self.job_id, self.lease.claim, position, attempt, started_at, outcome, result, error
            )
        )


def _cut_off(recorded: RecordedStep | None) -> bool:
    """An attempt was open when its run ended: a step left ``running`` with no error
    (a retry's failed attempt records its error; a start clears it)."""
    return (
        recorded is not None
        and recorded.status == StepStatus.RUNNING
        and recorded.attempts > 0
        and recorded.error is None
    )


def _describe(exc: BaseException) -> str:
    text = str(exc) or type(exc).__name__
    return f"{type(exc).__name__}: {text}"[:2000]
