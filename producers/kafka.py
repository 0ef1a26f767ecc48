"""The Kafka side of ingest: an idempotent producer whose acks become awaitables.

``send`` returns only when Kafka acknowledged (acks=all) or refused each record, so
the HTTP layer can answer 202 only for jobs that are durably in the topic. How each
delivery report reaches its request: :mod:`producers.delivery`.
"""

from __future__ import annotations

import asyncio
import logging
import threading
import time
from collections.abc import Callable, Sequence
from typing import Protocol

from confluent_kafka import KafkaError, KafkaException, Producer
from confluent_kafka.admin import AdminClient, ConfigResource

from onceflow.envelope import JobEnvelope
from onceflow.kafka_producer import idempotent_producer_config
from onceflow.settings import Settings
from producers.broker_link import RECONNECT_BACKOFF_MAX_MS, BrokerLink, Down, unwritable
from producers.delivery import Ack, Deliveries, Reports, resolve
from producers.metrics import KAFKA_ERRORS, PRODUCE_LATENCY

log = logging.getLogger(__name__)

__all__ = ["Ack", "JobProducer", "JobSender", "producer_config"]

#: close() flushes the two lanes in turns of this long.
_FLUSH_TURN_SECONDS = 0.05


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
        **idempotent_producer_config(
            settings.kafka_bootstrap_servers,
            "onceflow-ingest",
            linger_ms=settings.producer_linger_ms,
            delivery_timeout_ms=timeout_ms,
        ),
        "queue.buffering.max.messages": 500000,
        "queue.buffering.max.kbytes": 262144,
        "reconnect.backoff.max.ms": RECONNECT_BACKOFF_MAX_MS,
    }


class _Lane:
    """One librdkafka producer and the thread serving its delivery reports."""

    def __init__(self, producer: Producer, deliveries: Deliveries, name: str) -> None:
        self.producer = producer
        self.deliveries = deliveries
        self.poller = threading.Thread(target=deliveries.run, name=name, daemon=True)
        self.poller.start()

    def stop_polling(self) -> None:
        self.deliveries.running = False
        self.poller.join(timeout=2)


