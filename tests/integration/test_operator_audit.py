"""The operators' audit trail (issue 23), admin API and CLI side, on real PostgreSQL:
every action through the admin API names its key, a refusal at the door or by the
store is a row too, the action and its row commit together, ``GET /v1/admin/audit``
filters and pages with one error shape, the CLI acts as ``cli:<OS user>`` and reads
the trail back, and retention prunes old rows."""

from __future__ import annotations

import logging

import orjson
import pytest
import sqlalchemy as sa
from fastapi.testclient import TestClient

from onceflow.envelope import JobEnvelope
from onceflow.logs import JsonFormatter
from onceflow.vocabulary import FrontEnd, InstanceStatus, OperatorAction
from producers.api import create_app
from producers.models import ErrorBody
from tests.acceptance.test_demo import run_cli
from tests.conftest import settings_env
from tests.integration.test_admin_http import NoKafka
from tests.integration.test_console import CONTROL_KEY, READ_KEY, keyed  # noqa: F401
from workflow_engine.model import Delivery
from workflow_engine.store import operations
from workflow_engine.store.operations import Actor
from workflow_engine.store.views import InstanceFilter, describe_instance
from workflow_engine.store.writes import create_instances, prune

READER = {"Authorization": f"Bearer {READ_KEY}"}
OPERATOR = {"Authorization": f"Bearer {CONTROL_KEY}"}
WF = "approval-workflow"
DAY = 86400


def deliver(db, *job_ids, workflow=WF):
    for n, job_id in enumerate(job_ids):
        create_instances(db, [Delivery(JobEnvelope(job_id, workflow, {}), "t", 0, n)])


def trail(db, **where):
    """The trail's rows (as dicts), oldest first, narrowed by column = value."""
    conditions = " AND ".join(f"{k} = :{k}" for k in where) or "TRUE"
    with db.connect() as conn:
        rows = conn.execute(
            sa.text(f"SELECT * FROM onceflow_operator_actions WHERE {conditions} ORDER BY id"),
            where,
        ).mappings()
        return [dict(r) for r in rows]


def status(db, job_id):
    return describe_instance(db, job_id).status


@pytest.fixture
def api(keyed):  # noqa: F811 (the fixture imported above)
    with TestClient(create_app(keyed, NoKafka())) as client:
        yield client


def test_an_admin_api_action_is_one_row_and_one_json_log_line_naming_its_key(api, db, caplog):
    deliver(db, "adm_1")
    caplog.set_level(logging.INFO, logger="workflow_engine.store.operator_audit")
    paused = api.post(f"/v1/instances/{WF}/adm_1/pause", headers=OPERATOR)
    assert paused.status_code == 200, paused.text

    [row] = trail(db, job_id="adm_1")
    assert (row["actor"], row["front_end"], row["action"], row["result"]) == (
        "operator",
        "admin_api",
        "pause",
        "ok",
    )
    assert (row["workflow"], row["detail"], row["client"]) == (WF, "adm_1: paused", "testclient")
    [line] = [r for r in caplog.records if getattr(r, "event", "") == "operator.pause"]
    logged = orjson.loads(JsonFormatter().format(line))
    assert logged["actor"] == "operator" and logged["front_end"] == "admin_api"
    assert (logged["job_id"], logged["result"], logged["audit_id"]) == ("adm_1", "ok", row["id"])

    sent = api.post(f"/v1/instances/{WF}/adm_1/events", headers=OPERATOR, json={"type": "go"})
    assert sent.status_code == 202
    [event_row] = trail(db, job_id="adm_1", action="send_event")
    assert event_row["result"] == "ok" and "'go' stored" in event_row["detail"]


