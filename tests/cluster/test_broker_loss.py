"""Losing a Kafka broker while jobs flow: a 3-broker KRaft cluster of its own (topics
with 3 replicas, ``min.insync.replicas=2``, ingest producing with ``acks=all``), the
three onceflow processes, jobs submitted from threads, and the broker leading partition
0 of the jobs topic killed with SIGKILL in the middle. Every job answered 202 must
become exactly one instance; the latency and the 503s around the election are printed
(figures, not assertions: performance is measured, not asserted by timed tests).
"""

from __future__ import annotations

import threading
import time
import uuid
from collections.abc import Iterator
from dataclasses import dataclass, field

import httpx
import pytest
from confluent_kafka.admin import AdminClient, ConfigResource, PartitionMetadata

from onceflow_tools.dev.cluster import KafkaCluster
from onceflow_tools.processes import free_port
from onceflow_tools.stack import Stack

pytestmark = pytest.mark.timeout(180)

THREADS = 3
JOBS_PER_THREAD = 700
RATE_PER_THREAD = 40.0  # submissions a second: 2,100 jobs over ~18 s
KILL_AFTER = 700  # accepted jobs before the kill
ELECTION_WINDOW = (-1.0, 10.0)  # requests started this long around the kill


@dataclass
class Request:
    started: float
    seconds: float
    status: int  # 0: no HTTP answer


@dataclass
class Submissions:
    accepted: list[str] = field(default_factory=list)
    requests: list[Request] = field(default_factory=list)
    lock: threading.Lock = field(default_factory=threading.Lock)

    def record(self, request: Request, job_id: str | None) -> None:
        with self.lock:
            self.requests.append(request)
            if job_id is not None:
                self.accepted.append(job_id)


@pytest.fixture
def cluster(tmp_path) -> Iterator[KafkaCluster]:
    kafka = KafkaCluster(tmp_path / "kafka", brokers=3, ports=[free_port() for _ in range(6)])
    try:
        kafka.up()
        yield kafka
    finally:
        kafka.down(timeout=5)  # scratch data: no need to wait for a clean shutdown


def _submit(stack: Stack, thread: int, out: Submissions, deadline: float) -> None:
    """Single-job submissions at a steady pace; a 503 is counted and retried (same id)."""
    with httpx.Client(base_url=stack.ingest_url, headers=stack.auth_headers, timeout=30) as http:
        start = time.monotonic()
        for i in range(JOBS_PER_THREAD):
            pause = start + i / RATE_PER_THREAD - time.monotonic()
            if pause > 0:
                time.sleep(pause)
            job_id = f"bl_{thread}_{i:04d}"
            job = {
                "job_id": job_id,
                "workflow": "order-workflow",
                "params": {"step_seconds": 0},
            }
            while time.monotonic() < deadline:
                t0 = time.monotonic()
                try:
                    status = http.post("/v1/jobs", json=job).status_code
                except httpx.HTTPError:
                    status = 0
                accepted = job_id if status == 202 else None
                out.record(Request(t0, time.monotonic() - t0, status), accepted)
                if status == 202:
                    break
                time.sleep(0.2 if status in (0, 503) else 1.0)


def _partition_0(admin: AdminClient, topic: str) -> PartitionMetadata:
    """Partition 0 of ``topic`` as the metadata shows it. Right after the topic is
    created, the broker that answers may not list its partitions yet (KRaft spreads the
    new metadata to the brokers a moment later): asked again, for at most 10 s."""
    deadline = time.monotonic() + 10
    while True:
        partitions = admin.list_topics(topic, timeout=10).topics[topic].partitions
        if 0 in partitions or time.monotonic() > deadline:
            return partitions[0]
        time.sleep(0.1)


def _leader_of_partition_0(bootstrap: str, topic: str) -> tuple[int, list[int]]:
    partition = _partition_0(AdminClient({"bootstrap.servers": bootstrap}), topic)
    return partition.leader, list(partition.isrs)


