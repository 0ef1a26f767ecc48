"""Creating the topics (once, before the processes start).

Both topics get ``max.message.bytes = ONCEFLOW_KAFKA_MAX_MESSAGE_BYTES``, the same
figure as the dead-letter producer's ``message.max.bytes`` and the broker's own
``message.max.bytes``, so whatever the jobs topic took, the dead-letter topic takes a
copy of (or, for a record that decompressed past it, a bounded prefix). Existing topics
are brought to that limit too.
"""

from __future__ import annotations

from confluent_kafka import KafkaException
from confluent_kafka.admin import (
    AdminClient,
    AlterConfigOpType,
    ConfigEntry,
    ConfigResource,
    NewTopic,
)

from onceflow.errors import ServiceUnavailable
from onceflow.settings import Settings


def topic_config(settings: Settings) -> dict[str, str]:
    """The per-topic settings both topics are created (or altered) with."""
    return {"max.message.bytes": str(settings.kafka_max_message_bytes)}


def ensure_topics(settings: Settings, timeout: float = 30.0) -> list[str]:
    """Create the jobs and dead-letter topics if missing; return the names created."""
    admin = AdminClient({"bootstrap.servers": settings.kafka_bootstrap_servers})
    try:
        existing = set(admin.list_topics(timeout=timeout).topics)
    except KafkaException as exc:
        raise ServiceUnavailable(
            f"Kafka unreachable at {settings.kafka_bootstrap_servers}: {exc}"
        ) from None
    config = topic_config(settings)
    wanted = [
        NewTopic(
            name,
            settings.topic_partitions,
            settings.topic_replication_factor,
            config=config,
        )
        for name in (settings.jobs_topic, settings.dlq_topic)
    ]
    _align_limits(admin, [t.topic for t in wanted if t.topic in existing], config, timeout)
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


def _align_limits(
    admin: AdminClient, topics: list[str], config: dict[str, str], timeout: float
) -> None:
    """Set the size limit on topics that already exist (an upgrade, or another tool)."""
    if not topics:
        return
    resources = [
        ConfigResource(
            ConfigResource.Type.TOPIC,
            name,
            incremental_configs=[
                ConfigEntry(name=k, value=v, incremental_operation=AlterConfigOpType.SET)
                for k, v in config.items()
            ],
        )
        for name in topics
    ]
    for future in admin.incremental_alter_configs(resources, request_timeout=timeout).values():
        future.result()
