"""Signed webhooks on real Kafka and PostgreSQL, delivered to a real HTTP server on
loopback (tests/integration/webhook_receiver.py).

Until the outbox relay is merged, each test produces the lifecycle events itself,
exactly as issue 25's contract says the relay does (CloudEvents binary mode), for
instances that exist in PostgreSQL (created by the worker's own insert). The receiver
checks every signature with the ``standardwebhooks`` package's ``Webhook.verify``.
"""

from __future__ import annotations

import asyncio
import base64
import threading
import uuid
from collections.abc import Iterator
from contextlib import contextmanager
from dataclasses import replace
from datetime import UTC, datetime
from typing import Any

import orjson
import pytest
import sqlalchemy as sa
from confluent_kafka.admin import AdminClient, NewTopic
from standardwebhooks import Webhook

from onceflow import failpoints
from onceflow.envelope import HEADER_JOB_ID, JobEnvelope
from onceflow.vocabulary import WebhookDeadReason
from onceflow.webhooks import WebhookEndpoint
from onceflow_cli.render import render_instance
from tests.integration.kafka_helpers import committed_offsets, produce
from tests.integration.webhook_receiver import Answer, start_receiver, wait_for
from workflow_engine.engine.webhook_dispatcher import DispatcherConfig, WebhookDispatcher
from workflow_engine.model import Delivery, Registry, WebhookSubscription, WorkflowDef
from workflow_engine.store.operations import redrive_webhooks
from workflow_engine.store.views import describe_instance, job_trace
from workflow_engine.store.writes import create_instances

SECRET = "whsec_" + base64.b64encode(b"test-secret-of-32-bytes-exactly!").decode()
FAST = {
    "concurrency": 4,
    "connect_timeout": 0.3,
    "read_timeout": 0.4,
    "attempt_timeout": 0.5,
    "backoff_base": 0.05,
    "backoff_max": 0.2,
    "retry_seconds": 30.0,
    "lease_seconds": 2.0,
    "poll_interval": 0.2,
}


@pytest.fixture(autouse=True)
def _disarm():
    yield
    failpoints.disarm_all()


@pytest.fixture
def events_topic(settings) -> str:
    # its own two-partition topic (the settings fixture's events topic has the default count)
    topic = settings.jobs_topic.replace(".jobs", ".webhook-events")
    admin = AdminClient({"bootstrap.servers": settings.kafka_bootstrap_servers})
    for future in admin.create_topics([NewTopic(topic, 2, 1)]).values():
        future.result(30)
    return topic


@pytest.fixture
def receiver():
    r = start_receiver()
    yield r
    r.stop()


def endpoint(url: str, **fields: Any) -> WebhookEndpoint:
    return WebhookEndpoint(url=url, secret=SECRET, **fields)


def config(settings, topic: str, **changes: Any) -> DispatcherConfig:
    return DispatcherConfig(
        bootstrap_servers=settings.kafka_bootstrap_servers,
        events_topic=topic,
        consumer_group=f"wh-{uuid.uuid4().hex[:8]}",
        **{**FAST, **changes},
    )


def registry(*subscriptions: WebhookSubscription) -> Registry:
    async def flow(ctx, params):
        return None

    r = Registry()
    r.add_workflow(WorkflowDef(flow, "wh-flow", "1", webhooks=subscriptions))
    return r


def make_instances(db, jobs: dict[str, str | None], workflow: str = "wh-flow") -> None:
    """One instance per job id (value: its callback), by the worker's own insert."""
    create_instances(
        db,
        [
            Delivery(JobEnvelope(job_id, workflow, {}, callback=callback), "jobs", 0, n)
            for n, (job_id, callback) in enumerate(jobs.items())
        ],
    )


def event(job_id: str, seq: int, kind: str, workflow: str = "wh-flow", **data: Any):
    """A lifecycle event's Kafka record, as the contract has the relay write it."""
    at = datetime.now(UTC).isoformat()
    doc = {
        "job_id": job_id,
        "workflow": workflow,
        "version": "1",
        "sequence": seq,
        "time": at,
        "status": kind.rsplit(".", 1)[-1],
        "kafka": None,
        **data,
    }
    headers = [
        ("ce_specversion", b"1.0"),
        ("ce_id", f"{job_id}:{seq}".encode()),
        ("ce_source", f"/onceflow/workflows/{workflow}".encode()),
        ("ce_type", f"dev.onceflow.{kind}".encode()),
        ("ce_subject", job_id.encode()),
        ("ce_time", at.encode()),
        ("content-type", b"application/json"),
        ("ce_jobid", job_id.encode()),
        ("ce_workflow", workflow.encode()),
        ("ce_workflowversion", b"1"),
        ("ce_sequence", str(seq).encode()),
        (HEADER_JOB_ID, job_id.encode()),
    ]
    return job_id.encode(), orjson.dumps(doc), headers


