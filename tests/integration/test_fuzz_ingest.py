"""The ingest API fuzzed from its own OpenAPI spec (schemathesis + hypothesis), with the
real producer on real Kafka: no 5xx, and every error is a JSON 4xx in the one
``ErrorBody`` shape (a code and a message)."""

from __future__ import annotations

import os
from collections import Counter

import schemathesis
from hypothesis import HealthCheck, given
from hypothesis import settings as hypothesis_settings

from onceflow.settings import ApiKey
from producers.api import create_app
from producers.auth import SCOPES, hash_key, new_key
from producers.models import ErrorBody

ERROR_SHAPE = set(ErrorBody.model_fields)

# CI runs 100 derandomized examples per operation; a manual run can ask for more, with
# fresh randomness: FUZZ_EXAMPLES=2000 FUZZ_RANDOM=1 pytest -k fuzz -s
EXAMPLES_PER_OPERATION = int(os.environ.get("FUZZ_EXAMPLES", "100"))
DERANDOMIZE = os.environ.get("FUZZ_RANDOM", "") in ("", "0")


def test_no_server_errors_and_clear_4xx(settings, capsys):
    key = new_key()
    app = create_app(
        settings.model_copy(
            update={
                "auth_disabled": False,
                "api_keys": [ApiKey(name="fuzz", sha256=hash_key(key), scopes=list(SCOPES))],
                "ingest_rate_limit_per_second": 0,
                # a stream reader of an unknown id answers its 404 at once, not after
                # waiting for the instance to appear
                "ingest_stream_wait_seconds": 0,
                # no start-and-wait: a fuzzed `Prefer: wait` or `?wait=` would hold each
                # request up to a minute (the answers' shapes are the same without it)
                "ingest_max_wait_seconds": 0,
            }
        )
    )
    schema = schemathesis.openapi.from_asgi("/openapi.json", app)
    statuses: Counter[int] = Counter()
    operations = 0
    for result in schema.get_all_operations():
        operation = result.ok()
        operations += 1

        @given(case=operation.as_strategy())
        @hypothesis_settings(
            max_examples=EXAMPLES_PER_OPERATION,
            deadline=None,
            database=None,
            derandomize=DERANDOMIZE,  # reproducible in CI
            suppress_health_check=list(HealthCheck),
        )
        def fuzz(case):
            case.headers = {**(case.headers or {}), "Authorization": f"Bearer {key}"}
            response = case.call()
            statuses[response.status_code] += 1
            assert response.status_code < 500, (case.method, case.path, response.text[:300])
            if response.status_code >= 400:
                content_type = response.headers.get("content-type") or [""]
                if isinstance(content_type, list):
                    content_type = content_type[0]
                assert content_type.startswith("application/json"), response.text[:200]
                body = response.json()
                assert set(body) == ERROR_SHAPE, body
                assert body["error"] and body["message"], body

        fuzz()
    with capsys.disabled():
        print(
            f"\nfuzzed {operations} operations, {sum(statuses.values())} requests:"
            f" {dict(sorted(statuses.items()))}"
        )
    assert operations >= 8
    assert sum(statuses.values()) >= operations * 10
    assert any(400 <= s < 500 for s in statuses)
