"""Faust's Kafka transport, with a cheaper hand-over of each fetched record.

faust-streaming's fetcher (``Consumer._drain_messages``) hands every record to the
conductor with ``await self.wait_first(callback(message), self.suspend_flow.wait())``:
four tasks (the callback, the flow, the consumer's stopped and crashed events) and an
``asyncio.wait`` per record, so that a rebalance starting while the callback waits for
room in a stream's buffer abandons that record (it is fetched again from the committed
offset). A py-spy profile of the worker at full speed put 22% of the GIL's time there,
more than the conductor's own delivery; without it one worker went from 5,500 to
7,800-8,000 records/s, interleaved (BENCHMARKS.md, "Without a task per record").

Almost always the callback does not wait: it decodes the record and puts an event in a
buffer that has room. So :meth:`Consumer.wait_first` runs that call's first step
itself; when it finishes there, no task was needed and nothing could have come
between. When it does wait (a full buffer), it goes on where it stopped inside
faust's own ``wait_first``, racing the flow as before: the same outcome on a
rebalance, a stop or a crash. Every other ``wait_first`` is faust's, unchanged.

What still differs from a task: the first step runs under the fetcher's task
(``asyncio.current_task()``, an ``asyncio.timeout`` entered there would cancel the
fetcher). Nothing faust runs on that path (the conductor's ``on_message``, flow
control, the raw decode, the buffer's put) uses either; revisit on a faust upgrade.
"""

from __future__ import annotations

import asyncio
import contextvars
import functools
import inspect
from collections.abc import Callable, Coroutine
from typing import Any

import faust
from faust.sensors import Monitor
from faust.transport.drivers import aiokafka as aiokafka_driver
from mode.services import WaitResults


def _waits_on(awaitable: object, event: asyncio.Event) -> bool:
    """Whether ``awaitable`` is a not-yet-started ``event.wait()``."""
    return (
        inspect.iscoroutine(awaitable)
        and awaitable.cr_code is type(event).wait.__code__
        and inspect.getcoroutinelocals(awaitable).get("self") is event
    )


async def finish(coro: Coroutine[Any, Any, Any], yielded: Any, context: contextvars.Context) -> Any:
    """Run ``coro`` to its end as a task would; its first step, run by the caller in
    ``context``, suspended on ``yielded`` (a future, or None for a bare yield:
    ``sleep(0)``). Every later step runs in ``context`` too, so what the coroutine sets
    in a context variable stays its own, as in a task.

    Cancelled while it waits, it cancels what ``coro`` waits on and throws the
    cancellation into ``coro``, as a task does: an ``asyncio.Queue.put`` then gives
    back its place among the queue's waiters before the cancellation goes on. Anything
    else yielded is thrown back into ``coro`` as the ``RuntimeError`` a task raises."""
    while True:
        resume: Callable[[], Any]
        if yielded is not None and not asyncio.isfuture(yielded):
            wrong = RuntimeError(f"coroutine yielded {yielded!r}, not a future")
            resume = functools.partial(context.run, coro.throw, wrong)
        else:
            try:
                if yielded is None:
                    await asyncio.sleep(0)
                else:
                    await asyncio.wait((yielded,))
            except asyncio.CancelledError as cancelled:
                if yielded is not None:
                    yielded.cancel()
                resume = functools.partial(context.run, coro.throw, cancelled)
            else:
                resume = functools.partial(context.run, coro.send, None)
        try:
            yielded = resume()
        except StopIteration as done:
            return done.value


class Consumer(aiokafka_driver.Consumer):
    """faust's aiokafka consumer; only the fetcher's per-record hand-over differs."""

    async def wait_first(self, *coros: Any, timeout: Any = None) -> WaitResults:
        if timeout is not None or len(coros) != 2 or not _waits_on(coros[1], self.suspend_flow):
            return await super().wait_first(*coros, timeout=timeout)
        delivery, flow = coros
        if self.suspend_flow.is_set() or self._stopped.is_set() or self._crashed.is_set():
            return await super().wait_first(delivery, flow)
        context = contextvars.copy_context()  # the delivery's own, as a task's would be
        try:
            yielded = context.run(delivery.send, None)
        except StopIteration as done:
            flow.close()
            return WaitResults([delivery], [done.value], False)
        except BaseException:
            flow.close()
            raise
        return await super().wait_first(finish(delivery, yielded, context), flow)


class QuietMonitor(Monitor):
    """faust's monitor without its per-record bookkeeping (6% of the worker's time at
    full speed). Those figures feed only faust's own web views, which the worker turns
    off: its metrics are its own (``streams.metrics``) and the lag monitor's, read
    from the broker. Commits, sends and rebalances are still recorded."""

    def on_message_in(self, tp: Any, offset: int, message: Any) -> None:
        return None

    def on_stream_event_in(self, tp: Any, offset: int, stream: Any, event: Any) -> None:
        return None

    def on_stream_event_out(
        self, tp: Any, offset: int, stream: Any, event: Any, state: Any = None
    ) -> None:
        return None

    def on_message_out(self, tp: Any, offset: int, message: Any) -> None:
        return None


class Transport(aiokafka_driver.Transport):
    Consumer = Consumer


class App(faust.App):
    """A faust app whose consumer is :class:`Consumer` (its producer is faust's)."""

    def _new_transport(self) -> Transport:
        return Transport(self.conf.broker_consumer, self)
