"""The HTTP contract of ingest, with a producer double standing in for Kafka's answers.

(The real producer against real Kafka is covered in tests/integration.)
"""

from __future__ import annotations

import re

import pytest
from fastapi.testclient import TestClient

from onceflow.envelope import JobEnvelope
from onceflow.settings import Settings
from producers.api import create_app
from producers.kafka import Ack


class ScriptedProducer:
    """Acknowledges every record, except job ids listed in ``refuse``."""

    def __init__(self, refuse=()):
        self.refuse = set(refuse)
        self.sent: list[JobEnvelope] = []

    async def send(self, envelopes):
        self.sent.extend(envelopes)
        return [
            Ack(e.job_id, error="Local: Message timed out")
            if e.job_id in self.refuse
            else Ack(e.job_id, 0, len(self.sent))
            for e in envelopes
        ]

    def ready(self):
        return True

    def close(self):
        return 0


@pytest.fixture
def client_for():
    def make(producer):
        return TestClient(
            create_app(
                Settings(ingest_max_batch=200, auth_disabled=True, ingest_validate_types=False),
                producer,
            )
        )

    return make


def test_202_lists_every_job_with_its_offset(client_for):
    producer = ScriptedProducer()
    with client_for(producer) as client:
        r = client.post(
            "/v1/jobs",
            json={
                "jobs": [
                    {"job_id": "a", "workflow": "w"},
                    {"workflow": "w"},
                    {"job_id": "a", "workflow": "w"},
                ]
            },
        )
    assert r.status_code == 202
    body = r.json()
    assert next(j["job_id"] for j in body["accepted"]) == "a"
    assert body["accepted"][1]["job_id"].startswith("job_")
    assert body["duplicates_in_request"] == 1
    assert len(producer.sent) == 2  # the in-request duplicate is written once
    assert r.headers["x-request-id"] == body["request_id"]
    assert {e.request_id for e in producer.sent} == {body["request_id"]}


def test_503_when_kafka_does_not_acknowledge_and_no_false_accept(client_for):
    with client_for(ScriptedProducer(refuse={"b"})) as client:
        r = client.post(
            "/v1/jobs",
            json={"jobs": [{"job_id": "a", "workflow": "w"}, {"job_id": "b", "workflow": "w"}]},
        )
    assert r.status_code == 503
    assert r.headers["retry-after"] == "2"
    body = r.json()
    assert [j["job_id"] for j in body["accepted"]] == ["a"]
    assert [j["job_id"] for j in body["rejected"]] == ["b"]


def test_wrong_content_type_is_415(client_for):
    with client_for(ScriptedProducer()) as client:
        r = client.post(
            "/v1/jobs", content=b'{"workflow":"w"}', headers={"content-type": "text/plain"}
        )
    assert r.status_code == 415
    assert r.json()["error"] == "unsupported_media_type"


def test_bad_field_is_422_and_nothing_is_sent(client_for):
    producer = ScriptedProducer()
    with client_for(producer) as client:
        r = client.post(
            "/v1/jobs", json={"jobs": [{"workflow": "w"}, {"workflow": "w", "job_id": "bad id"}]}
        )
    assert r.status_code == 422
    assert r.json()["fields"][0]["field"] == "jobs[1].job_id"
    assert producer.sent == []


def test_openapi_documents_both_body_shapes(client_for):
    with client_for(ScriptedProducer()) as client:
        spec = client.get("/openapi.json").json()
    body = spec["paths"]["/v1/jobs"]["post"]["requestBody"]["content"]["application/json"]
    refs = {s["$ref"] for s in body["schema"]["oneOf"]}
    assert refs == {"#/components/schemas/JobIn", "#/components/schemas/BatchIn"}
    assert "JobIn" in spec["components"]["schemas"]


def test_nul_characters_in_the_url_are_a_400(client_for):
    with client_for(ScriptedProducer()) as client:
        r = client.get("/v1/instances", params={"workflow": "a\x00b"})
    assert r.status_code == 400 and "NUL" in r.json()["message"]


def test_a_sane_client_request_id_is_kept_and_an_odd_one_replaced(client_for):
    producer = ScriptedProducer()
    with client_for(producer) as client:
        kept = client.post("/v1/jobs", json={"workflow": "w"}, headers={"X-Request-Id": "abc-1"})
        odd = client.post("/v1/jobs", json={"workflow": "w"}, headers={"X-Request-Id": "x" * 300})
    assert kept.json()["request_id"] == "abc-1"
    assert odd.json()["request_id"].startswith("req_")


def test_admin_status_filter_is_the_instance_status_vocabulary():
    from onceflow.vocabulary import InstanceStatus

    app = create_app(
        Settings(auth_disabled=True, admin_api_enabled=True, ingest_validate_types=False),
        ScriptedProducer(),
    )
    with TestClient(app) as client:
        spec = client.get("/openapi.json").json()
        unknown = client.get("/v1/instances", params={"status": "sleepy"})
    params = {p["name"]: p for p in spec["paths"]["/v1/instances"]["get"]["parameters"]}
    schema = params["status"]["schema"]["anyOf"][0]
    enum = (
        schema.get("enum") or spec["components"]["schemas"][schema["$ref"].split("/")[-1]]["enum"]
    )
    assert enum == [s.value for s in InstanceStatus]
    assert unknown.status_code == 422  # refused before any database work


