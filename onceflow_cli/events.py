"""``onceflow events tail``: read the lifecycle events topic (issue 25).

One line per event (``--json``: one JSON object), oldest first with
``--from-beginning``, else from now on. ``--job`` reads only the partition the job id's
key lands on (murmur2, as every onceflow producer partitions: ``onceflow.partitioning``)
and keeps that job's events; ``--workflow`` keeps one workflow's (by the ``ce_workflow``
header, without decoding the value). Events are printed as they come: a consumer that
needs each event once dedupes by ``(job id, sequence)``, as the README says.
"""

from __future__ import annotations

import uuid
from typing import Any

import click
import orjson
from confluent_kafka import OFFSET_BEGINNING, OFFSET_END, Consumer, TopicPartition

from onceflow.errors import ServiceUnavailable
from onceflow.event_reader import event_partitions
from onceflow.settings import get_settings
from onceflow.vocabulary import EVENT_TYPE_PREFIX


@click.group("events")
def events() -> None:
    """Lifecycle events on the events topic (ONCEFLOW_EVENTS_TOPIC)."""


@events.command("tail")
@click.option("--job", "job_id", default=None, help="Only this job id's events (its partition).")
@click.option("--workflow", default=None, help="Only this workflow's events.")
@click.option("--from-beginning", is_flag=True, help="Start at the oldest event kept.")
@click.option("--limit", type=click.IntRange(min=1), default=None, help="Stop after N events.")
@click.option("--json", "as_json", is_flag=True, help="Print JSON lines instead of text.")
def tail(
    job_id: str | None,
    workflow: str | None,
    from_beginning: bool,
    limit: int | None,
    as_json: bool,
) -> None:
    """Print lifecycle events as they reach the topic (Ctrl-C stops)."""
    settings = get_settings()
    consumer = Consumer(
        {
            "bootstrap.servers": settings.kafka_bootstrap_servers,
            "group.id": f"onceflow-events-tail-{uuid.uuid4().hex[:8]}",
            "enable.auto.commit": False,
            "socket.connection.setup.timeout.ms": 5000,
        }
    )
    try:
        partitions = event_partitions(consumer, settings.events_topic, job_id)
        start = OFFSET_BEGINNING if from_beginning else OFFSET_END
        consumer.assign([TopicPartition(settings.events_topic, p, start) for p in partitions])
        printed = 0
        while limit is None or printed < limit:
            msg = consumer.poll(0.5)
            if msg is None:
                continue
            if msg.error() is not None:
                raise ServiceUnavailable(f"reading {settings.events_topic}: {msg.error()}")
            headers = _headers(msg)
            if not _wanted(msg.key(), headers, job_id, workflow):
                continue
            click.echo(_render(msg, headers, as_json))
            printed += 1
    except KeyboardInterrupt:
        pass
    finally:
        consumer.close()


def _headers(msg: Any) -> dict[str, bytes]:
    return {name: value for name, value in (msg.headers() or []) if isinstance(value, bytes)}


def _wanted(
    key: bytes | None, headers: dict[str, bytes], job_id: str | None, workflow: str | None
) -> bool:
    if job_id is not None and key != job_id.encode():
        return False
    return workflow is None or headers.get("ce_workflow") == workflow.encode()


def _render(msg: Any, headers: dict[str, bytes], as_json: bool) -> str:
    data = orjson.loads(msg.value())
    if as_json:
        attributes = {
            k.removeprefix("ce_"): v.decode() for k, v in headers.items() if k.startswith("ce_")
        }
        doc = {"partition": msg.partition(), "offset": msg.offset(), "ce": attributes, "data": data}
        return orjson.dumps(doc).decode()
    kind = headers.get("ce_type", b"").decode().removeprefix(EVENT_TYPE_PREFIX)
    fields = (data.get("time", "-"), data.get("job_id"), f"#{data.get('sequence')}", kind)
    line = "  ".join(str(f) for f in (*fields, data.get("status")))
    step = data.get("step")
    if step:
        where = f"position {step.get('position')}, attempt {step.get('attempt')}"
        line += f"  step {step.get('name')!r} ({where})"
    if data.get("until"):
        line += f"  until {data['until']}"
    if data.get("event_type"):
        line += f"  for {data['event_type']!r}"
    if data.get("error"):
        line += f"  error: {' '.join(str(data['error']).split())[:200]}"
    return line
