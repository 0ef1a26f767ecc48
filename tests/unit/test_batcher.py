"""The group-commit writer, against an in-memory store (no PostgreSQL)."""

from __future__ import annotations

import asyncio
import random
from collections.abc import Awaitable, Callable, Sequence
from datetime import UTC, datetime
from typing import Any

import pytest

from onceflow.vocabulary import AttemptOutcome
from workflow_engine.engine.batcher import BatcherConfig, WriteBatcher
from workflow_engine.errors import NonDeterminismError
from workflow_engine.store.writes import Answer, Chain, FinishStep, Heartbeat, StartStep, Write


class Broken(Exception):
    """What the fake store raises for a batch holding a write named 'bad'."""


def _answer(write: Write[Any]) -> Answer:
    if isinstance(write, StartStep):
        return write.position * 10  # distinct per caller
    if isinstance(write, Heartbeat):
        return frozenset(write.held)
    return None


def _is_bad(write: Write[Any]) -> bool:
    if isinstance(write, Chain):
        return _is_bad(write.then)
    return isinstance(write, StartStep) and write.name == "bad"


class FakeStore:
    """Records batches; optionally holds each batch open until released, or sleeps."""

    def __init__(self, hold: bool = False, commit_time: Callable[[], float] | None = None):
        self.batches: list[list[Write[Any]]] = []
        self.each: list[list[Write[Any]]] = []
        self.hold = hold
        self.commit_time = commit_time
        self.gates: list[asyncio.Event] = []
        self.in_flight = 0
        self.max_in_flight = 0
        self.heartbeat_running = False
        self.overlaps: list[str] = []

    async def apply_batch(self, writes: Sequence[Write[Any]]) -> list[Answer]:
        alone = any(isinstance(w, Heartbeat) for w in writes)
        if (alone and self.in_flight) or self.heartbeat_running:
            self.overlaps.append(f"{len(writes)} writes, heartbeat={alone}")
        self.batches.append(list(writes))
        self.in_flight += 1
        self.max_in_flight = max(self.max_in_flight, self.in_flight)
        self.heartbeat_running = alone
        try:
            await self._commit()
            if any(_is_bad(w) for w in writes):
                raise Broken("unique violation")
            return [_answer(w) for w in writes]
        finally:
            self.in_flight -= 1
            self.heartbeat_running = False

    async def apply_each(self, writes: Sequence[Write[Any]]) -> list[Answer]:
        self.each.append(list(writes))
        return [NonDeterminismError("used twice") if _is_bad(w) else _answer(w) for w in writes]

    async def _commit(self) -> None:
        if self.hold:
            gate = asyncio.Event()
            self.gates.append(gate)
            await gate.wait()
        elif self.commit_time is not None:
            await asyncio.sleep(self.commit_time())
        else:
            await asyncio.sleep(0)

    async def release_next(self) -> None:
        """Let the oldest held batch commit (waiting for it to be held first)."""
        await until(lambda: bool(self.gates))
        self.gates.pop(0).set()


async def until(condition: Callable[[], bool], timeout: float = 2.0) -> None:
    async with asyncio.timeout(timeout):
        while not condition():
            await asyncio.sleep(0)


def run_with(
    batcher: WriteBatcher, body: Callable[[], Awaitable[Any]], timeout: float = 5.0
) -> Any:
    async def main() -> Any:
        writer = asyncio.create_task(batcher.run())
        try:
            async with asyncio.timeout(timeout):
                return await body()
        finally:
            writer.cancel()

    return asyncio.run(main())


def test_every_caller_gets_its_own_answer():
    store = FakeStore()
    batcher = WriteBatcher(store)

    async def body() -> list[int]:
        return await asyncio.gather(
            *(batcher.write(StartStep(f"j{i}", 1, i, "s")) for i in range(50))
        )

    assert run_with(batcher, body) == [i * 10 for i in range(50)]
    assert sum(len(b) for b in store.batches) == 50
    # All 50 were queued before the writer woke, so they share one transaction.
    assert len(store.batches) == 1


def test_writes_queued_while_a_batch_commits_form_the_next_batch():
    store = FakeStore(hold=True)
    batcher = WriteBatcher(store, BatcherConfig(writers=1))

    async def body() -> list[int]:
        first = asyncio.ensure_future(batcher.write(StartStep("first", 1, 0, "s")))
        await until(lambda: bool(store.gates))
        rest = [
            asyncio.ensure_future(batcher.write(StartStep(f"j{i}", 1, i, "s"))) for i in range(20)
        ]
        await store.release_next()
        await store.release_next()
        return [await first] + [await f for f in rest]

    assert run_with(batcher, body) == [0] + [i * 10 for i in range(20)]
    assert [len(b) for b in store.batches] == [1, 20]


