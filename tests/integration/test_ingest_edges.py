"""Ingest at the edges of its dependencies, on real Kafka and PostgreSQL (issue 17):
readiness that ignores PostgreSQL, an immediate 503 while no broker is connected (and
recovery within a second of its return), payloads stored exactly or refused."""

from __future__ import annotations

import os
import signal
import threading
import time
import urllib.error
import urllib.request
from concurrent.futures import ThreadPoolExecutor
from pathlib import Path

import orjson
import pytest
from confluent_kafka.admin import AdminClient
from fastapi.testclient import TestClient

from onceflow.envelope import JobEnvelope
from onceflow.topics import ensure_topics
from onceflow_tools.dev.services import KafkaService
from onceflow_tools.processes import free_port
from producers.api import create_app
from producers.kafka import JobProducer
from producers.server import start_probe_server
from tests.integration.kafka_helpers import consume_all


def _get(url: str) -> tuple[int, bytes]:
    try:
        with urllib.request.urlopen(url, timeout=10) as r:
            return r.status, r.read()
    except urllib.error.HTTPError as exc:
        return exc.code, exc.read()


def _until(check, timeout: float, what: str):
    deadline = time.monotonic() + timeout
    while time.monotonic() < deadline:
        value = check()
        if value:
            return value
        time.sleep(0.02)
    raise AssertionError(f"{what}: not within {timeout}s")


# -- item 6: readiness is Kafka only -------------------------------------------------


def test_ingest_stays_ready_and_accepts_jobs_while_postgres_is_down(settings):
    down = settings.model_copy(
        update={
            "admin_api_enabled": True,  # the admin API is what uses PostgreSQL
            "database_url": f"postgresql://onceflow@127.0.0.1:{free_port()}/nowhere",
            "ingest_metrics_port": free_port(),
        }
    )
    producer = JobProducer(down)
    server = start_probe_server(down, producer, host="127.0.0.1")
    base = f"http://127.0.0.1:{down.ingest_metrics_port}"
    try:
        with TestClient(create_app(down, producer)) as client:
            submitted = client.post(
                "/v1/jobs", json={"job_id": "pg_down", "workflow": "order-workflow"}
            )
            api_ready = client.get("/readyz")
            status, body = _get(f"{base}/readyz")  # while the app runs: its close
            _, details = _get(f"{base}/readyz/details")  # closes the producer
            _, metrics = _get(f"{base}/metrics")
    finally:
        server.shutdown()
    assert submitted.status_code == 202, submitted.text
    assert (status, orjson.loads(body)) == (200, {"kafka": "ok"})
    assert api_ready.status_code == 200
    assert orjson.loads(details) == {
        "ready": True,
        "dependencies": {
            "kafka": {"state": "ok", "required": True},
            "postgres": {"state": "unavailable", "required": False},
        },
    }
    assert b'onceflow_ingest_dependency_up{dependency="postgres"} 0.0' in metrics
    assert b'onceflow_ingest_dependency_up{dependency="kafka"} 1.0' in metrics


# -- item 7: no broker, no 15 s wait ----------------------------------------------------


def _post(client: TestClient, job_id: str):
    started = time.monotonic()
    r = client.post("/v1/jobs", json={"job_id": job_id, "workflow": "order-workflow"})
    return r, time.monotonic() - started


def test_nothing_listening_means_an_immediate_503(settings):
    dead = settings.model_copy(
        update={
            "kafka_bootstrap_servers": f"127.0.0.1:{free_port()}",
            "ingest_ack_timeout_seconds": 15.0,  # the default: what a request used to wait
        }
    )
    with TestClient(create_app(dead)) as client:
        link = client.app.state.ingest.producer.link
        _until(lambda: not link.up, 5, "librdkafka reports all brokers down")
        answers = [_post(client, f"fast_{i}") for i in range(20)]
        ready = client.get("/readyz")
    slowest = max(elapsed for _, elapsed in answers)
    print(f"\n503 answer times with no broker: max {slowest * 1000:.1f} ms")
    # at once rather than after the 15 s acknowledgement timeout (a few ms here; 0.29 s
    # seen once on a loaded box, so the bound is a second, still 15x under the timeout)
    assert slowest < 1.0
    for r, _ in answers:
        assert r.status_code == 503 and r.headers["retry-after"] == "1"
        assert r.json()["error"] == "kafka_unreachable" and r.json()["accepted"] == []
    assert ready.status_code == 503


@pytest.fixture
def private_broker(tmp_path: Path):
    """A broker of our own (same jars, other ports): this test SIGKILLs it."""
    broker = KafkaService(tmp_path / "broker", port=free_port(), controller_port=free_port())
    broker.up()
    yield broker
    pidfile = broker.root / "kafka.pid"
    if broker.running():
        os.kill(int(pidfile.read_text()), signal.SIGKILL)


