"""Whether ingest has a connection to Kafka right now.

Without it, every request during a broker outage waited out the ack timeout (15 s)
before its 503, though librdkafka had said within milliseconds that no broker answered.
:class:`BrokerLink` keeps that knowledge: librdkafka's ``_ALL_BROKERS_DOWN`` error marks
the link down (measured: ~40 ms after a SIGKILLed broker's connection resets); while it
is down a watcher thread asks for metadata every :data:`PROBE_INTERVAL` seconds, and
the first answer, or any record Kafka acknowledges, marks it up again. With
``reconnect.backoff.max.ms`` at 500 ms (librdkafka's default is 10 s) the link is up
well within a second of the broker's return.

The link is also down while Kafka answers but cannot confirm a write: a partition of
the jobs topic without a leader, or with fewer in-sync replicas than its
``min.insync.replicas`` (``acks=all`` is then refused, and librdkafka retries each record
until the ack timeout). Before, each request waited out those 15 s for its 503 although
``/readyz`` already said Kafka was unavailable. Now the readiness check's metadata, or
a delivery report that failed for such a reason (:data:`UNCONFIRMED_ERRORS`), marks the
link down (:attr:`Down.UNWRITABLE`), and the watcher's probe brings it back when every
partition has a leader and enough in-sync replicas again (:func:`unwritable`).

Requests refused while the link is down wrote nothing, and are told to retry after
:data:`RETRY_AFTER_SECONDS`: the link is re-checked four times a second, so by then
ingest knows whether the broker is back. A request whose records were produced before
the link went down is not cut short: its delivery reports decide its answer.
"""

from __future__ import annotations

import logging
import threading
import time
from collections.abc import Callable
from enum import StrEnum

from confluent_kafka import KafkaError
from confluent_kafka.admin import TopicMetadata

from producers.metrics import DEPENDENCY_UP

log = logging.getLogger(__name__)

PROBE_INTERVAL = 0.25
#: Reconnection backoff ceiling handed to librdkafka (its default, 10 s, would keep
#: ingest refusing for up to 10 s after the broker came back).
RECONNECT_BACKOFF_MAX_MS = 500
#: Whole seconds (HTTP's unit): the next probes tell within a second.
RETRY_AFTER_SECONDS = 1


#: Delivery errors that say the cluster cannot confirm writes now, not that the record
#: is at fault (a record too large, say, leaves the link up): librdkafka retries these
#: until the ack timeout, so the report comes 15 s later with one of them.
UNCONFIRMED_ERRORS = frozenset(
    {
        KafkaError._MSG_TIMED_OUT,
        KafkaError.NOT_ENOUGH_REPLICAS,
        KafkaError.NOT_ENOUGH_REPLICAS_AFTER_APPEND,
        KafkaError.LEADER_NOT_AVAILABLE,
        KafkaError.NOT_LEADER_FOR_PARTITION,
        KafkaError.REQUEST_TIMED_OUT,
    }
)


class Down(StrEnum):
    """Why the link is down: the ``error`` code of the 503 that refuses at once (a
    request Kafka was asked about and did not confirm gets ``kafka_unavailable``)."""

    UNREACHABLE = "kafka_unreachable"  # no broker answers
    UNWRITABLE = "kafka_not_writable"  # brokers answer, but acks=all cannot be met

    @property
    def text(self) -> str:
        if self is Down.UNREACHABLE:
            return "no connection to Kafka"
        return "Kafka cannot confirm writes"


class KafkaUnreachable(Exception):
    """Kafka is known to be unable to take a write (no broker connection, or it cannot
    confirm one): the request was refused before anything was produced."""

    def __init__(self, down_for: float, reason: str, why: Down = Down.UNREACHABLE) -> None:
        super().__init__(f"{why.text} for {down_for:.1f}s: {reason}")
        self.down_for = down_for
        self.reason = reason
        self.why = why
        self.retry_after = RETRY_AFTER_SECONDS


