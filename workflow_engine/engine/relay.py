"""The outbox relay: lifecycle events from ``onceflow_outbox`` to the events topic.

One round: read the first events in position order, produce each (key = job id, value =
its JSON data, CloudEvents binary-mode headers) with the idempotent producer
(``acks=all``, at most 5 in flight, so one partition's records keep their order), wait
for every acknowledgement, then delete those rows. Delivery is at least once: a relay
that dies after Kafka acknowledged and before the delete publishes those events again,
and consumers dedupe by ``(job id, sequence)`` (``ce_id``).

Exactly one relay is active across processes: the one whose dedicated connection holds
the session advisory lock (``writes.try_lock_relay``). The others try again every
``lock_retry_seconds``; PostgreSQL releases the lock when the holder's connection or
process dies, so another one takes over within that interval. A lost connection ends
the round: nothing is deleted, the lock is gone with the connection, and the relay
starts over (another may have taken over meanwhile; republishing is harmless).

While Kafka is unreachable the producer holds the round's records (no message timeout:
they are never failed for time) and the relay waits for them; the engines go on
writing, the outbox grows, and :class:`~workflow_engine.engine.backpressure.Backpressure`
stops their claims past the configured depth.

The headers are built here, to the CloudEvents Kafka protocol binding (binary content
mode), not by the ``cloudevents`` package: its ``to_binary`` took 13.5 us per event
(validation, a datetime per event), about 30x this, on the engine's own GIL at
thousands of events a second. The tests decode what this relay wrote with that package
(``cloudevents.core.bindings.kafka.from_binary``), so the spec is checked by code nobody
here wrote.
"""

from __future__ import annotations

import asyncio
import contextlib
import logging
import signal
import threading
import time
from collections import Counter
from collections.abc import Callable
from dataclasses import dataclass
from typing import Any

import orjson
from confluent_kafka import KafkaError, KafkaException, Message, Producer
from sqlalchemy.engine import Connection, Engine

from onceflow import failpoints
from onceflow.envelope import HEADER_JOB_ID
from onceflow.errors import ConfigurationError
from onceflow.health import serve_metrics_and_health
from onceflow.kafka_producer import idempotent_producer_config
from onceflow.logs import setup_logging
from onceflow.service_config import require_positive
from onceflow.settings import Settings
from workflow_engine.engine.metrics import (
    EVENTS_PUBLISHED,
    RELAY_ACTIVE,
    RELAY_ERRORS,
    RELAY_LAG,
)
from workflow_engine.engine.services import Service
from workflow_engine.store import (
    check_connection,
    database_ready,
    is_transient,
    make_engine,
    writes,
)
from workflow_engine.store.writes import OutboxEvent

log = logging.getLogger(__name__)

#: The CloudEvents source of a workflow's events (``ce_source``).
SOURCE_PREFIX = "/onceflow/workflows/"


@dataclass(frozen=True, slots=True)
class RelayConfig:
    """What the relay publishes where, and how often it looks."""

    bootstrap_servers: str
    topic: str
    batch: int = 2000
    #: The wait after a round that caught up (fewer than ``batch`` events) at light
    #: load: the floor of an event's delay.
    interval_seconds: float = 0.02
    #: The wait after one under load: events arriving fast enough that a round after
    #: the short interval would carry ``busy_round`` or more; each round then carries
    #: what this gathered (see :meth:`OutboxRelay.pause_after`).
    busy_interval_seconds: float = 0.1
    busy_round: int = 32
    #: How often a relay without the lock tries to take it (the take-over time).
    lock_retry_seconds: float = 1.0
    #: The backoff after a database or Kafka error.
    retry_seconds: float = 1.0
    client_id: str = "onceflow-relay"
    max_message_bytes: int | None = None

    def __post_init__(self) -> None:
        require_positive(
            self,
            "batch",
            "interval_seconds",
            "busy_interval_seconds",
            "busy_round",
            "lock_retry_seconds",
            "retry_seconds",
        )
        if self.busy_interval_seconds < self.interval_seconds:
            raise ConfigurationError(
                f"RelayConfig.busy_interval_seconds ({self.busy_interval_seconds}) must not"
                f" be shorter than interval_seconds ({self.interval_seconds})"
            )


