"""Searchable attributes (issue 26, item 7): the one bounds rule
(``onceflow.envelope.check_attributes``) that ingest's 422, the worker's dead letter and
``ctx.set_attributes`` share, at and just past each limit; the merge of an update; and
the ``attr.<key>`` filter terms."""

from __future__ import annotations

import orjson
import pytest

from onceflow.envelope import (
    MAX_ATTRIBUTE_INT,
    MAX_ATTRIBUTE_VALUE_CHARS,
    MAX_ATTRIBUTES,
    MAX_ATTRIBUTES_BYTES,
    JobEnvelope,
    check_attributes,
    merge_attributes,
)
from onceflow.errors import InvalidEnvelope
from onceflow.vocabulary import DeadLetterReason
from producers.models import RequestError, parse_jobs
from workflow_engine.store.views import InstanceFilter, InvalidFilter
from workflow_engine.store.views.listing import attribute_matches, where_clause


def _sized(total: int) -> dict[str, str]:
    """Attributes of exactly ``total`` bytes as compact JSON, in values of <= 256 chars."""
    doc: dict[str, str] = {}
    n = 0
    while len(orjson.dumps(doc)) < total:
        key = f"k{n:02d}"
        doc[key] = ""
        room = total - len(orjson.dumps(doc))
        doc[key] = "x" * min(room, MAX_ATTRIBUTE_VALUE_CHARS)
        n += 1
    assert len(orjson.dumps(doc)) == total
    return doc


def test_the_limits_are_the_documented_ones():
    assert (MAX_ATTRIBUTES, MAX_ATTRIBUTE_VALUE_CHARS, MAX_ATTRIBUTES_BYTES) == (16, 256, 2048)
    assert MAX_ATTRIBUTE_INT == 2**53 - 1


def test_at_each_limit_is_accepted_unchanged():
    sixteen = {f"k{i}": i for i in range(MAX_ATTRIBUTES)}
    assert check_attributes(sixteen) == sixteen
    long_key = "a" + "b" * 63
    assert check_attributes({long_key: 1}) == {long_key: 1}
    assert check_attributes({"a.b-c_9": "x" * MAX_ATTRIBUTE_VALUE_CHARS})
    assert check_attributes({"big": MAX_ATTRIBUTE_INT, "small": -MAX_ATTRIBUTE_INT})
    assert check_attributes({"f": 0.5, "t": True, "n": False, "e": ""})
    assert check_attributes({"f": 9.0e15, "g": -9.0e15, "z": 0.0, "s": 1e-300})
    doc = _sized(MAX_ATTRIBUTES_BYTES)
    assert check_attributes(doc) == doc
    assert check_attributes({}) == {}
    # multi-byte characters count as characters for the value, as bytes for the whole
    assert check_attributes({"u": "é" * MAX_ATTRIBUTE_VALUE_CHARS})


@pytest.mark.parametrize(
    ("value", "says"),
    [
        ({f"k{i}": i for i in range(MAX_ATTRIBUTES + 1)}, "17 keys, at most 16"),
        ({"a" + "b" * 64: 1}, "does not match"),
        ({"Tenant": "x"}, "does not match"),
        ({"1x": "x"}, "does not match"),
        ({"": "x"}, "does not match"),
        ({"a b": "x"}, "does not match"),
        ({"v": "x" * (MAX_ATTRIBUTE_VALUE_CHARS + 1)}, "257 characters, at most 256"),
        ({"v": MAX_ATTRIBUTE_INT + 1}, "beyond"),
        ({"v": -MAX_ATTRIBUTE_INT - 1}, "beyond"),
        ({"v": float("inf")}, "not finite"),
        ({"v": float("nan")}, "not finite"),
        ({"v": -0.0}, "negative zero"),
        ({"v": float(MAX_ATTRIBUTE_INT + 1)}, "beyond"),  # read back as a larger integer
        ({"v": -1e300}, "beyond"),
        ({f"k{i}": 1e-300 for i in range(7)}, "bytes as JSON"),  # 302 bytes each as stored
        ({"v": "\ud800"}, "cannot be written as JSON"),  # a lone surrogate from code
        ({"v": None}, "not null"),
        ({"v": [1]}, "not list"),
        ({"v": {"a": 1}}, "not dict"),
        ({"v": "a\x00b"}, "NUL"),
        (["tenant"], "must be a JSON object"),
        ("tenant=acme", "must be a JSON object"),
    ],
)
def test_just_past_each_limit_is_refused_saying_why(value, says):
    with pytest.raises(ValueError, match=says):
        check_attributes(value)


