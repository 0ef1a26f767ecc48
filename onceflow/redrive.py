"""Reading the dead-letter topic, and sending dead letters back to the jobs topic.

A dead letter is the original record (key, value, headers) plus the ``onceflow-dlq-*``
headers of :mod:`onceflow.envelope` saying why. Once the cause is fixed (the workflow
module is deployed, the database accepts the row again), ``redrive`` produces each
original back to the jobs topic as the original producer would have: same key, same
value, the original headers, ``acks=all``, idempotent, murmur2 partitioning (so the
job id lands on its usual partition; :mod:`onceflow.kafka_producer`). A re-driven
record of a job id that already has an instance collapses like any duplicate delivery
(the unique constraint of ``onceflow_jobs``): redriving twice never makes two instances.

A truncated letter (``onceflow-dlq-truncated: true``) holds only a prefix of the
original: it is refused, never produced.

This module only produces. What a re-drive *does* depends on the job id's state in the
database (a dead-lettered task run must be reopened first, or its record only collapses
as a duplicate and nothing runs): the CLI and the console re-drive through
``workflow_engine.store.operations.redrives``, which plans each letter, reopens what must run again
and reports what happened to each.

Core level: confluent-kafka and the settings only.
"""

from __future__ import annotations

import uuid
from collections.abc import Callable, Sequence
from dataclasses import dataclass, field

from confluent_kafka import Consumer, KafkaError, KafkaException, Message, Producer, TopicPartition

from onceflow.envelope import (
    HEADER_DLQ_DETAIL,
    HEADER_DLQ_REASON,
    HEADER_DLQ_SOURCE,
    HEADER_DLQ_TRUNCATED,
)
from onceflow.errors import OnceflowError, ServiceUnavailable
from onceflow.kafka_producer import idempotent_producer_config
from onceflow.settings import Settings

DLQ_HEADER_PREFIX = "onceflow-dlq-"
_POLL_SECONDS = 1.0


@dataclass(frozen=True, slots=True)
class DeadLetterRecord:
    """One record of the dead-letter topic."""

    dlq_partition: int
    dlq_offset: int
    key: bytes | None
    value: bytes | None
    headers: list[tuple[str, bytes]]  # all of them: the original's and ours
    reason: str  # a DeadLetterReason code ("" if the header is missing)
    detail: str
    source: str  # topic/partition@offset of the original
    truncated: bool
    timestamp_ms: int

    @property
    def position(self) -> str:
        return f"{self.dlq_partition}@{self.dlq_offset}"

    @property
    def original_headers(self) -> list[tuple[str, bytes]]:
        """The original record's headers (ours, ``onceflow-dlq-*``, left out)."""
        return [(k, v) for k, v in self.headers if not k.startswith(DLQ_HEADER_PREFIX)]


@dataclass(frozen=True, slots=True)
class Redriven:
    """A letter produced back to the jobs topic, and where it landed."""

    dlq_partition: int
    dlq_offset: int
    partition: int
    offset: int


@dataclass(frozen=True, slots=True)
class NotRedriven:
    """A letter refused (truncated) or whose produce failed, and why."""

    dlq_partition: int
    dlq_offset: int
    why: str


@dataclass(frozen=True, slots=True)
class RedriveResult:
    redriven: list[Redriven] = field(default_factory=list)
    refused: list[NotRedriven] = field(default_factory=list)  # truncated letters
    failed: list[NotRedriven] = field(default_factory=list)  # Kafka did not acknowledge

    @property
    def produced(self) -> int:
        return len(self.redriven)

    @property
    def refused_count(self) -> int:
        return len(self.refused)


def parse_position(text: str) -> tuple[int, int]:
    """``"P@O"`` (partition@offset in the dead-letter topic) as ``(P, O)``."""
    partition, sep, offset = text.partition("@")
    try:
        if not sep:
            raise ValueError
        p, o = int(partition), int(offset)
        if p < 0 or o < 0:
            raise ValueError
        return p, o
    except ValueError:
        raise OnceflowError(
            f"dead-letter position {text!r} is not PARTITION@OFFSET (e.g. 0@42)"
        ) from None


def _text(raw: bytes | str | None) -> str:
    if raw is None:
        return ""
    return raw.decode(errors="replace") if isinstance(raw, bytes) else str(raw)


def _record(msg: Message) -> DeadLetterRecord:
    headers: list[tuple[str, bytes]] = []
    for name, raw in list(msg.headers() or []):
        headers.append((str(name), raw if isinstance(raw, bytes) else str(raw or "").encode()))
    ours = {k: _text(v) for k, v in headers if k.startswith(DLQ_HEADER_PREFIX)}
    timestamp = int(msg.timestamp()[1])
    return DeadLetterRecord(
        dlq_partition=msg.partition() or 0,
        dlq_offset=msg.offset() or 0,
        key=msg.key(),
        value=msg.value(),
        headers=headers,
        reason=ours.get(HEADER_DLQ_REASON, ""),
        detail=ours.get(HEADER_DLQ_DETAIL, ""),
        source=ours.get(HEADER_DLQ_SOURCE, ""),
        truncated=ours.get(HEADER_DLQ_TRUNCATED, "").lower() == "true",
        timestamp_ms=timestamp,
    )