def test_refusals_by_the_store_and_at_the_door_are_rows_and_change_nothing(api, db):
    deliver(db, "ref_1", "ref_2")
    assert api.post(f"/v1/instances/{WF}/ref_1/terminate", headers=OPERATOR).status_code == 200
    conflict = api.post(f"/v1/instances/{WF}/ref_1/pause", headers=OPERATOR)
    assert conflict.status_code == 409
    [refused] = trail(db, job_id="ref_1", action="pause")
    assert refused["result"] == "refused" and "terminated" in refused["detail"]

    # a key without instances:control: 403, recorded as the action it tried, undone
    forbidden = api.post(f"/v1/instances/{WF}/ref_2/pause", headers=READER)
    assert forbidden.status_code == 403
    assert status(db, "ref_2") == InstanceStatus.QUEUED
    [door] = trail(db, job_id="ref_2")
    assert (door["actor"], door["action"], door["result"], door["workflow"]) == (
        "reader",
        "pause",
        "refused",
        WF,
    )
    assert door["detail"].startswith(f"403 POST /v1/instances/{WF}/ref_2/pause: key 'reader'")

    # an unknown key on a read, and no key at all: named as such, never the key itself
    assert api.get("/v1/instances", headers={"X-API-Key": "ofk_guessed"}).status_code == 401
    assert api.post(f"/v1/instances/{WF}/ref_2/terminate").status_code == 401
    assert status(db, "ref_2") == InstanceStatus.QUEUED
    [unknown] = trail(db, actor="(unknown key)")
    assert (unknown["action"], unknown["result"]) == ("request", "refused")
    [nobody] = trail(db, actor="(no key)")
    assert (nobody["action"], nobody["job_id"]) == ("terminate", "ref_2")
    assert "ofk_guessed" not in str(trail(db))

    # an event the store refuses: 422, and the refusal is recorded
    bad = api.post(f"/v1/instances/{WF}/ref_2/events", headers=OPERATOR, json={"type": "a b"})
    assert bad.status_code == 422
    [event] = trail(db, job_id="ref_2", action="send_event")
    assert event["result"] == "refused"

    # a path no index could take is still a row (its job id dropped, its detail bounded)
    huge = "x" * 5000
    assert api.post(f"/v1/instances/{WF}/{huge}/pause", headers=READER).status_code == 403
    [last] = trail(db)[-1:]
    assert last["job_id"] is None and len(last["detail"]) <= 1000


def test_a_bulk_start_records_its_filter_and_operation_an_empty_filter_its_refusal(api, db):
    deliver(db, "blk_1", "blk_2")
    dry = api.post(
        "/v1/instances/bulk/pause",
        headers=OPERATOR,
        json={"filter": "prefix=blk_", "dry_run": True},
    )
    assert dry.status_code == 200 and trail(db) == []  # a count, not an action
    started = api.post("/v1/instances/bulk/pause", headers=OPERATOR, json={"filter": "prefix=blk_"})
    assert started.status_code == 202, started.text
    [row] = trail(db)
    assert (row["actor"], row["action"], row["result"]) == ("operator", "bulk_pause", "ok")
    assert row["filter"] == {"job_id_prefix": "blk_"} and row["bulk_id"] == started.json()["id"]

    empty = api.post("/v1/instances/bulk/terminate", headers=OPERATOR, json={"filter": " "})
    assert empty.status_code == 400 and set(empty.json()) == set(ErrorBody.model_fields)
    [refused] = trail(db, action="bulk_terminate")
    assert refused["result"] == "refused" and "narrows something" in refused["detail"]
    assert refused["filter"] == {} and refused["bulk_id"] is None


def test_the_audit_endpoint_filters_pages_and_answers_bad_input_with_the_error_body(api, db):
    for n in range(5):
        who = Actor.admin_api("alice" if n % 2 == 0 else "bob")
        operations.record(db, who, OperatorAction.PAUSE, job_id=f"aud_{n}", workflow=WF)
    everything = api.get("/v1/admin/audit", headers=READER).json()
    assert [a["job_id"] for a in everything["actions"]] == [f"aud_{n}" for n in (4, 3, 2, 1, 0)]
    assert everything["next_cursor"] is None
    alice = api.get("/v1/admin/audit", headers=READER, params={"actor": "alice"}).json()
    assert [a["job_id"] for a in alice["actions"]] == ["aud_4", "aud_2", "aud_0"]
    one = api.get("/v1/admin/audit", headers=READER, params={"job_id": "aud_3"}).json()
    assert [(a["actor"], a["action"]) for a in one["actions"]] == [("bob", "pause")]

    seen, cursor = [], None
    while True:
        params = {"limit": 2, **({"cursor": cursor} if cursor else {})}
        page = api.get("/v1/admin/audit", headers=READER, params=params).json()
        seen += [a["job_id"] for a in page["actions"]]
        cursor = page["next_cursor"]
        if cursor is None:
            break
    assert seen == [f"aud_{n}" for n in (4, 3, 2, 1, 0)]

    bad = [
        api.get("/v1/admin/audit", headers=READER, params={"cursor": "abc"}),
        api.get("/v1/admin/audit", headers=READER, params={"action": "bogus"}),
        api.get("/v1/admin/audit", headers=READER, params={"actor": "a" * 300}),
        api.get("/v1/admin/audit", headers=READER, params={"limit": "many"}),
        api.get("/v1/admin/audit", headers=READER, params={"job_id": "a\x00b"}),
    ]
    assert [r.status_code for r in bad] == [400, 422, 400, 422, 400]
    for r in bad:
        assert set(r.json()) == set(ErrorBody.model_fields), r.json()
    assert api.get("/v1/admin/audit", headers=READER, params={"limit": 0}).status_code == 200
    assert api.get("/v1/admin/audit").status_code == 401


