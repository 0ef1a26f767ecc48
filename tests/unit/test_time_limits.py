"""The one rule for a time limit (``start_within``, ``execution_timeout``: seconds, more
than 0, at most a year), which ingest's 422, the worker's dead letter and the workflow
decorator's check at registration share; at and just past its bounds."""

from __future__ import annotations

import math
from datetime import timedelta

import orjson
import pytest

from onceflow.envelope import MAX_TIME_LIMIT_SECONDS, JobEnvelope, time_limit
from onceflow.errors import InvalidEnvelope
from onceflow.vocabulary import DeadLetterReason
from producers.models import RequestError, parse_jobs
from workflow_engine import workflow
from workflow_engine.definitions import REGISTRY


@pytest.mark.parametrize(
    ("value", "seconds"),
    [(None, None), (1, 1.0), (0.001, 0.001), (MAX_TIME_LIMIT_SECONDS, MAX_TIME_LIMIT_SECONDS)],
)
def test_a_limit_within_its_bounds_is_seconds(value, seconds):
    assert time_limit("start_within", value) == seconds


@pytest.mark.parametrize(
    "value",
    [
        0,
        -1,
        MAX_TIME_LIMIT_SECONDS + 0.001,
        MAX_TIME_LIMIT_SECONDS + 1,
        True,
        "5",
        math.nan,
        math.inf,
        [1],
    ],
)
def test_a_limit_outside_its_bounds_or_not_a_number_is_refused(value):
    with pytest.raises(ValueError, match="more than 0 and at most"):
        time_limit("start_within", value)


def _record(**extra):
    return orjson.dumps({"job_id": "j1", "workflow": "w", "params": {}, **extra})


def test_the_envelope_carries_start_within_and_dead_letters_a_bad_one():
    assert JobEnvelope.decode(b"j1", _record()).start_within is None
    env = JobEnvelope.decode(b"j1", _record(start_within=300))
    assert env.start_within == 300.0
    assert JobEnvelope.decode(b"j1", env.encode()).start_within == 300.0  # round trip
    at_limit = JobEnvelope.decode(b"j1", _record(start_within=MAX_TIME_LIMIT_SECONDS))
    assert at_limit.start_within == MAX_TIME_LIMIT_SECONDS
    for bad in (0, MAX_TIME_LIMIT_SECONDS + 1, "60", False):
        with pytest.raises(InvalidEnvelope) as refused:
            JobEnvelope.decode(b"j1", _record(start_within=bad))
        assert refused.value.reason == DeadLetterReason.INVALID_START_WITHIN


def _job(**extra):
    return orjson.dumps({"workflow": "w", "params": {}, **extra})


def test_ingest_refuses_a_bad_start_within_with_a_reason_and_keeps_a_good_one():
    (job,) = parse_jobs(_job(start_within=MAX_TIME_LIMIT_SECONDS), 10, 1 << 20)
    assert job.start_within == MAX_TIME_LIMIT_SECONDS
    for bad in (0, -5, MAX_TIME_LIMIT_SECONDS + 1):
        with pytest.raises(RequestError) as refused:
            parse_jobs(_job(start_within=bad), 10, 1 << 20)
        assert refused.value.status == 422
        assert refused.value.body.fields[0].field == "start_within"
        assert "more than 0" in refused.value.body.fields[0].reason
    with pytest.raises(RequestError) as refused:  # a string is not seconds (strict)
        parse_jobs(_job(start_within="60"), 10, 1 << 20)
    assert refused.value.status == 422


def test_the_workflow_decorator_checks_its_limits_when_the_module_loads():
    @workflow(
        "test-time-limits-declared",
        start_within=timedelta(minutes=5),
        execution_timeout=MAX_TIME_LIMIT_SECONDS,
    )
    async def limited(ctx, params):
        return None

    assert REGISTRY.start_within("test-time-limits-declared") == 300.0
    assert REGISTRY.execution_timeouts()["test-time-limits-declared"] == MAX_TIME_LIMIT_SECONDS
    with pytest.raises(ValueError, match=r"test-time-limits-zero.*start_within"):
        workflow("test-time-limits-zero", start_within=0)
    with pytest.raises(ValueError, match="execution_timeout"):
        workflow("test-time-limits-long", execution_timeout=timedelta(days=366))
    with pytest.raises(ValueError, match="execution_timeout"):
        workflow("test-time-limits-bool", execution_timeout=True)  # type: ignore[arg-type]
