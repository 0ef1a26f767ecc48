"""Replay of a workflow's history through ``WorkflowContext``, with a fake runtime."""

from __future__ import annotations

import asyncio
import contextlib
import time
from collections.abc import Callable
from concurrent.futures import ThreadPoolExecutor
from datetime import UTC, datetime
from typing import Any, TypeVar, cast

import pytest

from onceflow.vocabulary import AttemptOutcome, InstanceStatus, StepKind, StepStatus
from workflow_engine.clock import FakeClock
from workflow_engine.definitions import RetryPolicy
from workflow_engine.engine.context import WorkflowContext
from workflow_engine.engine.runtime import Runtime
from workflow_engine.errors import NonDeterminismError, StepFailed, StepResultError, Suspend
from workflow_engine.model import RecordedStep
from workflow_engine.steps import current_step
from workflow_engine.store.writes import (
    Chain,
    FinishInstance,
    FinishStep,
    Lease,
    Started,
    StartStep,
    Write,
)

STEP_THREADS = ThreadPoolExecutor(4, thread_name_prefix="test-steps")
T = TypeVar("T")
AT = datetime(2025, 1, 1, tzinfo=UTC)  # every attempt's start, as the fake answers it
LEASE = Lease("test-engine", 1)  # the claim every test run holds


class FakeRuntime:
    """Records writes (a ``Chain`` as its two parts, and whole in ``sent``); answers a
    ``StartStep`` with the next attempt number."""

    owner = "test-engine"
    max_result_bytes = 1000
    step_executor = STEP_THREADS  # sync steps' threads, shared by the test runs

    def __init__(self, default_retry: RetryPolicy | None = None) -> None:
        self.clock = FakeClock(datetime(2025, 1, 1).astimezone())
        self.default_retry = default_retry
        self.writes: list[Write[Any]] = []
        self.sent: list[Write[Any]] = []
        self.db_calls: list[str] = []
        self._attempts: dict[int, int] = {}

    async def write(self, write: Write[T]) -> T:
        self.sent.append(write)
        return await self._apply(write)

    async def _apply(self, write: Write[T]) -> T:
        if isinstance(write, Chain):
            await self._apply(write.first)
            return await self._apply(write.then)
        self.writes.append(write)
        if isinstance(write, StartStep):
            attempt = self._attempts[write.position] = self._attempts.get(write.position, 0) + 1
            return cast(T, Started(attempt, AT, attempt))
        return cast(T, None)

    async def call_db(self, fn: Callable[..., T], *args: Any, **kwargs: Any) -> T:
        self.db_calls.append(fn.__name__)
        raise AssertionError(f"replay should not touch the database ({fn.__name__})")


def _runtime(rt: FakeRuntime) -> Runtime:
    return rt  # the type checker verifies FakeRuntime against the protocol here


def step(position: int, name: str, result: Any, status: StepStatus = StepStatus.COMPLETE):
    return RecordedStep(position, name, status, 1, result)


def context(rt: FakeRuntime, history: list[RecordedStep]) -> WorkflowContext:
    return WorkflowContext(_runtime(rt), LEASE, "job-1", "orders", history)


def never(*args: Any) -> Any:
    raise AssertionError("a recorded step ran again")


HISTORY = [step(0, "fetch", {"order": 7}), step(1, "charge", 42)]


def test_completed_steps_return_their_recorded_results_without_running():
    rt = FakeRuntime()
    ctx = context(rt, HISTORY)

    async def workflow() -> list[Any]:
        return [await ctx.step("fetch", never), await ctx.step("charge", never)]

    assert asyncio.run(workflow()) == [{"order": 7}, 42]
    assert rt.writes == []


def test_a_different_step_name_at_a_recorded_position_is_non_determinism():
    rt = FakeRuntime()
    ctx = context(rt, HISTORY)

    async def workflow() -> None:
        await ctx.step("fetch", never)
        await ctx.step("refund", never)  # the history has "charge" at position 1

    with pytest.raises(NonDeterminismError, match=r"'refund' at position 1.*'charge'"):
        asyncio.run(workflow())
    assert rt.writes == []


def test_a_different_kind_at_a_recorded_position_is_non_determinism():
    rt = FakeRuntime()
    ctx = context(rt, HISTORY)

    async def workflow() -> None:
        await ctx.sleep("fetch", 10)  # a sleep where the history has a step

    with pytest.raises(NonDeterminismError, match="sleep 'fetch' at position 0"):
        asyncio.run(workflow())
    assert rt.db_calls == []


