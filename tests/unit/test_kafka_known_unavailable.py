"""Kafka known unable to confirm a write is a 503 at once (issue 23: below
``min.insync.replicas`` each request waited the full ack timeout for its 503 although
``/readyz`` already said Kafka was unavailable).

The real ``JobProducer`` and HTTP app, with librdkafka's ``Producer`` and
``AdminClient`` replaced by a scripted cluster: its metadata (leaders, in-sync
replicas), its ``min.insync.replicas``, and what becomes of a produced record (held
while librdkafka would still be retrying, refused, or acknowledged). A real 3-broker
cluster losing a broker is tests/cluster/test_broker_loss.py.
"""

from __future__ import annotations

import time
from dataclasses import dataclass, field
from types import SimpleNamespace
from typing import Any

import pytest
from confluent_kafka import KafkaError
from fastapi.testclient import TestClient

import producers.kafka as kafka_module
from onceflow.settings import Settings
from producers.api import create_app
from producers.broker_link import BrokerLink, Down, KafkaUnreachable, unwritable
from producers.kafka import JobProducer


@dataclass
class Cluster:
    """What the scripted brokers say. ``outcome``: "hold" (no report yet, as while
    librdkafka retries), "refuse" (the report after its retries: not enough replicas),
    or "ack"."""

    isrs: list[int] = field(default_factory=lambda: [1])
    replicas: list[int] = field(default_factory=lambda: [1, 2, 3])
    min_insync: str = "2"
    outcome: str = "hold"
    produced: int = 0


class _Message:
    def __init__(self, offset: int) -> None:
        self._offset = offset

    def partition(self) -> int:
        return 0

    def offset(self) -> int:
        return self._offset


class ScriptedProducer:
    """Stands in for confluent_kafka.Producer (the calls JobProducer makes)."""

    def __init__(self, cluster: Cluster) -> None:
        self.cluster = cluster
        self.pending: list[Any] = []

    def produce(self, topic, key, value, headers, on_delivery) -> None:
        self.cluster.produced += 1
        self.pending.append(on_delivery)

    def poll(self, timeout: float) -> int:
        time.sleep(min(timeout, 0.005))
        if self.cluster.outcome == "hold":
            return 0
        served, self.pending = self.pending, []
        for offset, report in enumerate(served):
            if self.cluster.outcome == "ack":
                report(None, _Message(offset))
            else:
                report(KafkaError(KafkaError.NOT_ENOUGH_REPLICAS), _Message(offset))
        return len(served)

    def list_topics(self, topic: str, timeout: float) -> Any:
        partition = SimpleNamespace(
            id=0, leader=1, replicas=self.cluster.replicas, isrs=self.cluster.isrs, error=None
        )
        return SimpleNamespace(
            brokers={1: object()},
            topics={topic: SimpleNamespace(error=None, partitions={0: partition})},
        )

    def flush(self, timeout: float) -> int:
        return 0

    def close(self) -> None:
        pass

    def __len__(self) -> int:
        return len(self.pending)


class ScriptedAdmin:
    def __init__(self, cluster: Cluster) -> None:
        self.cluster = cluster

    def describe_configs(self, resources, request_timeout: float) -> dict:
        entry = SimpleNamespace(value=self.cluster.min_insync)
        done = SimpleNamespace(result=lambda timeout=None: {"min.insync.replicas": entry})
        return {resources[0]: done}


@pytest.fixture
def cluster(monkeypatch) -> Cluster:
    scripted = Cluster()
    monkeypatch.setattr(kafka_module, "Producer", lambda config: ScriptedProducer(scripted))
    monkeypatch.setattr(kafka_module, "AdminClient", lambda config: ScriptedAdmin(scripted))
    return scripted


def _client(settings: Settings) -> tuple[TestClient, JobProducer]:
    producer = JobProducer(settings)
    return TestClient(create_app(settings, producer)), producer


SETTINGS = Settings(auth_disabled=True, ingest_validate_types=False, ingest_ack_timeout_seconds=2)
JOB = {"job_id": "isr_1", "workflow": "order-workflow"}