@contextmanager
def running(*dispatchers: WebhookDispatcher) -> Iterator[None]:
    """The dispatchers on an event loop in a thread, stopped (and waited for) on exit."""
    loop = asyncio.new_event_loop()
    thread = threading.Thread(target=loop.run_forever, daemon=True)
    thread.start()

    async def start() -> None:
        for d in dispatchers:
            d.start()

    asyncio.run_coroutine_threadsafe(start(), loop).result(10)
    try:
        yield
    finally:
        failpoints.disarm_all()

        async def stop() -> None:
            for d in dispatchers:
                await d.stop()

        asyncio.run_coroutine_threadsafe(stop(), loop).result(30)
        loop.call_soon_threadsafe(loop.stop)
        thread.join(10)


def deliveries(db, job_id: str) -> list[Any]:
    with db.connect() as conn:
        return conn.execute(
            sa.text("SELECT * FROM onceflow_webhook_deliveries WHERE job_id = :j ORDER BY id"),
            {"j": job_id},
        ).all()


def attempts(db, job_id: str) -> list[Any]:
    with db.connect() as conn:
        return conn.execute(
            sa.text(
                "SELECT a.* FROM onceflow_webhook_attempts a"
                " JOIN onceflow_webhook_deliveries d ON d.id = a.delivery_id"
                " WHERE d.job_id = :j ORDER BY a.attempt"
            ),
            {"j": job_id},
        ).all()


def settled(db, job_id: str, *statuses: str):
    """The job's deliveries once every one is in ``statuses`` (else None)."""
    rows = deliveries(db, job_id)
    return rows if rows and all(r.status in statuses for r in rows) else None


def test_retried_until_delivered_once_signed_and_deduplicated(settings, db, events_topic, receiver):
    """(a) Three 500s, then a 200: four attempts recorded, exactly one success, every
    signature verified by the standardwebhooks library; the relay's duplicate of the
    final event collapses; the subscriptions choose which events are delivered; the
    offsets are committed once the deliveries are."""
    receiver.script = [Answer(500), Answer(500), Answer(500), Answer(200)]
    audit = start_receiver()
    try:
        endpoints = {
            "recv": endpoint(receiver.url, allow_private=True),
            "audit": endpoint(audit.url, allow_private=True),
        }
        make_instances(db, {"job-a": "recv", "job-b": None})
        records = [
            event("job-a", 1, "instance.started"),  # not a final kind: nothing
            event("job-a", 2, "step.completed", step={"position": 0, "name": "s", "attempt": 1}),
            event("job-a", 3, "instance.complete", result={"n": 12345678901234567890}),
            event("job-a", 3, "instance.complete", result={"n": 12345678901234567890}),
            event("job-b", 1, "step.completed"),  # the workflow's subscription only
            event("job-gone", 1, "instance.complete"),  # no instance: nothing
        ]
        produce(settings.kafka_bootstrap_servers, events_topic, records)
        subscriptions = registry(WebhookSubscription("audit", ("step.completed",)))
        dispatcher = WebhookDispatcher(
            db, subscriptions, endpoints, config(settings, events_topic), "d1"
        )
        with running(dispatcher):
            final = wait_for(lambda: settled(db, "job-a", "delivered"), what="delivered")
            wait_for(lambda: audit.count() == 2, what="the audit endpoint's two events")
            offsets = committed_offsets(
                settings.kafka_bootstrap_servers,
                dispatcher.config.consumer_group,
                events_topic,
                2,
            )
    finally:
        audit.stop()
    assert [(r.endpoint, r.kind, r.attempts) for r in final] == [
        ("audit", "step.completed", 1),
        ("recv", "instance.complete", 4),
    ]
    tried = [a for a in attempts(db, "job-a") if a.delivery_id == final[1].id]
    assert [(a.attempt, a.response_code, a.outcome) for a in tried] == [
        (1, 500, "failed"),
        (2, 500, "failed"),
        (3, 500, "failed"),
        (4, 200, "delivered"),
    ]
    assert all(a.latency_ms is not None and a.latency_ms >= 0 for a in tried)
    assert receiver.count() == 4
    for got in receiver.requests:
        payload = Webhook(SECRET).verify(got.body, got.headers)
        assert got.headers["webhook-id"] == "job-a:3"
        assert payload["type"] == "dev.onceflow.instance.complete"
        assert payload["data"]["job_id"] == "job-a"
    # The data byte for byte as published: the 20-digit integer is not a float.
    assert b'"result":{"n":12345678901234567890}' in receiver.requests[-1].body
    assert {d.kind for d in deliveries(db, "job-b")} == {"step.completed"}
    assert sum(o for o in offsets.values() if o >= 0) == len(records)
    view = describe_instance(db, "job-a")
    assert view is not None and view.callback == "recv"
    assert [(d.endpoint, d.status, d.attempts, d.last_code) for d in view.deliveries] == [
        ("audit", "delivered", 1, 200),
        ("recv", "delivered", 4, 200),
    ]
    described = render_instance(view)  # onceflow instances describe
    assert "callback: recv" in described
    assert "webhook recv instance.complete (job-a:3): delivered, 4 attempts, last HTTP 200" in (
        described
    )
    trace = [t for t in job_trace(db, "job-a") if t.layer == "webhooks"]
    assert [t.event for t in trace][-4:] == ["webhook failed"] * 3 + ["webhook delivered"]