def read_dead_letters(
    settings: Settings,
    limit: int = 100,
    reason: str | None = None,
    after: tuple[int, int] | None = None,
    timeout: float = 10.0,
) -> list[DeadLetterRecord]:
    """Up to ``limit`` dead letters (of ``reason``, if given), oldest first: partition by
    partition, in offset order, starting after position ``after`` (``(partition,
    offset)``, the last one of a previous call). Reads up to the end of each partition
    as it was when the call began, so it always returns."""
    if limit < 1:
        return []
    topic = settings.dlq_topic
    consumer = Consumer(
        {
            "bootstrap.servers": settings.kafka_bootstrap_servers,
            # Assigned partitions, never committed: the group id is only librdkafka's.
            "group.id": f"onceflow-dlq-reader-{uuid.uuid4().hex[:12]}",
            "enable.auto.commit": False,
            "enable.partition.eof": False,
            "client.id": "onceflow-dlq-reader",
            "fetch.max.bytes": max(settings.kafka_max_message_bytes, 52428800),
            "max.partition.fetch.bytes": settings.kafka_max_message_bytes,
        }
    )
    found: list[DeadLetterRecord] = []
    try:
        meta = consumer.list_topics(topic, timeout=timeout).topics.get(topic)
        if meta is None or meta.error is not None:
            raise ServiceUnavailable(f"dead-letter topic {topic!r} not found")
        for partition in sorted(meta.partitions):
            if after is not None and partition < after[0]:
                continue
            low, high = consumer.get_watermark_offsets(
                TopicPartition(topic, partition), timeout=timeout
            )
            start = low
            if after is not None and partition == after[0]:
                start = max(low, after[1] + 1)
            if start >= high:
                continue
            found += _read_partition(
                consumer, topic, partition, start, high, limit - len(found), reason, timeout
            )
            if len(found) >= limit:
                break
    except KafkaException as exc:
        raise ServiceUnavailable(
            f"Kafka unreachable at {settings.kafka_bootstrap_servers}: {exc}"
        ) from None
    finally:
        consumer.close()
    return found


def _read_partition(
    consumer: Consumer,
    topic: str,
    partition: int,
    start: int,
    high: int,
    want: int,
    reason: str | None,
    timeout: float,
) -> list[DeadLetterRecord]:
    consumer.assign([TopicPartition(topic, partition, start)])
    found: list[DeadLetterRecord] = []
    position = start
    idle = 0.0
    while position < high and len(found) < want:
        msg = consumer.poll(_POLL_SECONDS)
        if msg is None:
            idle += _POLL_SECONDS
            if idle >= timeout:
                raise ServiceUnavailable(
                    f"no record from {topic}/{partition} at offset {position} within {timeout}s"
                )
            continue
        idle = 0.0
        if msg.error() is not None:
            raise KafkaException(msg.error())
        offset = msg.offset() or 0
        if offset >= high:
            break
        position = offset + 1
        letter = _record(msg)
        if reason is None or letter.reason == reason:
            found.append(letter)
    consumer.unassign()
    return found


def redrive(
    settings: Settings, records: Sequence[DeadLetterRecord], timeout: float = 30.0
) -> RedriveResult:
    """Produce each letter's original back to the jobs topic and wait for every
    acknowledgement (at most ``timeout`` seconds); truncated letters are refused."""
    result = RedriveResult()
    todo = _refuse_truncated(records, result)
    if not todo:
        return result
    producer = Producer(
        idempotent_producer_config(
            settings.kafka_bootstrap_servers,
            "onceflow-redrive",
            max_message_bytes=settings.kafka_max_message_bytes,
        )
    )
    reports = _produce_all(producer, settings.jobs_topic, todo, timeout)
    _settle(todo, reports, timeout, result)
    return result


_Report = tuple[KafkaError | None, Message | None]


def _refuse_truncated(
    records: Sequence[DeadLetterRecord], result: RedriveResult
) -> list[DeadLetterRecord]:
    """The letters that can be produced; the truncated ones go to ``result.refused``."""
    todo = []
    for letter in records:
        if letter.truncated:
            result.refused.append(
                NotRedriven(
                    letter.dlq_partition,
                    letter.dlq_offset,
                    "truncated: the letter holds only a prefix of the original",
                )
            )
        else:
            todo.append(letter)
    return todo


def _produce_all(
    producer: Producer, topic: str, todo: list[DeadLetterRecord], timeout: float
) -> dict[int, _Report]:
    """Produce every letter's original to ``topic`` and flush (at most ``timeout``
    seconds): the delivery report of each, by its index in ``todo``, as far as they came."""
    reports: dict[int, _Report] = {}

    def reporter(index: int) -> Callable[[KafkaError | None, Message], None]:
        def on_delivery(err: KafkaError | None, msg: Message) -> None:
            reports[index] = (err, msg)

        return on_delivery

    try:
        for index, letter in enumerate(todo):
            while True:
                try:
                    producer.produce(
                        topic,
                        key=letter.key,
                        value=letter.value,
                        headers=list[tuple[str, str | bytes | None]](letter.original_headers),
                        on_delivery=reporter(index),
                    )
                    break
                except BufferError:  # the local queue is full: let it drain
                    producer.poll(0.5)
        producer.flush(timeout)
    except KafkaException as exc:
        raise ServiceUnavailable(f"cannot produce to {topic}: {exc}") from None
    return reports


def _settle(
    todo: list[DeadLetterRecord], reports: dict[int, _Report], timeout: float, result: RedriveResult
) -> None:
    """Each letter of ``todo`` into ``result``: redriven where Kafka acknowledged it,
    failed (and why) where it did not."""
    for index, letter in enumerate(todo):
        err, msg = reports.get(index, (None, None))
        if msg is not None and err is None:
            result.redriven.append(
                Redriven(
                    letter.dlq_partition,
                    letter.dlq_offset,
                    msg.partition() or 0,
                    msg.offset() or 0,
                )
            )
        else:
            why = str(err) if err is not None else f"not acknowledged within {timeout}s"
            result.failed.append(NotRedriven(letter.dlq_partition, letter.dlq_offset, why))
