"""Start and wait end to end: ingest, a streams worker and an engine as subprocesses,
the engine's lifecycle events published by the outbox relay, and ``Prefer: wait=5``
answered from them."""

from __future__ import annotations

import time
import uuid

import httpx
import pytest

from onceflow_tools.stack import Stack

pytestmark = pytest.mark.timeout(180)


@pytest.fixture
def stack(base_settings, tmp_path):
    s = Stack(base_settings, f"wait-{uuid.uuid4().hex[:8]}", tmp_path / "run").prepare()
    assert s.db is not None and s.settings is not None
    s.start_ingest()
    s.start_worker()
    s.start_engine()
    yield s
    s.close()


def _submit(stack: Stack, job_id: str, step_seconds: float) -> tuple[httpx.Response, float]:
    job = {"job_id": job_id, "workflow": "order-workflow", "params": {"step_seconds": step_seconds}}
    started = time.monotonic()
    r = httpx.post(
        f"{stack.ingest_url}/v1/jobs",
        json=job,
        headers={**stack.auth_headers, "Prefer": "wait=5"},
        timeout=30,
    )
    return r, time.monotonic() - started


def test_a_quick_workflow_answers_200_and_a_slow_one_202_then_completes(stack):
    quick, took = _submit(stack, "e2e_quick", 0.1)  # three steps of 0.1 s
    assert quick.status_code == 200, quick.text
    assert quick.headers["preference-applied"] == "wait=5"
    body = quick.json()
    assert body["status"] == "complete" and took < 5
    assert body["result"] == {
        "receipt": "e2e_quick:charge payment",
        "shipment": "e2e_quick:ship",
    }

    slow, took = _submit(stack, "e2e_slow", 3.4)  # three steps of 3.4 s: about 10 s
    assert slow.status_code == 202, slow.text
    assert 5.0 <= took < 8.0
    assert slow.headers["location"] == "/v1/jobs/e2e_slow"
    # not lost by the wait: it completes, and its result can be waited for again
    done = httpx.get(
        f"{stack.ingest_url}/v1/jobs/e2e_slow/result",
        params={"wait": 30},
        headers=stack.auth_headers,
        timeout=40,
    )
    assert done.status_code == 200 and done.json()["status"] == "complete"