def test_broker_killed_then_back_in_flight_requests_get_their_true_answer(settings, private_broker):
    own = settings.model_copy(
        update={
            "kafka_bootstrap_servers": private_broker.bootstrap,
            "topic_partitions": 1,
            "topic_replication_factor": 1,
            "producer_linger_ms": 1000,  # holds the in-flight record while we kill
            "producer_express_when_idle": False,  # (which a lone request would skip)
            "ingest_ack_timeout_seconds": 60.0,
        }
    )
    ensure_topics(own)
    pool = ThreadPoolExecutor(1)
    with TestClient(create_app(own)) as client:
        link = client.app.state.ingest.producer.link
        assert _post(client, "before")[0].status_code == 202

        in_flight = pool.submit(_post, client, "in_flight")
        time.sleep(0.3)  # produced, waiting in linger
        os.kill(int((private_broker.root / "kafka.pid").read_text()), signal.SIGKILL)
        killed = time.monotonic()
        _until(lambda: not link.up, 5, "the link notices the dead broker")
        print(f"\nbroker death noticed after {(time.monotonic() - killed) * 1000:.0f} ms")

        answers = [_post(client, f"down_{i}") for i in range(10)]
        assert all(r.status_code == 503 and r.headers["retry-after"] == "1" for r, _ in answers)
        slowest = max(elapsed for _, elapsed in answers)
        print(f"503 answer times while down: max {slowest * 1000:.1f} ms")
        assert slowest < 0.1
        assert not in_flight.done()  # not cut short: its delivery report decides

        back: list[float] = []
        threading.Thread(target=_watch_broker, args=(private_broker.bootstrap, back)).start()
        restart = ThreadPoolExecutor(1)
        restarted = restart.submit(private_broker.up)
        recovered = _until(lambda: link.up and time.monotonic(), 60, "the link is up again")
        restarted.result(timeout=90)
        restart.shutdown()
        after, _ = _post(client, "after")
        r, _ = in_flight.result(timeout=60)
    _until(lambda: back, 5, "the broker answered an independent client")
    print(f"ingest back to normal {(recovered - back[0]) * 1000:.0f} ms after the broker answered")
    assert recovered - back[0] < 1.0
    assert after.status_code == 202, after.text
    assert r.status_code == 202, r.text  # delivered after the broker's return: the truth
    assert [a["job_id"] for a in r.json()["accepted"]] == ["in_flight"]
    records = consume_all(own.kafka_bootstrap_servers, own.jobs_topic, 3)
    assert {JobEnvelope.decode(m.key(), m.value()).job_id for m in records} >= {
        "before",
        "in_flight",
        "after",
    }


def _watch_broker(bootstrap: str, back: list[float]) -> None:
    """Record when the broker first answers a metadata request of a fresh client."""
    deadline = time.monotonic() + 90
    while time.monotonic() < deadline:
        try:
            md = AdminClient({"bootstrap.servers": bootstrap}).list_topics(timeout=0.2)
            if md.brokers:
                back.append(time.monotonic())
                return
        except Exception:
            pass
        time.sleep(0.02)


# -- item 8: stored exactly or refused ----------------------------------------------------


def test_payloads_reach_kafka_exactly_or_are_refused(settings):
    exact = (
        b'{"job_id":"exact","workflow":"order-workflow",'
        b'"params":{"u64":18446744073709551615,"i64":-9223372036854775808,"f":0.1}}'
    )
    big = b'{"job_id":"big","workflow":"w","params":{"n":123456789012345678901234567890}}'
    dup = b'{"job_id":"dup","workflow":"order-workflow","params":{"a":{"b":1,"b":2}}}'
    headers = {"content-type": "application/json"}
    with TestClient(create_app(settings)) as client:
        ok = client.post("/v1/jobs", content=exact, headers=headers)
        refused_big = client.post("/v1/jobs", content=big, headers=headers)
        refused_dup = client.post("/v1/jobs", content=dup, headers=headers)
    assert ok.status_code == 202, ok.text
    assert (refused_big.status_code, refused_big.json()["fields"][0]["field"]) == (422, "params.n")
    assert refused_big.json()["error"] == "number_out_of_range"
    assert (refused_dup.status_code, refused_dup.json()["fields"][0]["field"]) == (
        422,
        "params.a.b",
    )
    [record] = consume_all(settings.kafka_bootstrap_servers, settings.jobs_topic, 1)
    env = JobEnvelope.decode(record.key(), record.value())
    assert env.job_id == "exact"
    assert env.params == {"u64": 2**64 - 1, "i64": -(2**63), "f": 0.1}
    assert b"18446744073709551615" in record.value()