class JobProducer:
    """Ingest's producer. Two when ``producer_express_when_idle`` is on (the default)
    and the linger is not 0: a request that finds no record of this process awaiting
    Kafka's report, and none produced within the linger, goes out at once through a
    second producer with ``linger.ms`` 0, so a lone job does not wait out the linger
    (a light load's submit → first step); any other goes through the lingering one,
    where it is batched with its neighbours (a heavy load's throughput). librdkafka
    cannot change a producer's linger while it runs, hence two.

    Two submissions of one job id made one after the other (the second sent after the
    first's 202) reach Kafka in that order whichever producer carries each: the first
    was acknowledged before the second was produced. Nothing orders submissions in
    flight at once, nor a resubmission after a 503 or a client's own timeout against
    the first try, which may still be written late (a single producer would have kept
    those two in order; two ingest processes never did): the first to reach the worker
    is the one that counts (README, "The HTTP API")."""

    def __init__(
        self,
        settings: Settings,
        producer_factory: Callable[[dict[str, object]], Producer] | None = None,
    ) -> None:
        make = Producer if producer_factory is None else producer_factory
        self.settings = settings
        self.topic = settings.jobs_topic
        self.link = BrokerLink()
        config = {**producer_config(settings), "error_cb": self.link.on_error, "logger": log}
        express: Producer | None = None
        if settings.producer_express_when_idle and settings.producer_linger_ms > 0:
            express = make({**config, "linger.ms": 0, "client.id": "onceflow-ingest-express"})
        lingering = make(config)
        depth_of = (lingering,) if express is None else (lingering, express)
        self._lane = _Lane(lingering, Deliveries(lingering, self.link, depth_of), "kafka-poll")
        self._express = (
            None
            if express is None
            else _Lane(express, Deliveries(express, self.link, ()), "kafka-poll-express")
        )
        self._lanes = [self._lane] if self._express is None else [self._lane, self._express]
        self._admin: AdminClient | None = None  # made on first use, let go at close
        self._closed = False
        self._linger_seconds = settings.producer_linger_ms / 1000
        # time.monotonic(), not the loop's clock: uvloop's counts whole milliseconds
        self._last_produce = float("-inf")
        self._watcher = self.link.watch(self._writable)

    def _lane_for_next(self, now: float) -> _Lane:
        """The express lane when no record of this process awaits its report and none
        was produced within the linger (which it would have been batched with); the
        lingering one otherwise. Under load every request finds either, so the lone
        express sends do not take the batches' place (a request in a few between each
        burst of acknowledgements did: 0.9 of the single-job throughput)."""
        express = self._express
        if (
            express is not None
            and now - self._last_produce >= self._linger_seconds
            and express.deliveries.idle
            and self._lane.deliveries.idle
        ):
            return express
        return self._lane

    async def send(self, envelopes: Sequence[JobEnvelope]) -> list[Ack]:
        """Produce every envelope; wait for each one's delivery report.

        While the reports are awaited, this loop polls for them
        (:mod:`producers.delivery`).
        Raises :class:`KafkaUnreachable` at once, producing nothing, while no broker
        is connected.
        """
        self.link.check()
        loop = asyncio.get_running_loop()
        started = loop.time()
        now = time.monotonic()
        lane = self._lane_for_next(now)
        reports = lane.deliveries.reports(loop, [env.job_id for env in envelopes])
        produced = 0
        for index, env in enumerate(envelopes):
            produced += self._produce(lane.producer, env, index, reports)
        if produced:
            lane.deliveries.produced(loop, produced)
            self._last_produce = now
        if envelopes:
            # librdkafka's delivery.timeout.ms fires first; this is a safety net. A job
            # whose report has not arrived is *not* reported accepted. A timer on the
            # loop rather than asyncio.wait_for(shield(...)): the same deadline without
            # two more futures and their callbacks per request.
            timer = loop.call_later(
                self.settings.ingest_ack_timeout_seconds + 5, resolve, reports.done
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
        failed = [a for a in result if a.error is not None]
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

    def _produce(self, producer: Producer, env: JobEnvelope, index: int, reports: Reports) -> bool:
        """Hand one record to librdkafka; False (and its ``Ack`` an error) if refused."""
        job_id = env.job_id
        try:
            producer.produce(
                self.topic,
                key=env.key(),
                value=env.encode(),
                headers=env.headers(),
                on_delivery=reports.callback(index),
            )
        except BufferError:
            reports.record(index, Ack(job_id, error="producer queue is full"))
        except Exception as exc:  # KafkaException for a record librdkafka refuses
            reports.record(index, Ack(job_id, error=str(exc)))
        else:
            return True
        return False

    def _unwritable(self, timeout: float) -> str | None:
        """Why Kafka cannot confirm a write to the jobs topic now (None: it can); raises
        KafkaException when no broker answers in ``timeout`` (not this check's to say:
        librdkafka's "all brokers down" marks the link)."""
        md = self._lane.producer.list_topics(self.topic, timeout=timeout)
        if not md.brokers:
            raise KafkaException(KafkaError(KafkaError._ALL_BROKERS_DOWN, "no broker answers"))
        return unwritable(md.topics.get(self.topic), self._min_insync(timeout))

    def _min_insync(self, timeout: float) -> int:
        """The jobs topic's ``min.insync.replicas`` (its own or the broker's default),
        asked each time: a probe runs only while the link is down, a readiness check
        every few seconds. 1 when it cannot be read (then only leaders are checked)."""
        resource = ConfigResource(ConfigResource.Type.TOPIC, self.topic)
        admin = self._admin
        if admin is None:
            admin = self._admin = AdminClient(
                {"bootstrap.servers": self.settings.kafka_bootstrap_servers}
            )
        try:
            configs = admin.describe_configs([resource], request_timeout=timeout)
            entry = configs[resource].result(timeout)["min.insync.replicas"]
            return int(entry.value)
        except (KafkaException, KeyError, ValueError, TypeError, TimeoutError):
            return 1

    def _writable(self, timeout: float) -> bool:
        """The link watcher's probe: can Kafka take and confirm a write now?"""
        return self._unwritable(timeout) is None

    def ready(self, timeout: float = 2.0) -> bool:
        """Kafka can take and confirm a write. A "cannot confirm" found here (a partition
        without a leader or short of in-sync replicas) marks the link down too, so that
        submissions get their 503 at once instead of after the ack timeout."""
        if self._closed or not self.link.up:  # known at once: no 2 s wait
            return False
        try:
            reason = self._unwritable(timeout)
        except Exception:
            return False
        if reason is not None:
            self.link.mark_down(reason, Down.UNWRITABLE)
        return reason is None

    def close(self, timeout: float = 30.0) -> int:
        """Flush what is queued (clean shutdown); return records still undelivered."""
        self._closed = True  # readiness says no from now on (and makes no admin client)
        self.link.stop()
        for lane in self._lanes:
            lane.stop_polling()
        self._watcher.join(timeout=2)
        deadline = time.monotonic() + timeout
        try:  # what flush() serves here goes to its requests
            here: asyncio.AbstractEventLoop | None = asyncio.get_running_loop()
        except RuntimeError:
            here = None
        # Both lanes flushed in turns, so that one slow to drain leaves the other its
        # share of the time.
        left = [len(lane.producer) for lane in self._lanes]
        while True:
            for n, lane in enumerate(self._lanes):
                if left[n]:
                    left[n] = lane.producer.flush(_FLUSH_TURN_SECONDS)
                lane.deliveries.dispatch(here)
            if not any(left) or time.monotonic() >= deadline:
                break
        for lane, undelivered in zip(self._lanes, left, strict=True):
            if not undelivered and not lane.poller.is_alive() and not self._watcher.is_alive():
                # The handle's threads and connections go now, not when the object is
                # collected: an app object can outlive its server (FastAPI caches its
                # endpoints, the Swagger page's closure holds the app), and tests
                # start many. Undelivered records keep it: close() would wait on them
                # again.
                lane.producer.close()
        self._admin = None
        return sum(left)
