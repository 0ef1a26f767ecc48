"""The events topic as ingest's start-and-wait sees it: one Kafka consumer per ingest
process, on every partition of ``events_topic``, handing the final lifecycle events of
the job ids someone waits for to :class:`producers.waiters.Waiters`.

Every ingest process reads the whole topic: a job's events land on the partition of its
id, and the caller waiting for it is on whichever process the load balancer picked, so
a consumer group (which splits partitions between processes) would not do. The
consumer is ``assign()``-ed, never ``subscribe()``-d: no group membership, no
rebalances, no committed offsets. librdkafka still insists on a ``group.id``; a unique
one per process is given and never used (auto commit off, nothing stored).

Where reading starts matters for the waiters' guarantee. Each partition is assigned at
its high watermark, read from the broker *before* the watcher reports itself ready:
every record written after that read has a higher offset and will be consumed. So a
waiter registered while the watcher is ready sees every event published after its
registration (producers/waiters.py explains why that is all it needs). Partitions
added later are assigned from their beginning. Partitions lost (the topic missing, a
metadata request unanswered) are assigned again at their high watermark: what was
published while they were not assigned is skipped, so the waiters registered then are
told (``on_gap``) to read their jobs' status again, after the new watermarks were read.

The filter runs in the consumer's thread and is cheap for the events nobody waits for:
the record key (the job id) is looked up first, and only a record whose id has a waiter
has its ``ce_type`` header read and, for a final kind, its JSON value parsed. The events
that say the worker wrote a record down (``instance.created``, ``instance.duplicate``,
``instance.payload_mismatch``) are handed over too, without their data (the waiter reads
the status), for the ids in ``records``: a waiter whose submission may start a new run
waits for its record to be written down (producers/waiters.py).
"""

from __future__ import annotations

import asyncio
import logging
import os
import socket
import threading
import time
import uuid
from collections.abc import Callable, Container
from typing import Any

import orjson
from confluent_kafka import Consumer, KafkaError, KafkaException, Message, TopicPartition

from onceflow import failpoints
from onceflow.settings import Settings
from onceflow.vocabulary import FINAL_EVENTS, RECORDED_EVENTS
from producers.metrics import DEPENDENCY_UP, EVENTS_CONSUMED

log = logging.getLogger(__name__)

#: The contract's final kinds (``ce_type``): a start-and-wait caller's answer.
FINAL_TYPES = frozenset(kind.ce_type.encode() for kind in FINAL_EVENTS)
#: The kinds that say the worker wrote a job's record down (a run started, or the
#: record collapsed as a duplicate).
RECORDED_TYPES = frozenset(kind.ce_type.encode() for kind in RECORDED_EVENTS)
#: A consumer that has not come back from a poll for this long is stuck: not ready.
STALE_SECONDS = 5.0
#: How often the partitions are looked up again (a topic grown, or one that was missing).
REFRESH_SECONDS = 10.0
_POLL_SECONDS = 0.2
#: A metadata or offsets request's longest wait (a broker down blocks the thread, and
#: the process's stop, that long).
_METADATA_SECONDS = 2.0
_BATCH = 500
_LOST = frozenset(
    {KafkaError.UNKNOWN_TOPIC_OR_PART, KafkaError._UNKNOWN_TOPIC, KafkaError._UNKNOWN_PARTITION}
)

#: What the watcher hands over, on the event loop: (job id, the event's data or None
#: when its value is not the contract's JSON object).
Finals = list[tuple[str, dict[str, Any] | None]]


