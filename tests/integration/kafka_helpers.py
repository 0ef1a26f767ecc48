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
