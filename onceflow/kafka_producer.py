"""The one configuration of onceflow's idempotent Kafka producers.

Ingest (``producers/kafka.py``), the worker's dead-letter producer
(``streams/agents.py``) and the re-drive (``onceflow/redrive.py``) all write records
that must land exactly once and on the partition their key names, so they share
``acks=all``, idempotence and murmur2 partitioning. What differs per use is an explicit
argument: the record limit, the linger, the delivery timeout.

Core level: no client is built here, only its configuration.
"""

from __future__ import annotations

__all__ = ["idempotent_producer_config"]

#: librdkafka's default ``request.timeout.ms``: a shorter delivery timeout shortens
#: each request to match, a longer one leaves the default.
REQUEST_TIMEOUT_MAX_MS = 30000


def idempotent_producer_config(
    bootstrap_servers: str,
    client_id: str,
    *,
    max_message_bytes: int | None = None,
    linger_ms: float | None = None,
    delivery_timeout_ms: int | None = None,
) -> dict[str, object]:
    """librdkafka settings for a producer whose acknowledged records are durable
    (``acks=all``), written once per send (idempotent) and keyed to the partition a
    Java or aiokafka client would choose (murmur2).

    ``None`` leaves librdkafka's default. A delivery timeout also bounds each request
    (at most :data:`REQUEST_TIMEOUT_MAX_MS`)."""
    config: dict[str, object] = {
        "bootstrap.servers": bootstrap_servers,
        "client.id": client_id,
        "enable.idempotence": True,
        "acks": "all",
        # Same partition for a job id whichever client wrote it (Java and aiokafka
        # use murmur2; librdkafka's default is CRC32 'consistent_random').
        "partitioner": "murmur2_random",
    }
    if max_message_bytes is not None:
        config["message.max.bytes"] = max_message_bytes
    if linger_ms is not None:
        config["linger.ms"] = linger_ms
    if delivery_timeout_ms is not None:
        config["delivery.timeout.ms"] = delivery_timeout_ms
        config["request.timeout.ms"] = min(delivery_timeout_ms, REQUEST_TIMEOUT_MAX_MS)
    return config