def unwritable(topic: TopicMetadata | None, min_insync: int) -> str | None:
    """Why ``acks=all`` cannot be met on some partition of ``topic`` (its metadata), or
    None: every partition has a leader and at least ``min_insync`` in-sync replicas.
    A minimum above a partition's replication factor counts as the factor, as the
    broker applies it (Kafka 4, KIP-966: measured, a single broker acknowledges a
    topic with one replica and ``min.insync.replicas=2``)."""
    if topic is None:
        return "the jobs topic is not in the metadata"
    if topic.error is not None:
        return f"the jobs topic: {topic.error.str()}"
    for partition in sorted(topic.partitions.values(), key=lambda p: p.id):
        if partition.leader < 0:
            return f"partition {partition.id} has no leader"
        needed = min(min_insync, len(partition.replicas) or min_insync)
        if len(partition.isrs) < needed:
            return (
                f"partition {partition.id} has {len(partition.isrs)} in-sync replica(s),"
                f" min.insync.replicas is {min_insync}"
            )
    return None


class BrokerLink:
    """The producer's connection state, fed by librdkafka's error callback, delivery
    reports and the watcher's probes. Reads are one attribute load (the hot path)."""

    def __init__(self) -> None:
        self._down_since: float | None = None
        self._reason = ""
        self._why = Down.UNREACHABLE
        self._lock = threading.Lock()
        self._wake = threading.Event()
        self._stopped = threading.Event()
        DEPENDENCY_UP.labels("kafka").set(1)

    @property
    def up(self) -> bool:
        return self._down_since is None

    def check(self) -> None:
        """Raise :class:`KafkaUnreachable` while the link is down."""
        since = self._down_since
        if since is not None:
            raise KafkaUnreachable(time.monotonic() - since, self._reason, self._why)

    def on_error(self, err: KafkaError) -> None:
        """librdkafka's ``error_cb``: only "all brokers down" says nothing can be written
        (one broker's ``_TRANSPORT`` error in a cluster does not)."""
        if err.code() == KafkaError._ALL_BROKERS_DOWN:
            self.mark_down(err.str())

    def on_delivered(self) -> None:
        if self._down_since is not None:
            self.mark_up()

    def on_failed(self, err: KafkaError) -> None:
        """A delivery report that failed, none of its dispatch delivered: down if the
        error is the cluster's (:data:`UNCONFIRMED_ERRORS`), not the record's."""
        if err.code() in UNCONFIRMED_ERRORS:
            self.mark_down(f"a write was not confirmed: {err.str()}", Down.UNWRITABLE)

    def mark_down(self, reason: str, why: Down = Down.UNREACHABLE) -> None:
        with self._lock:
            if self._down_since is not None:
                # already down: "no connection" says more than "not confirmed"
                if why is Down.UNREACHABLE or self._why is Down.UNWRITABLE:
                    self._reason, self._why = reason, why
                return
            self._reason, self._why = reason, why
            self._down_since = time.monotonic()
        DEPENDENCY_UP.labels("kafka").set(0)
        log.warning(
            "%s: refusing submissions at once until it is back (%s)",
            why.text,
            reason,
            extra={"event": "ingest.kafka_down", "reason": str(why)},
        )
        self._wake.set()

    def mark_up(self) -> None:
        with self._lock:
            since, self._down_since = self._down_since, None
        if since is None:
            return
        DEPENDENCY_UP.labels("kafka").set(1)
        log.info(
            "Kafka reachable again after %.1fs",
            time.monotonic() - since,
            extra={"event": "ingest.kafka_up"},
        )

    def watch(self, probe: Callable[[float], bool]) -> threading.Thread:
        """Start the thread that probes (``probe(timeout)``: can Kafka take a write
        now?) while the link is down."""
        thread = threading.Thread(target=self._watch, args=(probe,), name="kafka-link")
        thread.daemon = True
        thread.start()
        return thread

    def _watch(self, probe: Callable[[float], bool]) -> None:
        while not self._stopped.is_set():
            self._wake.wait(1.0)
            self._wake.clear()
            while self._down_since is not None and not self._stopped.is_set():
                started = time.monotonic()
                try:
                    answered = probe(PROBE_INTERVAL)
                except Exception:
                    answered = False
                if answered:
                    self.mark_up()
                else:
                    self._stopped.wait(max(0.0, PROBE_INTERVAL - (time.monotonic() - started)))

    def stop(self) -> None:
        self._stopped.set()
        self._wake.set()