def test_a_refused_address_is_never_contacted(settings, db, events_topic, receiver):
    """(b) Loopback without allow_private, by address and by a name that resolves to
    it: no connection reaches the server, the delivery is dead at once (refused)."""
    endpoints = {
        "by-address": endpoint(receiver.url),
        "by-name": endpoint(f"http://localhost:{receiver.port}/hooks"),
        "narrow": endpoint(receiver.url, allowed_cidrs=("10.0.0.0/8",)),
    }
    jobs = {"job-ip": "by-address", "job-name": "by-name", "job-narrow": "narrow"}
    make_instances(db, jobs)
    produce(
        settings.kafka_bootstrap_servers,
        events_topic,
        [event(job, 2, "instance.errored", error="boom") for job in jobs],
    )
    with running(WebhookDispatcher(db, registry(), endpoints, config(settings, events_topic), "d")):
        for job in jobs:
            wait_for(lambda job=job: settled(db, job, "dead"), what=f"{job} dead")
    for job in jobs:
        [row] = deliveries(db, job)
        assert (row.status, row.dead_reason, row.attempts) == ("dead", "refused_address", 1)
        [tried] = attempts(db, job)
        assert tried.outcome == "refused" and "loopback" in tried.error
    assert receiver.connections == 0 and receiver.count() == 0


def test_a_hanging_receiver_is_timed_out_and_retried(settings, db, events_topic, receiver):
    """(c) The first answer never comes in time: that attempt times out (bounded by the
    attempt timeout), the next is delivered."""
    receiver.script = [Answer(200, hang_seconds=5.0), Answer(200)]
    make_instances(db, {"job-hang": "recv"})
    produce(
        settings.kafka_bootstrap_servers,
        events_topic,
        [event("job-hang", 4, "instance.terminated")],
    )
    endpoints = {"recv": endpoint(receiver.url, allow_private=True)}
    with running(WebhookDispatcher(db, registry(), endpoints, config(settings, events_topic), "d")):
        wait_for(lambda: settled(db, "job-hang", "delivered"), what="delivered")
    first, second = attempts(db, "job-hang")
    assert (first.outcome, first.response_code) == ("failed", None)
    assert "timed out" in first.error and first.latency_ms < 1500
    assert (second.outcome, second.response_code) == ("delivered", 200)


