"""The one rule for a delayed start (``run_at`` / ``start_after``), which ingest's 422
and the worker's dead letter share, and the workflow decorator's default."""

from __future__ import annotations

from datetime import UTC, datetime, timedelta

import orjson
import pytest

from onceflow.envelope import MAX_START_DELAY_SECONDS, JobEnvelope, start_time
from onceflow.errors import InvalidEnvelope
from onceflow.vocabulary import DeadLetterReason
from workflow_engine import workflow
from workflow_engine.definitions import REGISTRY

AT = datetime(2026, 11, 29, 16, 0, tzinfo=UTC)


def test_run_at_and_start_after_give_the_start_time():
    assert start_time(None, None, AT) is None
    assert start_time("2026-11-29T18:00:00Z", None, AT) == AT + timedelta(hours=2)
    assert start_time("2026-11-29T18:00:00+02:00", None, AT) == AT
    assert start_time(None, 90, AT) == AT + timedelta(seconds=90)
    assert start_time(None, 0.5, AT) == AT + timedelta(seconds=0.5)
    past = start_time("2020-01-01T00:00:00Z", None, AT)
    assert past is not None and past < AT  # the store starts it now


@pytest.mark.parametrize(
    ("run_at", "start_after", "reason"),
    [
        ("2026-11-29T18:00:00", None, "no UTC offset"),
        ("2026-11-30", None, "RFC 3339"),
        ("tomorrow", None, "RFC 3339"),
        (1764432000, None, "RFC 3339"),
        ("2027-12-01T00:00:00Z", None, "more than 365 days"),
        (None, -1, "0 to"),
        (None, True, "a number of seconds"),
        (None, "5", "a number of seconds"),
        (None, MAX_START_DELAY_SECONDS + 1, "0 to"),
        ("2026-11-29T18:00:00Z", 5, "not both"),
    ],
)
def test_a_bad_start_time_is_refused_with_its_reason(run_at, start_after, reason):
    with pytest.raises(ValueError, match=reason):
        start_time(run_at, start_after, AT)


def test_the_envelope_carries_run_at_and_dead_letters_a_bad_one():
    env = JobEnvelope("j1", "w", {}, submitted_at=AT, run_at=AT + timedelta(minutes=5))
    decoded = JobEnvelope.decode(b"j1", env.encode())
    assert decoded.run_at == AT + timedelta(minutes=5)
    relative = orjson.dumps(
        {
            "job_id": "j2",
            "workflow": "w",
            "params": {},
            "submitted_at": AT.isoformat(),
            "start_after": 60,
        }
    )
    assert JobEnvelope.decode(b"j2", relative).run_at == AT + timedelta(minutes=1)
    bad = orjson.dumps({"job_id": "j3", "workflow": "w", "params": {}, "run_at": "soon"})
    with pytest.raises(InvalidEnvelope) as refused:
        JobEnvelope.decode(b"j3", bad)
    assert refused.value.reason == DeadLetterReason.INVALID_RUN_AT


def test_the_workflow_decorator_takes_a_default_start_delay_checked_at_load():
    @workflow("test-start-after-default", start_after=timedelta(minutes=2))
    async def delayed(ctx, params):
        return None

    assert REGISTRY.start_after("test-start-after-default") == 120.0
    with pytest.raises(ValueError, match="outside"):
        workflow("test-start-after-too-far", start_after=2 * MAX_START_DELAY_SECONDS)
