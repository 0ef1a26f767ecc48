from datetime import UTC, datetime

import orjson
import pytest

from onceflow.envelope import (
    HEADER_JOB_ID,
    HEADER_REQUEST_ID,
    HEADER_TRACEPARENT,
    JobEnvelope,
    params_digest,
)
from onceflow.errors import InvalidEnvelope
from onceflow.ids import is_valid_job_id, new_job_id, new_traceparent
from onceflow.vocabulary import DeadLetterReason, Origin


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
    assert JobEnvelope.decode(env.key(), env.encode(), env.headers()) == env
    assert env.origin == Origin.HTTP
    direct = _env(request_id=None)
    assert JobEnvelope.decode(direct.key(), direct.encode(), direct.headers()) == direct


def test_the_natural_record_format_is_accepted_with_defaults():
    """What kcat or a Java producer writes: no v, no submitted_at, no headers."""
    value = orjson.dumps({"job_id": "job_k1", "workflow": "order-workflow", "params": {"a": 1}})
    env = JobEnvelope.decode(b"job_k1", value, [], timestamp=1_800_000_000.25)
    assert (env.job_id, env.workflow, env.params) == ("job_k1", "order-workflow", {"a": 1})
    assert env.submitted_at == datetime.fromtimestamp(1_800_000_000.25, UTC)
    assert env.request_id is None and env.origin == Origin.KAFKA
    # keyless: accepted on the body's job id
    assert JobEnvelope.decode(None, value, []).job_id == "job_k1"


def test_provenance_comes_from_the_ingest_header_not_the_body():
    body = orjson.dumps({"job_id": "j", "workflow": "w", "params": {}, "request_id": "req_x"})
    assert JobEnvelope.decode(b"j", body, []).origin == Origin.KAFKA
    via_ingest = JobEnvelope.decode(b"j", body, [(HEADER_REQUEST_ID, b"req_x")])
    assert (via_ingest.origin, via_ingest.request_id) == (Origin.HTTP, "req_x")


def test_a_naive_submitted_at_is_utc():
    body = orjson.dumps(
        {"job_id": "j", "workflow": "w", "params": {}, "submitted_at": "2026-01-02T03:04:05"}
    )
    assert JobEnvelope.decode(b"j", body, []).submitted_at == datetime(
        2026, 1, 2, 3, 4, 5, tzinfo=UTC
    )


def test_envelope_headers_carry_the_ids():
    env = _env()
    headers = dict(env.headers())
    assert headers[HEADER_JOB_ID] == b"job_1"
    assert headers[HEADER_TRACEPARENT] == env.traceparent.encode()
    assert headers["onceflow-request-id"] == b"req_1"


def test_each_record_carries_its_own_submitted_at_in_value_and_header():
    first = datetime(2026, 11, 30, 10, 0, 0, 5, tzinfo=UTC)
    second = datetime(2026, 11, 30, 10, 0, 1, tzinfo=UTC)
    envelopes = [_env(submitted_at=first), _env(submitted_at=first), _env(submitted_at=second)]
    texts = ["10:00:00.000005", "10:00:00.000005", "10:00:01.000000"]
    for env, text in zip(envelopes, texts, strict=True):
        at = f"2026-11-30T{text}+00:00"
        assert orjson.loads(env.encode())["submitted_at"] == at
        assert dict(env.headers())["onceflow-submitted-at"] == at.encode()


def test_params_digest_ignores_key_order_but_not_values():
    assert params_digest({"a": 1, "b": {"x": 1, "y": 2}}) == params_digest(
        {"b": {"y": 2, "x": 1}, "a": 1}
    )
    assert params_digest({"a": 1}) != params_digest({"a": 2})


R = DeadLetterReason
_OK = {"job_id": "j", "workflow": "w", "params": {}}


@pytest.mark.parametrize(
    ("key", "value", "code", "text"),
    [
        (b"k", b"not json", R.NOT_JSON, "not JSON"),
        (b"k", b"[1]", R.NOT_AN_OBJECT, "not a JSON object"),
        (b"k", None, R.NO_VALUE, "no value"),
        (b"j", orjson.dumps({**_OK, "v": 2}), R.UNSUPPORTED_VERSION, "version 2"),
        (b"j", orjson.dumps({**_OK, "v": "1"}), R.UNSUPPORTED_VERSION, "version '1'"),
        (b"j", orjson.dumps({**_OK, "v": True}), R.UNSUPPORTED_VERSION, "version True"),
        (b"j", orjson.dumps({**_OK, "v": 0}), R.UNSUPPORTED_VERSION, "version 0"),
        (b"x", _env().encode(), R.KEY_MISMATCH, "does not match"),
        (b"bad id", orjson.dumps({"v": 1, "job_id": "bad id"}), R.INVALID_JOB_ID, "invalid job_id"),
        (None, orjson.dumps({"workflow": "w", "params": {}}), R.INVALID_JOB_ID, "invalid job_id"),
        (b"j", orjson.dumps({"v": 1, "job_id": "j", "params": {}}), R.MISSING_WORKFLOW, "workflow"),
        (b"j", orjson.dumps({**_OK, "params": []}), R.INVALID_PARAMS, "params must be"),
        (b"j", orjson.dumps({**_OK, "submitted_at": "soon"}), R.INVALID_SUBMITTED_AT, "soon"),
        (b"j", orjson.dumps({**_OK, "submitted_at": 17}), R.INVALID_SUBMITTED_AT, "17"),
    ],
)
def test_envelope_decode_gives_a_code_and_says_why(key, value, code, text):
    with pytest.raises(InvalidEnvelope, match=text) as caught:
        JobEnvelope.decode(key, value, [])
    assert caught.value.reason == code
    assert str(caught.value) == caught.value.detail
