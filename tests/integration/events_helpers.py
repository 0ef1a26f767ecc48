"""Reading the lifecycle events topic back in the tests, and the checks every test of
the events makes: decoded by the ``cloudevents`` package (the CloudEvents Kafka binding,
checked by code nobody here wrote), deduplicated by ``(job id, sequence)`` as the docs
tell a consumer to, each job's sequence 1..n, first seen in order."""

from __future__ import annotations

import uuid
from dataclasses import dataclass
from typing import Any

import orjson
from cloudevents.core.bindings import kafka as ce_kafka
from confluent_kafka import OFFSET_BEGINNING, Consumer, TopicPartition


@dataclass(frozen=True)
class Record:
    partition: int
    offset: int
    key: str
    headers: dict[str, bytes]
    data: dict[str, Any]

    @property
    def seq(self) -> int:
        return int(self.headers["ce_sequence"])

    @property
    def kind(self) -> str:
        return self.headers["ce_type"].decode().removeprefix("dev.onceflow.")


def read_topic(bootstrap: str, topic: str, timeout: float = 30.0) -> list[Record]:
    """Every record of ``topic`` up to its high watermarks now, in partition order."""
    consumer = Consumer(
        {
            "bootstrap.servers": bootstrap,
            "group.id": f"t-{uuid.uuid4().hex}",
            "enable.auto.commit": False,
        }
    )
    try:
        partitions = consumer.list_topics(topic, timeout=10).topics[topic].partitions
        ends = {
            p: consumer.get_watermark_offsets(TopicPartition(topic, p), timeout=10)[1]
            for p in partitions
        }
        consumer.assign([TopicPartition(topic, p, OFFSET_BEGINNING) for p in partitions])
        wanted = {p: end for p, end in ends.items() if end > 0}
        got: list[Record] = []
        import time

        deadline = time.monotonic() + timeout
        while wanted and time.monotonic() < deadline:
            msg = consumer.poll(0.5)
            if msg is None or msg.error() is not None:
                continue
            headers = {k: v for k, v in (msg.headers() or [])}
            got.append(
                Record(
                    msg.partition(),
                    msg.offset(),
                    msg.key().decode(),
                    headers,
                    orjson.loads(msg.value()),
                )
            )
            if msg.offset() + 1 >= wanted.get(msg.partition(), 0):
                wanted.pop(msg.partition(), None)
        assert not wanted, f"topic {topic} not read to its end: {wanted}"
        return got
    finally:
        consumer.close()


def check_cloudevent(record: Record) -> None:
    """The record decodes as a CloudEvent with the contract's attributes."""
    message = ce_kafka.KafkaMessage(
        headers=record.headers, key=record.key, value=orjson.dumps(record.data)
    )
    event = ce_kafka.from_binary_event(message)
    attrs = event.get_attributes()
    data = record.data
    assert attrs["specversion"] == "1.0"
    assert attrs["id"] == f"{data['job_id']}:{data['sequence']}"
    assert attrs["source"] == f"/onceflow/workflows/{data['workflow']}"
    assert attrs["subject"] == record.key == data["job_id"]
    assert attrs["datacontenttype"] == "application/json"
    assert attrs["jobid"] == data["job_id"] and attrs["workflow"] == data["workflow"]
    assert int(attrs["sequence"]) == data["sequence"]
    assert attrs.get("workflowversion") == data["version"]
    assert attrs["time"].isoformat().replace("+00:00", "Z").startswith(data["time"][:19])
    assert record.headers["onceflow-job-id"] == record.key.encode()


def sequences(records: list[Record]) -> dict[str, list[Record]]:
    """Each job's events after dedupe by (job id, sequence), in first-seen order; every
    job's sequence must be 1..n with no gap, first seen in increasing order."""
    seen: set[tuple[str, int]] = set()
    jobs: dict[str, list[Record]] = {}
    for record in sorted(records, key=lambda r: (r.partition, r.offset)):
        if (record.key, record.seq) in seen:
            continue
        seen.add((record.key, record.seq))
        jobs.setdefault(record.key, []).append(record)
    for job, events in jobs.items():
        assert [e.seq for e in events] == list(range(1, len(events) + 1)), (
            job,
            [(e.seq, e.kind) for e in events],
        )
    return jobs


def event_schemas() -> dict[str, dict[str, Any]]:
    """The JSON Schema of each event type, from docs/events.md: ``common`` and each
    ``dev.onceflow.<kind>`` section's block."""
    import re
    from pathlib import Path

    text = (Path(__file__).resolve().parents[2] / "docs" / "events.md").read_text()
    found: dict[str, dict[str, Any]] = {}
    for title, block in re.findall(r"^### (.+?)\n\n```json\n(.*?)\n```", text, re.M | re.S):
        name = "common" if title == "Common fields" else title.strip("`")
        found[name] = orjson.loads(block)
    return found


def check_schema(record: Record, schemas: dict[str, dict[str, Any]]) -> None:
    """The record's data is valid against the common schema and its type's."""
    import jsonschema

    jsonschema.validate(record.data, schemas["common"])
    jsonschema.validate(record.data, schemas[record.headers["ce_type"].decode()])
