"""The Kafka side of ingest: an idempotent producer whose acks become awaitables.

``send`` returns only when Kafka acknowledged (acks=all) or refused each record, so
the HTTP layer can answer 202 only for jobs that are durably in the topic.
A dedicated thread serves librdkafka's delivery callbacks (``poll``) and hands each
result to the event loop.
"""

from __future__ import annotations

import asyncio
import logging
import threading
from collections.abc import Sequence
from dataclasses import dataclass
from typing import Protocol

from confluent_kafka import KafkaError, Message, Producer

from onceflow.envelope import JobEnvelope
from onceflow.settings import Settings
from producers.broker_link import RECONNECT_BACKOFF_MAX_MS, BrokerLink
from producers.metrics import KAFKA_ERRORS, PRODUCE_LATENCY, QUEUE_DEPTH

log = logging.getLogger(__name__)


@dataclass(frozen=True, slots=True)
class Ack:
    job_id: str
    partition: int | None = None
    offset: int | None = None
    error: str | None = None

    @property
    def ok(self) -> bool:
        return self.error is None


class JobSender(Protocol):
    """What the HTTP layer needs of a producer (``JobProducer``, or a test double).

    ``send`` raises :class:`KafkaUnreachable` (nothing produced) while no broker is
    connected; otherwise it answers one ``Ack`` per envelope."""

    async def send(self, envelopes: Sequence[JobEnvelope]) -> list[Ack]: ...

    def ready(self) -> bool: ...

    def close(self) -> int: ...


def producer_config(settings: Settings) -> dict[str, object]:
    timeout_ms = int(settings.ingest_ack_timeout_seconds * 1000)
    return {
        "bootstrap.servers": settings.kafka_bootstrap_servers,
        "client.id": "onceflow-ingest",
        "enable.idempotence": True,
        "acks": "all",
        # Same partition for a job id whichever client wrote it (Java and aiokafka
        # use murmur2; librdkafka's default is CRC32 'consistent_random').
        "partitioner": "murmur2_random",
        "linger.ms": settings.producer_linger_ms,
        "delivery.timeout.ms": timeout_ms,
        "request.timeout.ms": min(timeout_ms, 30000),
        "queue.buffering.max.messages": 500000,
        "queue.buffering.max.kbytes": 262144,
        "reconnect.backoff.max.ms": RECONNECT_BACKOFF_MAX_MS,
    }


class JobProducer:
    def __init__(self, settings: Settings) -> None:
        self.settings = settings
        self.topic = settings.jobs_topic
        self.link = BrokerLink()
        config = {**producer_config(settings), "error_cb": self.link.on_error}
        self._producer = Producer(config, logger=log)
        self._running = True
        self._poller = threading.Thread(target=self._poll, name="kafka-poll", daemon=True)
        self._poller.start()
        self.link.watch(self._answers)

    def _poll(self) -> None:
        while self._running:
            self._producer.poll(0.1)
            QUEUE_DEPTH.set(len(self._producer))

    async def send(self, envelopes: Sequence[JobEnvelope]) -> list[Ack]:
        """Produce every envelope; wait for each one's delivery report.

        The reports of one request are collected on librdkafka's poll thread and hand
        the event loop ONE wake-up when the last arrives (not one per record).
        Raises :class:`KafkaUnreachable` at once, producing nothing, while no broker
        is connected.
        """
        self.link.check()
        loop = asyncio.get_running_loop()
        started = loop.time()
        reports = _Reports(loop, len(envelopes))
        for index, env in enumerate(envelopes):
            self._produce(env, index, reports)
        if envelopes:
            # librdkafka's delivery.timeout.ms fires first; this is a safety net. A job
            # whose report has not arrived is *not* reported accepted. A timer on the
            # loop rather than asyncio.wait_for(shield(...)): the same deadline without
            # two more futures and their callbacks per request.
            timer = loop.call_later(
                self.settings.ingest_ack_timeout_seconds + 5, _resolve, reports.done
            )
            try:
                await reports.done
            finally:
                timer.cancel()
        result = [
            ack if ack is not None else Ack(env.job_id, error="no delivery report in time")
            for ack, env in zip(list(reports.acks), envelopes, strict=True)
        ]
        PRODUCE_LATENCY.observe(loop.time() - started)
        failed = [a for a in result if not a.ok]
        if failed:
            KAFKA_ERRORS.inc(len(failed))
            log.warning(
                "kafka refused %d of %d records: %s",
                len(failed),
                len(result),
                failed[0].error,
                extra={"event": "ingest.produce_failed", "job_id": failed[0].job_id},
            )
        return result

    def _produce(self, env: JobEnvelope, index: int, reports: _Reports) -> None:
        job_id = env.job_id
        link = self.link

        def on_delivery(err: KafkaError | None, msg: Message) -> None:
            if err is not None:
                reports.record(index, Ack(job_id, error=err.str()))
            else:
                link.on_delivered()
                reports.record(index, Ack(job_id, msg.partition(), msg.offset()))

        try:
            self._producer.produce(
                self.topic,
                key=env.key(),
                value=env.encode(),
                headers=env.headers(),
                on_delivery=on_delivery,
            )
        except BufferError:
            reports.record(index, Ack(job_id, error="producer queue is full"))
        except Exception as exc:  # KafkaException for a record librdkafka refuses
            reports.record(index, Ack(job_id, error=str(exc)))

    def _answers(self, timeout: float) -> bool:
        """Does a broker answer a metadata request (the link watcher's probe)?"""
        return bool(self._producer.list_topics(self.topic, timeout=timeout).brokers)

    def ready(self, timeout: float = 2.0) -> bool:
        if not self.link.up:  # known at once: no 2 s wait for a broker that is gone
            return False
        try:
            md = self._producer.list_topics(self.topic, timeout=timeout)
        except Exception:
            return False
        topic = md.topics.get(self.topic)
        return topic is not None and topic.error is None and bool(topic.partitions)

    def close(self, timeout: float = 30.0) -> int:
        """Flush what is queued (clean shutdown); return records still undelivered."""
        self.link.stop()
        remaining = self._producer.flush(timeout)
        self._running = False
        self._poller.join(timeout=2)
        return remaining


class _Reports:
    """The delivery reports of one request, filled in on librdkafka's poll thread;
    ``done`` resolves (one event-loop wake-up) when the last one arrives."""

    __slots__ = ("_lock", "_loop", "_pending", "acks", "done")

    def __init__(self, loop: asyncio.AbstractEventLoop, count: int) -> None:
        self.acks: list[Ack | None] = [None] * count
        self.done: asyncio.Future[None] = loop.create_future()
        self._loop = loop
        self._pending = count
        self._lock = threading.Lock()

    def record(self, index: int, ack: Ack) -> None:
        self.acks[index] = ack
        with self._lock:
            self._pending -= 1
            last = self._pending == 0
        if last:
            self._loop.call_soon_threadsafe(_resolve, self.done)


def _resolve(fut: asyncio.Future[None]) -> None:
    if not fut.done():
        fut.set_result(None)
