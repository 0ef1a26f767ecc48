"""What the schedules admin API refuses before the database sees it: a NUL character
(PostgreSQL text and jsonb cannot hold one; it was a driver error, a 500) and params
nested deeper than a job's may be."""

from __future__ import annotations

import pytest
from pydantic import ValidationError

from producers.models import MAX_PARAMS_DEPTH
from producers.routes.schedules import ScheduleIn


def test_a_plain_schedule_is_accepted():
    body = ScheduleIn(name="nightly", workflow="order-workflow", cron="0 3 * * *", params={"a": 1})
    assert body.params == {"a": 1}


@pytest.mark.parametrize(
    "fields",
    [
        {"workflow": "order\x00workflow"},
        {"timezone": "UTC\x00"},
        {"cron": "0 3 * * *\x00"},
        {"params": {"note": "a\x00b"}},
        {"params": {"k\x00": 1}},
    ],
)
def test_a_nul_character_is_refused_with_a_reason(fields):
    base = {"name": "nightly", "workflow": "order-workflow", "cron": "0 3 * * *"}
    with pytest.raises(ValidationError, match="NUL"):
        ScheduleIn(**{**base, **fields})


def test_params_nested_too_deep_are_refused():
    deep: dict = {}
    node = deep
    for _ in range(MAX_PARAMS_DEPTH + 1):
        node["x"] = {}
        node = node["x"]
    with pytest.raises(ValidationError, match="nested deeper"):
        ScheduleIn(name="nightly", workflow="w", cron="0 3 * * *", params=deep)
