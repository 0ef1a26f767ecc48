"""Consumer lag: the broker's end offsets minus the group's committed offsets.

Computed from the broker, not from a consumer's own position, so it is right across
rebalances and restarts and can be read by any process (ingest, the audit, metrics).
"""

from __future__ import annotations

from dataclasses import dataclass

from confluent_kafka import Consumer, KafkaException, TopicPartition

from onceflow.errors import ServiceUnavailable


@dataclass(frozen=True, slots=True)
class PartitionLag:
    partition: int
    committed: int | None  # None: the group has committed nothing on this partition
    low: int
    end: int

    @property
    def lag(self) -> int:
        start = self.committed if self.committed is not None else self.low
        return max(0, self.end - start)


def consumer_lag(
    bootstrap: str, group: str, topic: str, timeout: float = 10.0
) -> list[PartitionLag]:
    consumer = Consumer(
        {
            "bootstrap.servers": bootstrap,
            "group.id": group,
            "enable.auto.commit": False,
            "client.id": "onceflow-lag",
        }
    )
    try:
        md = consumer.list_topics(topic, timeout=timeout)
        meta = md.topics.get(topic)
        if meta is None or meta.error is not None:
            raise ServiceUnavailable(f"topic {topic!r} not found on {bootstrap}")
        tps = [TopicPartition(topic, p) for p in sorted(meta.partitions)]
        committed = consumer.committed(tps, timeout=timeout)
        result = []
        for tp in committed:
            low, high = consumer.get_watermark_offsets(tp, timeout=timeout)
            result.append(
                PartitionLag(tp.partition, tp.offset if tp.offset >= 0 else None, low, high)
            )
        return result
    except KafkaException as exc:
        raise ServiceUnavailable(f"Kafka unreachable at {bootstrap}: {exc}") from None
    finally:
        consumer.close()
