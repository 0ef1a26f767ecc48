"""Output streams without services: the name and value rule, and the keys that make
an emit replay-safe (a fake runtime records the appends a run sends)."""

from __future__ import annotations

import asyncio
from concurrent.futures import ThreadPoolExecutor
from datetime import UTC, datetime
from typing import Any, TypeVar, cast

import pytest

from onceflow.output_streams import (
    MAX_STREAM_NAME_CHARS,
    InvalidStreamValue,
    StreamRefusal,
    check_stream_name,
    encode_stream_value,
)
from onceflow.vocabulary import StepStatus
from workflow_engine import (
    NonRetryableError,
    StreamLimitReached,
    StreamValueRefused,
    current_step,
    emit,
)
from workflow_engine.clock import FakeClock
from workflow_engine.engine.branches import Cursor
from workflow_engine.engine.context import WorkflowContext
from workflow_engine.engine.emits import MAX_KEY_CHARS, StreamLimits, bounded_key
from workflow_engine.engine.runtime import Runtime
from workflow_engine.model import RecordedStep
from workflow_engine.store.writes import (
    Appended,
    AppendValue,
    Chain,
    FinishStep,
    Lease,
    Started,
    StartStep,
    Write,
)

T = TypeVar("T")


@pytest.mark.parametrize(
    ("name", "code"),
    [
        ("", StreamRefusal.NAME_MISSING),
        (None, StreamRefusal.NAME_MISSING),
        ("x" * (MAX_STREAM_NAME_CHARS + 1), StreamRefusal.NAME_TOO_LONG),
        ("two words", StreamRefusal.NAME_CHARACTERS),
        ("line\nbreak", StreamRefusal.NAME_CHARACTERS),  # would end the SSE field early
        ("end", StreamRefusal.NAME_RESERVED),  # the readers' last event
    ],
)
def test_a_bad_stream_name_is_refused_with_its_code(name, code):
    with pytest.raises(InvalidStreamValue) as refused:
        check_stream_name(name)
    assert refused.value.code == code


def test_a_good_name_passes_as_given():
    assert check_stream_name("llm.tokens:v2_a-b") == "llm.tokens:v2_a-b"
    assert check_stream_name("x" * MAX_STREAM_NAME_CHARS) == "x" * MAX_STREAM_NAME_CHARS


@pytest.mark.parametrize(
    ("value", "code"),
    [
        ({1, 2}, StreamRefusal.VALUE_NOT_JSON),
        (2**70, StreamRefusal.VALUE_NOT_JSON),
        ({"a": float("nan")}, StreamRefusal.VALUE_NOT_FINITE),  # orjson would write null
        (["ok", "nul\x00"], StreamRefusal.VALUE_NUL),  # jsonb holds no NUL
        ({"k\x00": 1}, StreamRefusal.VALUE_NUL),
        ("x" * 100, StreamRefusal.VALUE_TOO_LARGE),
    ],
)
def test_a_bad_value_is_refused_with_its_code(value, code):
    with pytest.raises(InvalidStreamValue) as refused:
        encode_stream_value(value, max_bytes=64)
    assert refused.value.code == code


def test_a_value_is_encoded_exactly_and_the_bound_is_inclusive():
    assert encode_stream_value({"t": "héllo", "n": 1.5}, 64) == '{"t":"héllo","n":1.5}'.encode()
    assert encode_stream_value("x" * 62, 64) == b'"' + b"x" * 62 + b'"'


def test_a_long_key_is_hashed_to_a_bounded_one():
    assert bounded_key("b@1#0") == "b@1#0"
    long = "b" + "/0.1" * 100 + "@0#0"
    assert len(bounded_key(long)) <= MAX_KEY_CHARS and bounded_key(long) == bounded_key(long)
    assert bounded_key(long) != bounded_key(long.replace("@0#0", "@0#1"))


def test_cursor_slots_differ_across_gathers_whose_branches_take_no_position():
    main = Cursor()
    slots = [main.emit_slot()]
    for _ in range(2):  # two gathers in a row at the same local index
        branches = main.split(2)
        slots += [b.emit_slot() for b in branches]
        main.join(branches)  # nobody took a position: main.next is unchanged
    slots.append(main.emit_slot())
    assert main.next == 0
    assert len(set(slots)) == len(slots), slots


STEP_THREADS = ThreadPoolExecutor(4, thread_name_prefix="test-steps")


