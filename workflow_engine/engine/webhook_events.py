"""From lifecycle events on the events topic to webhook deliveries: pure functions.

An event is a Kafka record in CloudEvents' binary mode (issue 25's contract): the
``ce_*`` headers say what it is, the value is the event's JSON data. A receiver gets
the Standard Webhooks payload shape, the data byte for byte as published::

    {"type": "dev.onceflow.instance.complete", "timestamp": "<ce_time>", "data": {...}}

with ``webhook-id`` the event's id (``<job_id>:<sequence>``, the same on every attempt).
"""

from __future__ import annotations

from collections.abc import Iterable, Mapping, Sequence
from dataclasses import dataclass
from typing import Any

import orjson

from onceflow.ids import MAX_DERIVED_JOB_ID, is_derived_job_id, is_valid_job_id
from onceflow.vocabulary import EVENT_TYPE_PREFIX, WebhookDeadReason
from onceflow.webhooks import EVENT_KINDS, FINAL_KINDS, WebhookEndpoint
from workflow_engine.model import Registry
from workflow_engine.store.writes import NewDelivery


@dataclass(frozen=True, slots=True)
class LifecycleEvent:
    event_id: str
    kind: str
    job_id: str
    workflow: str
    sequence: int
    body: str  # the webhook payload, exactly as it will be sent and signed
    run: int | None = None  # the run the event is of (id reuse); None: not named


def _headers(headers: Iterable[tuple[str, Any]] | None) -> dict[str, str]:
    found: dict[str, str] = {}
    for name, raw in headers or ():
        if raw is None:
            continue
        try:
            found[name] = raw.decode() if isinstance(raw, bytes) else str(raw)
        except UnicodeDecodeError:
            continue
    return found


#: The longest event id (``<job_id>:<sequence>``): a derived job id's, and its number.
MAX_EVENT_ID = 220


def _job_id_of_ours(job_id: str) -> bool:
    """A job id onceflow gives: a client's, or one the system derives (a tick's, a
    fork's, a batch run's, a later run's child: ``onceflow.ids``)."""
    if is_valid_job_id(job_id):
        return True
    return is_derived_job_id(job_id) and 0 < len(job_id) <= MAX_DERIVED_JOB_ID


def parse_event(
    headers: Iterable[tuple[str, Any]] | None, value: bytes | None
) -> LifecycleEvent | None:
    """The event a record carries, or None when it is not one this code reads (an
    unknown ``ce_type``, a missing attribute, a value that is not a JSON object)."""
    h = _headers(headers)
    ce_type = h.get("ce_type", "")
    kind = ce_type.removeprefix(EVENT_TYPE_PREFIX)
    job_id = h.get("ce_jobid") or h.get("ce_subject") or ""
    event_id, workflow = h.get("ce_id", ""), h.get("ce_workflow", "")
    if not ce_type.startswith(EVENT_TYPE_PREFIX) or kind not in EVENT_KINDS:
        return None
    if not (event_id and workflow and _job_id_of_ours(job_id)) or len(event_id) > MAX_EVENT_ID:
        return None
    try:
        sequence = int(h.get("ce_sequence", ""))
        if value is None or not isinstance(doc := orjson.loads(value), dict):
            return None
        data = value.decode()
    except (ValueError, UnicodeDecodeError):
        return None
    run = doc.get("run")
    if not isinstance(run, int) or isinstance(run, bool) or run < 1:
        run = None
    head = orjson.dumps({"type": ce_type, "timestamp": h.get("ce_time", "")}).decode()
    body = f'{head[:-1]},"data":{data}}}'
    return LifecycleEvent(event_id, kind, job_id, workflow, sequence, body, run)


def _wanted(
    registry: Registry,
    endpoints: Mapping[str, WebhookEndpoint],
    event: LifecycleEvent,
    callback: str | None,
) -> list[str]:
    """The endpoints that get ``event``: the workflow's subscriptions (their kinds, or
    the endpoint's) and the job's callback (the endpoint's kinds), each once."""
    names: list[str] = []

    def consider(name: str, kinds: Sequence[str] | None) -> None:
        endpoint = endpoints.get(name)
        if kinds is None:
            kinds = endpoint.kinds if endpoint is not None else FINAL_KINDS
        if event.kind in kinds and name not in names:
            names.append(name)

    for subscription in registry.webhooks(event.workflow):
        consider(subscription.endpoint, subscription.kinds)
    if callback is not None:
        consider(callback, None)
    return names


def deliveries_for(
    events: Sequence[LifecycleEvent],
    callbacks: Mapping[tuple[str, int | None], str | None],
    registry: Registry,
    endpoints: Mapping[str, WebhookEndpoint],
) -> list[NewDelivery]:
    """The deliveries ``events`` make. ``callbacks``: each existing instance's callback
    by (job id, run), the run's own (an event of an instance not in it delivers
    nothing: it is gone). An
    endpoint no longer configured gets its delivery created dead (visible, re-drivable
    once it is configured again)."""
    rows: list[NewDelivery] = []
    for event in events:
        key = (event.job_id, event.run)
        if key not in callbacks:
            continue
        for name in _wanted(registry, endpoints, event, callbacks[key]):
            dead = None if name in endpoints else WebhookDeadReason.UNKNOWN_ENDPOINT
            rows.append(
                NewDelivery(
                    event.event_id,
                    name,
                    event.job_id,
                    event.workflow,
                    event.kind,
                    event.sequence,
                    event.body,
                    dead,
                )
            )
    return rows
