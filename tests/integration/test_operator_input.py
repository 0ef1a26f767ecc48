"""Operator input, one rule below every front end (issue 23, console and admin items):
the empty bulk filter and the send-event checks are the store's, so the console, the
admin API and the CLI refuse the same things with the same words; and whatever the
console or the admin API parse answers a 4xx in their one error shape, never a 500."""

from __future__ import annotations

import pytest
import sqlalchemy as sa
from fastapi.testclient import TestClient

from console import create_app as console_app
from onceflow.envelope import JobEnvelope
from onceflow.vocabulary import BulkAction
from producers.api import create_app as ingest_app
from producers.models import ErrorBody
from tests.acceptance.test_demo import run_cli
from tests.conftest import settings_env
from tests.integration.test_admin_http import NoKafka
from tests.integration.test_console import csrf_of
from workflow_engine.model import Delivery
from workflow_engine.store import operations
from workflow_engine.store.views import describe_instance
from workflow_engine.store.writes import create_instances

BAD_TYPES = ["not valid!", "x" * 201, "spaced type", "tab\there"]


@pytest.fixture
def instances(db):
    for n, job_id in enumerate(("in_1", "in_2", "other_1")):
        workflow = "approval-workflow" if job_id.startswith("in_") else "order-workflow"
        create_instances(db, [Delivery(JobEnvelope(job_id, workflow, {}), "t", 0, n)])
    return db


def _console(settings, db) -> TestClient:
    app = console_app(settings, db)
    return TestClient(app, base_url="http://testserver", raise_server_exceptions=False)


def _events(db) -> int:
    with db.connect() as conn:
        return conn.execute(sa.text("SELECT count(*) FROM onceflow_events")).scalar_one()


def _bulk_operations(db) -> int:
    with db.connect() as conn:
        return conn.execute(sa.text("SELECT count(*) FROM onceflow_bulk_operations")).scalar_one()


def test_the_console_refuses_a_bulk_operation_with_an_empty_filter(settings, instances):
    client = _console(settings, instances)
    token = csrf_of(client, "/instances")
    for form in ({"action": "terminate"}, {"action": "terminate", "confirm": "yes"}):
        refused = client.post("/bulk", data={"csrf_token": token, **form}, follow_redirects=False)
        assert refused.status_code == 400, (refused.status_code, refused.text[:300])
        assert "the empty filter would apply it to every instance" in refused.text
    assert _bulk_operations(instances) == 0
    assert {describe_instance(instances, j).status for j in ("in_1", "in_2", "other_1")} == {
        "queued"
    }


def test_the_empty_filter_is_refused_by_the_store_and_so_by_every_front_end(settings, instances):
    from workflow_engine.store.views import InstanceFilter

    with pytest.raises(operations.EmptyFilter, match="narrow it"):
        operations.start_bulk(instances, BulkAction.PAUSE, InstanceFilter.parse(" , "))
    with TestClient(ingest_app(settings, NoKafka())) as api:
        for body in ({"filter": ","}, {"filter": " ,", "dry_run": True}):
            refused = api.post("/v1/instances/bulk/pause", json=body)
            assert refused.status_code == 400 and refused.json()["error"] == "invalid_filter"
            assert "narrow it" in refused.json()["message"]
    cli = run_cli("instances", "pause", "--filter", ",", "--yes", env=settings_env(settings))
    assert cli.returncode == 1 and "narrow it" in cli.stderr and "Traceback" not in cli.stderr
    assert _bulk_operations(instances) == 0


def test_the_console_refuses_the_event_types_the_api_refuses(settings, instances):
    client = _console(settings, instances)
    token = csrf_of(client, "/instances/in_1")
    for event_type in BAD_TYPES:
        form = {"csrf_token": token, "event_type": event_type, "payload": "{}", "confirm": "yes"}
        sent = client.post("/instances/in_1/send-event", data=form, follow_redirects=False)
        assert sent.status_code == 400, (event_type, sent.status_code)
    big = {"csrf_token": token, "event_type": "ok", "confirm": "yes"}
    sent = client.post(
        "/instances/in_1/send-event", data={**big, "payload": '"' + "x" * 70000 + '"'}
    )
    assert sent.status_code == 400 and "at most 65536" in sent.text
    assert _events(instances) == 0