def headers_of(event: OutboxEvent) -> list[tuple[str, str]]:
    """The record's headers: CloudEvents 1.0 binary mode (``ce_*`` attributes,
    ``content-type`` for ``datacontenttype``), the extensions ``jobid``, ``workflow``,
    ``workflowversion`` (absent when the instance has none) and ``sequence``, and
    onceflow's job-id header, as on every onceflow record."""
    job = event.job_id
    headers = [
        _SPECVERSION,
        ("ce_id", event.id),
        ("ce_source", SOURCE_PREFIX + event.workflow),
        ("ce_type", event.type),
        ("ce_subject", job),
        ("ce_time", event.time),
        _CONTENT_TYPE,
        ("ce_jobid", job),
        ("ce_workflow", event.workflow),
        ("ce_sequence", str(event.seq)),
        (HEADER_JOB_ID, job),
    ]
    if event.version is not None:
        headers.append(("ce_workflowversion", event.version))
    return headers


#: About what one round takes besides its pause (read, produce, acknowledgement,
#: delete): part of the time a round after the short interval gathers over.
_ROUND_SECONDS = 0.005

# confluent-kafka encodes str header values as UTF-8 itself (in C).
_SPECVERSION = ("ce_specversion", "1.0")
_CONTENT_TYPE = ("content-type", "application/json")


def producer_config(config: RelayConfig) -> dict[str, object]:
    """The shared idempotent configuration, and no message timeout: while Kafka is
    away the records wait in the producer (and their rows in the outbox) instead of
    failing, so they are published in order once it is back."""
    settings = idempotent_producer_config(
        config.bootstrap_servers,
        config.client_id,
        max_message_bytes=config.max_message_bytes,
        linger_ms=5,
    )
    settings["message.timeout.ms"] = 0  # infinite
    settings["delivery.report.only.error"] = True
    settings["max.in.flight.requests.per.connection"] = 5
    return settings


def without_result(data: bytes) -> bytes:
    """An event's data without its ``result`` and with ``result_too_large: true``: what
    is published when the event is over the record limit (``kafka_max_message_bytes``).
    Only a result can be that large (errors are cut at 2,000 characters); the consumer
    reads it from ``GET /v1/jobs/{id}`` instead."""
    fields = orjson.loads(data)
    fields.pop("result", None)
    fields["result_too_large"] = True
    return orjson.dumps(fields)


class _Failures:
    """The failed deliveries of one round: with ``delivery.report.only.error`` the
    producer calls back only for those (a callback per acknowledged record was a
    third of the relay's CPU), and ``flush`` says when every record is settled."""

    def __init__(self) -> None:
        self.errors: list[str] = []

    def __call__(self, err: KafkaError | None, _msg: Message) -> None:
        if err is not None:
            self.errors.append(str(err))


