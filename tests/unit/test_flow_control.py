"""Flow control declarations, and the job priority in the envelope and the HTTP body."""

from __future__ import annotations

from datetime import timedelta

import pytest

from onceflow.envelope import JobEnvelope
from onceflow.errors import InvalidEnvelope
from onceflow.vocabulary import DeadLetterReason
from producers.models import RequestError, parse_jobs
from workflow_engine import RateLimit, workflow
from workflow_engine.definitions import REGISTRY
from workflow_engine.model import FlowControl, flow_control, key_path


def test_a_key_is_a_dotted_path_on_params():
    assert key_path("params.tenant") == ("tenant",)
    assert key_path("params.customer.id") == ("customer", "id")
    assert key_path("params.items.0") == ("items", "0")
    for bad in ("tenant", "params", "params.", "body.tenant", "params..x"):
        with pytest.raises(ValueError, match="dotted path on params"):
            key_path(bad)


def test_rate_limit_period_in_seconds():
    assert RateLimit(100).seconds == 1.0
    assert RateLimit(5, timedelta(minutes=1)).seconds == 60.0
    assert RateLimit(5, 0.5).seconds == 0.5


def test_the_decorator_records_the_flow_control_and_the_lane():
    @workflow(
        "unit-flow",
        concurrency_key="params.customer_id",
        max_per_key=3,
        rate_limit=RateLimit(10, timedelta(seconds=2), key="params.tenant"),
        fairness_key="params.tenant",
    )
    async def flow(ctx, params):
        return None

    got = REGISTRY.flows()["unit-flow"]
    assert got == FlowControl(
        concurrency_key=("customer_id",),
        max_per_key=3,
        rate_limit=10,
        rate_period=2.0,
        rate_key=("tenant",),
        fairness_key=("tenant",),
    )
    assert REGISTRY.lane_path("unit-flow") == ("tenant",)  # fairness key first
    assert got.spec()["rate_period"] == 2.0 and got.spec()["concurrency_key"] == ["customer_id"]


def test_the_lane_falls_back_to_the_concurrency_key_then_the_rate_key():
    assert FlowControl(concurrency_key=("c",), rate_key=("r",)).lane == ("c",)
    assert FlowControl(rate_limit=1, rate_key=("r",)).lane == ("r",)
    assert FlowControl(concurrency=3).lane is None


def test_a_workflow_without_flow_control_declares_none():
    @workflow("unit-plain")
    async def plain(ctx, params):
        return None

    @workflow("unit-capped", concurrency=2)
    async def capped(ctx, params):
        return None

    assert flow_control() is None
    assert "unit-plain" not in REGISTRY.flows()
    assert REGISTRY.lane_path("unit-plain") is None  # no lane: the plain claim takes it
    assert REGISTRY.flows()["unit-capped"] == FlowControl(concurrency=2)
    assert REGISTRY.lane_path("unit-capped") == ()  # flow control without a key: the lane ''


@pytest.mark.parametrize(
    ("kwargs", "message"),
    [
        ({"max_per_key": 2}, "need a concurrency_key"),
        ({"hold_while_waiting": True}, "need a concurrency_key"),
        ({"concurrency_key": "params.c", "max_per_key": 0}, "max_per_key must be at least 1"),
        ({"rate_limit": RateLimit(0)}, "limit >= 1"),
        ({"rate_limit": RateLimit(1, timedelta(0))}, "positive period"),
        ({"fairness_key": "tenant"}, "dotted path on params"),
        ({"concurrency": 0}, "concurrency must be at least 1"),
    ],
)
def test_bad_declarations_are_refused(kwargs, message):
    with pytest.raises(ValueError, match=message):
        flow_control(**kwargs)


def test_the_envelope_carries_a_priority_and_leaves_out_the_default():
    high = JobEnvelope("job_1", "wf", {}, priority=1)
    assert JobEnvelope.decode(None, high.encode()).priority == 1
    default = JobEnvelope("job_1", "wf", {})
    assert b"priority" not in default.encode()
    assert JobEnvelope.decode(None, default.encode()).priority == 3


@pytest.mark.parametrize("value", [0, 6, "1", 2.0, True, None])
def test_an_envelope_priority_outside_1_to_5_is_dead_lettered(value):
    doc = b'{"job_id": "job_1", "workflow": "wf", "params": {}, "priority": %s}' % (
        str(value).lower().encode() if not isinstance(value, str) else b'"1"'
    )
    if value is None:
        doc = doc.replace(b"none", b"null")
    with pytest.raises(InvalidEnvelope) as caught:
        JobEnvelope.decode(None, doc)
    assert caught.value.reason == DeadLetterReason.INVALID_PRIORITY


def test_http_priority_defaults_to_3_and_out_of_range_is_a_422():
    assert parse_jobs(b'{"workflow": "w"}', 10, 1000)[0].priority == 3
    assert parse_jobs(b'{"workflow": "w", "priority": 5}', 10, 1000)[0].priority == 5
    for body, field in (
        (b'{"workflow": "w", "priority": 0}', "priority"),
        (b'{"workflow": "w", "priority": "2"}', "priority"),
        (b'{"jobs": [{"workflow": "w"}, {"workflow": "w", "priority": 6}]}', "jobs[1].priority"),
    ):
        with pytest.raises(RequestError) as caught:
            parse_jobs(body, 10, 1000)
        assert caught.value.status == 422
        assert caught.value.body.error == "invalid_request"
        assert caught.value.body.fields[0].field == field
