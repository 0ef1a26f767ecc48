"""Delivery reports, from librdkafka to the requests waiting for them.

librdkafka hands each report to Python in ``Producer.poll``, and confluent-kafka takes
the GIL for every report's callback. Served from a thread of its own (how ingest did it
first), each report waited for the event loop's thread to let go of the GIL (up to the
5 ms switch interval while the loop is busy) and then cost a ``call_soon_threadsafe``
(a self-pipe write and a loop wake-up): under load the reports queued behind the GIL
and a request's wait for its ack grew to tens of milliseconds while ingest's CPU was
not even full (BENCHMARKS.md, "Single-job requests: where the time goes").

So once :data:`LOOP_POLLING_FROM` records or more wait for reports, the event loop
polls: ``poll(0)`` every :data:`LOOP_POLL_INTERVAL` seconds, on its own thread, so the
callbacks run there, with the GIL already held, and resolve the requests' futures
directly; it keeps polling until no record waits. Below that (single jobs from up
to a few dozen clients) the loop is often idle, the thread gets the GIL soon, and a
timer every half millisecond would cost more CPU than it saves (measured: 3x the CPU
per request at one connection, +25% at 64 clients and ~1,500 requests/s), so the
thread (:meth:`Deliveries.run`) serves the reports, as it serves errors while nothing
waits (``poll(0.1)``); while the loop polls, the thread only polls every 50 ms, as a
safety net. A report served on a thread other than its request's loop is handed over
with one ``call_soon_threadsafe`` per ``poll``, whatever the number of reports.
"""

from __future__ import annotations

import asyncio
import threading
from collections import deque
from collections.abc import Callable, Sequence
from functools import partial
from typing import NamedTuple

from confluent_kafka import KafkaError, Message, Producer

from producers.broker_link import BrokerLink
from producers.metrics import QUEUE_DEPTH

#: How often a loop with requests waiting polls for their reports: at most this much
#: is added to a request's wait (linger.ms is 2 ms), for a few microseconds a poll.
LOOP_POLL_INTERVAL = 0.0005
#: Records waiting for reports from which the loop, not the thread, polls. At 8, 64
#: clients posting single jobs at ~1,500 requests/s kept the loop's timer running
#: (2,000 wake-ups a second for ~1 request each): 0.39-0.55 ms of CPU per request
#: against 0.30-0.35 at 32; at 5,000 requests/s and for batches the two are alike
#: (BENCHMARKS.md, "Third round").
LOOP_POLLING_FROM = 32
_BUSY_THREAD_INTERVAL = 0.05


class Ack(NamedTuple):
    """What Kafka said of one record. A named tuple, not a frozen dataclass: one is
    built per job, and a frozen dataclass's ``__init__`` (one ``object.__setattr__``
    per field) cost 1.3-2x as much."""

    job_id: str
    partition: int | None = None
    offset: int | None = None
    error: str | None = None

    @property
    def ok(self) -> bool:
        return self.error is None


class Reports:
    """The delivery reports of one request's records (``job_ids``, in produce order);
    ``done`` resolves when the last arrives. Settled on its event loop's thread only."""

    __slots__ = ("_pending", "_served", "acks", "done", "job_ids", "loop")

    def __init__(
        self, loop: asyncio.AbstractEventLoop, job_ids: list[str], served: deque[_Report]
    ) -> None:
        self.acks: list[Ack | None] = [None] * len(job_ids)
        self.done: asyncio.Future[None] = loop.create_future()
        self.loop = loop
        self.job_ids = job_ids
        self._pending = len(job_ids)
        self._served = served

    def callback(self, index: int) -> Callable[[KafkaError | None, Message], None]:
        """The ``on_delivery`` of record ``index`` (a C partial: no closure per record)."""
        return partial(self._on_delivery, index)

    def _on_delivery(self, index: int, err: KafkaError | None, msg: Message) -> None:
        # On whichever thread polled; deque appends are atomic.
        self._served.append((self, index, err, msg))

    def record(self, index: int, ack: Ack) -> None:
        if self.acks[index] is None:
            self._pending -= 1
        self.acks[index] = ack
        if self._pending == 0:
            resolve(self.done)


