"""streams.gather: batches taken when nothing more waits; the drainer held while the body works.

The stream here is a stand-in with the few members ``batches`` uses of a faust
``Stream``; the worker's integration tests run it on real Kafka and PostgreSQL."""

from __future__ import annotations

import asyncio
import contextlib
from typing import Any

from streams.gather import Gathering, batches

STALL = "stall"  # a record Faust is still working on: it left the queue, not yet added


class FakeStream:
    def __init__(self, items: list[str]) -> None:
        self.queue: asyncio.Queue[str] = asyncio.Queue()
        for item in items:
            self.queue.put_nowait(item)
        self.channel = self
        self.processors: list[Any] = []
        self.acked: list[str] = []
        self.added: list[str] = []
        self.current_event: str | None = None
        self.should_stop = False
        self.enable_acks = True

    def __aiter__(self) -> FakeStream:
        return self

    async def __anext__(self) -> str:  # a channel iterator's
        return await self.queue.get()

    def add_processor(self, processor: Any) -> None:
        self.processors.append(processor)

    def _enable_passive(self, channel: Any) -> None:
        self.drainer = asyncio.ensure_future(self._drain())

    async def _drain(self) -> None:
        while True:
            item = await self.queue.get()
            if item == STALL:
                await asyncio.Event().wait()
            self.current_event = item
            for processor in self.processors:
                await processor(item)
            self.added.append(item)

    async def wait(self, event: asyncio.Event) -> None:
        await event.wait()

    async def wait_for_stopped(self, event: asyncio.Event, timeout: float | None = None) -> bool:
        with contextlib.suppress(TimeoutError):
            await asyncio.wait_for(event.wait(), timeout)
        return self.should_stop

    async def ack(self, event: str) -> None:
        self.acked.append(event)


async def _ticks(n: int = 20) -> None:
    for _ in range(n):
        await asyncio.sleep(0)


def test_a_lone_record_is_taken_at_once_not_after_the_wait():
    async def main() -> tuple[list[str], float]:
        stream = FakeStream(["a"])
        loop = asyncio.get_running_loop()
        started = loop.time()
        taken = batches(stream, 500, within=30.0)  # type: ignore[arg-type]
        batch = await asyncio.wait_for(anext(taken), 5)
        return batch, loop.time() - started

    batch, waited = asyncio.run(main())
    assert batch == ["a"] and waited < 1.0


def test_the_drainer_waits_while_the_body_holds_a_batch_and_acks_come_only_after():
    async def main() -> None:
        stream = FakeStream([f"r{i}" for i in range(5)])
        taken = batches(stream, 2, within=30.0)  # type: ignore[arg-type]
        first = await asyncio.wait_for(anext(taken), 5)
        assert stream.enable_acks is False
        assert first == ["r0", "r1"]
        await _ticks()
        # the body still holds r0 and r1: the drainer took r2 off the queue and waits
        # with it (the batch's handling gets the whole core); nothing is acked yet
        assert stream.added == ["r0", "r1"]
        assert stream.queue.qsize() == 2 and stream.acked == []
        second = await asyncio.wait_for(anext(taken), 5)
        assert second == ["r2", "r3"] and stream.acked == ["r0", "r1"]
        third = await asyncio.wait_for(anext(taken), 5)
        assert third == ["r4"] and stream.acked == ["r0", "r1", "r2", "r3"]
        await taken.aclose()  # the body is done with r4 (or was cancelled): acked
        assert stream.acked == ["r0", "r1", "r2", "r3", "r4"]
        stream.drainer.cancel()

    asyncio.run(main())


def test_records_still_coming_are_waited_for_at_most_within():
    async def main() -> tuple[list[str], float, list[str]]:
        stream = FakeStream(["a", "b", STALL])
        loop = asyncio.get_running_loop()
        started = loop.time()
        taken = batches(stream, 500, within=0.2)  # type: ignore[arg-type]
        batch = await asyncio.wait_for(anext(taken), 5)
        waited = loop.time() - started
        stream.drainer.cancel()
        return batch, waited, list(stream.acked)  # the body still holds the batch

    batch, waited, acked = asyncio.run(main())
    assert batch == ["a", "b"] and 0.15 < waited < 2.0 and acked == []


def test_a_gathered_record_that_is_never_yielded_is_never_acked():
    async def main() -> list[str]:
        stream = FakeStream(["r0", "r1", "r2"])
        taken = batches(stream, 2, within=30.0)  # type: ignore[arg-type]
        assert await asyncio.wait_for(anext(taken), 5) == ["r0", "r1"]
        await taken.aclose()  # the worker stops (or the partition moves) here
        await _ticks()
        assert stream.added == ["r0", "r1", "r2"]  # r2 gathered once there was room
        stream.drainer.cancel()
        return stream.acked

    assert asyncio.run(main()) == ["r0", "r1"]  # r2 is redelivered, not acked


def test_a_full_batch_has_no_room_until_taken_and_done():
    gathering = Gathering(2)
    gathering.add("a", more_queued=True)
    assert gathering.room.is_set() and not gathering.ready.is_set()
    gathering.add("b", more_queued=True)
    assert gathering.full and not gathering.room.is_set() and gathering.ready.is_set()
    assert gathering.take() == ["a", "b"]
    assert not gathering.room.is_set() and not gathering.waiting.is_set()
    gathering.done()
    assert gathering.room.is_set()


def test_closed_batches_let_records_through_and_a_failing_gather_crashes_the_stream():
    async def main() -> tuple[list[str], list[BaseException]]:
        stream = FakeStream(["r0", "r1"])
        crashes: list[BaseException] = []

        async def crash(exc: BaseException) -> None:
            crashes.append(exc)

        stream.crash = crash  # type: ignore[attr-defined]
        taken = batches(stream, 1, within=30.0)  # type: ignore[arg-type]
        assert await asyncio.wait_for(anext(taken), 5) == ["r0"]
        await taken.aclose()  # r1 waited for room; closed, it is let through, not held
        await _ticks()
        stream.current_event = None
        await stream.processors[0]("x")  # closed: no batch, no error
        stream.processors.clear()
        again = batches(stream, 1, within=30.0)  # type: ignore[arg-type]
        waiting = asyncio.ensure_future(anext(again))
        await _ticks()
        await stream.processors[0]("y")  # no current event: the stream crashes
        waiting.cancel()
        stream.drainer.cancel()
        return stream.acked, crashes

    acked, crashes = asyncio.run(main())
    assert acked == ["r0"] and len(crashes) == 1 and isinstance(crashes[0], RuntimeError)
