"""Creating the topics (once, before the processes start).

Both topics get ``max.message.bytes = ONCEFLOW_KAFKA_MAX_MESSAGE_BYTES``, the same
figure as the dead-letter producer's ``message.max.bytes`` and the broker's own
``message.max.bytes``, so whatever the jobs topic took, the dead-letter topic takes a
copy of (or, for a record that decompressed past it, a bounded prefix). Existing topics
are brought to that limit too.

Replication: ``ONCEFLOW_TOPIC_REPLICATION_FACTOR`` (or ``auto``: the brokers, up to 3)
and ``min.insync.replicas`` (``ONCEFLOW_TOPIC_MIN_INSYNC_REPLICAS``; by default a
majority when there are 3 replicas or more, else 1). Ingest produces with ``acks=all``,
so with 3 replicas and a minimum of 2 an acknowledged job is on two brokers, and one
broker may die without losing it or stopping ingest (tests/cluster/test_broker_loss.py).
Existing topics get the minimum that fits their own replication factor.
"""

from __future__ import annotations

from confluent_kafka import KafkaException
from confluent_kafka.admin import (
    AdminClient,
    AlterConfigOpType,
    ConfigEntry,
    ConfigResource,
    NewTopic,
    TopicMetadata,
)

from onceflow.errors import ConfigurationError, ServiceUnavailable
from onceflow.settings import Settings

AUTO_REPLICAS_MAX = 3


def replication_factor(settings: Settings, brokers: int) -> int:
    """The replication factor new topics get on a cluster of ``brokers`` brokers."""
    wanted = settings.topic_replication_factor
    return min(AUTO_REPLICAS_MAX, max(1, brokers)) if wanted == "auto" else wanted


def min_insync_replicas(settings: Settings, replicas: int) -> int:
    """The topics' ``min.insync.replicas`` for a replication factor of ``replicas``."""
    if settings.topic_min_insync_replicas is not None:
        return settings.topic_min_insync_replicas
    return replicas // 2 + 1 if replicas >= 3 else 1


def topic_config(settings: Settings, replicas: int = 1) -> dict[str, str]:
    """The per-topic settings both topics are created (or altered) with."""
    return {
        "max.message.bytes": str(settings.kafka_max_message_bytes),
        "min.insync.replicas": str(min(replicas, min_insync_replicas(settings, replicas))),
    }


def ensure_topics(settings: Settings, timeout: float = 30.0) -> list[str]:
    """Create the jobs, dead-letter and events topics if missing; return the names created."""
    admin = AdminClient({"bootstrap.servers": settings.kafka_bootstrap_servers})
    try:
        metadata = admin.list_topics(timeout=timeout)
    except KafkaException as exc:
        raise ServiceUnavailable(
            f"Kafka unreachable at {settings.kafka_bootstrap_servers}: {exc}"
        ) from None
    replicas = replication_factor(settings, len(metadata.brokers))
    if min_insync_replicas(settings, replicas) > replicas:
        raise ConfigurationError(
            f"ONCEFLOW_TOPIC_MIN_INSYNC_REPLICAS={settings.topic_min_insync_replicas} is more"
            f" than the replication factor {replicas}: no write could ever be acknowledged"
        )
    wanted = [
        NewTopic(
            name,
            settings.topic_partitions,
            replicas,
            config=topic_config(settings, replicas),
        )
        for name in (settings.jobs_topic, settings.dlq_topic, *_events_topic(settings))
    ]
    existing = {
        t.topic: _replicas_of(metadata.topics[t.topic])
        for t in wanted
        if t.topic in metadata.topics
    }
    _align_limits(
        admin,
        {name: topic_config(settings, rf) for name, rf in existing.items()},
        timeout,
    )
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


def _events_topic(settings: Settings) -> tuple[str, ...]:
    """The lifecycle events' topic, when events are written (same partitions and
    limits as the jobs topic: one job's events land on one partition, by its key)."""
    return (settings.events_topic,) if settings.lifecycle_events else ()


def _replicas_of(topic: TopicMetadata) -> int:
    """An existing topic's replication factor (its smallest, should partitions differ)."""
    return min((len(p.replicas) for p in topic.partitions.values()), default=1)


def _align_limits(admin: AdminClient, configs: dict[str, dict[str, str]], timeout: float) -> None:
    """Set the size limit and the in-sync minimum on topics that already exist (an
    upgrade, or another tool); the minimum fits the topic's own replication factor."""
    if not configs:
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
        for name, config in configs.items()
    ]
    for future in admin.incremental_alter_configs(resources, request_timeout=timeout).values():
        future.result()