def test_a_redirect_is_not_followed_and_redrive_delivers(settings, db, events_topic, receiver):
    """(d) A 302 is an attempt that failed, its target never contacted; once the retry
    window closes the delivery is dead. (f) Re-driven, it is delivered."""
    elsewhere = start_receiver()
    try:
        receiver.script = [Answer(302, location=elsewhere.url)]
        make_instances(db, {"job-302": "recv"})
        produce(
            settings.kafka_bootstrap_servers,
            events_topic,
            [event("job-302", 5, "instance.complete")],
        )
        endpoints = {"recv": endpoint(receiver.url, allow_private=True)}
        cfg = config(settings, events_topic, retry_seconds=0.6)
        with running(WebhookDispatcher(db, registry(), endpoints, cfg, "d")):
            [dead] = wait_for(lambda: settled(db, "job-302", "dead"), what="dead")
            tried = attempts(db, "job-302")
            assert dead.dead_reason == "retries_exhausted" and dead.last_code == 302
            assert tried and all(a.response_code == 302 for a in tried)
            assert elsewhere.connections == 0
            receiver.script = [Answer(204)]
            done = redrive_webhooks(db, 30.0, job_id="job-302")
            assert done.requeued == 1
            [row] = wait_for(lambda: settled(db, "job-302", "delivered"), what="re-driven")
    finally:
        elsewhere.stop()
    assert row.attempts == len(tried) + 1 and row.last_code == 204
    assert attempts(db, "job-302")[-1].attempt == len(tried) + 1
    assert receiver.count() == len(tried) + 1 and elsewhere.count() == 0


def test_two_dispatchers_never_send_the_same_attempt(settings, db, events_topic, receiver):
    """(e) Dispatcher A stops in the window between its claim and its record, past its
    lease; dispatcher B takes the delivery over as the next attempt.

    job-x: A stops after the claim, before sending; once it wakes (its lease gone) it
    must not send: the receiver sees only B's attempt. job-y: A stops after sending (a
    500), before recording: B's attempt 2 is delivered, and A's stale record is fenced
    out (the delivery stays delivered, attempt 1 stays lost, not a 500). A has two slots,
    both held by its stopped attempts, so the next claim is B's."""
    receiver.script = [Answer(500), Answer(200)]  # job-y's attempt 1, then B's attempts
    make_instances(db, {"job-x": "recv", "job-y": "recv"})
    before_send = failpoints.arm("webhooks.after_claim", job_id="job-x")
    before_record = failpoints.arm("webhooks.before_record", job_id="job-y")
    endpoints = {"recv": endpoint(receiver.url, allow_private=True)}
    cfg = config(settings, events_topic)
    a = WebhookDispatcher(db, registry(), endpoints, replace(cfg, concurrency=2), "dispatcher-a")
    b = WebhookDispatcher(db, registry(), endpoints, cfg, "dispatcher-b")
    with running(a):
        records = [event("job-x", 3, "instance.complete"), event("job-y", 3, "instance.complete")]
        produce(settings.kafka_bootstrap_servers, events_topic, records)
        before_send.wait_reached()
        before_record.wait_reached()
        with running(b):
            wait_for(lambda: settled(db, "job-x", "delivered"), what="job-x taken over")
            wait_for(lambda: settled(db, "job-y", "delivered"), what="job-y taken over")
            before_send.release()
            before_record.release()
    # Stopped: the stale attempts have ended (stop waits for the attempts in flight).
    x1, x2 = attempts(db, "job-x")
    y1, y2 = attempts(db, "job-y")
    assert [(t.owner, t.outcome) for t in (x1, x2, y1, y2)] == [
        ("dispatcher-a", "lost"),
        ("dispatcher-b", "delivered"),
        ("dispatcher-a", "lost"),
        ("dispatcher-b", "delivered"),
    ]
    assert "lease ran out" in x1.error and x1.response_code is None
    assert "lease ran out" in y1.error and y1.response_code is None  # not A's stale 500
    assert [(r.status, r.attempts) for r in deliveries(db, "job-x") + deliveries(db, "job-y")] == [
        ("delivered", 2),
        ("delivered", 2),
    ]
    # job-x's attempt 1 was never sent; job-y's was (the 500), then B's two attempts.
    ids = [r.headers["webhook-id"] for r in receiver.requests]
    assert ids[0] == "job-y:3" and sorted(ids[1:]) == ["job-x:3", "job-y:3"]


