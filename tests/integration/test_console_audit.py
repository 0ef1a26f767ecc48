"""The operators' audit trail, console side (issue 23): logins and refused logins, a
console action and a refused one are rows naming ``console:<key name>``; the ``/audit``
page shows the trail (filters, a cursor), an instance's page its own actions. FastAPI's
TestClient against real PostgreSQL (and Kafka for the re-drive)."""

from __future__ import annotations

import logging
import re

import pytest
import sqlalchemy as sa

from onceflow.vocabulary import OperatorAction
from tests.integration.kafka_helpers import produce
from tests.integration.test_console import (
    CONTROL_KEY,
    READ_KEY,
    client_for,
    csrf_of,
    deliver,
    keyed,  # noqa: F401  (a fixture)
    login,
)
from tests.integration.test_operator_audit import trail
from tests.integration.test_redrive import _letter
from workflow_engine.store import operations
from workflow_engine.store.operations import Actor


def act(client, path, **fields):
    token = csrf_of(client, "/instances")
    return client.post(path, data={"csrf_token": token, **fields}, follow_redirects=False)


def test_logins_and_refused_logins_are_rows_never_holding_the_key(keyed, db):  # noqa: F811
    client = client_for(keyed, db)
    assert login(client, "ofk_not_a_key").status_code == 401
    assert login(client, READ_KEY).status_code == 303
    token = csrf_of(client, "/")
    assert (
        client.post("/logout", data={"csrf_token": token}, follow_redirects=False).status_code
        == 303
    )
    wrong_csrf = client.post("/login", data={"csrf_token": "nope", "api_key": READ_KEY})
    assert wrong_csrf.status_code == 403
    rows = [(r["actor"], r["action"], r["result"]) for r in trail(db)]
    assert rows == [
        ("console:(unknown key)", "login", "refused"),
        ("console:reader", "login", "ok"),
        ("console:reader", "logout", "ok"),
        ("console:reader", "login", "refused"),
    ]
    assert all(r["front_end"] == "console" and r["client"] == "testclient" for r in trail(db))
    assert "CSRF" in trail(db)[-1]["detail"]
    assert "ofk_not_a_key" not in str(trail(db)) and READ_KEY not in str(trail(db))


def test_a_console_action_and_a_refused_one_are_rows(keyed, db, caplog):  # noqa: F811
    deliver(db, "con_1")
    caplog.set_level(logging.INFO, logger="workflow_engine.store.operator_audit")
    reader = client_for(keyed, db)
    login(reader, READ_KEY)
    refused = act(reader, "/instances/con_1/pause", confirm="yes")
    assert refused.status_code == 403
    bulk = act(reader, "/bulk", action="terminate", workflow="order-workflow", confirm="yes")
    assert bulk.status_code == 403

    operator = client_for(keyed, db)
    login(operator, CONTROL_KEY)
    assert act(operator, "/instances/con_1/pause").status_code == 200  # the confirmation page
    assert trail(db, action="pause", result="ok") == []  # … is not an action
    assert act(operator, "/instances/con_1/pause", confirm="yes").status_code == 303
    sent = act(
        operator, "/instances/con_1/send-event", event_type="go", payload="{}", confirm="yes"
    )
    assert sent.status_code == 303
    wrong = operator.post(
        "/instances/con_1/terminate", data={"csrf_token": "forged", "confirm": "yes"}
    )
    assert wrong.status_code == 403

    acts = [r for r in trail(db) if r["action"] != "login"]
    rows = [(r["actor"], r["action"], r["result"], r["job_id"]) for r in acts]
    assert rows == [
        ("console:reader", "pause", "refused", "con_1"),
        ("console:reader", "bulk_terminate", "refused", None),
        ("console:operator", "pause", "ok", "con_1"),
        ("console:operator", "send_event", "ok", "con_1"),
        ("console:operator", "terminate", "refused", "con_1"),
    ]
    assert "lacks scope 'instances:control'" in acts[0]["detail"]
    logged = [r for r in caplog.records if getattr(r, "event", "") == "operator.pause"]
    assert [(r.actor, r.front_end, r.job_id, r.result, r.levelname) for r in logged] == [
        ("console:reader", "console", "con_1", "refused", "WARNING"),
        ("console:operator", "console", "con_1", "ok", "INFO"),
    ]