def test_max_batch_is_respected():
    store = FakeStore()
    batcher = WriteBatcher(store, BatcherConfig(writers=1, max_batch=4))

    async def body() -> list[None]:
        writes = [
            FinishStep(f"j{i}", 1, i, 1, datetime.now(UTC), AttemptOutcome.COMPLETE, b"1")
            for i in range(10)
        ]
        return await asyncio.gather(*(batcher.write(w) for w in writes))

    assert run_with(batcher, body) == [None] * 10
    assert [len(b) for b in store.batches] == [4, 4, 2]


def test_a_failed_batch_is_replayed_one_write_at_a_time():
    store = FakeStore()
    batcher = WriteBatcher(store)
    writes = [StartStep("a", 1, 1, "s"), StartStep("b", 1, 2, "bad"), StartStep("c", 1, 3, "s")]

    async def body() -> list[Any]:
        return await asyncio.gather(*(batcher.write(w) for w in writes), return_exceptions=True)

    a, b, c = run_with(batcher, body)
    assert (a, c) == (10, 30)
    assert isinstance(b, NonDeterminismError)  # only the culprit's caller fails
    assert store.each == [writes]


def test_a_failed_single_write_gets_the_batch_error():
    store = FakeStore()
    batcher = WriteBatcher(store)

    async def body() -> int:
        return await batcher.write(StartStep("b", 1, 2, "bad"))

    with pytest.raises(Broken):
        run_with(batcher, body)
    assert store.each == []  # nothing to isolate


def test_a_failed_chain_alone_in_its_batch_is_still_split():
    """Its checkpoint must commit on its own even when what follows it is refused, so a
    lone chain goes through the one-by-one path too (which applies its parts apart)."""
    store = FakeStore()
    batcher = WriteBatcher(store)
    checkpoint = FinishStep("b", 1, 1, 1, datetime.now(UTC), AttemptOutcome.COMPLETE, b"1")
    chain = Chain(checkpoint, StartStep("b", 1, 2, "bad"))

    async def body() -> Any:
        return await batcher.write(chain)

    with pytest.raises(NonDeterminismError):
        run_with(batcher, body)
    assert store.each == [[chain]]


def test_a_heartbeat_batch_never_overlaps_another_batch():
    rng = random.Random(7)
    store = FakeStore(commit_time=lambda: rng.uniform(0, 0.003))
    batcher = WriteBatcher(store, BatcherConfig(writers=3, max_batch=8))

    async def instance(i: int) -> None:
        for position in range(5):
            assert await batcher.write(StartStep(f"j{i}", 1, position, "s")) == position * 10
            await asyncio.sleep(rng.uniform(0, 0.002))

    async def heartbeats() -> None:
        for n in range(10):
            ids = tuple(f"j{i}" for i in range(n))
            assert await batcher.write(Heartbeat(tuple((i, 1) for i in ids), 30.0)) == frozenset(
                (i, 1) for i in ids
            )
            await asyncio.sleep(0.002)

    async def body() -> None:
        await asyncio.gather(heartbeats(), *(instance(i) for i in range(40)))

    run_with(batcher, body)
    assert store.max_in_flight > 1  # batches did run side by side...
    assert sum(isinstance(w, Heartbeat) for b in store.batches for w in b) == 10
    assert store.overlaps == []  # ...but never beside a heartbeat


def test_a_heartbeat_left_behind_by_max_batch_is_taken_at_once():
    store = FakeStore(hold=True)
    batcher = WriteBatcher(store, BatcherConfig(writers=1, max_batch=2))

    async def body() -> None:
        first = asyncio.ensure_future(batcher.write(StartStep("x", 1, 0, "s")))
        await until(lambda: bool(store.gates))
        queued = [
            asyncio.ensure_future(batcher.write(w))
            for w in (
                StartStep("a", 1, 1, "s"),
                StartStep("b", 1, 2, "s"),
                StartStep("c", 1, 3, "s"),
            )
        ]
        beat = asyncio.ensure_future(batcher.write(Heartbeat((("a", 1),), 30.0)))
        for _ in range(3):
            await store.release_next()
        await asyncio.gather(first, beat, *queued)

    run_with(batcher, body)
    labels = [[_label(w) for w in batch] for batch in store.batches]
    assert labels == [["x"], ["a", "b", "heartbeat"], ["c"]]


def _label(write: Write[Any]) -> str:
    return write.job_id if isinstance(write, StartStep) else "heartbeat"


def test_a_cancelled_caller_does_not_break_the_batch():
    store = FakeStore(hold=True)
    batcher = WriteBatcher(store, BatcherConfig(writers=1))

    async def body() -> int:
        gone = asyncio.ensure_future(batcher.write(StartStep("gone", 1, 1, "s")))
        kept = asyncio.ensure_future(batcher.write(StartStep("kept", 1, 2, "s")))
        await until(lambda: bool(store.gates))
        gone.cancel()
        await store.release_next()
        return await kept

    assert run_with(batcher, body) == 20
