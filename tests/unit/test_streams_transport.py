"""The fetcher's per-record hand-over (streams.transport): no task when the conductor's
delivery does not wait, and faust's outcome when it does, rebalance included.

The consumer is the worker's own (built by ``create_app``, never connected): its
``wait_first`` is called the way faust's fetcher calls it, with a delivery that puts
into an ``asyncio.Queue`` standing in for the stream's buffer.
"""

from __future__ import annotations

import asyncio
import contextvars
import inspect
from pathlib import Path

import pytest
from faust.transport.drivers import aiokafka as aiokafka_driver
from faust.types import TP

from onceflow.settings import Settings
from streams.app import create_app
from streams.transport import Consumer, QuietMonitor, finish


def _consumer(tmp_path: Path) -> Consumer:
    """The worker's consumer, made in the running loop (faust binds it to that loop)."""
    settings = Settings(kafka_bootstrap_servers="127.0.0.1:1", state_dir=tmp_path)
    consumer = create_app(settings).consumer
    assert isinstance(consumer, Consumer)
    return consumer


def _counting_tasks(loop: asyncio.AbstractEventLoop) -> list[int]:
    made = [0]

    def factory(loop, coro, **kwargs):
        made[0] += 1
        return asyncio.Task(coro, loop=loop, **kwargs)

    loop.set_task_factory(factory)
    return made


async def _deliver(queue: asyncio.Queue, item: object) -> str:
    await queue.put(item)
    return f"delivered {item}"


@pytest.mark.parametrize("faust_own", [False, True])
def test_a_delivery_that_does_not_wait_makes_no_task(tmp_path, faust_own):
    wait_first = aiokafka_driver.Consumer.wait_first if faust_own else Consumer.wait_first

    async def run():
        consumer = _consumer(tmp_path)
        made = _counting_tasks(asyncio.get_running_loop())
        queue: asyncio.Queue = asyncio.Queue(2)
        flow = consumer.suspend_flow.wait()
        result = await wait_first(consumer, _deliver(queue, "a"), flow)
        return made[0], result, queue.get_nowait(), inspect.getcoroutinestate(flow)

    made, result, item, flow_state = asyncio.run(run())
    assert (result.results, result.stopped, item) == (["delivered a"], False, "a")
    if faust_own:
        assert made >= 4  # what the fast path saves, per record
    else:
        assert made == 0
        assert flow_state == inspect.CORO_CLOSED  # never left unawaited


async def _handing_to_a_full_buffer(tmp_path: Path, item: str):
    """A consumer handing ``item`` to a buffer holding "first", and waiting for room."""
    consumer = _consumer(tmp_path)
    queue: asyncio.Queue = asyncio.Queue(1)
    queue.put_nowait("first")
    handing = asyncio.ensure_future(
        consumer.wait_first(_deliver(queue, item), consumer.suspend_flow.wait())
    )
    await asyncio.sleep(0.01)
    assert not handing.done()  # the buffer is full: it waits, as faust's does
    return consumer, queue, handing


def test_a_delivery_that_waits_for_room_goes_on_where_it_stopped(tmp_path):
    async def run():
        _, queue, handing = await _handing_to_a_full_buffer(tmp_path, "second")
        assert queue.get_nowait() == "first"
        result = await asyncio.wait_for(handing, 5)
        return result, queue.get_nowait()

    result, item = asyncio.run(run())
    assert (result.results, item) == (["delivered second"], "second")


def test_a_rebalance_while_a_delivery_waits_for_room_abandons_it_as_faust_does(tmp_path):
    async def run():
        consumer, queue, handing = await _handing_to_a_full_buffer(tmp_path, "stale")
        consumer.stop_flow()  # a rebalance begins: suspend_flow is set
        result = await asyncio.wait_for(handing, 5)
        putters = len(queue._putters)  # type: ignore[attr-defined]
        assert queue.get_nowait() == "first"
        queue.put_nowait("next")  # the abandoned put holds no place in the buffer
        return result, putters, queue.get_nowait(), queue.empty()

    result, putters, item, empty = asyncio.run(run())
    assert result.results == [True]  # the flow won; the record is fetched again later
    assert (putters, item, empty) == (0, "next", True)


def test_a_delivery_that_raises_raises_and_closes_the_flow_wait(tmp_path):
    async def broken():
        raise ValueError("undecodable")

    async def run():
        consumer = _consumer(tmp_path)
        flow = consumer.suspend_flow.wait()
        with pytest.raises(ValueError, match="undecodable"):
            await consumer.wait_first(broken(), flow)
        return inspect.getcoroutinestate(flow)

    assert asyncio.run(run()) == inspect.CORO_CLOSED