def test_the_whole_object_is_bounded_in_bytes():
    doc = _sized(MAX_ATTRIBUTES_BYTES + 1)
    with pytest.raises(ValueError, match="2049 bytes as JSON, at most 2048"):
        check_attributes(doc)
    # 16 keys of 256 multi-byte characters: every value fits, the whole does not
    with pytest.raises(ValueError, match="bytes as JSON"):
        check_attributes({f"k{i}": "é" * 256 for i in range(16)})


def test_an_update_merges_and_none_removes_a_key():
    current = {"tenant": "acme", "tier": "gold"}
    assert merge_attributes(current, {"tier": "silver", "n": 2}) == {
        "tenant": "acme",
        "tier": "silver",
        "n": 2,
    }
    assert merge_attributes(current, {"tier": None, "gone": None}) == {"tenant": "acme"}
    assert current == {"tenant": "acme", "tier": "gold"}  # not changed in place


def test_an_update_is_checked_on_the_merged_result():
    full = {f"k{i}": i for i in range(MAX_ATTRIBUTES)}
    assert merge_attributes(full, {"k0": "replaced"})["k0"] == "replaced"
    assert len(merge_attributes(full, {"k0": None, "new": 1})) == MAX_ATTRIBUTES
    with pytest.raises(ValueError, match="17 keys"):
        merge_attributes(full, {"new": 1})
    with pytest.raises(ValueError, match="does not match"):
        merge_attributes({}, {"Bad": None})
    with pytest.raises(ValueError, match="must be a dict"):
        merge_attributes({}, [("a", 1)])


def _decode(doc: dict) -> JobEnvelope:
    return JobEnvelope.decode(doc["job_id"].encode(), orjson.dumps(doc))


def test_the_envelope_carries_attributes_and_dead_letters_bad_ones():
    doc = {"job_id": "a_1", "workflow": "w", "params": {}, "attributes": {"tenant": "acme"}}
    env = _decode(doc)
    assert env.attributes == {"tenant": "acme"}
    assert orjson.loads(env.encode())["attributes"] == {"tenant": "acme"}
    assert "attributes" not in orjson.loads(JobEnvelope("a_2", "w", {}).encode())
    for bad in ({"Tenant": "x"}, {"v": "x" * 257}, "acme", {"n": None}):
        with pytest.raises(InvalidEnvelope) as caught:
            _decode({**doc, "attributes": bad})
        assert caught.value.reason == DeadLetterReason.INVALID_ATTRIBUTES


def test_the_envelope_refuses_a_number_its_parse_would_change():
    raw = b'{"job_id":"a_3","workflow":"w","params":{},"attributes":{"x":1e-400}}'
    with pytest.raises(InvalidEnvelope) as caught:
        JobEnvelope.decode(b"a_3", raw)
    assert caught.value.reason == DeadLetterReason.INVALID_ATTRIBUTES
    assert "attributes.x" in caught.value.detail


