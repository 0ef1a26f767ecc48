"""The console's pages and actions, server side: FastAPI's TestClient against a real,
migrated PostgreSQL (and Kafka for the lag and the dead-letter topic)."""

from __future__ import annotations

import re
import time

import pytest
import sqlalchemy as sa
from fastapi.testclient import TestClient

from console import create_app
from onceflow.envelope import JobEnvelope
from onceflow.keys import hash_key
from onceflow.settings import ApiKey
from onceflow.vocabulary import InstanceStatus
from workflow_engine.model import Delivery
from workflow_engine.store.views import describe_instance, step_results
from workflow_engine.store.writes import create_instances

READ_KEY, CONTROL_KEY = "ofk_test_reader", "ofk_test_operator"


def deliver(db, job_id, params=None, offset=0, workflow="order-workflow"):
    envelope = JobEnvelope(job_id, workflow, params or {}, "req-1")
    return create_instances(db, [Delivery(envelope, "jobs", 0, offset)])


@pytest.fixture
def keyed(settings):
    return settings.model_copy(
        update={
            "auth_disabled": False,
            "api_keys": [
                ApiKey(name="reader", sha256=hash_key(READ_KEY), scopes=["jobs:read"]),
                ApiKey(
                    name="operator",
                    sha256=hash_key(CONTROL_KEY),
                    scopes=["jobs:read", "instances:control"],
                ),
            ],
        }
    )


@pytest.fixture
def seeded(db):
    deliver(db, "order_0001", {"amount": 1}, offset=1)
    deliver(db, "order_0001", {"amount": 1}, offset=2)  # a duplicate
    deliver(db, "order_0002", {"amount": 2}, offset=3)
    deliver(db, "order_0002", {"amount": 99}, offset=4)  # a params mismatch
    deliver(db, "other_0003", {}, offset=5, workflow="noop-workflow")
    return db


def client_for(settings, db) -> TestClient:
    return TestClient(create_app(settings, db), base_url="http://testserver")


def csrf_of(client: TestClient, path: str = "/login") -> str:
    page = client.get(path)
    match = re.search(r'name="csrf_token" value="([^"]+)"', page.text)
    assert match, page.text[:500]
    return match.group(1)


def login(client: TestClient, key: str):
    token = csrf_of(client)
    return client.post(
        "/login", data={"csrf_token": token, "api_key": key, "next": "/"}, follow_redirects=False
    )


def test_login_sets_an_httponly_strict_cookie_and_unknown_keys_are_refused(keyed, db):
    client = client_for(keyed, db)
    assert client.get("/", follow_redirects=False).headers["location"] == "/login?next=/"
    assert login(client, "ofk_wrong").status_code == 401
    response = login(client, READ_KEY)
    assert response.status_code == 303
    cookie = next(
        h for h in response.headers.get_list("set-cookie") if h.startswith("onceflow_console_key=")
    )
    assert "HttpOnly" in cookie
    assert "SameSite=strict" in cookie or "SameSite=Strict" in cookie
    assert "Secure" not in cookie  # plain http here; https sets it
    assert client.get("/").status_code == 200


def test_login_over_https_sets_a_secure_cookie(keyed, db):
    client = TestClient(create_app(keyed, db), base_url="https://testserver")
    response = login(client, READ_KEY)
    cookie = next(
        h for h in response.headers.get_list("set-cookie") if h.startswith("onceflow_console_key=")
    )
    assert "Secure" in cookie


def test_login_refuses_an_open_redirect(keyed, db):
    client = client_for(keyed, db)
    token = csrf_of(client)
    response = client.post(
        "/login",
        data={"csrf_token": token, "api_key": READ_KEY, "next": "//evil.example/"},
        follow_redirects=False,
    )
    assert response.headers["location"] == "/"


