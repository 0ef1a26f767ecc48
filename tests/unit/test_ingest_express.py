"""Ingest's express lane (producers/kafka.py, ``JobProducer``): a request that finds no
record in flight and none sent within the linger goes through the producer without
linger; any other through the lingering producer, batched with its neighbours."""

from __future__ import annotations

import asyncio
import threading
from collections.abc import Iterator
from contextlib import contextmanager

from onceflow.envelope import JobEnvelope
from onceflow.settings import Settings
from producers.kafka import JobProducer
from tests.unit.test_ingest_fast_path import FakeMessage


class HeldProducer:
    """Keeps what is produced until ``release``; then serves the delivery reports on
    the next poll, as librdkafka does once the broker answers."""

    def __init__(self, config: dict[str, object]) -> None:
        self.config = config
        self.keys: list[bytes] = []
        self._callbacks: list = []
        self._released = threading.Event()
        self._lock = threading.Lock()
        self.closed = False

    def produce(self, topic: str, key: bytes, value: bytes, headers: object, on_delivery) -> None:
        with self._lock:
            self.keys.append(key)
            self._callbacks.append(on_delivery)

    def release(self) -> None:
        self._released.set()

    def poll(self, timeout: float) -> int:
        if not self._released.wait(min(timeout, 0.01)):
            return 0
        with self._lock:
            served, self._callbacks = self._callbacks, []
        for callback in served:
            callback(None, FakeMessage(0, len(self.keys)))
        return len(served)

    def flush(self, timeout: float) -> int:
        self.release()
        self.poll(0)
        return 0

    def close(self) -> None:
        self.closed = True

    def __len__(self) -> int:
        return len(self._callbacks)


def _producer(**settings: object) -> tuple[JobProducer, dict[str, HeldProducer]]:
    made: dict[str, HeldProducer] = {}

    def factory(config: dict[str, object]) -> HeldProducer:
        made[str(config["client.id"])] = HeldProducer(config)
        return made[str(config["client.id"])]

    s = Settings(kafka_bootstrap_servers="127.0.0.1:1", **settings)
    return JobProducer(s, producer_factory=factory), made  # type: ignore[arg-type]


@contextmanager
def _lanes(**settings: object) -> Iterator[tuple[JobProducer, HeldProducer, HeldProducer]]:
    """A producer with fake lanes (express, lingering), closed at the end."""
    producer, made = _producer(**settings)
    try:
        yield producer, made["onceflow-ingest-express"], made["onceflow-ingest"]
    finally:
        producer.close(timeout=1)


def _env(job_id: str) -> list[JobEnvelope]:
    return [JobEnvelope(job_id, "w", {})]


def test_a_lone_request_skips_the_linger_and_one_behind_others_is_batched():
    with _lanes(producer_linger_ms=5) as (producer, express, lingering):
        assert express.config["linger.ms"] == 0 and lingering.config["linger.ms"] == 5

        async def main() -> None:
            first = asyncio.ensure_future(producer.send(_env("a")))
            await asyncio.sleep(0.05)
            # "a" awaits its report: "b" and "c" find a record in flight
            second = asyncio.ensure_future(producer.send(_env("b")))
            third = asyncio.ensure_future(producer.send(_env("c")))
            await asyncio.sleep(0.05)
            assert express.keys == [b"a"] and lingering.keys == [b"b", b"c"]
            express.release()
            lingering.release()
            acks = await asyncio.gather(first, second, third)
            assert all(ack.ok for batch in acks for ack in batch)
            # nothing in flight any more: the next lone request is express again
            express_after = await producer.send(_env("d"))
            assert express_after[0].ok and express.keys == [b"a", b"d"]

        asyncio.run(main())


def test_a_record_in_flight_on_either_lane_sends_the_next_to_the_lingering_one():
    with _lanes(producer_linger_ms=5) as (producer, express, lingering):

        async def main() -> None:
            first = asyncio.ensure_future(producer.send(_env("a")))  # express, held
            await asyncio.sleep(0.05)
            second = asyncio.ensure_future(producer.send(_env("b")))  # lingering, held
            await asyncio.sleep(0.05)
            express.release()
            await asyncio.wait_for(first, 5)
            # the express lane is idle, the lingering one is not: "c" joins "b"
            third = asyncio.ensure_future(producer.send(_env("c")))
            await asyncio.sleep(0.05)
            assert express.keys == [b"a"] and lingering.keys == [b"b", b"c"]
            lingering.release()
            assert all(ack.ok for batch in await asyncio.gather(second, third) for ack in batch)

        asyncio.run(main())


def test_a_request_within_the_linger_of_the_last_one_is_batched_even_when_idle():
    with _lanes(producer_linger_ms=60_000) as (producer, express, lingering):
        express.release()
        lingering.release()

        async def main() -> None:
            await producer.send(_env("a"))  # the first: nothing before it
            await producer.send(_env("b"))  # nothing in flight, but "a" within the linger
            assert express.keys == [b"a"] and lingering.keys == [b"b"]

        asyncio.run(main())


def test_close_flushes_both_lanes_and_settles_their_requests():
    producer, made = _producer(producer_linger_ms=5)

    async def main() -> None:
        first = asyncio.ensure_future(producer.send(_env("a")))  # express, held
        await asyncio.sleep(0.05)
        second = asyncio.ensure_future(producer.send(_env("b")))  # lingering, held
        await asyncio.sleep(0.05)
        assert producer.close(timeout=2) == 0  # on the loop, as the lifespan calls it
        acks = await asyncio.wait_for(asyncio.gather(first, second), 5)
        assert [ack.job_id for batch in acks for ack in batch if ack.ok] == ["a", "b"]

    asyncio.run(main())
    assert all(p.closed for p in made.values())


def test_no_express_lane_when_off_or_when_nothing_lingers():
    for settings in ({"producer_express_when_idle": False}, {"producer_linger_ms": 0}):
        producer, made = _producer(**settings)
        try:
            assert list(made) == ["onceflow-ingest"]
        finally:
            producer.close(timeout=1)