_Report = tuple[Reports, int, KafkaError | None, Message]


class Deliveries:
    """Routes the reports of one producer to their requests (see the module's doc)."""

    def __init__(
        self, producer: Producer, link: BrokerLink, depth_of: Sequence[Producer] | None = None
    ) -> None:
        self._producer = producer
        self._link = link
        #: The producers whose queued records the depth gauge sums (this one by
        #: default; none: another lane's thread reports them).
        self._depth_of = (producer,) if depth_of is None else tuple(depth_of)
        # Filled by the callbacks on whichever thread polled; deque appends and
        # pops are atomic, so two pollers never take the same report or lose one.
        self._served: deque[_Report] = deque()
        self._waiting = 0  # records produced whose report has not been settled
        self._polling: set[asyncio.AbstractEventLoop] = set()
        self._thread_may_poll = threading.Event()  # set: no loop is polling
        self._thread_may_poll.set()
        self.running = True

    @property
    def idle(self) -> bool:
        """No record of this producer awaits its report."""
        return self._waiting <= 0

    def reports(self, loop: asyncio.AbstractEventLoop, job_ids: list[str]) -> Reports:
        """Where the reports of one request's records (``job_ids``) go."""
        return Reports(loop, job_ids, self._served)

    def produced(self, loop: asyncio.AbstractEventLoop, count: int) -> None:
        """``count`` records of a request on ``loop`` await their reports."""
        self._waiting += count
        if self._waiting >= LOOP_POLLING_FROM and loop not in self._polling:
            self._polling.add(loop)
            self._thread_may_poll.clear()
            loop.call_later(LOOP_POLL_INTERVAL, self._poll_on_loop, loop)

    def _poll_on_loop(self, loop: asyncio.AbstractEventLoop) -> None:
        if not self.running:  # closing: close() flushes and settles what is left
            self._polling.discard(loop)
            return
        self._producer.poll(0)
        self.dispatch(loop)
        if self._waiting > 0 and self.running:
            loop.call_later(LOOP_POLL_INTERVAL, self._poll_on_loop, loop)
        else:
            self._polling.discard(loop)
            if not self._polling:
                self._thread_may_poll.set()

    def run(self) -> None:
        """The poll thread's loop: serve reports and errors while no loop polls."""
        while self.running:
            if self._thread_may_poll.is_set():
                self._producer.poll(0.1)
            else:  # a loop polls: only a safety net here
                self._thread_may_poll.wait(_BUSY_THREAD_INTERVAL)
                self._producer.poll(0)
            self.dispatch(None)
            if self._depth_of:
                QUEUE_DEPTH.set(sum(len(p) for p in self._depth_of))

    def dispatch(self, here: asyncio.AbstractEventLoop | None) -> None:
        """Settle what was served: directly for requests of ``here`` (the loop whose
        thread this is), with one ``call_soon_threadsafe`` per other loop."""
        served = self._served
        if not served:
            return
        local: list[_Report] = []
        others: dict[asyncio.AbstractEventLoop, list[_Report]] = {}
        delivered = False
        failed: KafkaError | None = None
        while served:
            item = served.popleft()
            if item[2] is None:
                delivered = True
            elif failed is None:
                failed = item[2]
            if item[0].loop is here:
                local.append(item)
            else:
                others.setdefault(item[0].loop, []).append(item)
        if delivered:
            self._link.on_delivered()
        elif failed is not None:  # nothing confirmed: the link learns why (BrokerLink)
            self._link.on_failed(failed)
        if local:
            self._settle(local)
        for loop, items in others.items():
            try:
                loop.call_soon_threadsafe(self._settle, items)
            except RuntimeError:  # that loop is closed: nobody waits for these
                self._waiting -= len(items)

    def _settle(self, reports: list[_Report]) -> None:
        """On the requests' loop: each report becomes its request's ``Ack``."""
        self._waiting -= len(reports)
        for request, index, err, msg in reports:
            job_id = request.job_ids[index]
            if err is not None:
                request.record(index, Ack(job_id, error=err.str()))
            else:
                request.record(index, Ack(job_id, msg.partition(), msg.offset()))


def resolve(fut: asyncio.Future[None]) -> None:
    if not fut.done():
        fut.set_result(None)