def test_the_intake_survives_a_failed_offset_commit(settings, db, events_topic, receiver):
    """A batch's deliveries are committed, then its offset commit fails (the consumer
    group rebalanced, the coordinator moved: a KafkaException; here the failpoint's
    error in that very place). The intake goes on: a later event still becomes a
    delivery, and the failed commit's offsets are committed with the next poll's."""
    make_instances(db, {"job-c1": "recv", "job-c2": "recv"})
    failed = failpoints.arm("webhooks.before_commit", "raise")
    endpoints = {"recv": endpoint(receiver.url, allow_private=True)}
    cfg = config(settings, events_topic)
    with running(WebhookDispatcher(db, registry(), endpoints, cfg, "d")):
        produce(
            settings.kafka_bootstrap_servers,
            events_topic,
            [event("job-c1", 3, "instance.complete")],
        )
        failed.wait_reached(10)
        wait_for(lambda: settled(db, "job-c1", "delivered"), what="job-c1 delivered")
        produce(
            settings.kafka_bootstrap_servers,
            events_topic,
            [event("job-c2", 3, "instance.complete")],
        )
        wait_for(lambda: settled(db, "job-c2", "delivered"), timeout=10, what="job-c2 delivered")
        # job-c1 and job-c2 hash to different partitions: the first commit's offset
        # is carried to the next commit, not left behind (a lag that never ends).
        committed = wait_for(
            lambda: (
                committed_offsets(
                    settings.kafka_bootstrap_servers, cfg.consumer_group, events_topic, 2
                )
                == {0: 1, 1: 1}
            ),
            timeout=10,
            what="both partitions' offsets committed",
        )
    assert committed
    assert sorted(r.headers["webhook-id"] for r in receiver.requests) == ["job-c1:3", "job-c2:3"]


def test_the_engine_runs_the_dispatcher_when_endpoints_are_configured(
    settings, db, events_topic, receiver
):
    """An EngineRunner with endpoints configured starts the dispatcher among its
    services: the workflow's instance runs to completion on the engine, and its final
    event (produced as the relay would) is delivered, signed, by the engine's
    dispatcher (the attempt's owner is the engine's). With ONCEFLOW_ENGINE_WEBHOOKS off
    the engine runs none."""
    from workflow_engine.engine.runner import EngineRunner

    make_instances(db, {"job-eng": "recv"})
    engine_settings = settings.model_copy(
        update={
            "engine_poll_interval_seconds": 0.1,
            "webhook_endpoints": {"recv": endpoint(receiver.url, allow_private=True)},
            "events_topic": events_topic,
            "webhook_consumer_group": f"wh-{uuid.uuid4().hex[:8]}",
            "webhook_attempt_timeout_seconds": 0.5,
            "webhook_lease_seconds": 2.0,
            "webhook_poll_interval_seconds": 0.2,
        }
    )
    off = EngineRunner(engine_settings.model_copy(update={"engine_webhooks": False}), registry())
    assert off.configs.webhooks is None
    off.db.dispose()

    async def main() -> None:
        runner = EngineRunner(engine_settings, registry(), db=db)
        task = asyncio.create_task(runner.run())
        try:
            await asyncio.to_thread(
                wait_for, lambda: describe_instance(db, "job-eng").status == "complete"
            )
            produce(
                settings.kafka_bootstrap_servers,
                events_topic,
                [event("job-eng", 3, "instance.complete", result=None)],
            )
            await asyncio.to_thread(
                wait_for, lambda: settled(db, "job-eng", "delivered"), what="delivered"
            )
        finally:
            runner.stop()
            await asyncio.wait_for(task, 30)

    asyncio.run(main())
    [tried] = attempts(db, "job-eng")
    assert tried.outcome == "delivered" and tried.owner.endswith(":webhooks")
    [got] = receiver.requests
    assert Webhook(SECRET).verify(got.body, got.headers)["data"]["job_id"] == "job-eng"


