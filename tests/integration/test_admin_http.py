"""The HTTP admin API on real PostgreSQL."""

from __future__ import annotations

from fastapi.testclient import TestClient

from onceflow.envelope import JobEnvelope
from producers.api import create_app
from producers.models import ErrorBody
from workflow_engine.model import Delivery
from workflow_engine.store.writes import create_instances


class NoKafka:
    async def send(self, envelopes):  # pragma: no cover - not used here
        raise AssertionError("no job submission in this test")

    def ready(self):
        return True

    def close(self):
        return 0


def test_list_describe_control_and_events(settings, db):
    for i in range(3):
        create_instances(
            db, [Delivery(JobEnvelope(f"adm_{i}", "approval-workflow", {}), "t", 0, i)]
        )
    with TestClient(create_app(settings, NoKafka())) as client:
        listed = client.get("/v1/instances", params={"prefix": "adm_", "status": "queued"})
        assert listed.status_code == 200
        assert sorted(r["job_id"] for r in listed.json()["instances"]) == [
            "adm_0",
            "adm_1",
            "adm_2",
        ]

        described = client.get("/v1/instances/approval-workflow/adm_0").json()
        assert (described["job_id"], described["status"]) == ("adm_0", "queued")

        paused = client.post("/v1/instances/approval-workflow/adm_0/pause")
        assert paused.json() == {
            "job_id": "adm_0",
            "status": "paused",
            "requested": None,
            "note": None,
        }
        assert (
            client.post("/v1/instances/approval-workflow/adm_0/resume").json()["status"] == "queued"
        )
        assert (
            client.post("/v1/instances/approval-workflow/adm_1/terminate").json()["status"]
            == "terminated"
        )
        conflict = client.post("/v1/instances/approval-workflow/adm_1/pause")
        assert conflict.status_code == 409 and "terminated" in conflict.json()["message"]
        assert conflict.json()["error"] == "conflict"

        sent = client.post(
            "/v1/instances/approval-workflow/adm_2/events",
            json={"type": "approved", "payload": {"by": "ann"}},
        )
        assert sent.status_code == 202 and sent.json()["event_id"] > 0
        bad = client.post("/v1/instances/approval-workflow/adm_2/events", json={"type": ""})
        assert bad.status_code == 422

        missing = client.get("/v1/instances/approval-workflow/nope")
        assert missing.status_code == 404
        wrong_type = client.post("/v1/instances/order-workflow/adm_2/pause")
        assert wrong_type.status_code == 404
        # one error shape on every refusal, the database's answers included
        for r in (conflict, bad, missing, wrong_type):
            assert set(r.json()) == set(ErrorBody.model_fields), r.json()
        assert bad.json()["fields"][0]["field"] == "body.type"


def test_list_pages_with_a_cursor_and_counts(settings, db):
    for i in range(5):
        create_instances(
            db, [Delivery(JobEnvelope(f"lst_{i}", "approval-workflow", {}), "t", 0, i)]
        )
    create_instances(db, [Delivery(JobEnvelope("lst_o", "order-workflow", {}), "t", 0, 9)])
    with TestClient(create_app(settings, NoKafka())) as client:
        params = {"workflow": "approval-workflow", "limit": 2, "count": "true"}
        seen, cursor = [], None
        while True:
            body = client.get("/v1/instances", params={**params, "cursor": cursor or ""}).json()
            assert body["count"] == 5
            seen += [r["job_id"] for r in body["instances"]]
            cursor = body["next_cursor"]
            if cursor is None:
                break
        assert sorted(seen) == [f"lst_{i}" for i in range(5)] and len(seen) == 5
        row = body["instances"][0]
        assert {"duplicates", "mismatches", "error", "updated_at"} <= set(row)
        by_updated = client.get("/v1/instances", params={"sort": "updated", "limit": 100})
        assert len(by_updated.json()["instances"]) == 6
        assert by_updated.json()["count"] is None

        bad_cursor = client.get("/v1/instances", params={"cursor": "nope"})
        bad_sort = client.get("/v1/instances", params={"sort": "sideways"})
        assert bad_cursor.status_code == 400 and bad_cursor.json()["error"] == "invalid_filter"
        assert bad_sort.status_code == 422
        for r in (bad_cursor, bad_sort):
            assert set(r.json()) == set(ErrorBody.model_fields), r.json()


def test_bulk_operations_over_http(settings, db):
    import time

    for i in range(4):
        create_instances(db, [Delivery(JobEnvelope(f"hb_{i}", "approval-workflow", {}), "t", 0, i)])
    with TestClient(create_app(settings, NoKafka())) as client:
        dry = client.post(
            "/v1/instances/bulk/terminate", json={"filter": "prefix=hb_", "dry_run": True}
        )
        assert dry.status_code == 200
        assert dry.json() == {
            "action": "terminate",
            "filter": "job_id_prefix=hb_",
            "dry_run": True,
            "count": 4,
        }
        started = client.post("/v1/instances/bulk/terminate", json={"filter": "prefix=hb_"})
        assert started.status_code == 202
        op = started.json()
        assert (op["action"], op["total"], op["filter"]) == ("terminate", 4, "job_id_prefix=hb_")
        deadline = time.monotonic() + 30
        while op["status"] == "running":
            assert time.monotonic() < deadline, op
            time.sleep(0.05)
            op = client.get(f"/v1/instances/bulk/{op['id']}").json()
        assert (op["status"], op["done"], op["skipped"]) == ("complete", 4, 0)
        listed = client.get("/v1/instances", params={"status": "terminated", "count": "true"})
        assert listed.json()["count"] == 4
        assert [o["id"] for o in client.get("/v1/instances/bulk").json()] == [op["id"]]

        refusals = [
            client.post("/v1/instances/bulk/terminate", json={"filter": "colour=red"}),
            client.post("/v1/instances/bulk/terminate", json={"filter": ""}),
            client.post("/v1/instances/bulk/explode", json={"filter": "prefix=hb_"}),
            client.get("/v1/instances/bulk/999999"),
        ]
        assert [r.status_code for r in refusals] == [400, 422, 422, 404]
        assert "unknown filter key" in refusals[0].json()["message"]
        for r in refusals:
            assert set(r.json()) == set(ErrorBody.model_fields), r.json()


def test_bulk_needs_the_control_scope(settings, db):
    import hashlib

    from onceflow.settings import ApiKey

    keyed = settings.model_copy(
        update={
            "auth_disabled": False,
            "api_keys": [
                ApiKey(name="r", sha256=hashlib.sha256(b"reader").hexdigest(), scopes=["jobs:read"])
            ],
        }
    )
    with TestClient(create_app(keyed, NoKafka())) as client:
        headers = {"Authorization": "Bearer reader"}
        assert client.get("/v1/instances", headers=headers).status_code == 200
        refused = client.post(
            "/v1/instances/bulk/pause", json={"filter": "prefix=x"}, headers=headers
        )
        assert refused.status_code == 403


def test_job_status_404_carries_the_lag_in_details(settings):
    admin = settings.model_copy(update={"admin_api_enabled": True})
    with TestClient(create_app(admin, NoKafka())) as client:
        unknown = client.get("/v1/jobs/never_submitted")
    assert unknown.status_code == 404
    body = unknown.json()
    assert set(body) == set(ErrorBody.model_fields)
    assert body["error"] == "not_found" and body["details"]["job_id"] == "never_submitted"
    assert "total" in body["details"]["consumer_lag"]
