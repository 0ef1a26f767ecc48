from __future__ import annotations

import time
import uuid

from confluent_kafka import Consumer, Message, Producer

from onceflow.envelope import JobEnvelope


def produce(bootstrap: str, topic: str, records: list[tuple[bytes | None, bytes | None, list]]):
    producer = Producer(
        {
            "bootstrap.servers": bootstrap,
            "partitioner": "murmur2_random",
            "enable.idempotence": True,
            "acks": "all",
        }
    )
    for key, value, headers in records:
        producer.produce(topic, key=key, value=value, headers=headers)
    assert producer.flush(30) == 0


def produce_envelopes(bootstrap: str, topic: str, envelopes: list[JobEnvelope]) -> None:
    produce(bootstrap, topic, [(e.key(), e.encode(), e.headers()) for e in envelopes])


def consume_all(bootstrap: str, topic: str, expected: int, timeout: float = 30.0) -> list[Message]:
    consumer = Consumer(
        {
            "bootstrap.servers": bootstrap,
            "group.id": f"t-{uuid.uuid4().hex}",
            "auto.offset.reset": "earliest",
            "enable.auto.commit": False,
        }
    )
    consumer.subscribe([topic])
    got: list[Message] = []
    deadline = time.monotonic() + timeout
    try:
        while len(got) < expected and time.monotonic() < deadline:
            msg = consumer.poll(0.5)
            if msg is not None and msg.error() is None:
                got.append(msg)
        return got
    finally:
        consumer.close()


def committed_offsets(bootstrap: str, group: str, topic: str, partitions: int) -> dict[int, int]:
    from confluent_kafka import TopicPartition

    consumer = Consumer(
        {"bootstrap.servers": bootstrap, "group.id": group, "enable.auto.commit": False}
    )
    try:
        tps = consumer.committed([TopicPartition(topic, p) for p in range(partitions)], timeout=10)
        return {tp.partition: tp.offset for tp in tps}
    finally:
        consumer.close()


def murmur2_partition(key: bytes, partitions: int) -> int:
    """Kafka's Java default partitioner (murmur2, positive, modulo partitions)."""
    seed, m, r = 0x9747B28C, 0x5BD1E995, 24
    length = len(key)
    h = (seed ^ length) & 0xFFFFFFFF
    for i in range(length // 4):
        k = int.from_bytes(key[i * 4 : i * 4 + 4], "little")
        k = (k * m) & 0xFFFFFFFF
        k ^= k >> r
        k = (k * m) & 0xFFFFFFFF
        h = (h * m) & 0xFFFFFFFF
        h ^= k
    rest = length % 4
    tail = key[length - rest :]
    if rest == 3:
        h ^= tail[2] << 16
    if rest >= 2:
        h ^= tail[1] << 8
    if rest >= 1:
        h ^= tail[0]
        h = (h * m) & 0xFFFFFFFF
    h ^= h >> 13
    h = (h * m) & 0xFFFFFFFF
    h ^= h >> 15
    return (h & 0x7FFFFFFF) % partitions