def test_a_new_step_after_the_history_runs_and_is_checkpointed():
    rt = FakeRuntime()
    ctx = context(rt, HISTORY)
    seen: list[Any] = []

    def ship(order: int) -> str:
        seen.append((order, current_step().idempotency_key))
        return f"shipped {order}"

    async def workflow() -> str:
        order = await ctx.step("fetch", never)
        await ctx.step("charge", never)
        shipped = await ctx.step("ship", ship, order["order"])
        await ctx.flush()  # the runner's part at the end of a run
        return shipped

    assert asyncio.run(workflow()) == "shipped 7"
    assert seen == [(7, "job-1:ship")]
    assert rt.writes == [
        StartStep("job-1", 1, 2, "ship"),
        FinishStep("job-1", 1, 2, 1, AT, AttemptOutcome.COMPLETE, b'"shipped 7"'),
    ]


def test_an_interrupted_step_runs_again_at_its_position():
    rt = FakeRuntime()
    ctx = context(rt, [step(0, "fetch", None, StepStatus.RUNNING)])

    async def workflow() -> int:
        value = await ctx.step("fetch", lambda: 5)
        await ctx.flush()
        return value

    assert asyncio.run(workflow()) == 5
    assert [type(w) for w in rt.writes] == [StartStep, FinishStep]
    assert rt.writes[0] == StartStep("job-1", 1, 0, "fetch")


def test_a_failing_step_records_each_attempt_until_its_retries_run_out():
    rt = FakeRuntime(RetryPolicy(limit=1, delay=0))
    ctx = context(rt, [])

    def flaky() -> None:
        raise ValueError("down")

    with pytest.raises(StepFailed, match="after 2 attempts"):
        asyncio.run(ctx.step("call", flaky))
    outcomes = [(w.attempt, w.outcome) for w in rt.writes if isinstance(w, FinishStep)]
    assert outcomes == [(1, AttemptOutcome.RETRY), (2, AttemptOutcome.FAILED)]


def test_a_retry_delay_suspends_the_instance():
    rt = FakeRuntime(RetryPolicy(limit=3, delay=30))
    ctx = context(rt, [])

    def flaky() -> None:
        raise ValueError("down")

    with pytest.raises(Suspend) as suspended:
        asyncio.run(ctx.step("call", flaky))
    assert (suspended.value.status, suspended.value.delay) == (InstanceStatus.SLEEPING, 30)


def test_a_completed_sleep_in_the_history_returns_at_once():
    rt = FakeRuntime()
    ctx = context(rt, [RecordedStep(0, "nap", StepStatus.COMPLETE, 1, None, StepKind.SLEEP)])

    asyncio.run(ctx.sleep("nap", 3600))
    assert rt.db_calls == [] and rt.writes == []


def test_a_checkpoint_commits_with_the_next_step_start_before_that_step_runs():
    """One write per step: step N's checkpoint goes with step N+1's start (a ``Chain``),
    the last one with the instance's finish, and no step body runs before the
    checkpoint of the step before it was written."""
    rt = FakeRuntime()
    ctx = context(rt, [])
    seen: list[int] = []

    def body(n: int) -> int:
        seen.append(len(rt.sent))  # writes sent before this body ran
        return n

    async def workflow() -> None:
        for n in range(3):
            await ctx.step(f"s{n}", body, n)
        await ctx.commit(FinishInstance("job-1", 1, InstanceStatus.COMPLETE, b"null"))

    asyncio.run(workflow())
    done = [
        FinishStep("job-1", 1, n, 1, AT, AttemptOutcome.COMPLETE, str(n).encode()) for n in range(3)
    ]
    assert rt.sent == [
        StartStep("job-1", 1, 0, "s0"),
        Chain(done[0], StartStep("job-1", 1, 1, "s1")),
        Chain(done[1], StartStep("job-1", 1, 2, "s2")),
        Chain(done[2], FinishInstance("job-1", 1, InstanceStatus.COMPLETE, b"null")),
    ]
    assert seen == [1, 2, 3]


def test_a_held_checkpoint_is_written_before_a_gather():
    rt = FakeRuntime()
    ctx = context(rt, [])

    async def workflow() -> None:
        await ctx.step("a", lambda: 1)
        await ctx.gather(ctx.step("b", lambda: 2), ctx.step("c", lambda: 3))

    asyncio.run(workflow())
    assert rt.sent[:2] == [
        StartStep("job-1", 1, 0, "a"),
        FinishStep("job-1", 1, 0, 1, AT, AttemptOutcome.COMPLETE, b"1"),
    ]
    # branches write their own checkpoints: none is held past the gather
    assert sum(isinstance(w, FinishStep) for w in rt.writes) == 3
    assert not any(isinstance(w, Chain) for w in rt.sent)


def test_an_inline_step_runs_on_the_event_loop_thread_and_a_plain_one_does_not():
    import threading

    rt = FakeRuntime()
    ctx = context(rt, [])
    loop_thread = threading.get_ident()

    async def workflow() -> list[bool]:
        here = threading.get_ident
        return [
            await ctx.step("threaded", lambda: here() == loop_thread),
            await ctx.step("inline", lambda: here() == loop_thread, inline=True),
            await ctx.step("timed", lambda: here() == loop_thread, inline=True, timeout=5),
        ]

    assert asyncio.run(workflow()) == [False, True, False]
    ctx2 = WorkflowContext(_runtime(FakeRuntime()), LEASE, "job-2", "orders", [], inline_steps=True)

    async def defaulted() -> list[bool]:
        here = threading.get_ident
        return [
            await ctx2.step("inline", lambda: here() == loop_thread),
            await ctx2.step("opt-out", lambda: here() == loop_thread, inline=False),
        ]

    assert asyncio.run(defaulted()) == [True, False]