def _wait_until(condition, what: str, timeout: float = 10.0) -> None:
    deadline = time.monotonic() + timeout
    while not condition():
        assert time.monotonic() < deadline, f"timed out waiting for {what}"
        time.sleep(0.01)


def test_below_min_insync_readyz_says_so_and_submissions_are_refused_at_once(cluster):
    client, producer = _client(SETTINGS)
    with client:
        ready = client.get("/readyz")
        refused = client.post("/v1/jobs", json=JOB)
        assert ready.status_code == 503
        assert refused.status_code == 503, refused.text
        assert cluster.produced == 0  # refused before producing: no ack timeout waited out
        body = refused.json()
        assert (body["error"], body["accepted"]) == ("kafka_not_writable", [])
        assert body["rejected"] == [{"job_id": "isr_1", "reason": "kafka_not_writable"}]
        assert "nothing was written" in body["message"]
        assert body["details"]["kafka"] == (
            "partition 0 has 1 in-sync replica(s), min.insync.replicas is 2"
        )
        assert refused.headers["retry-after"] == "1"

        # the brokers come back: the watcher's probe sees it, and writes go through
        cluster.isrs, cluster.outcome = [1, 2], "ack"
        _wait_until(lambda: producer.link.up, "the link to come back up")
        accepted = client.post("/v1/jobs", json=JOB)
        assert accepted.status_code == 202, accepted.text
        assert client.get("/readyz").status_code == 200


def test_a_write_kafka_did_not_confirm_refuses_the_next_request_at_once(cluster):
    cluster.outcome = "refuse"  # nobody asked /readyz: the first request finds out
    client, _ = _client(SETTINGS)
    with client:
        first = client.post("/v1/jobs", json=JOB)
        assert first.status_code == 503 and first.json()["error"] == "kafka_unavailable"
        assert cluster.produced == 1
        second = client.post("/v1/jobs", json={**JOB, "job_id": "isr_2"})
        assert second.status_code == 503 and cluster.produced == 1  # not produced at all
        assert second.json()["error"] == "kafka_not_writable"
        assert "a write was not confirmed" in second.json()["details"]["kafka"]


def test_a_record_at_fault_does_not_mark_kafka_down():
    link = BrokerLink()
    link.on_failed(KafkaError(KafkaError.MSG_SIZE_TOO_LARGE))
    assert link.up
    link.on_failed(KafkaError(KafkaError._MSG_TIMED_OUT))
    with pytest.raises(KafkaUnreachable) as info:
        link.check()
    assert info.value.why is Down.UNWRITABLE
    link.on_error(KafkaError(KafkaError._ALL_BROKERS_DOWN, "1/1 brokers are down"))
    with pytest.raises(KafkaUnreachable) as info:
        link.check()
    assert (info.value.why, info.value.reason) == (Down.UNREACHABLE, "1/1 brokers are down")
    link.on_delivered()
    assert link.up
    link.stop()


def _partition(pid: int, leader: int, isrs: list[int], replicas: list[int]) -> Any:
    return SimpleNamespace(id=pid, leader=leader, isrs=isrs, replicas=replicas, error=None)


@pytest.mark.parametrize(
    ("partitions", "min_insync", "why"),
    [
        ([_partition(0, 1, [1, 2], [1, 2, 3])], 2, None),
        ([_partition(0, 1, [1, 2], [1, 2, 3]), _partition(1, -1, [], [1, 2, 3])], 2, "no leader"),
        ([_partition(0, 1, [1], [1, 2, 3])], 2, "1 in-sync replica(s)"),
        # a minimum above the replication factor counts as the factor (Kafka 4, KIP-966)
        ([_partition(0, 1, [1], [1])], 2, None),
    ],
)
def test_unwritable_names_the_partition_that_cannot_confirm(partitions, min_insync, why):
    topic = SimpleNamespace(error=None, partitions={p.id: p for p in partitions})
    reason = unwritable(topic, min_insync)  # type: ignore[arg-type]
    assert (reason is None) if why is None else (why in (reason or ""))
