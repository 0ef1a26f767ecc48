"""API keys with scopes, body size and per-client limits at the HTTP edge."""

from __future__ import annotations

import pytest
from fastapi.testclient import TestClient

from onceflow.errors import ConfigurationError
from onceflow.settings import ApiKey, Settings
from producers.api import create_app
from producers.auth import hash_key, new_key
from producers.limits import ClientLimiter
from producers.models import ErrorBody
from tests.unit.test_ingest_http import ScriptedProducer

SUBMIT, READ = new_key(), new_key()


def settings(**kw) -> Settings:
    keys = [
        ApiKey(name="producer", sha256=hash_key(SUBMIT), scopes=["jobs:submit"]),
        ApiKey(name="support", sha256=hash_key(READ), scopes=["jobs:read"]),
    ]
    return Settings(api_keys=keys, admin_api_enabled=True, ingest_validate_types=False, **kw)


JOB = {"job_id": "a", "workflow": "w"}


def test_refuses_to_start_without_keys():
    with pytest.raises(ConfigurationError, match="ONCEFLOW_API_KEYS"):
        create_app(Settings(), ScriptedProducer())


def test_missing_unknown_and_wrong_scope():
    producer = ScriptedProducer()
    with TestClient(create_app(settings(), producer)) as client:
        missing = client.post("/v1/jobs", json=JOB)
        unknown = client.post("/v1/jobs", json=JOB, headers={"Authorization": "Bearer nope"})
        wrong = client.post("/v1/jobs", json=JOB, headers={"X-API-Key": READ})
        ok = client.post("/v1/jobs", json=JOB, headers={"Authorization": f"Bearer {SUBMIT}"})
        control = client.post("/v1/instances/w/a/pause", headers={"X-API-Key": SUBMIT})
    assert (missing.status_code, unknown.status_code, wrong.status_code) == (401, 401, 403)
    assert missing.headers["www-authenticate"] == "Bearer"
    assert "lacks scope 'jobs:submit'" in wrong.json()["message"]
    # the one error shape, as on every other refusal
    assert [r.json()["error"] for r in (missing, unknown, wrong, control)] == [
        "unauthorized",
        "unauthorized",
        "forbidden",
        "forbidden",
    ]
    assert all(set(r.json()) == set(ErrorBody.model_fields) for r in (missing, wrong, control))
    assert ok.status_code == 202
    assert control.status_code == 403  # a submit key cannot pause instances
    assert [e.job_id for e in producer.sent] == ["a"]  # refused requests changed nothing
    for response in (missing, unknown, wrong):
        assert SUBMIT not in response.text and READ not in response.text


def test_body_over_the_limit_is_413():
    producer = ScriptedProducer()
    app = create_app(settings(ingest_max_body_bytes=2048), producer)
    jobs = {"jobs": [{"workflow": "w", "params": {"pad": "x" * 100}} for _ in range(30)]}
    with TestClient(app) as client:
        r = client.post("/v1/jobs", json=jobs, headers={"X-API-Key": SUBMIT})
    assert r.status_code == 413 and r.json()["error"] == "body_too_large"
    assert producer.sent == []


def test_rate_limit_is_per_client_with_retry_after():
    app = create_app(
        settings(ingest_rate_limit_per_second=1, ingest_rate_limit_burst=3), ScriptedProducer()
    )
    with TestClient(app) as client:
        codes = [
            client.post("/v1/jobs", json=JOB, headers={"X-API-Key": SUBMIT}).status_code
            for _ in range(5)
        ]
        limited = client.post("/v1/jobs", json=JOB, headers={"X-API-Key": SUBMIT})
    assert codes[:3] == [202, 202, 202] and codes[3:] == [429, 429]
    assert limited.headers["retry-after"] == "1"


def test_token_bucket_refills_and_isolates_clients():
    limiter = ClientLimiter(rate=10, burst=2, max_inflight=1)
    assert limiter.retry_after("a", now=0) is None
    assert limiter.retry_after("a", now=0) is None
    assert limiter.retry_after("a", now=0) == pytest.approx(0.1)
    assert limiter.retry_after("b", now=0) is None  # another client is not affected
    assert limiter.retry_after("a", now=0.1) is None  # refilled
    with limiter.slot("a") as first, limiter.slot("a") as second, limiter.slot("b") as other:
        assert (first, second, other) == (True, False, True)
    assert limiter.inflight == {}
