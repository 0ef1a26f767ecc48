"""Ingest with the real producer against the real broker."""

from __future__ import annotations

import time

from fastapi.testclient import TestClient

from onceflow.envelope import HEADER_JOB_ID, HEADER_TRACEPARENT, JobEnvelope
from onceflow.partitioning import partition_for
from onceflow_tools.processes import free_port
from producers.api import create_app
from tests.integration.kafka_helpers import consume_all


def test_202_means_the_records_are_in_kafka(settings):
    jobs = [
        {"job_id": f"order_{i}", "workflow": "order-workflow", "params": {"i": i}}
        for i in range(150)
    ]
    with TestClient(create_app(settings)) as client:
        r = client.post("/v1/jobs", json={"jobs": jobs})
    assert r.status_code == 202, r.text
    accepted = {a["job_id"]: a for a in r.json()["accepted"]}
    assert len(accepted) == 150

    records = consume_all(settings.kafka_bootstrap_servers, settings.jobs_topic, 150)
    assert len(records) == 150
    for msg in records:
        env = JobEnvelope.decode(msg.key(), msg.value())
        headers = dict(msg.headers())
        assert headers[HEADER_JOB_ID] == msg.key() == env.job_id.encode()
        assert headers[HEADER_TRACEPARENT].startswith(b"00-")
        assert env.request_id == r.json()["request_id"]
        # the answer names where each job landed
        assert (msg.partition(), msg.offset()) == (
            accepted[env.job_id]["partition"],
            accepted[env.job_id]["offset"],
        )
        # murmur2, as the Java clients would choose
        assert msg.partition() == partition_for(env.job_id, settings.topic_partitions)


def test_503_with_retry_after_when_kafka_is_unreachable(settings):
    dead = settings.model_copy(
        update={
            "kafka_bootstrap_servers": f"127.0.0.1:{free_port()}",
            "ingest_ack_timeout_seconds": 2.0,
        }
    )
    with TestClient(create_app(dead)) as client:
        r = client.post(
            "/v1/jobs",
            json={
                "jobs": [
                    {"job_id": "a", "workflow": "order-workflow"},
                    {"job_id": "b", "workflow": "order-workflow"},
                ]
            },
        )
        ready = client.get("/readyz")
    assert r.status_code == 503
    assert r.headers["retry-after"]
    body = r.json()
    # refused at once (no broker connection) or after the ack timeout: either way Kafka
    # did not acknowledge, and the answer has the one error shape
    assert body["error"] in ("kafka_unreachable", "kafka_unavailable")
    assert body["accepted"] == []
    assert sorted(j["job_id"] for j in body["rejected"]) == ["a", "b"]
    assert ready.status_code == 503


def test_concurrent_requests_on_one_loop_each_get_their_own_acks(settings):
    """Many requests of one event loop waiting at once: the loop polls for their
    delivery reports (producers/delivery.py) and each request gets exactly its own."""
    import asyncio

    from producers.kafka import JobProducer

    producer = JobProducer(settings)

    async def submit_all() -> list[list]:
        singles = [
            producer.send([JobEnvelope(f"single_{i}", "order-workflow", {"i": i}, "req_s")])
            for i in range(300)
        ]
        batch = producer.send(
            [JobEnvelope(f"batch_{i}", "order-workflow", {"i": i}, "req_b") for i in range(200)]
        )
        return await asyncio.gather(*singles, batch)

    try:
        results = asyncio.run(submit_all())
    finally:
        assert producer.close(10) == 0
    acks = [ack for result in results for ack in result]
    assert [len(r) for r in results] == [1] * 300 + [200]
    assert [a.job_id for a in results[0]] == ["single_0"]
    assert [a.job_id for a in results[-1]] == [f"batch_{i}" for i in range(200)]
    assert all(a.ok for a in acks), [a.error for a in acks if not a.ok][:3]
    positions = {(a.partition, a.offset) for a in acks}
    assert len(positions) == 500  # every record its own place in the topic
    records = consume_all(settings.kafka_bootstrap_servers, settings.jobs_topic, 500)
    assert {(m.partition(), m.offset()) for m in records} == positions


def test_a_lone_request_does_not_wait_out_the_linger(settings):
    """With a linger far longer than a broker's answer, a lone job's 202 comes at the
    broker's pace through the express lane, and at the linger's without it; both
    records are in Kafka, on the partition their key names."""
    linger = 1.0
    answered: dict[bool, float] = {}
    for express in (True, False):
        own = settings.model_copy(
            update={
                "producer_linger_ms": int(linger * 1000),
                "producer_express_when_idle": express,
            }
        )
        with TestClient(create_app(own)) as client:
            client.post("/v1/jobs", json={"job_id": "warm", "workflow": "order-workflow"})
            time.sleep(linger * 1.2)  # a request within a linger of another is batched
            started = time.monotonic()
            r = client.post(
                "/v1/jobs", json={"job_id": f"lone_{express}", "workflow": "order-workflow"}
            )
            answered[express] = time.monotonic() - started
        assert r.status_code == 202, r.text
    assert answered[True] < linger / 2 and answered[False] >= linger * 0.9, answered
    records = consume_all(settings.kafka_bootstrap_servers, settings.jobs_topic, 4)
    by_id = {JobEnvelope.decode(m.key(), m.value()).job_id: m for m in records}
    for job_id in ("lone_True", "lone_False"):
        assert by_id[job_id].partition() == partition_for(job_id, settings.topic_partitions)
