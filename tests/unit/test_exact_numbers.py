"""A number in a job's params is stored as written or refused (issue 23: ``1e-400`` and
``-0.0`` were stored as ``0.0``): ingest answers 422 in the one error body shape, and the
worker dead-letters a record a producer wrote to the topic directly (``invalid_params``).
"""

from __future__ import annotations

from decimal import Decimal

import orjson
import pytest
from fastapi.testclient import TestClient
from hypothesis import assume, given
from hypothesis import strategies as st

from onceflow.envelope import JobEnvelope
from onceflow.exact_numbers import Inexact, exact_loads, floats_in, may_be_inexact
from onceflow.settings import Settings
from onceflow.vocabulary import DeadLetterReason
from producers.api import create_app
from producers.kafka import Ack
from streams.records import RawRecord, classify
from tests.unit.registries import registry_of

REFUSED = [
    (b"1e-400", "too small for a 64-bit float and would be stored as 0.0"),
    (b"-0.0", "negative zero"),
    (b"-0e5", "negative zero"),
    (b"4e-324", "would be stored as 5e-324"),
    (b"3.14159265358979323846", "more than 17 significant digits"),
    (b"0." + b"0" * 400 + b"1", "would be stored as 0.0"),
]
KEPT = [
    (b"0.1", 0.1),
    (b"-0.5", -0.5),
    (b"0.0", 0.0),
    (b"0", 0),
    (b"-0", 0),  # the integer zero: integers have no sign on zero to lose
    (b"5e-324", 5e-324),
    (b"1e300", 1e300),
    (b"-2.5e19", -2.5e19),
    (b"18446744073709551615", 2**64 - 1),
    (b"5.6843418860808015E-14", 5.6843418860808015e-14),  # Java's 17 digits: one float
]


class Producer:
    """Acknowledges every record and keeps what it was given."""

    def __init__(self) -> None:
        self.sent: list[JobEnvelope] = []

    async def send(self, envelopes):
        self.sent.extend(envelopes)
        return [Ack(e.job_id, 0, i) for i, e in enumerate(envelopes)]

    def ready(self):
        return True

    def close(self):
        return 0


def _post(body: bytes):
    producer = Producer()
    settings = Settings(auth_disabled=True, ingest_validate_types=False)
    with TestClient(create_app(settings, producer)) as client:
        answer = client.post("/v1/jobs", content=body, headers={"content-type": "application/json"})
    return answer, producer.sent


@pytest.mark.parametrize(("number", "why"), REFUSED)
def test_ingest_refuses_a_number_it_would_not_store_as_written(number, why):
    body = b'{"jobs":[{"workflow":"w"},{"workflow":"w","params":{"at":"2024-01-05","x":[' + number
    answer, sent = _post(body + b"]}}]}")
    assert answer.status_code == 422, answer.text
    error = answer.json()
    assert error["error"] == "number_not_exact"
    assert error["fields"][0]["field"] == "jobs[1].params.x[0]"
    assert why in error["fields"][0]["reason"] and why in error["message"]
    assert sent == []  # nothing reached Kafka


@pytest.mark.parametrize(("number", "value"), KEPT)
def test_ingest_keeps_every_other_number_as_the_value_written(number, value):
    answer, [env] = _post(b'{"workflow":"w","params":{"x":' + number + b',"d":"2024-01-05"}}')
    assert answer.status_code == 202, answer.text
    kept = env.params["x"]
    assert (kept, type(kept)) == (value, type(value))
    # What goes to Kafka (and on to jsonb) is that same value, sign included.
    assert Decimal(orjson.loads(env.encode())["params"]["x"].__repr__()) == Decimal(repr(value))


def _record(value: bytes) -> RawRecord:
    return RawRecord("onceflow.jobs", 0, 7, b"j1", value, [])


@pytest.mark.parametrize(("number", "why"), REFUSED)
def test_the_worker_dead_letters_a_direct_record_with_such_a_number(number, why):
    value = b'{"job_id":"j1","workflow":"w","params":{"a":{"b":' + number + b"}}}"
    deliveries, [dead] = classify([_record(value)], 1 << 20, registry_of({"w": "v1"}))
    assert deliveries == []
    assert (dead.reason, dead.job_id) == (DeadLetterReason.INVALID_PARAMS, "j1")
    assert dead.detail.startswith("params.a.b: ") and why in dead.detail


@pytest.mark.parametrize(("number", "value"), KEPT)
def test_the_worker_takes_a_direct_record_with_any_other_number(number, value):
    value_bytes = b'{"job_id":"j1","workflow":"w","params":{"a":' + number + b"}}"
    [delivery], dead = classify([_record(value_bytes)], 1 << 20, registry_of({"w": "v1"}))
    assert dead == [] and delivery.envelope.params == {"a": value}


def test_records_ingest_writes_are_not_parsed_twice_for_their_dates_and_ids():
    env = JobEnvelope("job_01J2AB3CD4", "w", {"due": "2026-01-05", "n": 0.0, "m": -0.5})
    assert not may_be_inexact(env.encode())


# The fast check may send a clean body to the exact parse, never let a changed number by.
_numbers = st.builds(
    lambda sign, whole, frac, exp: sign + whole + frac + exp,
    st.sampled_from(["", "-"]),
    st.one_of(st.just("0"), st.from_regex(r"[1-9][0-9]{0,25}", fullmatch=True)),
    st.one_of(st.just(""), st.from_regex(r"\.[0-9]{1,25}", fullmatch=True)),
    st.one_of(st.just(""), st.from_regex(r"[eE][+-]?[0-9]{1,3}", fullmatch=True)),
)


@given(_numbers)
def test_the_fast_check_never_clears_a_number_the_exact_parse_marks(text):
    raw = b'{"x":' + text.encode() + b"}"
    try:
        parsed = orjson.loads(raw)
    except orjson.JSONDecodeError:  # beyond the float's range: refused as not JSON (400)
        assume(False)
    floats, suspect = floats_in(parsed)
    if isinstance(exact_loads(raw)["x"], Inexact):
        assert suspect or (floats and may_be_inexact(raw))
