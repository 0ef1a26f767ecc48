"""The Kafka side of ingest: an idempotent producer whose acks become awaitables.

``send`` returns only when Kafka acknowledged (acks=all) or refused each record, so
the HTTP layer can answer 202 only for jobs that are durably in the topic. How each
delivery report reaches its request: :mod:`producers.delivery`.
"""

from __future__ import annotations

import asyncio
import logging
import threading
from collections.abc import Sequence
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


class JobProducer:
    def __init__(self, settings: Settings) -> None:
        self.settings = settings
        self.topic = settings.jobs_topic
        self.link = BrokerLink()
        config = {**producer_config(settings), "error_cb": self.link.on_error}
        self._producer = Producer(config, logger=log)
        self._deliveries = Deliveries(self._producer, self.link)
        self._poller = threading.Thread(target=self._deliveries.run, name="kafka-poll", daemon=True)
        self._poller.start()
        self._admin: AdminClient | None = None  # made on first use, let go at close
        self._watcher = self.link.watch(self._writable)

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
        reports = self._deliveries.reports(loop, [env.job_id for env in envelopes])
        produced = 0
        for index, env in enumerate(envelopes):
            produced += self._produce(env, index, reports)
        if produced:
            self._deliveries.produced(loop, produced)
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

    def _produce(self, env: JobEnvelope, index: int, reports: Reports) -> bool:
        """Hand one record to librdkafka; False (and its ``Ack`` an error) if refused."""
        job_id = env.job_id
        try:
            self._producer.produce(
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
        md = self._producer.list_topics(self.topic, timeout=timeout)
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
        if not self.link.up:  # known at once: no 2 s wait for a broker that is gone
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
        self.link.stop()
        self._deliveries.running = False
        self._poller.join(timeout=2)
        self._watcher.join(timeout=2)
        remaining = self._producer.flush(timeout)
        try:  # what flush() served here goes to its requests
            here: asyncio.AbstractEventLoop | None = asyncio.get_running_loop()
        except RuntimeError:
            here = None
        self._deliveries.dispatch(here)
        if remaining == 0 and not self._poller.is_alive() and not self._watcher.is_alive():
            # The handle's threads and connections go now, not when the object is
            # collected: an app object can outlive its server (FastAPI caches its
            # endpoints, the Swagger page's closure holds the app), and tests start
            # many. Undelivered records keep it: close() would wait on them again.
            self._producer.close()
        self._admin = None
        return remaining