class OutboxRelay:
    """The relay loop, on a thread of its own (blocking psycopg2 and librdkafka calls).

    ``run`` loops until :meth:`stop`; ``active`` says whether it holds the lock now."""

    def __init__(
        self,
        db: Engine,
        config: RelayConfig,
        producer_factory: Callable[[dict[str, object]], Any] = Producer,
    ) -> None:
        self.db = db
        self.config = config
        self._producer_factory = producer_factory
        self._producer: Any = None
        self._conn: Connection | None = None
        self._stopping = threading.Event()
        self.active = False
        # When the last round read the outbox (monotonic): what a round found is
        # judged by the time it gathered over (pause_after).
        self._last_read: float | None = None

    def stop(self) -> None:
        self._stopping.set()

    def run(self) -> None:
        """Relay until stopped: take the lock, then publish round after round."""
        self._producer = self._producer_factory(producer_config(self.config))
        try:
            while not self._stopping.is_set():
                try:
                    self._relay_while_holding()
                except Exception as exc:
                    self._lost(exc)
        finally:
            self._release()
            if self._producer is not None:
                self._producer.flush(0)  # what is unacknowledged stays in the outbox

    def _relay_while_holding(self) -> None:
        if not self._hold_lock():
            self._stopping.wait(self.config.lock_retry_seconds)
            return
        read_at = time.monotonic()
        published = self._round()
        gathered = None if self._last_read is None else read_at - self._last_read
        self._last_read = read_at
        if published < self.config.batch:
            self._stopping.wait(self.pause_after(published, gathered))

    def pause_after(self, published: int, gathered_seconds: float | None = None) -> float:
        """How long to wait after a round that caught up and published ``published``
        events written over ``gathered_seconds`` (since the round before read; None:
        the first round).

        Not at once: rounds back to back carried a few dozen events each under load,
        each paying two statements, two commits and a flush, and taking the GIL from
        the engine's loop as often. Under load (the events arriving at a rate that
        would give a round after the short interval ``busy_round`` events or more)
        the long interval makes each round carry hundreds (BENCHMARKS.md, "Lifecycle
        events": 20 ms rounds of ~60 events cost the engine and PostgreSQL together
        about 0.3 ms a three-step workflow more than 100 ms rounds of ~300); below
        that rate the short one keeps the delay low, and what a round costs is small.
        The rate, not the round's count, decides: a round after the long pause
        gathers five times as much, and judged by its count the relay would stay in
        the long pause down to a fifth of the rate that put it there (found in
        review)."""
        if gathered_seconds is None or gathered_seconds <= 0:
            would_gather = float(published)
        else:
            per_second = published / gathered_seconds
            would_gather = per_second * (self.config.interval_seconds + _ROUND_SECONDS)
        if would_gather >= self.config.busy_round:
            return self.config.busy_interval_seconds
        return self.config.interval_seconds

    def _hold_lock(self) -> bool:
        if self._conn is not None:
            return True
        conn = self.db.connect()
        try:
            locked = writes.try_lock_relay(conn)
        except Exception:
            conn.close()
            raise
        if not locked:
            conn.close()
            return False
        self._conn = conn
        self.active = True
        RELAY_ACTIVE.set(1)
        log.info("relay active", extra={"event": "relay.active", "topic": self.config.topic})
        return True

    def _round(self) -> int:
        """Publish one batch and delete it once acknowledged; the number published."""
        assert self._conn is not None
        events = writes.due_events(self._conn, self.config.batch)
        if not events:
            return 0
        failures = _Failures()
        for event in events:
            self._produce(event, failures)
        # Every record settled: acknowledged, or reported failed (no timeout: Kafka
        # away means waiting here, polled so that a stop ends the wait).
        while self._producer.flush(0.1) > 0:
            if self._stopping.is_set():
                return 0  # the rows stay; the next relay publishes them
        if failures.errors:
            RELAY_ERRORS.labels("kafka").inc()
            log.error(
                "events not acknowledged; the round is published again: %s",
                failures.errors[0],
                extra={"event": "relay.kafka_error", "count": len(failures.errors)},
            )
            self._stopping.wait(self.config.retry_seconds)
            return 0
        failpoints.hit("relay.after_publish")
        oldest = writes.delete_published(self._conn, [e.position for e in events])
        for type_, count in Counter(e.type for e in events).items():
            EVENTS_PUBLISHED.labels(type_).inc(count)
        # One observation per round, its oldest event's: an observation per event cost
        # the relay a sixth of its CPU, and the round's worst delay is what an SLO needs.
        RELAY_LAG.observe(oldest)
        return len(events)

    def _produce(self, event: OutboxEvent, failures: _Failures) -> None:
        value = event.data
        while True:
            try:
                self._producer.produce(
                    self.config.topic,
                    key=event.job_id,
                    value=value,
                    headers=headers_of(event),
                    on_delivery=failures,
                )
                return
            except BufferError:
                # The producer's queue is full (Kafka slow or away): serve reports.
                self._producer.poll(0.1)
            except KafkaException as exc:
                # Over the record limit: refused here, synchronously, before any later
                # event of its job is produced, so its smaller self keeps its place.
                # Retried as it was, it failed the round, every round, for ever.
                if exc.args[0].code() != KafkaError.MSG_SIZE_TOO_LARGE or value is not event.data:
                    raise
                value = without_result(event.data)
                log.warning(
                    "event %s over the record limit: published without its result",
                    event.id,
                    extra={"event": "relay.result_too_large", "job_id": event.job_id},
                )

    def _lost(self, exc: Exception) -> None:
        """A database error: give up the lock (with the connection) and start over."""
        RELAY_ERRORS.labels("database" if is_transient(exc) else "other").inc()
        log.warning(
            "relay round failed; retrying: %s",
            exc,
            extra={"event": "relay.error"},
        )
        self._release()
        self._stopping.wait(self.config.retry_seconds)

    def _release(self) -> None:
        conn, self._conn = self._conn, None
        if self.active:
            log.info("relay inactive", extra={"event": "relay.inactive"})
        self.active = False
        RELAY_ACTIVE.set(0)
        if conn is None:
            return
        try:
            writes.unlock_relay(conn)
        except Exception:
            pass  # closing the connection releases it too
        finally:
            conn.invalidate()  # never back to the pool with a session lock
            conn.close()