def test_ingest_answers_422_naming_the_job_and_field():
    body = orjson.dumps({"workflow": "w", "attributes": {"tenant": "acme", "tier": 2}})
    (job,) = parse_jobs(body, 100, 10_000)
    assert job.attributes == {"tenant": "acme", "tier": 2}
    batch = {"jobs": [{"workflow": "w"}, {"workflow": "w", "attributes": {"x": "y" * 300}}]}
    with pytest.raises(RequestError) as caught:
        parse_jobs(orjson.dumps(batch), 100, 10_000)
    assert caught.value.status == 422
    assert caught.value.body.error == "invalid_attributes"
    assert caught.value.body.fields[0].field == "jobs[1].attributes"
    assert "300 characters, at most 256" in caught.value.body.message
    # not an object: the same code as every other bad attributes, naming the field
    for body in (
        {"workflow": "w", "attributes": ["x"]},
        {"jobs": [{"workflow": "w"}, {"workflow": "w", "attributes": "tenant=acme"}]},
    ):
        with pytest.raises(RequestError, match=r"must be a JSON object|valid dictionary") as bad:
            parse_jobs(orjson.dumps(body), 100, 10_000)
        assert (bad.value.status, bad.value.body.error) == (422, "invalid_attributes")
        assert bad.value.body.fields[0].field in ("attributes", "jobs[1].attributes")


def test_filter_terms_round_trip_in_both_forms():
    f = InstanceFilter.parse("workflow=w,attr.tier=gold,attr.tenant=acme")
    assert f.attributes == (("tenant", "acme"), ("tier", "gold"))
    assert f.describe() == "workflow=w,attr.tenant=acme,attr.tier=gold"
    assert InstanceFilter.parse(f.describe()) == f
    assert InstanceFilter.from_params(f.as_params()) == f
    console = InstanceFilter.from_params({"workflow": "w", "attributes": "tier=gold, tenant=acme"})
    assert console == f
    assert InstanceFilter(workflow="w").with_attributes(["tier=gold", "tenant=acme"]) == f
    assert not f.empty and InstanceFilter().with_attributes(["a=1"]).empty is False


@pytest.mark.parametrize(
    ("text", "says"),
    [
        ("attr.Tenant=acme", "does not match"),
        ("attr.=acme", "does not match"),
        ("attr.tenant=", "needs a value"),
        ("attr.tenant=a,attr.tenant=b", "given twice"),
        ("attr.v=" + "x" * 257, "at most 256"),
        (",".join(f"attr.k{i}=1" for i in range(17)), "at most 16"),
    ],
)
def test_bad_filter_terms_are_refused(text, says):
    with pytest.raises(InvalidFilter, match=says):
        InstanceFilter.parse(text)


def test_bad_cli_terms_are_refused():
    with pytest.raises(InvalidFilter, match="not key=value"):
        InstanceFilter().with_attributes(["tenant"])
    with pytest.raises(InvalidFilter, match="not valid UTF-8"):  # argv's surrogateescape
        InstanceFilter().with_attributes([b"tenant=\xff".decode("utf-8", "surrogateescape")])
    assert InstanceFilter().with_attributes(["tenant=é"]).attributes == (("tenant", "é"),)
    with pytest.raises(InvalidFilter, match="given twice"):
        InstanceFilter.parse("attr.tenant=a").with_attributes(["tenant=b"])


def test_a_term_matches_the_string_and_the_value_it_spells():
    assert attribute_matches("t", "acme") == [b'{"t":"acme"}']
    assert attribute_matches("t", "2") == [b'{"t":"2"}', b'{"t":2}']
    # the number as written (jsonb's numeric compares it exactly), not a float's rounding
    assert attribute_matches("t", "-1.5e3") == [b'{"t":"-1.5e3"}', b'{"t":-1.5e3}']
    assert attribute_matches("t", "1e-400") == [b'{"t":"1e-400"}']  # no attribute is that
    assert attribute_matches("t", "1e400") == [b'{"t":"1e400"}']  # past any float
    assert attribute_matches("t", "-0.0") == [b'{"t":"-0.0"}', b'{"t":-0.0}']  # 0
    assert attribute_matches("t", "true") == [b'{"t":"true"}', b'{"t":true}']
    assert attribute_matches("t", "01") == [b'{"t":"01"}']  # not a JSON number
    sql, params = where_clause(InstanceFilter.parse("attr.a=x,attr.b=2"))
    assert sql.count("i.attributes @>") == 3 and " OR " in sql
    assert params["f_attr_0_0"] == '{"a":"x"}'