def test_a_suspended_or_stopped_consumer_takes_fausts_path(tmp_path):
    async def run():
        consumer = _consumer(tmp_path)
        queue: asyncio.Queue = asyncio.Queue(1)
        consumer.stop_flow()
        suspended = await consumer.wait_first(_deliver(queue, "x"), consumer.suspend_flow.wait())
        consumer.resume_flow()
        consumer._stopped.set()
        stopped = await consumer.wait_first(_deliver(queue, "y"), consumer.suspend_flow.wait())
        return suspended, stopped

    suspended, stopped = asyncio.run(run())
    assert not suspended.stopped and True in suspended.results
    assert stopped.stopped  # faust's answer for a stopping consumer


def test_finish_passes_a_futures_error_into_the_coroutine():
    async def run():
        fut = asyncio.get_running_loop().create_future()

        async def waiting():
            try:
                await fut
            except KeyError as exc:
                return f"caught {exc.args[0]}"
            return "not reached"

        coro = waiting()
        yielded = coro.send(None)  # its first step, as the consumer runs it
        assert yielded is fut
        fut.set_exception(KeyError("k"))
        return await finish(coro, yielded, contextvars.copy_context())

    assert asyncio.run(run()) == "caught k"


def test_finish_after_a_bare_yield():
    async def run():
        async def twice():
            await asyncio.sleep(0)
            await asyncio.sleep(0)
            return "done"

        coro = twice()
        return await finish(coro, coro.send(None), contextvars.copy_context())

    assert asyncio.run(run()) == "done"


def test_finish_cancelled_throws_the_cancellation_into_the_coroutine():
    seen: list[str] = []

    async def run():
        fut = asyncio.get_running_loop().create_future()

        async def waiting():
            try:
                await fut
            except asyncio.CancelledError:
                seen.append("cancelled")  # not GeneratorExit at some later collection
                raise

        coro = waiting()
        task = asyncio.ensure_future(finish(coro, coro.send(None), contextvars.copy_context()))
        await asyncio.sleep(0)
        task.cancel()
        with pytest.raises(asyncio.CancelledError):
            await task
        return fut.cancelled(), inspect.getcoroutinestate(coro)

    assert asyncio.run(run()) == (True, inspect.CORO_CLOSED)
    assert seen == ["cancelled"]


def test_the_monitor_keeps_no_per_record_books_but_takes_faust_calls(tmp_path):
    async def run():
        settings = Settings(kafka_bootstrap_servers="127.0.0.1:1", state_dir=tmp_path)
        app = create_app(settings)
        assert isinstance(app.monitor, QuietMonitor)
        app.sensors.add(app.monitor)
        tp, message = TP("jobs", 0), object()
        # The calls faust's conductor, streams and consumer make, with their arguments.
        app.sensors.on_message_in(tp, 7, message)
        state = app.sensors.on_stream_event_in(tp, 7, object(), object())
        app.sensors.on_stream_event_out(tp, 7, object(), object(), state)
        app.sensors.on_message_out(tp, 7, message)
        return app.monitor

    monitor = asyncio.run(run())
    assert (monitor.messages_received_total, monitor.events_total) == (0, 0)


_SEEN_BY: contextvars.ContextVar[str] = contextvars.ContextVar("seen_by", default="nobody")


@pytest.mark.parametrize("waits", [False, True])
def test_what_a_delivery_sets_in_its_context_stays_its_own(tmp_path, waits):
    async def run():
        consumer = _consumer(tmp_path)
        room = asyncio.Event()
        seen = []

        async def delivery():
            _SEEN_BY.set("delivery")
            if waits:
                await room.wait()  # the rest of it runs in finish, in the same context
            seen.append(_SEEN_BY.get())

        if not waits:  # awaited here, as the fetcher does: the fetcher's context
            await consumer.wait_first(delivery(), consumer.suspend_flow.wait())
            return seen, _SEEN_BY.get()
        handing = asyncio.ensure_future(
            consumer.wait_first(delivery(), consumer.suspend_flow.wait())
        )
        await asyncio.sleep(0.01)
        room.set()
        await asyncio.wait_for(handing, 5)
        return seen, _SEEN_BY.get()

    assert asyncio.run(run()) == (["delivery"], "nobody")


def test_finish_throws_a_yield_that_is_no_future_back_into_the_coroutine():
    class Odd:
        def __await__(self):
            yield "not a future"

    async def run():
        async def odd():
            try:
                await Odd()
            except RuntimeError as exc:
                return f"told: {exc}"
            return "not reached"

        coro = odd()
        result = await finish(coro, coro.send(None), contextvars.copy_context())
        return result, inspect.getcoroutinestate(coro)

    result, state = asyncio.run(run())
    assert result.startswith("told: coroutine yielded 'not a future'")
    assert state == inspect.CORO_CLOSED