def _topic_replication(bootstrap: str, topic: str) -> tuple[int, str]:
    admin = AdminClient({"bootstrap.servers": bootstrap})
    replicas = len(_partition_0(admin, topic).replicas)
    resource = ConfigResource(ConfigResource.Type.TOPIC, topic)
    configs = admin.describe_configs([resource])[resource].result(timeout=10)
    return replicas, configs["min.insync.replicas"].value


def _quantile(values: list[float], q: float) -> float:
    ordered = sorted(values)
    return ordered[min(len(ordered) - 1, int(q * len(ordered)))] if ordered else 0.0


def test_no_acknowledged_job_is_lost_when_a_broker_dies(
    base_settings, cluster: KafkaCluster, tmp_path, capsys
):
    base = base_settings.model_copy(
        update={"kafka_bootstrap_servers": cluster.bootstrap, "topic_replication_factor": "auto"}
    )
    stack = Stack(base, f"brokerloss-{uuid.uuid4().hex[:8]}", tmp_path / "run").prepare()
    try:
        assert stack.settings is not None
        topic = stack.settings.jobs_topic
        assert _topic_replication(cluster.bootstrap, topic) == (3, "2")
        stack.start_ingest()
        stack.start_worker()
        stack.start_engine()

        out = Submissions()
        deadline = time.monotonic() + 90
        threads = [
            threading.Thread(target=_submit, args=(stack, t, out, deadline), daemon=True)
            for t in range(THREADS)
        ]
        for thread in threads:
            thread.start()
        stack.wait_for(lambda: len(out.accepted) >= KILL_AFTER, 60, f"{KILL_AFTER} jobs")
        leader, isr = _leader_of_partition_0(cluster.bootstrap, topic)
        assert sorted(isr) == [1, 2, 3], isr
        killed_at = time.monotonic()
        cluster.kill(leader)

        for thread in threads:
            thread.join(max(0.0, deadline - time.monotonic()))
        assert not any(t.is_alive() for t in threads), "the submitters did not finish in time"
        new_leader, new_isr = _leader_of_partition_0(cluster.bootstrap, topic)
        assert new_leader not in (leader, -1), (leader, new_leader)

        accepted = sorted(set(out.accepted))
        assert len(accepted) == THREADS * JOBS_PER_THREAD

        def instances() -> tuple[int, int]:
            assert stack.db is not None
            with stack.db.connect() as conn:
                row = conn.exec_driver_sql(
                    "SELECT count(*), count(DISTINCT job_id) FROM onceflow_instances"
                    " WHERE job_id = ANY(%(ids)s)",
                    {"ids": accepted},
                ).one()
            return int(row[0]), int(row[1])

        stack.wait_for(
            lambda: instances()[1] == len(accepted), 60, "an instance for every accepted job"
        )
        rows, distinct = instances()
        assert (rows, distinct) == (len(accepted), len(accepted))
    finally:
        stack.close()

    lo, hi = ELECTION_WINDOW
    around = [r for r in out.requests if lo <= r.started - killed_at <= hi]
    before = [r for r in out.requests if r.started < killed_at + lo]
    seconds = [r.seconds for r in around]
    with capsys.disabled():
        print(
            f"\nbroker loss: killed node {leader} (leader of {topic}[0]); new leader"
            f" {new_leader}, ISR {new_isr}; {len(accepted)} jobs accepted, all with one"
            f" instance; {sum(r.status == 503 for r in out.requests)} answers 503,"
            f" {sum(r.status == 0 for r in out.requests)} without answer;"
            f" {len(around)} requests in [{lo:+.0f} s, {hi:+.0f} s] of the kill:"
            f" max {max(seconds, default=0) * 1000:.0f} ms,"
            f" p99 {_quantile(seconds, 0.99) * 1000:.0f} ms"
            f" (before: p99 {_quantile([r.seconds for r in before], 0.99) * 1000:.0f} ms)"
        )
