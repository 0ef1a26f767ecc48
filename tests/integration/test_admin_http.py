"""The HTTP admin API on real PostgreSQL."""

from __future__ import annotations

from fastapi.testclient import TestClient

from onceflow.envelope import JobEnvelope
from producers.api import create_app
from producers.models import ErrorBody
from workflow_engine.store.instances import Delivery, create_instances


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
        assert sorted(r["job_id"] for r in listed.json()) == ["adm_0", "adm_1", "adm_2"]

        described = client.get("/v1/instances/approval-workflow/adm_0").json()
        assert (described["job_id"], described["status"]) == ("adm_0", "queued")

        paused = client.post("/v1/instances/approval-workflow/adm_0/pause")
        assert paused.json() == {"job_id": "adm_0", "status": "paused", "requested": None}
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


def test_job_status_404_carries_the_lag_in_details(settings):
    admin = settings.model_copy(update={"admin_api_enabled": True})
    with TestClient(create_app(admin, NoKafka())) as client:
        unknown = client.get("/v1/jobs/never_submitted")
    assert unknown.status_code == 404
    body = unknown.json()
    assert set(body) == set(ErrorBody.model_fields)
    assert body["error"] == "not_found" and body["details"]["job_id"] == "never_submitted"
    assert "total" in body["details"]["consumer_lag"]
