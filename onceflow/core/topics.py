"""Creating the topics (once, before the processes start)."""

from __future__ import annotations

from confluent_kafka import KafkaException
from confluent_kafka.admin import AdminClient, NewTopic

from onceflow.core.errors import ServiceUnavailable
from onceflow.core.settings import Settings


def ensure_topics(settings: Settings, timeout: float = 30.0) -> list[str]:
    """Create the jobs and dead-letter topics if missing; return the names created."""
    admin = AdminClient({"bootstrap.servers": settings.kafka_bootstrap_servers})
    try:
        existing = set(admin.list_topics(timeout=timeout).topics)
    except KafkaException as exc:
        raise ServiceUnavailable(
            f"Kafka unreachable at {settings.kafka_bootstrap_servers}: {exc}"
        ) from None
    wanted = [
        NewTopic(settings.jobs_topic, settings.topic_partitions, settings.topic_replication_factor),
        NewTopic(settings.dlq_topic, settings.topic_partitions, settings.topic_replication_factor),
    ]
    missing = [t for t in wanted if t.topic not in existing]
    if not missing:
        return []
    created = []
    for name, future in admin.create_topics(missing, operation_timeout=timeout).items():
        try:
            future.result()
            created.append(name)
        except KafkaException as exc:
            if "TOPIC_ALREADY_EXISTS" not in str(exc):
                raise
    return created