def test_every_page_renders(settings, seeded):
    client = client_for(settings, seeded)
    overview = client.get("/")
    assert overview.status_code == 200
    assert 'hx-trigger="every 5s"' in overview.text
    assert "order-workflow" in overview.text and "noop-workflow" in overview.text
    assert 'id="lag-table"' in overview.text  # the lag of the test's own topic
    fragment = client.get("/overview/fragment")
    assert fragment.status_code == 200 and "<html" not in fragment.text
    listing = client.get("/instances")
    assert "order_0001" in listing.text and "other_0003" in listing.text
    assert re.search(r"<strong>3</strong> matching", listing.text)
    page = client.get("/instances/order_0002")
    assert page.status_code == 200
    assert "SELECT * FROM job_trace(&#39;order_0002&#39;);" in page.text
    assert 'id="timeline"' in page.text and "<li>" in page.text
    assert client.get("/instances/nope").status_code == 404
    assert client.get("/dead-letters").status_code == 200
    assert client.get("/bulk").status_code == 200
    for asset in ("/static/console.css", "/static/console.js", "/static/vendor/htmx/htmx.min.js"):
        assert client.get(asset).status_code == 200, asset


def test_the_instance_page_shows_what_each_step_returned(settings, seeded):
    with seeded.begin() as conn:
        conn.execute(
            sa.text(
                "INSERT INTO onceflow_steps (job_id, position, name, status, attempts, result,"
                " finished_at) VALUES ('order_0002', 0, 'reserve', 'complete', 1,"
                " '{\"held\": \"sku-42\"}', now()), ('order_0002', 1, 'charge', 'running', 1,"
                " NULL, NULL)"
            )
        )
        # A webhook delivery that died (the dispatcher's rows, written by hand here).
        conn.execute(
            sa.text(
                "INSERT INTO onceflow_webhook_deliveries (event_id, endpoint, job_id, workflow,"
                " kind, sequence, body, status, attempts, give_up_at, last_code, dead_reason,"
                " finished_at) VALUES ('order_0002:7', 'billing', 'order_0002', 'order-workflow',"
                " 'instance.complete', 7, '{}', 'dead', 5, now(), 503, 'retries_exhausted', now())"
            )
        )
    assert step_results(seeded, "order_0002") == {0: {"held": "sku-42"}, 1: None}
    page = client_for(settings, seeded).get("/instances/order_0002").text
    assert page.count("<summary>output</summary>") == 1
    assert "sku-42" in page
    deliveries = page[page.index('id="webhook-deliveries"') : page.index('id="h-timeline"')]
    assert "billing" in deliveries and "instance.complete" in deliveries
    assert "retries_exhausted" in deliveries and ">503<" in deliveries and ">5<" in deliveries
    assert "onceflow webhooks redrive --job order_0002" in deliveries


def test_filters_narrow_the_list_and_pages_follow_the_cursor(settings, seeded):
    client = client_for(settings, seeded)
    mismatch = client.get("/instances", params={"payload_mismatch": "true"})
    assert "order_0002" in mismatch.text and "order_0001" not in mismatch.text
    assert re.search(r"<strong>1</strong> matching", mismatch.text)
    dups = client.get("/instances", params={"has_duplicates": "true"})
    assert "order_0001" in dups.text and "other_0003" not in dups.text
    prefix = client.get("/instances", params={"job_id_prefix": "other_"})
    assert "other_0003" in prefix.text and "order_0001" not in prefix.text
    bad = client.get("/instances", params={"status": "bogus"})
    assert bad.status_code == 400 and "unknown status" in bad.text
    for i in range(60):
        deliver(seeded, f"bulk_{i:03d}", offset=100 + i)
    first = client.get("/instances", params={"job_id_prefix": "bulk_"})
    next_url = re.search(r'href="([^"]+)" id="next-page"', first.text)
    assert next_url, "a second page is linked"
    second = client.get(next_url.group(1).replace("&amp;", "&"))
    firsts = set(re.findall(r">(bulk_\d+)</a>", first.text))
    seconds = set(re.findall(r">(bulk_\d+)</a>", second.text))
    assert len(firsts) == 50 and len(seconds) == 10 and not firsts & seconds


def test_a_read_only_key_cannot_act(keyed, seeded):
    client = client_for(keyed, seeded)
    login(client, READ_KEY)
    token = csrf_of(client, "/instances/order_0001")
    response = client.post(
        "/instances/order_0001/pause", data={"csrf_token": token, "confirm": "yes"}
    )
    assert response.status_code == 403
    assert describe_instance(seeded, "order_0001").status == InstanceStatus.QUEUED
    assert 'id="action-pause"' not in client.get("/instances/order_0001").text