@pytest.fixture
def refuse_ok_rows(db):
    """A trigger that makes the database refuse every audit row of an action that went
    through (``ok``): the action's own transaction must roll back with it."""
    with db.begin() as conn:
        conn.execute(
            sa.text(
                "CREATE FUNCTION refuse_ok() RETURNS trigger LANGUAGE plpgsql AS"
                " $$ BEGIN RAISE EXCEPTION 'audit row refused'; END $$"
            )
        )
        conn.execute(
            sa.text(
                "CREATE TRIGGER refuse_ok BEFORE INSERT ON onceflow_operator_actions"
                " FOR EACH ROW WHEN (NEW.result = 'ok') EXECUTE FUNCTION refuse_ok()"
            )
        )


def test_an_action_and_its_row_commit_together_or_not_at_all(db, refuse_ok_rows):
    deliver(db, "tx_1", "tx_2")
    who = Actor.cli("tester")
    with pytest.raises(sa.exc.DBAPIError, match="audit row refused"):
        operations.pause(db, WF, "tx_1", actor=who)
    assert status(db, "tx_1") == InstanceStatus.QUEUED  # no action without its row
    with pytest.raises(sa.exc.DBAPIError, match="audit row refused"):
        operations.send_event(db, WF, "tx_1", "approved", {}, actor=who)
    with pytest.raises(sa.exc.DBAPIError, match="audit row refused"):
        operations.start_bulk(db, "terminate", InstanceFilter(job_id_prefix="tx_"), actor=who)
    with db.connect() as conn:
        assert conn.execute(sa.text("SELECT count(*) FROM onceflow_events")).scalar() == 0
        assert conn.execute(sa.text("SELECT count(*) FROM onceflow_bulk_operations")).scalar() == 0
    # each failure is recorded on its own, as an error
    failed = trail(db)
    assert [(r["action"], r["result"]) for r in failed] == [
        ("pause", "error"),
        ("send_event", "error"),
        ("bulk_terminate", "error"),
    ]
    assert all("audit row refused" in r["detail"] for r in failed)
    # callers without an actor (the engine, tests) record nothing and are not hindered
    assert operations.pause(db, WF, "tx_2").status == InstanceStatus.PAUSED


def test_retention_deletes_rows_past_their_own_retention(db):
    who = Actor.console("ops")
    old = operations.record(db, who, OperatorAction.LOGIN)
    new = operations.record(db, who, OperatorAction.LOGOUT)
    with db.begin() as conn:
        conn.execute(
            sa.text(
                "UPDATE onceflow_operator_actions SET at = now() - interval '91 days'"
                " WHERE id = :id"
            ),
            {"id": old.id},
        )
    assert prune(db, 7 * DAY, 30 * DAY, operator_action_seconds=120 * DAY)["operator_actions"] == 0
    assert prune(db, 7 * DAY, 30 * DAY)["operator_actions"] == 1  # the default: 90 days
    assert [r["id"] for r in trail(db)] == [new.id]


@pytest.mark.timeout(120)
def test_the_cli_acts_as_its_os_user_and_reads_the_trail_back(settings, db):
    deliver(db, "cli_1", "cli_2")
    env = {**settings_env(settings), "LOGNAME": "alice", "USER": "alice"}

    def cli(*args, ok=True):
        result = run_cli(*args, env=env)
        assert (result.returncode == 0) == ok, result.stderr
        return result

    cli("instances", "pause", WF, "cli_1")
    cli("instances", "terminate", WF, "cli_1")
    refused = cli("instances", "pause", WF, "cli_1", ok=False)
    assert "terminated" in refused.stderr
    assert len(refused.stderr.strip().splitlines()) == 1  # one line, no log line beside it
    cli("instances", "send-event", WF, "cli_2", "approved", "{}")
    cli("instances", "restart", "--filter", "job_id=cli_1", "--yes")
    rows = trail(db)
    assert {(r["actor"], r["front_end"]) for r in rows} == {("cli:alice", FrontEnd.CLI.value)}
    assert [(r["action"], r["job_id"], r["result"]) for r in rows] == [
        ("pause", "cli_1", "ok"),
        ("terminate", "cli_1", "ok"),
        ("pause", "cli_1", "refused"),
        ("send_event", "cli_2", "ok"),
        ("bulk_restart", None, "ok"),
    ]
    assert rows[-1]["filter"] == {"job_id": "cli_1"}

    listed = cli("audit", "actions", "--job-id", "cli_1", "--json").stdout.splitlines()
    assert [orjson.loads(line)["action"] for line in listed] == ["pause", "terminate", "pause"]
    table = cli("audit", "actions", "--actor", "cli:alice", "--limit", "2").stdout.splitlines()
    assert len(table) == 2 and "bulk_restart" in table[0] and "send_event" in table[1]
    wrong = cli("audit", "actions", "--action", "bogus", ok=False)
    assert "bogus" in wrong.stderr