def test_the_redrive_command(settings, db, monkeypatch, capsys):
    """``onceflow webhooks redrive``: without a filter, or naming an endpoint that is not
    configured, one line on stderr and exit status 1, nothing re-queued; with --job,
    that job's dead delivery is pending again (due now), one line says how many, and
    the operators' audit trail has the re-drive."""
    import importlib
    import sys

    from workflow_engine.store.writes import NewDelivery, add_webhook_deliveries

    main = importlib.import_module("onceflow_cli.main")
    endpoints = {"recv": endpoint("http://127.0.0.1:9/hooks", allow_private=True)}
    monkeypatch.setattr(
        main, "_settings", lambda: settings.model_copy(update={"webhook_endpoints": endpoints})
    )
    make_instances(db, {"job-r1": "recv", "job-r2": "recv"})
    dead = WebhookDeadReason.RETRIES_EXHAUSTED  # created dead, as if retried out
    with db.begin() as conn:
        add_webhook_deliveries(
            conn,
            [
                NewDelivery(f"{j}:3", "recv", j, "wh-flow", "instance.complete", 3, "{}", dead)
                for j in ("job-r1", "job-r2")
            ],
            30.0,
        )

    def run(*args: str) -> tuple[int, str, str]:
        monkeypatch.setattr(sys, "argv", ["onceflow", "webhooks", "redrive", *args])
        code = 0
        try:
            main.main()
        except SystemExit as exc:
            code = int(exc.code or 0)
        out, err = capsys.readouterr()
        return code, out, err

    code, out, err = run()
    assert (code, out) == (1, "") and err.count("\n") == 1
    assert err.startswith("onceflow: name an endpoint or a job to re-drive")
    code, out, err = run("--endpoint", "nowhere")
    assert (code, out) == (1, "") and err.count("\n") == 1 and "'nowhere'" in err
    assert [r.status for r in deliveries(db, "job-r1") + deliveries(db, "job-r2")] == ["dead"] * 2
    assert run("--job", "job-r1") == (0, "re-queued 1 dead deliveries (1 jobs)\n", "")
    [row] = deliveries(db, "job-r1")
    assert (row.status, row.dead_reason, row.finished_at) == ("pending", None, None)
    assert [r.status for r in deliveries(db, "job-r2")] == ["dead"]
    assert run("--job", "job-r1") == (0, "re-queued 0 dead deliveries (0 jobs)\n", "")
    with db.connect() as conn:
        audited = conn.execute(
            sa.text(
                "SELECT count(*) FROM onceflow_operator_actions"
                " WHERE action = 'redrive' AND job_id = 'job-r1'"
            )
        ).scalar()
    assert audited == 2


def test_the_admin_redrive_route(settings, db):
    """``POST /v1/instances/{workflow}/{job_id}/webhooks/redrive``: a key without
    instances:control gets 403 and nothing moves; an unknown instance is 404 in the one
    error body shape; with the scope, the job's dead delivery is pending again."""
    import hashlib

    from fastapi.testclient import TestClient

    from onceflow.settings import ApiKey
    from producers.api import create_app
    from producers.models import ErrorBody
    from tests.integration.test_admin_http import NoKafka
    from workflow_engine.store.writes import NewDelivery, add_webhook_deliveries

    make_instances(db, {"job-h1": "recv"})
    with db.begin() as conn:
        dead = WebhookDeadReason.RETRIES_EXHAUSTED
        row = NewDelivery("job-h1:3", "recv", "job-h1", "wh-flow", "instance.complete", 3, "{}")
        add_webhook_deliveries(conn, [replace(row, dead_reason=dead)], 30.0)
    keys = [
        ApiKey(name="r", sha256=hashlib.sha256(b"reader").hexdigest(), scopes=["jobs:read"]),
        ApiKey(
            name="op", sha256=hashlib.sha256(b"operator").hexdigest(), scopes=["instances:control"]
        ),
    ]
    keyed = settings.model_copy(
        update={"auth_disabled": False, "api_keys": keys, "admin_api_enabled": True}
    )
    path = "/v1/instances/wh-flow/{}/webhooks/redrive"
    with TestClient(create_app(keyed, NoKafka())) as client:
        reader, op = {"Authorization": "Bearer reader"}, {"Authorization": "Bearer operator"}
        assert client.post(path.format("job-h1"), headers=reader).status_code == 403
        assert [r.status for r in deliveries(db, "job-h1")] == ["dead"]
        unknown = client.post(path.format("job-nope"), headers=op)
        assert unknown.status_code == 404 and set(unknown.json()) == set(ErrorBody.model_fields)
        done = client.post(path.format("job-h1"), headers=op)
        assert done.status_code == 200 and done.json() == {"job_id": "job-h1", "requeued": 1}
    assert [(r.status, r.dead_reason) for r in deliveries(db, "job-h1")] == [("pending", None)]