def test_a_console_redrive_is_a_row_with_the_letters_it_chose(settings, db):
    deliver(db, "rdv_1")
    from onceflow.envelope import JobEnvelope

    envelope = JobEnvelope("rdv_1", "order-workflow", {})
    produce(
        settings.kafka_bootstrap_servers, settings.dlq_topic, [_letter(envelope, "not_json", 0)]
    )
    client = client_for(settings, db)
    form = {"csrf_token": csrf_of(client, "/dead-letters"), "all": "yes", "confirm": "yes"}
    done = client.post("/dead-letters/redrive", data=form)
    assert done.status_code == 200, done.text
    [row] = trail(db, action="redrive")
    assert (row["actor"], row["result"], row["job_id"]) == (
        "console:anonymous (auth disabled)",
        "ok",
        "rdv_1",
    )
    assert row["filter"]["letters"] == 1 and row["filter"]["job_ids"] == ["rdv_1"]
    assert "skipped 1" in row["detail"]


def test_the_audit_page_shows_filters_and_pages_the_trail(settings, db):
    for n in range(60):
        operations.record(
            db, Actor.console(f"op{n % 3}"), OperatorAction.PAUSE, job_id=f"pg_{n:02d}"
        )
    operations.record(
        db, Actor.cli("root"), OperatorAction.BULK_TERMINATE, filter={"workflow": "w"}, bulk_id=7
    )
    client = client_for(settings, db)
    page = client.get("/audit")
    assert page.status_code == 200
    assert 'href="/audit" aria-current="page"' in page.text  # the nav links it
    assert "cli:root" in page.text and "workflow=w" in page.text and 'href="/bulk/7"' in page.text
    assert len(re.findall(r'<tr id="audit-\d+">', page.text)) == 50
    following = re.search(
        r'id="audit-next" rel="next" href="([^"]+)"|href="([^"]+)" id="audit-next"', page.text
    )
    assert following, "no next page link"
    older = client.get((following.group(1) or following.group(2)).replace("&amp;", "&"))
    assert len(re.findall(r'<tr id="audit-\d+">', older.text)) == 11
    assert "pg_00" in older.text and "audit-next" not in older.text

    op1 = client.get("/audit", params={"actor": "console:op1"})
    assert len(re.findall(r'<tr id="audit-\d+">', op1.text)) == 20
    assert "console:op2" not in op1.text
    one = client.get("/audit", params={"job_id": "pg_07", "action": "pause"})
    assert len(re.findall(r'<tr id="audit-\d+">', one.text)) == 1
    assert client.get("/audit", params={"action": "bogus"}).status_code == 400
    assert client.get("/audit", params={"cursor": "x"}).status_code == 400


def test_an_instance_page_shows_its_own_operator_actions(settings, db):
    deliver(db, "ipg_1")
    deliver(db, "ipg_2", offset=1)
    operations.record(db, Actor.console("alice"), OperatorAction.PAUSE, job_id="ipg_1")
    operations.record(db, Actor.admin_api("bob"), OperatorAction.TERMINATE, job_id="ipg_2")
    client = client_for(settings, db)
    page = client.get("/instances/ipg_1")
    assert page.status_code == 200
    section = page.text.split('id="instance-operator-actions"')[1].split("</table>")[0]
    assert "console:alice" in section and "pause" in section
    assert "bob" not in section
    empty = client.get("/instances/ipg_2").text
    assert "bob" in empty and "console:alice" not in empty


@pytest.fixture(autouse=True)
def _no_stray_rows(db):
    """Each test starts from an empty trail (its own database)."""
    with db.connect() as conn:
        assert conn.execute(sa.text("SELECT count(*) FROM onceflow_operator_actions")).scalar() == 0