class RelayThread:
    """An :class:`OutboxRelay` on its own thread, with a start and a stop."""

    def __init__(self, relay: OutboxRelay) -> None:
        self.relay = relay
        self._thread: threading.Thread | None = None

    def start(self) -> None:
        self._thread = threading.Thread(target=self.relay.run, name="outbox-relay", daemon=True)
        self._thread.start()

    def stop(self, timeout: float = 5.0) -> None:
        self.relay.stop()
        if self._thread is not None:
            self._thread.join(timeout)

    def is_alive(self) -> bool:
        return self._thread is not None and self._thread.is_alive()


class RelayService(Service):
    """The relay inside an engine process: its loop on a thread of its own."""

    def __init__(self, db: Engine, config: RelayConfig) -> None:
        super().__init__()
        self.relay = OutboxRelay(db, config)

    async def run(self) -> None:
        await asyncio.to_thread(self.relay.run)

    async def stop(self) -> None:
        self.relay.stop()
        task = self._task
        if task is not None:
            # The thread ends within one poll of its producer (0.1 s) or one statement.
            with contextlib.suppress(asyncio.CancelledError, TimeoutError):
                await asyncio.wait_for(asyncio.shield(task), 10.0)
        await super().stop()


def run_relay(settings: Settings, config: RelayConfig) -> None:
    """``onceflow relay``: the relay as its own process (with ``ONCEFLOW_EVENTS_RELAY``
    off in the engines, or beside them: the lock keeps one active). SIGTERM stops it
    within a poll; what it had not deleted stays in the outbox for the next relay.
    ``config``: ``configs.relay_config(settings)``."""
    setup_logging(settings.log_level, settings.log_format, "relay")
    db = make_engine(settings.database_url, pool_size=2)
    check_connection(db)
    serve_metrics_and_health(
        settings.relay_metrics_port, lambda: {"postgres": database_ready(settings.database_url)}
    )
    relay = OutboxRelay(db, config)
    for sig in (signal.SIGTERM, signal.SIGINT):
        signal.signal(sig, lambda *_: relay.stop())
    log.info("relay started", extra={"event": "relay.started", "topic": settings.events_topic})
    relay.run()
    log.info("relay stopped", extra={"event": "relay.stopped"})