class EventsWatcher:
    """The consumer thread. ``wanted`` says which job ids have a waiter (read from the
    thread: a dict's membership test); ``on_final`` is called on ``loop`` with the final
    events of those ids, one call per consumed batch, and with the record-written events
    (data None) of the ids in ``records``; ``on_gap`` once the partitions
    are assigned again after they were lost (what was published meanwhile below the
    new start is never read: the waiters registered before must read the status)."""

    def __init__(
        self,
        settings: Settings,
        wanted: Container[str],
        on_final: Callable[[Finals], None],
        loop: asyncio.AbstractEventLoop,
        on_gap: Callable[[], None] = lambda: None,
        records: Container[str] = frozenset(),
    ) -> None:
        self.topic = settings.events_topic
        self._wanted = wanted
        self._records = records
        self._on_final = on_final
        self._on_gap = on_gap
        self._loop = loop
        self._config = {
            "bootstrap.servers": settings.kafka_bootstrap_servers,
            "group.id": f"onceflow-ingest-wait-{socket.gethostname()}-{os.getpid()}"
            f"-{uuid.uuid4().hex[:8]}",
            "client.id": "onceflow-ingest-wait",
            "enable.auto.commit": False,
            "enable.auto.offset.store": False,
            "allow.auto.create.topics": False,
            # a bounded prefetch: this consumer keeps up or the waits time out, either way
            # it needs no more than a few MB queued
            "queued.max.messages.kbytes": 16384,
            "reconnect.backoff.max.ms": 500,
            "error_cb": self._on_error,
        }
        self._partitions: set[int] = set()
        self._assigned_before = False
        self._polled_at = 0.0
        self._brokers_down = False
        self._stop = threading.Event()
        self._thread: threading.Thread | None = None

    @property
    def ready(self) -> bool:
        """Every partition assigned (at an offset read from the broker), the broker
        reachable and the thread polling: a waiter registered now cannot miss its event."""
        return (
            bool(self._partitions)
            and not self._brokers_down
            and time.monotonic() - self._polled_at < STALE_SECONDS
        )

    def start(self) -> None:
        self._thread = threading.Thread(target=self._run, name="ingest-events", daemon=True)
        self._thread.start()

    def stop(self, timeout: float = 0.5) -> None:
        """Stop the thread; one blocked on a broker that does not answer finishes its
        request (at most ``_METADATA_SECONDS``) and closes the consumer by itself."""
        self._stop.set()
        if self._thread is not None:
            self._thread.join(timeout)

    def _on_error(self, error: KafkaError) -> None:
        if error.code() == KafkaError._ALL_BROKERS_DOWN:
            self._brokers_down = True
            self._gauge()

    def _gauge(self) -> None:
        DEPENDENCY_UP.labels("events").set(1 if self.ready else 0)

    def _run(self) -> None:
        consumer = Consumer(self._config)
        refreshed = 0.0
        try:
            while not self._stop.is_set():
                if time.monotonic() - refreshed > (REFRESH_SECONDS if self.ready else 1.0):
                    refreshed = time.monotonic()
                    self._refresh(consumer)
                    self._gauge()
                self._consume(consumer)
        except Exception:
            log.exception("events consumer failed", extra={"event": "ingest.events_failed"})
        finally:
            self._partitions = set()
            self._gauge()
            consumer.close()

    def _refresh(self, consumer: Consumer) -> None:
        """Assign the partitions not assigned yet: at their high watermark at start, at
        their beginning when they appeared later. A missing topic leaves the watcher
        unready (it is looked up again within a second)."""
        try:
            topic = consumer.list_topics(self.topic, timeout=_METADATA_SECONDS).topics[self.topic]
            if topic.error is not None:
                raise KafkaException(topic.error)
            new = sorted(set(topic.partitions) - self._partitions)
            first = not self._partitions
            if first and new and self._assigned_before:
                failpoints.hit("ingest.events_before_reassign")
            starts = [self._start_offset(consumer, p, first) for p in new]
        except KafkaException as exc:
            if self._partitions or not self._brokers_down:
                log.warning(
                    "events topic %s not watchable: %s",
                    self.topic,
                    exc,
                    extra={"event": "ingest.events_unwatched", "topic": self.topic},
                )
            self._partitions = set()
            consumer.unassign()
            return
        self._brokers_down = False
        if new:
            consumer.incremental_assign(starts)
            if first and self._assigned_before:
                # After the watermarks were read: a final change whose event is below
                # them committed before, so the waiters' status reads will see it.
                self._loop.call_soon_threadsafe(self._on_gap)
            self._partitions |= set(new)
            self._assigned_before = True
            log.info(
                "watching %d partitions of %s",
                len(self._partitions),
                self.topic,
                extra={"event": "ingest.events_watched", "topic": self.topic},
            )

    def _start_offset(self, consumer: Consumer, partition: int, first: bool) -> TopicPartition:
        if not first:
            # A partition added after the watcher started: everything in it is new.
            return TopicPartition(self.topic, partition, 0)
        _, high = consumer.get_watermark_offsets(
            TopicPartition(self.topic, partition), timeout=_METADATA_SECONDS, cached=False
        )
        return TopicPartition(self.topic, partition, high)

    def _consume(self, consumer: Consumer) -> None:
        if not self._partitions:
            self._stop.wait(_POLL_SECONDS)
            self._polled_at = time.monotonic()
            return
        messages = consumer.consume(_BATCH, _POLL_SECONDS)
        self._polled_at = time.monotonic()
        if messages:
            EVENTS_CONSUMED.inc(len(messages))
        finals: Finals = []
        for message in messages:
            error = message.error()
            if error is not None:
                if error.code() in _LOST:  # the topic was deleted: look it up again
                    self._partitions = set()
                    consumer.unassign()
                    return
                continue
            self._brokers_down = False
            found = self._final_of(message)
            if found is not None:
                finals.append(found)
        if finals:
            self._loop.call_soon_threadsafe(self._on_final, finals)

    def _final_of(self, message: Message) -> tuple[str, dict[str, Any] | None] | None:
        key = message.key()
        if key is None:
            return None
        job_id = key.decode("utf-8", "replace")
        if job_id not in self._wanted:
            return None
        kind = _ce_type(message)
        if kind not in FINAL_TYPES:
            if kind in RECORDED_TYPES and job_id in self._records:
                return job_id, None  # read the status: is the record written down?
            return None
        try:
            data = orjson.loads(message.value() or b"")
        except orjson.JSONDecodeError:
            data = None
        return job_id, data if isinstance(data, dict) else None


def _ce_type(message: Message) -> bytes | None:
    for header in message.headers() or ():
        if header[0] == "ce_type":
            value = header[1]
            return value if isinstance(value, bytes) else None
    return None