class StreamRuntime:
    """Answers StartStep with the next attempt, AppendValue with the next seq (or a
    refusal once ``limit`` values were taken); records the appends' keys."""

    owner = "test-engine"
    max_result_bytes = 1000
    step_executor = STEP_THREADS  # sync steps' threads, shared by the test runs
    default_retry = None
    registry: Any = None
    stream_limits = StreamLimits(value_max_bytes=1000)

    def __init__(self, limit: int = 1000) -> None:
        self.clock = FakeClock(datetime(2025, 1, 1, tzinfo=UTC))
        self.limit = limit
        self.keys: list[str] = []
        self.values: list[Any] = []
        self.steps: list[RecordedStep] = []
        self._names: dict[int, str] = {}
        self._attempts: dict[int, int] = {}

    async def write(self, write: Write[T]) -> T:
        if isinstance(write, Chain):
            await self.write(write.first)
            return await self.write(write.then)
        if isinstance(write, StartStep):
            self._names[write.position] = write.name
            attempt = self._attempts[write.position] = self._attempts.get(write.position, 0) + 1
            return cast(T, Started(attempt, datetime(2025, 1, 1, tzinfo=UTC), attempt))
        if isinstance(write, FinishStep) and write.result is not None:
            name = self._names[write.position]
            self.steps.append(RecordedStep(write.position, name, StepStatus.COMPLETE, 1, None))
        if isinstance(write, AppendValue):
            if len(self.keys) >= self.limit:
                raise StreamLimitReached("at the bound")
            self.keys.append(write.key)
            self.values.append(write.value)
            return cast(T, Appended(len(self.keys)))
        return cast(T, None)

    async def call_db(self, fn: Any, *args: Any, **kwargs: Any) -> Any:
        raise AssertionError("no database call expected")


def _context(rt: StreamRuntime, history: list[RecordedStep] | None = None) -> WorkflowContext:
    runtime: Runtime = rt  # the type checker verifies the fake against the protocol
    return WorkflowContext(runtime, Lease("test-engine", 1), "job-1", "w", history or [])


async def _gathering(ctx: WorkflowContext) -> None:
    async def quiet(name: str) -> None:
        await ctx.emit("g", name)

    async def stepping(name: str) -> None:
        await ctx.emit("g", f"{name} before")
        await ctx.step(f"step {name}", lambda: name)
        await ctx.emit("g", f"{name} after")

    await ctx.emit("g", "main 0")
    await ctx.gather(quiet("a"), quiet("b"))
    await ctx.gather(quiet("c"), quiet("d"))
    await ctx.gather(stepping("e"), stepping("f"))
    await ctx.step("last", lambda: 1)
    await ctx.emit("g", "main 1")
    await ctx.flush()


def test_a_replay_makes_the_same_keys_and_every_emit_has_its_own():
    first = StreamRuntime()
    asyncio.run(_gathering(_context(first)))
    assert len(first.keys) == 10 and len(set(first.keys)) == 10, first.keys
    again = StreamRuntime()
    asyncio.run(_gathering(_context(again, first.steps)))  # the steps do not run again
    # the same keys (branches may interleave their emits in another order)
    assert sorted(again.keys) == sorted(first.keys)
    assert again._attempts == {}


def test_step_code_keys_its_values_by_position_and_attempt():
    rt = StreamRuntime()

    def flaky() -> int:
        emit("s", current_step().attempt)
        emit("s", "second")
        if current_step().attempt == 1:
            raise ConnectionError("try again")
        return 1

    async def body(ctx: WorkflowContext) -> None:
        from workflow_engine import RetryPolicy

        await ctx.step("flaky", flaky, retries=RetryPolicy(limit=2, delay=0))

    asyncio.run(body(_context(rt)))
    assert rt.keys == ["s0.1#0", "s0.1#1", "s0.2#0", "s0.2#1"]


def test_emit_outside_a_step_and_in_an_inline_step_say_what_to_do_instead():
    with pytest.raises(RuntimeError, match="outside a workflow step"):
        emit("s", 1)
    rt = StreamRuntime()

    async def body(ctx: WorkflowContext) -> None:
        await ctx.step("inline", lambda: emit("s", 1), inline=True)

    with pytest.raises(NonRetryableError, match="would block it"):
        asyncio.run(body(_context(rt)))
    assert rt.keys == []


def test_a_refused_value_writes_nothing_and_the_bound_after_a_held_checkpoint_keeps_it():
    rt = StreamRuntime(limit=1)
    seen: list[str] = []

    async def body(ctx: WorkflowContext) -> None:
        with pytest.raises(StreamValueRefused, match="not JSON"):
            await ctx.emit("s", {1, 2})
        await ctx.emit("s", 1)
        await ctx.step("held", lambda: 2)  # its checkpoint goes with the next write
        try:
            await ctx.emit("s", 2)  # refused, after the checkpoint committed
        except StreamLimitReached as exc:
            seen.append(str(exc))
        await ctx.step("after", lambda: 3)  # the run is not broken by the refusal
        await ctx.flush()

    asyncio.run(body(_context(rt)))
    assert seen == ["at the bound"]
    assert [s.name for s in rt.steps] == ["held", "after"]
    assert rt.values == [b"1"]
