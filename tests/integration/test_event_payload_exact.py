"""An event's payload over the admin API is stored exactly or refused with a reason,
as a job's params are (found in review: -0.0 and 1e-400 became 0, a repeated key kept
the last value)."""

from __future__ import annotations

import pytest
from fastapi.testclient import TestClient

from onceflow.envelope import JobEnvelope
from producers.api import create_app
from tests.integration.test_admin_http import NoKafka
from workflow_engine.model import Delivery
from workflow_engine.store.writes import create_instances


@pytest.fixture
def client(settings, db):
    create_instances(db, [Delivery(JobEnvelope("ev_1", "approval-workflow", {}), "t", 0, 0)])
    with TestClient(create_app(settings, NoKafka())) as c:
        yield c


@pytest.mark.parametrize(
    "body",
    [
        b'{"type": "approved", "payload": {"x": -0.0}}',
        b'{"type": "approved", "payload": {"x": 1e-400}}',
        b'{"type": "approved", "payload": {"x": 1, "x": 2}}',
    ],
)
def test_a_payload_that_would_be_stored_as_something_else_is_refused(client, db, body):
    answer = client.post(
        "/v1/instances/approval-workflow/ev_1/events",
        content=body,
        headers={"content-type": "application/json"},
    )
    assert 400 <= answer.status_code < 500, answer.text
    assert "error" in answer.json()
    with db.connect() as conn:
        assert conn.exec_driver_sql("SELECT count(*) FROM onceflow_events").scalar() == 0


def test_an_exact_payload_is_stored_as_sent(client, db):
    answer = client.post(
        "/v1/instances/approval-workflow/ev_1/events",
        content=b'{"type": "approved", "payload": {"x": 0.1, "n": 12345678901234567}}',
        headers={"content-type": "application/json"},
    )
    assert answer.status_code == 202, answer.text
    with db.connect() as conn:
        stored = conn.exec_driver_sql("SELECT payload FROM onceflow_events").scalar()
    assert stored == {"x": 0.1, "n": 12345678901234567}
