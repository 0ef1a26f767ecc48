"""Reading one job's lifecycle events back from the events topic (issue 25).

The relay deletes what Kafka acknowledged, so once published an instance's events live
only on the topic. A job's events all land on one partition (keyed by job id, murmur2:
``onceflow.partitioning``), so reading them back means that one partition, from the
offset of the instance's creation time (``offsets_for_times``, a little earlier for
clock skew) to the partition's end as it was when the read began. The read is bounded in
events and in time, and says when it stopped early; it never waits for more events.

Used by the console's instance page and ``onceflow events tail --job``.
"""

from __future__ import annotations

import time
import uuid
from dataclasses import dataclass, field
from datetime import datetime, timedelta
from typing import Any

import orjson
from confluent_kafka import OFFSET_END, Consumer, KafkaException, TopicPartition

from onceflow.errors import OnceflowError, ServiceUnavailable
from onceflow.partitioning import partition_for
from onceflow.vocabulary import EVENT_TYPE_PREFIX

#: How far before the instance's creation time the read starts (clock skew between the
#: database that stamped ``created_at`` and the broker that stamped the records).
SKEW = timedelta(seconds=30)


@dataclass(frozen=True, slots=True)
class ReadEvent:
    """One event as read back: its CloudEvents type (without the prefix), its data,
    and where it is on the topic."""

    kind: str
    data: dict[str, Any]
    partition: int
    offset: int

    @property
    def sequence(self) -> int | None:
        return self.data.get("sequence")


@dataclass(slots=True)
class JobEvents:
    """What a bounded read found: ``truncated`` when it stopped at its limit or its time
    before the partition's end (later events may exist)."""

    events: list[ReadEvent] = field(default_factory=list)
    truncated: bool = False


def event_partitions(consumer: Consumer, topic: str, job_id: str | None) -> list[int]:
    """The topic's partitions, or the one ``job_id`` lands on; one clear error if Kafka
    or the topic is not there."""
    try:
        metadata = consumer.list_topics(topic, timeout=10)
    except KafkaException as exc:
        raise ServiceUnavailable(f"Kafka unreachable: {exc.args[0]}") from None
    found = metadata.topics.get(topic)
    if found is None or found.error is not None or not found.partitions:
        raise OnceflowError(
            f"no events topic {topic!r}"
            " (run `onceflow topics create`, or set ONCEFLOW_EVENTS_TOPIC)"
        )
    count = len(found.partitions)
    return [partition_for(job_id, count)] if job_id else sorted(found.partitions)


def decode(msg: Any) -> ReadEvent:
    """A record of the events topic as a :class:`ReadEvent` (binary-mode CloudEvent:
    the type in the ``ce_type`` header, the data in the value)."""
    kind = b""
    for name, value in msg.headers() or []:
        if name == "ce_type" and isinstance(value, bytes):
            kind = value
    return ReadEvent(
        kind.decode().removeprefix(EVENT_TYPE_PREFIX),
        orjson.loads(msg.value()),
        msg.partition(),
        msg.offset(),
    )


def read_job_events(
    bootstrap_servers: str,
    topic: str,
    job_id: str,
    since: datetime,
    limit: int = 500,
    timeout: float = 3.0,
) -> JobEvents:
    """``job_id``'s events published since ``since`` (less :data:`SKEW`), oldest first,
    at most ``limit`` of them, reading at most ``timeout`` seconds."""
    consumer = Consumer(
        {
            "bootstrap.servers": bootstrap_servers,
            "group.id": f"onceflow-event-reader-{uuid.uuid4().hex[:8]}",
            "enable.auto.commit": False,
            "socket.connection.setup.timeout.ms": max(1000, int(timeout * 1000)),
        }
    )
    try:
        return _read(consumer, topic, job_id, since, limit, time.monotonic() + timeout)
    finally:
        consumer.close()


def _read(
    consumer: Consumer, topic: str, job_id: str, since: datetime, limit: int, deadline: float
) -> JobEvents:
    (partition,) = event_partitions(consumer, topic, job_id)
    wait = max(0.1, deadline - time.monotonic())
    try:
        _, end = consumer.get_watermark_offsets(TopicPartition(topic, partition), timeout=wait)
        start_ms = int((since - SKEW).timestamp() * 1000)
        (found,) = consumer.offsets_for_times(
            [TopicPartition(topic, partition, start_ms)], timeout=wait
        )
    except KafkaException as exc:
        raise ServiceUnavailable(f"reading {topic}: {exc.args[0]}") from None
    result = JobEvents()
    if found.offset == OFFSET_END or found.offset < 0 or found.offset >= end:
        return result  # nothing on the partition since then
    consumer.assign([TopicPartition(topic, partition, found.offset)])
    key = job_id.encode()
    position = found.offset
    while position < end:
        if len(result.events) >= limit or time.monotonic() >= deadline:
            result.truncated = True
            break
        msg = consumer.poll(min(0.5, max(0.05, deadline - time.monotonic())))
        if msg is None:
            continue
        if msg.error() is not None:
            raise ServiceUnavailable(f"reading {topic}: {msg.error()}")
        position = (msg.offset() or 0) + 1
        if msg.key() == key:
            result.events.append(decode(msg))
    return result
