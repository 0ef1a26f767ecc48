"""The agent's batches: taken as soon as nothing more is waiting, not ``within`` later.

faust-streaming's ``Stream.take_events(max, within)`` waits ``within`` after each batch
before it looks at what was gathered, so at light load a lone record waited up to 20 ms
(half of that on average) for nothing (BENCHMARKS.md, "Submit to first step at light
load: where the milliseconds go").

:func:`batches` keeps what matters of it (the same processor and passive drainer, the
drainer held at the next record while the body handles a batch, acks only after the
body is done with a batch, in a ``finally``, exactly as ``take_events`` does: see
:meth:`streams.agents.InstanceCreator.consume` for why the body never raises) and changes
when a batch is taken: when it is full (``max_``), or when the stream's queue held
nothing more when its last record was added (what was fetched is all in), or at the
latest ``within`` after its first record with more still arriving. Under load that is
``max_`` or a Kafka fetch's worth; at light load it is at once.

Gathering the next batch *while* the body handles one was tried and measured slower
(the worker is one core's worth of Python: the drainer's per-record work competed with
the batch's own and the handle took 40% longer), so the drainer waits, as in
``take_events``.

Offsets are unchanged in kind: a record is acked only after the batch holding it was
handled, batches are handled one at a time in the order their records came, and a
gathered record that was never yielded (the worker stopped, the partition moved) is
never acked, so it is redelivered. Nothing here is faust API beyond what
``take_events`` itself uses (``add_processor``, ``_enable_passive``, ``current_event``,
``ack``, ``wait``), which ``faust-streaming`` pins.
"""

from __future__ import annotations

import asyncio
from collections.abc import AsyncGenerator
from typing import Any

import faust
from faust.types import EventT


class Gathering:
    """The batch being gathered: events added by the stream's processor, taken by the
    agent. Only ever touched from the event loop."""

    def __init__(self, max_: int) -> None:
        self.max = max_
        self.events: list[EventT] = []
        self.waiting = asyncio.Event()  # a record is in the batch
        self.ready = asyncio.Event()  # full, or nothing more was queued behind it
        self.room = asyncio.Event()  # not full, and no batch is with the body
        self.room.set()
        self.closed = False

    @property
    def full(self) -> bool:
        return len(self.events) >= self.max

    def add(self, event: EventT, more_queued: bool) -> None:
        """Add ``event``; the caller has waited for :attr:`room`."""
        self.events.append(event)
        self.waiting.set()
        if self.full:
            self.room.clear()
        if self.full or not more_queued:
            self.ready.set()

    def take(self) -> list[EventT]:
        """What is gathered, leaving an empty batch behind; no room until :meth:`done`."""
        events, self.events = self.events, []
        self.waiting.clear()
        self.ready.clear()
        self.room.clear()
        return events

    def done(self) -> None:
        """The body is done with the batch taken: gathering goes on."""
        self.room.set()

    def close(self) -> None:
        """No more batches: the processor lets every record through untouched."""
        self.closed = True
        self.room.set()


async def batches(
    stream: faust.Stream, max_: int, within: float
) -> AsyncGenerator[list[EventT], None]:
    """The stream's events in batches of at most ``max_`` (see the module's docstring);
    each batch's events are acked once the body is done with it."""
    gathering = Gathering(max_)
    channel = aiter(stream.channel)
    queue = channel.queue  # type: ignore[attr-defined]  # the channel's FlowControlQueue

    async def gather(value: Any) -> Any:
        try:
            while not gathering.room.is_set():  # close() sets it too
                # full, or the body holds a batch; returns early when stopping
                await stream.wait(gathering.room)  # type: ignore[arg-type]
                if stream.should_stop:
                    return value
            if gathering.closed:  # a later consumer of this stream gathers it
                return value
            event = stream.current_event
            if event is None:
                raise RuntimeError("gathering found no current event")
            gathering.add(event, more_queued=not queue.empty())
        except Exception as exc:  # as take_events does: the stream stops, the drainer lives
            await stream.crash(exc)
        return value

    stream.enable_acks = False  # acked below, once handled, as take_events does
    stream.add_processor(gather)
    stream._enable_passive(channel)  # type: ignore[arg-type]
    try:
        while not stream.should_stop:
            await stream.wait_for_stopped(gathering.waiting)  # type: ignore[arg-type]
            if not gathering.ready.is_set():
                await stream.wait_for_stopped(gathering.ready, timeout=within)  # type: ignore[arg-type]
            if not gathering.events:
                continue
            events = gathering.take()
            try:
                yield list(events)  # a body changing its list changes nothing acked
            finally:
                try:
                    for event in events:
                        await stream.ack(event)
                finally:
                    gathering.done()
    finally:
        gathering.close()