class FailingChainRuntime(FakeRuntime):
    """Fails the first chained write with ``error`` (its fate unknown to the caller)."""

    def __init__(self, error: BaseException) -> None:
        super().__init__()
        self.error = error

    async def write(self, write: Write[T]) -> T:
        if isinstance(write, Chain) and self.error is not None:
            error, self.error = self.error, None
            self.sent.append(write)
            raise error
        return await super().write(write)


def test_a_failed_chained_write_ends_the_run_even_if_the_workflow_catches_it():
    """A lost connection with a checkpoint aboard: whether it committed is unknown, so
    every later write raises the same error and replay decides (no run that completes
    with an earlier step left running)."""
    lost = ConnectionError("server closed the connection")
    rt = FailingChainRuntime(lost)
    ctx = context(rt, [])

    async def workflow() -> None:
        await ctx.step("a", lambda: 1)
        with contextlib.suppress(ConnectionError):  # workflow code may catch anything
            await ctx.step("b", lambda: 2)  # its start carries a's checkpoint: fails
        await ctx.step("c", lambda: 3)

    with pytest.raises(ConnectionError):
        asyncio.run(workflow())
    with pytest.raises(ConnectionError):
        asyncio.run(ctx.commit(FinishInstance("job-1", 1, InstanceStatus.COMPLETE, b"null")))
    assert rt.writes == [StartStep("job-1", 1, 0, "a")]  # nothing after the lost write


def test_two_main_line_steps_run_concurrently_without_gather_both_checkpoint():
    rt = FakeRuntime()
    ctx = context(rt, [])

    async def workflow() -> None:
        await asyncio.gather(ctx.step("x", lambda: 1), ctx.step("y", lambda: 2))
        await ctx.flush()

    asyncio.run(workflow())
    done = sorted(w.position for w in rt.writes if isinstance(w, FinishStep))
    assert done == [0, 1]


def test_a_held_checkpoint_is_written_before_a_database_call():
    order: list[str] = []

    class Recording(FakeRuntime):
        async def write(self, write: Write[T]) -> T:
            order.append(type(write).__name__)
            return await super().write(write)

        async def call_db(self, fn: Callable[..., T], *args: Any, **kwargs: Any) -> T:
            order.append(fn.__name__)
            return cast(T, (None, False))  # begin_wait: (wake, not due)

    ctx = context(Recording(), [])

    async def workflow() -> None:
        await ctx.step("a", lambda: 1)
        await ctx.sleep("nap", 60)

    with pytest.raises(Suspend):
        asyncio.run(workflow())
    assert order == ["StartStep", "FinishStep", "begin_wait"]


def test_a_result_with_a_nul_character_is_a_clear_step_error():
    rt = FakeRuntime(RetryPolicy(limit=3, delay=0))
    ctx = context(rt, [])

    with pytest.raises(StepResultError, match="NUL"):
        asyncio.run(ctx.step("a", lambda: {"note": "a\x00b"}))
    outcomes = [w.outcome for w in rt.writes if isinstance(w, FinishStep)]
    assert outcomes == [AttemptOutcome.FAILED]  # not retried: it would fail the same way
    assert asyncio.run(context(FakeRuntime(), []).step("b", lambda: "\\u0000")) == "\\u0000"


def test_a_finished_runs_context_is_freed_without_the_cyclic_collector():
    """A context that is a reference cycle (it once was: its two Coalescers held its own
    bound methods) is freed only by the cyclic collector, with each step's futures, and
    that collector's passes were a third of the engine's loop time per workflow
    (issue 23's profile). With the collector off, the last reference must free it."""
    import gc
    import weakref

    def plain(value: int) -> int:
        return value + 1

    async def run() -> weakref.ref[WorkflowContext]:
        ctx = context(FakeRuntime(), [])
        assert await ctx.step("threaded", plain, 1) == 2  # a sync step: its thread hop
        ref = weakref.ref(ctx)
        del ctx
        return ref

    gc.collect()
    gc.disable()
    try:
        ref = asyncio.run(run())
        # The step's thread drops its work item (which reaches the context through the
        # copied contextvars) just after setting the result the run awaited: give it a
        # moment. A cycle never goes, however long, with the collector off.
        deadline = time.monotonic() + 2.0
        while ref() is not None and time.monotonic() < deadline:
            time.sleep(0.01)
        assert ref() is None, [type(r).__name__ for r in gc.get_referrers(ref())]
    finally:
        gc.enable()
