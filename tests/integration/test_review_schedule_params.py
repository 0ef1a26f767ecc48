"""A schedule's params over the admin API follow the job submissions' rule (found in
review): stored exactly, or refused with a 4xx naming why, never a 500 and never
another value. Each tick's instance gets these params as they are stored, so a
schedule is a way in for params like any other.

Before: FastAPI parsed the body with Python's json, so an integer past 64 bits and a
lone surrogate answered 500 (orjson could not encode them for the store), while NaN was
stored as null and ``-0.0`` and ``1e-400`` as ``0.0`` (201, the schedule created).
"""

from __future__ import annotations

import pytest
import sqlalchemy as sa
from fastapi.testclient import TestClient

from producers.api import create_app
from producers.models import ErrorBody
from tests.integration.test_admin_http import NoKafka

BAD_PARAMS = [
    ('{"n": 123456789012345678901234567890}', "params.n"),
    ('{"n": -0.0}', "params.n"),
    ('{"n": 1e-400}', "params.n"),
    ('{"n": NaN}', None),
    ('{"n": "\\ud800"}', None),
    ('{"n": 1, "n": 2}', "params.n"),
]


def _schedules(db) -> int:
    with db.connect() as conn:
        return conn.execute(sa.text("SELECT count(*) FROM onceflow_schedules")).scalar_one()


@pytest.mark.parametrize(("params", "field"), BAD_PARAMS)
def test_schedule_params_that_would_change_or_fail_are_refused(settings, db, params, field):
    body = (
        '{"name": "nightly", "workflow": "order-workflow", "every_seconds": 60,'
        f' "params": {params}}}'
    )
    with TestClient(create_app(settings, NoKafka()), raise_server_exceptions=False) as api:
        answer = api.post(
            "/v1/schedules", content=body, headers={"content-type": "application/json"}
        )
    assert 400 <= answer.status_code < 500, (params, answer.status_code, answer.text[:300])
    assert set(answer.json()) == set(ErrorBody.model_fields), answer.json()
    if field is not None:
        assert field in answer.json()["message"], answer.json()
    assert _schedules(db) == 0


def test_exact_schedule_params_are_stored_as_sent(settings, db):
    body = (
        '{"name": "nightly", "workflow": "order-workflow", "every_seconds": 60,'
        ' "params": {"big": 18446744073709551615, "small": 5e-324, "pi": 3.141592653589793}}'
    )
    with TestClient(create_app(settings, NoKafka())) as api:
        answer = api.post(
            "/v1/schedules", content=body, headers={"content-type": "application/json"}
        )
    assert answer.status_code == 201, answer.text
    assert answer.json()["params"] == {
        "big": 18446744073709551615,
        "small": 5e-324,
        "pi": 3.141592653589793,
    }
