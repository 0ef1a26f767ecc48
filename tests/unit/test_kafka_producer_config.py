"""The one idempotent producer configuration (onceflow/kafka_producer.py) and ingest's
use of it: what each producer hands librdkafka."""

from onceflow.kafka_producer import idempotent_producer_config
from onceflow.settings import Settings
from producers.broker_link import RECONNECT_BACKOFF_MAX_MS
from producers.kafka import producer_config

DURABLE = {"enable.idempotence": True, "acks": "all", "partitioner": "murmur2_random"}


def test_the_base_is_durable_and_keyed_like_java_and_leaves_the_rest_default():
    assert idempotent_producer_config("b:9092", "c") == {
        "bootstrap.servers": "b:9092",
        "client.id": "c",
        **DURABLE,
    }


def test_a_record_limit_is_passed_through():
    config = idempotent_producer_config("b:9092", "c", max_message_bytes=2_000_000)
    assert config["message.max.bytes"] == 2_000_000


def test_a_delivery_timeout_bounds_each_request_up_to_librdkafkas_default():
    short = idempotent_producer_config("b", "c", delivery_timeout_ms=5000)
    long = idempotent_producer_config("b", "c", delivery_timeout_ms=120_000)
    assert (short["delivery.timeout.ms"], short["request.timeout.ms"]) == (5000, 5000)
    assert (long["delivery.timeout.ms"], long["request.timeout.ms"]) == (120_000, 30000)


def test_ingest_adds_its_linger_timeout_and_buffers():
    settings = Settings(
        kafka_bootstrap_servers="b:9092", producer_linger_ms=3, ingest_ack_timeout_seconds=4
    )
    assert producer_config(settings) == {
        "bootstrap.servers": "b:9092",
        "client.id": "onceflow-ingest",
        **DURABLE,
        "linger.ms": 3,
        "delivery.timeout.ms": 4000,
        "request.timeout.ms": 4000,
        "queue.buffering.max.messages": 500000,
        "queue.buffering.max.kbytes": 262144,
        "reconnect.backoff.max.ms": RECONNECT_BACKOFF_MAX_MS,
    }
