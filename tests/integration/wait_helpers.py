"""Start-and-wait tests' tools: an ingest app served by uvicorn in a thread (so many
requests wait at once, and failpoints armed here reach it), the events topic, and the
two halves of a final change in the order the outbox relay guarantees: the instance
row made final in PostgreSQL, then its event on the topic, written per the lifecycle
event contract (CloudEvents 1.0 binary mode, key = job id)."""

from __future__ import annotations

import threading
import time
from collections.abc import Iterator
from contextlib import contextmanager
from datetime import UTC, datetime
from typing import Any

import orjson
import sqlalchemy as sa
import uvicorn
from confluent_kafka import KafkaError, KafkaException, Producer
from confluent_kafka.admin import AdminClient, NewTopic
from prometheus_client import REGISTRY

from onceflow.envelope import HEADER_JOB_ID, JobEnvelope
from onceflow.settings import Settings
from onceflow_tools.processes import free_port
from producers.api import IngestFront, create_app
from producers.server import IngestServer
from workflow_engine.model import Delivery
from workflow_engine.store.writes import create_instances


def create_events_topic(settings: Settings) -> None:
    """The events topic (if missing: the topic setup may have made it already)."""
    admin = AdminClient({"bootstrap.servers": settings.kafka_bootstrap_servers})
    futures = admin.create_topics([NewTopic(settings.events_topic, settings.topic_partitions, 1)])
    for future in futures.values():
        try:
            future.result(30)
        except KafkaException as exc:
            if exc.args[0].code() != KafkaError.TOPIC_ALREADY_EXISTS:
                raise


@contextmanager
def served(
    settings: Settings, *, watchable: bool = True
) -> Iterator[tuple[str, IngestFront, IngestServer]]:
    """The ingest app (its real Kafka producer) on a loopback port; with ``watchable``,
    returned once its events consumer is assigned (its waits can be answered)."""
    app = create_app(settings)
    port = free_port()
    config = uvicorn.Config(app, host="127.0.0.1", port=port, log_config=None, access_log=False)
    server = IngestServer(config, app)
    thread = threading.Thread(target=server.run, name="ingest", daemon=True)
    thread.start()
    try:
        until(lambda: server.started, 20, "ingest started", alive=thread)
        if watchable:
            until(lambda: app.state.ingest.waiters.watchable, 20, "events consumer assigned")
        yield f"http://127.0.0.1:{port}", app, server
    finally:
        server.should_exit = True
        thread.join(20)


def until(predicate, timeout: float, what: str, alive: threading.Thread | None = None) -> None:
    deadline = time.monotonic() + timeout
    while not predicate():
        assert alive is None or alive.is_alive(), f"{what}: the thread died"
        assert time.monotonic() < deadline, f"timed out after {timeout}s waiting for {what}"
        time.sleep(0.02)


def metric(name: str, **labels: str) -> float:
    return REGISTRY.get_sample_value(name, labels) or 0.0


def create_instance(db: sa.Engine, settings: Settings, job_id: str, offset: int = 0) -> None:
    """The instance the streams worker would create from the job's record."""
    envelope = JobEnvelope(job_id, "order-workflow", {})
    create_instances(db, [Delivery(envelope, settings.jobs_topic, 0, offset)])


_FINISH = sa.text(
    "UPDATE onceflow_instances SET status = :status, result = CAST(:result AS jsonb),"
    " error = :error, finished_at = now(), updated_at = now()"
    " WHERE job_id = :job_id RETURNING workflow, version, finished_at"
)


def finish(
    db: sa.Engine,
    settings: Settings,
    job_id: str,
    status: str = "complete",
    result: Any = None,
    error: str | None = None,
    sequence: int = 3,
) -> None:
    """The final change, committed, then its event published (the relay's order)."""
    with db.begin() as conn:
        row = conn.execute(
            _FINISH,
            {
                "job_id": job_id,
                "status": status,
                "result": None if result is None else orjson.dumps(result).decode(),
                "error": error,
            },
        ).one()
    data: dict[str, Any] = {}
    if status == "complete":
        data["result"] = result
    elif status == "errored":
        data["error"] = error
    publish(
        settings,
        job_id,
        f"instance.{status}",
        sequence,
        row.workflow,
        row.version,
        status,
        row.finished_at,
        data,
    )


def publish(
    settings: Settings,
    job_id: str,
    kind: str,
    sequence: int,
    workflow: str,
    version: str | None,
    status: str,
    when: datetime | None = None,
    extra: dict[str, Any] | None = None,
) -> None:
    """One lifecycle event, exactly as the contract writes it."""
    record = event_record(settings, job_id, kind, sequence, workflow, version, status, when, extra)
    publish_records(settings, [record])


Record = tuple[bytes, bytes, list[tuple[str, bytes]]]


def event_record(
    settings: Settings,
    job_id: str,
    kind: str,
    sequence: int,
    workflow: str,
    version: str | None,
    status: str,
    when: datetime | None = None,
    extra: dict[str, Any] | None = None,
) -> Record:
    """(key, value, headers) of a lifecycle event: CloudEvents 1.0 binary mode, key the
    job id, value the event's data (the contract's fields)."""
    when = when or datetime.now(UTC)
    time_text = when.astimezone(UTC).isoformat().replace("+00:00", "Z")
    data = {
        "job_id": job_id,
        "workflow": workflow,
        "version": version,
        "sequence": sequence,
        "time": time_text,
        "status": status,
        "kafka": {"topic": settings.jobs_topic, "partition": 0, "offset": 0},
        **(extra or {}),
    }
    headers = [
        ("ce_specversion", b"1.0"),
        ("ce_id", f"{job_id}:{sequence}".encode()),
        ("ce_source", f"/onceflow/workflows/{workflow}".encode()),
        ("ce_type", f"dev.onceflow.{kind}".encode()),
        ("ce_subject", job_id.encode()),
        ("ce_time", time_text.encode()),
        ("content-type", b"application/json"),
        ("ce_jobid", job_id.encode()),
        ("ce_workflow", workflow.encode()),
        ("ce_workflowversion", (version or "").encode()),
        ("ce_sequence", str(sequence).encode()),
        (HEADER_JOB_ID, job_id.encode()),
    ]
    return job_id.encode(), orjson.dumps(data), headers


def publish_records(settings: Settings, records: list[Record]) -> None:
    producer = Producer(
        {
            "bootstrap.servers": settings.kafka_bootstrap_servers,
            "partitioner": "murmur2_random",
            "enable.idempotence": True,
            "acks": "all",
        }
    )
    for key, value, headers in records:
        producer.produce(settings.events_topic, key=key, value=value, headers=headers)
        producer.poll(0)
    assert producer.flush(30) == 0
