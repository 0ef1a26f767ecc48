"""Replay of a workflow's history through ``WorkflowContext``, with a fake runtime."""

from __future__ import annotations

import asyncio
from collections.abc import Callable
from datetime import datetime
from typing import Any, TypeVar, cast

import pytest

from onceflow.vocabulary import AttemptOutcome, InstanceStatus, StepKind, StepStatus
from workflow_engine.clock import FakeClock
from workflow_engine.definitions import RetryPolicy
from workflow_engine.engine.context import WorkflowContext
from workflow_engine.engine.runtime import Runtime
from workflow_engine.errors import NonDeterminismError, StepFailed, Suspend
from workflow_engine.steps import current_step
from workflow_engine.store.claim import RecordedStep
from workflow_engine.store.writes import FinishStep, StartStep, Write

T = TypeVar("T")


class FakeRuntime:
    """Records writes; answers a ``StartStep`` with the next attempt number."""

    owner = "test-engine"
    max_result_bytes = 1000

    def __init__(self, default_retry: RetryPolicy | None = None) -> None:
        self.clock = FakeClock(datetime(2025, 1, 1).astimezone())
        self.default_retry = default_retry
        self.writes: list[Write[Any]] = []
        self.db_calls: list[str] = []
        self._attempts: dict[int, int] = {}

    async def write(self, write: Write[T]) -> T:
        self.writes.append(write)
        if isinstance(write, StartStep):
            attempt = self._attempts[write.position] = self._attempts.get(write.position, 0) + 1
            return cast(T, attempt)
        return cast(T, None)

    async def db(self, fn: Callable[..., T], *args: Any, **kwargs: Any) -> T:
        self.db_calls.append(fn.__name__)
        raise AssertionError(f"replay should not touch the database ({fn.__name__})")


def _runtime(rt: FakeRuntime) -> Runtime:
    return rt  # the type checker verifies FakeRuntime against the protocol here


def step(position: int, name: str, result: Any, status: StepStatus = StepStatus.COMPLETE):
    return RecordedStep(position, name, status, 1, result)


def context(rt: FakeRuntime, history: list[RecordedStep]) -> WorkflowContext:
    return WorkflowContext(_runtime(rt), "job-1", "orders", history)


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
        return await ctx.step("ship", ship, order["order"])

    assert asyncio.run(workflow()) == "shipped 7"
    assert seen == [(7, "job-1:ship")]
    assert rt.writes == [
        StartStep("job-1", 2, "ship"),
        FinishStep("job-1", 2, 1, AttemptOutcome.COMPLETE, b'"shipped 7"'),
    ]


def test_an_interrupted_step_runs_again_at_its_position():
    rt = FakeRuntime()
    ctx = context(rt, [step(0, "fetch", None, StepStatus.RUNNING)])

    async def workflow() -> int:
        return await ctx.step("fetch", lambda: 5)

    assert asyncio.run(workflow()) == 5
    assert [type(w) for w in rt.writes] == [StartStep, FinishStep]
    assert rt.writes[0] == StartStep("job-1", 0, "fetch")


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