def test_send_event_is_checked_by_one_rule_for_the_api_the_console_and_the_cli(settings, instances):
    with pytest.raises(operations.InvalidEvent, match="use letters, digits"):
        operations.send_event(instances, "approval-workflow", "in_1", "not valid!")
    refusals = [
        ({"type": "not valid!"}, "type", "use letters, digits"),
        ({"type": "x" * 201}, "type", "at most 200"),
        ({"type": "ok", "payload": "x" * 70000}, "payload", "at most 65536"),
        ({"type": "ok", "payload": {"a\x00": 1}}, "payload", "NUL"),
        ({"type": "ok", "payload": ["\x00"]}, "payload", "NUL"),
        ({"type": "ok", "payload": 10**30}, "payload", "64-bit"),
    ]
    with TestClient(ingest_app(settings, NoKafka())) as api:
        url = "/v1/instances/approval-workflow/in_1/events"
        for body, field, words in refusals:
            refused = api.post(url, json=body)
            assert refused.status_code == 422, (body, refused.text)
            answer = refused.json()
            assert set(answer) == set(ErrorBody.model_fields)
            assert answer["fields"][0]["field"] == f"body.{field}" and words in answer["message"]
        infinite = api.post(
            url,
            content=b'{"type": "ok", "payload": [1e999]}',
            headers={"content-type": "application/json"},
        )
        # refused as a job's params are: a number JSON's parsers read as infinity
        assert infinite.status_code == 400 and "infinity" in infinite.json()["message"]
        assert api.post(url, json={"type": "approved", "payload": {"by": "ops"}}).status_code == 202
    cli = run_cli(
        "instances", "send-event", "approval-workflow", "in_2", "not valid!", "{}",
        env=settings_env(settings),
    )  # fmt: skip
    assert cli.returncode == 1 and "use letters, digits" in cli.stderr
    assert "Traceback" not in cli.stderr
    assert _events(instances) == 1


def test_odd_input_is_a_4xx_page_in_the_console_and_a_4xx_error_body_in_the_api(
    settings, instances
):
    client = _console(settings, instances)
    token = csrf_of(client, "/instances")
    pages = [
        client.get("/instances/%00"),
        client.get("/instances/in_1?done=%00"),
        client.get("/bulk/not-a-number"),
        client.get("/bulk/99999999999999999999"),
        client.get("/dead-letters?at=0@-5"),
        client.post("/bulk", data={"csrf_token": token, "action": "pause", "workflow": "\x00"}),
        client.post("/instances/%00/pause", data={"csrf_token": token}),
        client.post("/bulk", data={"csrf_token": token, "action": "explode", "workflow": "w"}),
    ]
    for page in pages:
        assert 400 <= page.status_code < 500, (page.request.url, page.status_code)
        assert page.headers["content-type"].startswith("text/html"), page.request.url
    with TestClient(ingest_app(settings, NoKafka())) as api:
        answers = [
            api.post("/v1/instances/bulk/pause", json={"filter": "prefix=\x00"}),
            api.post("/v1/instances/bulk/pause", json={"filter": "colour=red"}),
            api.get("/v1/instances/bulk/not-a-number"),
            api.get("/v1/instances/bulk/99999999999999999999"),
            api.post("/v1/instances/approval-workflow/in_1/events", json={"type": 5}),
        ]
    for answer in answers:
        assert 400 <= answer.status_code < 500, (answer.request.url, answer.status_code)
        assert set(answer.json()) == set(ErrorBody.model_fields), answer.json()