def test_a_post_without_the_csrf_token_is_refused(keyed, seeded):
    client = client_for(keyed, seeded)
    login(client, CONTROL_KEY)
    response = client.post("/instances/order_0001/pause", data={"confirm": "yes"})
    assert response.status_code == 403 and "CSRF" in response.text
    wrong = client.post(
        "/instances/order_0001/pause", data={"confirm": "yes", "csrf_token": "forged"}
    )
    assert wrong.status_code == 403
    assert describe_instance(seeded, "order_0001").status == InstanceStatus.QUEUED


def test_auth_disabled_still_checks_csrf(settings, seeded):
    client = client_for(settings, seeded)
    response = client.post("/instances/order_0001/pause", data={"confirm": "yes"})
    assert response.status_code == 403
    assert client.post("/login", data={"api_key": "x"}).status_code == 403


def test_actions_confirm_first_then_change_the_instance(keyed, seeded):
    client = client_for(keyed, seeded)
    login(client, CONTROL_KEY)
    token = csrf_of(client, "/instances/order_0001")
    ask = client.post("/instances/order_0001/pause", data={"csrf_token": token})
    assert ask.status_code == 200 and 'id="confirm"' in ask.text
    assert describe_instance(seeded, "order_0001").status == InstanceStatus.QUEUED

    def act(action: str, **extra: str):
        data = {"csrf_token": token, "confirm": "yes", **extra}
        return client.post(f"/instances/order_0001/{action}", data=data)

    assert act("pause").status_code == 200  # followed the redirect to the page
    assert describe_instance(seeded, "order_0001").status == InstanceStatus.PAUSED
    assert act("pause").status_code == 200  # pausing a paused one is a no-op
    act("resume")
    assert describe_instance(seeded, "order_0001").status == InstanceStatus.QUEUED
    bad = act("send-event", event_type="approved", payload="{not json")
    assert bad.status_code == 400 and "not JSON" in bad.text
    sent = act("send-event", event_type="approved", payload='{"by": "ops"}')
    assert sent.status_code == 200 and "event" in sent.text and "sent" in sent.text
    act("terminate")
    assert describe_instance(seeded, "order_0001").status == InstanceStatus.TERMINATED
    again = act("terminate")
    assert again.status_code == 409 and "already terminated" in again.text
    act("restart")
    view = describe_instance(seeded, "order_0001")
    assert (view.status, view.restart_count) == (InstanceStatus.QUEUED, 1)


def test_bulk_by_filter_shows_the_count_then_runs(settings, seeded):
    client = client_for(settings, seeded)
    token = csrf_of(client, "/instances")
    form = {"csrf_token": token, "action": "terminate", "workflow": "order-workflow"}
    ask = client.post("/bulk", data=form)
    assert ask.status_code == 200
    assert re.search(r'id="confirm-count">2<', ask.text)
    assert describe_instance(seeded, "order_0001").status == InstanceStatus.QUEUED
    started = client.post("/bulk", data={**form, "confirm": "yes"}, follow_redirects=False)
    assert started.status_code == 303
    op_page = started.headers["location"]
    deadline = time.monotonic() + 30
    while "complete" not in client.get(op_page + "/fragment").text:
        assert time.monotonic() < deadline, client.get(op_page).text
        time.sleep(0.2)
    assert "2 done, 0 skipped of 2" in client.get(op_page).text
    for job_id in ("order_0001", "order_0002"):
        assert describe_instance(seeded, job_id).status == InstanceStatus.TERMINATED
    assert describe_instance(seeded, "other_0003").status == InstanceStatus.QUEUED
    assert op_page.rsplit("/", 1)[1] in client.get("/bulk").text


def test_the_console_refuses_to_start_without_keys(settings, db):
    with pytest.raises(ValueError, match="API keys"):
        create_app(settings.model_copy(update={"auth_disabled": False}), db)