def test_admin_routes_exist_only_when_enabled():
    app = create_app(
        Settings(auth_disabled=True, admin_api_enabled=False, ingest_validate_types=False),
        ScriptedProducer(),
    )
    with TestClient(app) as client:
        paths = client.get("/openapi.json").json()["paths"]
        assert client.get("/v1/jobs/a").status_code == 404  # no job-status route
    assert set(paths) == {"/v1/jobs"}


def test_health_and_readiness(client_for):
    class NotReady(ScriptedProducer):
        def ready(self):
            return False

    with client_for(NotReady()) as client:
        assert client.get("/healthz").json() == {"status": "ok"}
        ready = client.get("/readyz")
    assert ready.status_code == 503
    assert (ready.json()["error"], ready.json()["details"]) == (
        "not_ready",
        {"kafka": "unavailable"},
    )


class Unreachable(ScriptedProducer):
    """A producer whose link to Kafka is down: it refuses before producing anything."""

    async def send(self, envelopes):
        from producers.broker_link import KafkaUnreachable

        raise KafkaUnreachable(3.0, "1/1 brokers are down")


def test_kafka_unreachable_is_an_immediate_503_that_wrote_nothing(client_for):
    with client_for(Unreachable()) as client:
        r = client.post(
            "/v1/jobs",
            json={"jobs": [{"job_id": "a", "workflow": "w"}, {"job_id": "b", "workflow": "w"}]},
        )
    assert r.status_code == 503 and r.headers["retry-after"] == "1"
    body = r.json()
    assert body["error"] == "kafka_unreachable" and body["accepted"] == []
    assert [(j["job_id"], j["reason"]) for j in body["rejected"]] == [
        ("a", "kafka_unreachable"),
        ("b", "kafka_unreachable"),
    ]


def _admin_client():
    app = create_app(
        Settings(auth_disabled=True, admin_api_enabled=True, ingest_validate_types=False),
        ScriptedProducer(),
    )
    return TestClient(app, raise_server_exceptions=False)


def test_every_error_has_the_one_shape():
    from producers.models import ErrorBody

    shape = set(ErrorBody.model_fields)
    with _admin_client() as client:
        answers = {
            "unknown path": client.get("/nope"),
            "wrong method": client.delete("/v1/jobs"),
            "query validation": client.get("/v1/instances", params={"status": "sleepy"}),
            "body validation": client.post(
                "/v1/instances/w/j/events",
                content=b"{",
                headers={"content-type": "application/json"},
            ),
            "NUL in the URL": client.get("/v1/instances", params={"workflow": "a\x00b"}),
            "media type": client.post("/v1/jobs", content=b"{}"),
            "duplicate key": client.post(
                "/v1/jobs",
                content=b'{"workflow":"w","workflow":"x"}',
                headers={"content-type": "application/json"},
            ),
            "missing asset": client.get("/static-offline-docs/nope.js"),
        }
    for what, r in answers.items():
        assert 400 <= r.status_code < 500, what
        assert r.headers["content-type"] == "application/json", what
        body = r.json()
        assert set(body) == shape and body["error"] and body["message"], (what, body)
    assert answers["unknown path"].json()["error"] == "not_found"
    assert answers["wrong method"].status_code == 405
    fields = answers["query validation"].json()["fields"]
    assert fields[0]["field"] == "query.status"


def test_openapi_declares_the_one_error_shape_on_every_route():
    with _admin_client() as client:
        spec = client.get("/openapi.json").json()
    assert "HTTPValidationError" not in spec["components"]["schemas"]
    for path, operations in spec["paths"].items():
        for method, op in operations.items():
            errors = {s: r for s, r in op["responses"].items() if s[0] in "45"}
            assert "401" in errors and "422" in errors, (method, path)
            for status, response in errors.items():
                schema = response["content"]["application/json"]["schema"]
                assert schema == {"$ref": "#/components/schemas/ErrorBody"}, (path, status)


def test_docs_are_served_from_assets_in_the_package(client_for):
    with client_for(ScriptedProducer()) as client:
        assert client.get("/redoc").status_code == 404  # ReDoc 2 pulls its logo from a CDN
        for page in [client.get("/docs")]:
            assert page.status_code == 200
            urls = re.findall(r'(?:src|href|url)\s*[:=]\s*["\']([^"\']+)', page.text)
            assert urls, page.text[:500]
            assert all(u.startswith("/") for u in urls), urls  # nothing from a CDN
        for asset in ("swagger-ui-bundle.js", "swagger-ui.css"):
            r = client.get(f"/static-offline-docs/{asset}")
            assert r.status_code == 200 and len(r.content) > 10_000, asset
