from datetime import UTC, datetime

import orjson
import pytest

from onceflow.core.envelope import (
    HEADER_JOB_ID,
    HEADER_TRACEPARENT,
    JobEnvelope,
    params_digest,
)
from onceflow.core.errors import InvalidEnvelope
from onceflow.core.ids import is_valid_job_id, new_job_id, new_traceparent


@pytest.mark.parametrize("job_id", ["a", "job_01J2AB3CD4", "_x", "A-b_c-9", "x" * 100])
def test_valid_job_ids(job_id):
    assert is_valid_job_id(job_id)


@pytest.mark.parametrize(
    "job_id", ["", "-starts-with-dash", "has space", "x" * 101, "semi;colon", "ünïcode", "a\n"]
)
def test_invalid_job_ids(job_id):
    assert not is_valid_job_id(job_id)


def test_generated_ids_are_valid_unique_and_time_sortable():
    ids = [new_job_id() for _ in range(2000)]
    assert all(i.startswith("job_") and len(i) == 30 and is_valid_job_id(i) for i in ids)
    assert len(set(ids)) == len(ids)
    # ULIDs in one millisecond are random in their low bits, but the time prefix sorts.
    assert [i[:14] for i in ids] == sorted(i[:14] for i in ids)


def test_traceparent_format():
    version, trace, span, flags = new_traceparent().split("-")
    assert (version, flags, len(trace), len(span)) == ("00", "01", 32, 16)


def _env(**kw):
    base = dict(
        job_id="job_1",
        workflow="order-workflow",
        params={"b": 2, "a": [1, {"c": None}]},
        request_id="req_1",
        submitted_at=datetime(2026, 1, 2, 3, 4, 5, 6000, tzinfo=UTC),
        traceparent=new_traceparent(),
    )
    base.update(kw)
    return JobEnvelope(**base)


def test_envelope_round_trip():
    env = _env()
    assert JobEnvelope.decode(env.key(), env.encode()) == env


def test_envelope_headers_carry_the_ids():
    env = _env()
    headers = dict(env.headers())
    assert headers[HEADER_JOB_ID] == b"job_1"
    assert headers[HEADER_TRACEPARENT] == env.traceparent.encode()
    assert headers["onceflow-request-id"] == b"req_1"


def test_params_digest_ignores_key_order_but_not_values():
    assert params_digest({"a": 1, "b": {"x": 1, "y": 2}}) == params_digest(
        {"b": {"y": 2, "x": 1}, "a": 1}
    )
    assert params_digest({"a": 1}) != params_digest({"a": 2})


@pytest.mark.parametrize(
    ("key", "value", "reason"),
    [
        (b"k", b"not json", "not JSON"),
        (b"k", b"[1]", "not a JSON object"),
        (b"k", None, "no value"),
        (b"job_1", orjson.dumps({"v": 2}), "unsupported envelope version"),
        (b"x", _env().encode(), "key does not match"),
        (b"bad id", orjson.dumps({"v": 1, "job_id": "bad id"}), "invalid job_id"),
        (b"j", orjson.dumps({"v": 1, "job_id": "j", "params": {}}), "missing workflow"),
        (
            b"j",
            orjson.dumps({"v": 1, "job_id": "j", "workflow": "w", "params": []}),
            "params must be",
        ),
        (
            b"j",
            orjson.dumps({"v": 1, "job_id": "j", "workflow": "w", "params": {}}),
            "submitted_at",
        ),
    ],
)
def test_envelope_decode_says_why(key, value, reason):
    with pytest.raises(InvalidEnvelope, match=reason):
        JobEnvelope.decode(key, value)
