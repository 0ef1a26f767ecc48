"""A job's callback at each door (ingest's 422, the envelope, the worker's dead letter),
a workflow's subscriptions at registration, and which events become deliveries."""

from __future__ import annotations

import orjson
import pytest

from onceflow.envelope import JobEnvelope
from onceflow.errors import ConfigurationError, InvalidEnvelope
from onceflow.vocabulary import DeadLetterReason, WebhookDeadReason
from onceflow.webhooks import WebhookEndpoint
from producers.models import RequestError, parse_jobs
from streams.records import RawRecord, classify
from tests.unit.test_webhooks_config import SECRET
from workflow_engine.engine.webhook_dispatcher import DispatcherConfig
from workflow_engine.engine.webhook_events import deliveries_for, parse_event
from workflow_engine.model import Registry, TaskDef, WebhookSubscription, WorkflowDef


def _registry(*subscriptions: WebhookSubscription) -> Registry:
    async def flow(ctx, params):
        return None

    r = Registry()
    r.add_workflow(WorkflowDef(flow, "flow", "1", webhooks=subscriptions))
    r.add_task(TaskDef("mail", lambda params: None))
    return r


def test_ingest_refuses_a_callback_that_is_a_url_or_unknown():
    known = frozenset({"billing"})
    [job] = parse_jobs(b'{"workflow":"flow","callback":"billing"}', 10, 1000, None, known)
    assert job.callback == "billing"
    with pytest.raises(RequestError) as caught:
        parse_jobs(b'{"workflow":"flow","callback":"payroll"}', 10, 1000, None, known)
    assert (caught.value.status, caught.value.body.error) == (422, "unknown_callback")
    assert "payroll" in caught.value.body.message
    with pytest.raises(RequestError) as caught:
        parse_jobs(b'{"jobs":[{"workflow":"flow","callback":"https://x.example/"}]}', 10, 1000)
    assert caught.value.status == 422
    assert caught.value.body.fields[0].field == "jobs[0].callback"


def test_the_envelope_carries_the_callback_and_refuses_a_url():
    env = JobEnvelope("j1", "flow", {}, callback="billing")
    assert orjson.loads(env.encode())["callback"] == "billing"
    assert JobEnvelope.decode(env.key(), env.encode(), env.headers()).callback == "billing"
    assert "callback" not in orjson.loads(JobEnvelope("j1", "flow", {}).encode())
    bad = b'{"job_id":"j1","workflow":"flow","params":{},"callback":"http://169.254.169.254/"}'
    with pytest.raises(InvalidEnvelope) as caught:
        JobEnvelope.decode(b"j1", bad)
    assert caught.value.reason == DeadLetterReason.INVALID_CALLBACK


def test_the_worker_dead_letters_an_unknown_callback_and_one_on_a_task():
    records = [
        JobEnvelope("ok", "flow", {}, callback="billing"),
        JobEnvelope("unknown", "flow", {}, callback="payroll"),
        JobEnvelope("task", "mail", {}, callback="billing"),
    ]
    raw = [RawRecord("jobs", 0, n, e.key(), e.encode(), e.headers()) for n, e in enumerate(records)]
    deliveries, dead = classify(raw, 1 << 20, _registry(), frozenset({"billing"}))
    assert [d.envelope.job_id for d in deliveries] == ["ok"]
    assert [(d.job_id, d.reason) for d in dead] == [
        ("unknown", DeadLetterReason.UNKNOWN_CALLBACK),
        ("task", DeadLetterReason.INVALID_CALLBACK),
    ]


def test_subscriptions_are_checked_against_the_configured_endpoints():
    r = _registry(WebhookSubscription("billing"), WebhookSubscription("audit", ("step.failed",)))
    r.check_webhooks({"billing", "audit"})
    with pytest.raises(ConfigurationError, match="'flow' -> 'audit'"):
        r.check_webhooks({"billing"})
    with pytest.raises(ValueError, match="unknown event kind"):
        WebhookSubscription("audit", ("step.exploded",))
    with pytest.raises(ValueError, match="never a URL"):
        WebhookSubscription("https://evil.example/")


def _event(kind: str, job_id: str = "j1", seq: int = 1, **extra_headers: bytes):
    headers = {
        "ce_specversion": b"1.0",
        "ce_id": f"{job_id}:{seq}".encode(),
        "ce_type": f"dev.onceflow.{kind}".encode(),
        "ce_jobid": job_id.encode(),
        "ce_workflow": b"flow",
        "ce_sequence": str(seq).encode(),
        "ce_time": b"2026-12-01T10:00:00+00:00",
        **extra_headers,
    }
    value = orjson.dumps({"job_id": job_id, "sequence": seq, "n": 1})
    return list(headers.items()), value


def test_parse_event_builds_the_standard_webhooks_payload_around_the_exact_data():
    headers, value = _event("instance.complete")
    event = parse_event(headers, value)
    assert event is not None and (event.event_id, event.kind, event.sequence) == (
        "j1:1",
        "instance.complete",
        1,
    )
    assert orjson.loads(event.body) == {
        "type": "dev.onceflow.instance.complete",
        "timestamp": "2026-12-01T10:00:00+00:00",
        "data": orjson.loads(value),
    }
    assert event.body.endswith(',"data":' + value.decode() + "}")
    assert parse_event(*_event("instance.exploded")) is None
    assert parse_event(headers, b"[1]") is None
    assert parse_event(headers, None) is None
    assert parse_event([(k, v) for k, v in headers if k != "ce_sequence"], value) is None


def test_events_of_derived_job_ids_are_read_and_ids_off_the_alphabet_are_not():
    """A later run's child (``p__charge~run2``), a fork, a schedule tick's child: ids
    the system derives, up to 200 characters, are delivered like a client's (they were
    skipped, so a child's webhooks stopped at run 1: found in review); an id no part
    of onceflow gives is not."""
    for job_id in ("p__charge~run2", "o~fork1", "nightly@2026-12-01T10:00:00Z__c", "d" * 199 + "~"):
        event = parse_event(*_event("instance.complete", job_id, 12))
        assert event is not None and event.job_id == job_id
    for job_id in ("bad id", "x" * 101, "d" * 200 + "~"):
        assert parse_event(*_event("instance.complete", job_id)) is None


def test_deliveries_follow_subscriptions_kinds_and_callbacks():
    endpoints = {
        "billing": WebhookEndpoint(url="https://b.example/", secret=SECRET),
        "audit": WebhookEndpoint(url="https://a.example/", secret=SECRET, kinds=("step.failed",)),
    }
    registry = _registry(WebhookSubscription("audit"))
    events = [
        parse_event(*_event("instance.started", "j1", 1)),
        parse_event(*_event("step.failed", "j1", 2)),
        parse_event(*_event("instance.complete", "j1", 3)),
        parse_event(*_event("instance.complete", "j2", 1)),
        parse_event(*_event("instance.complete", "gone", 1)),
    ]
    callbacks = {("j1", None): "billing", ("j2", None): "retired"}
    rows = deliveries_for([e for e in events if e], callbacks, registry, endpoints)
    assert [(r.event_id, r.endpoint, r.dead_reason) for r in rows] == [
        ("j1:2", "audit", None),  # the workflow's subscription: the endpoint's kinds
        ("j1:3", "billing", None),  # the job's callback: the final kinds by default
        ("j2:1", "retired", WebhookDeadReason.UNKNOWN_ENDPOINT),  # no longer configured
    ]


def test_the_lease_must_outlast_an_attempt():
    fields = {
        "bootstrap_servers": "x",
        "events_topic": "e",
        "consumer_group": "g",
        "concurrency": 1,
        "connect_timeout": 1.0,
        "read_timeout": 1.0,
        "attempt_timeout": 10.0,
        "backoff_base": 1.0,
        "backoff_max": 60.0,
        "retry_seconds": 600.0,
        "poll_interval": 1.0,
    }
    with pytest.raises(ConfigurationError, match="lease_seconds"):
        DispatcherConfig(**fields, lease_seconds=10.5)
    config = DispatcherConfig(**fields, lease_seconds=30.0)
    delays = [config.backoff(attempt) for attempt in (1, 3, 20) for _ in range(200)]
    assert all(0 <= d <= 60.0 for d in delays)
    assert max(delays[:200]) <= 1.0 and max(delays[400:]) > 30  # full jitter, capped
