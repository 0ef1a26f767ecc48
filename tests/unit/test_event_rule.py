"""The one send-event rule (onceflow.instance_events, applied by the store's
operations.send_event): every refusal carries a code, the field at fault and a message."""

from __future__ import annotations

import pytest

from workflow_engine.store.operations import (
    MAX_EVENT_PAYLOAD_BYTES,
    MAX_EVENT_TYPE_CHARS,
    EventRefusal,
    InvalidEvent,
    check_event,
)

R = EventRefusal


@pytest.mark.parametrize(
    ("event_type", "payload", "code", "field", "words"),
    [
        ("", None, R.MISSING_TYPE, "type", "needs a type"),
        ("x" * (MAX_EVENT_TYPE_CHARS + 1), None, R.TYPE_TOO_LONG, "type", "at most 200"),
        ("not valid!", None, R.TYPE_CHARACTERS, "type", "use letters, digits"),
        ("ok", "x" * MAX_EVENT_PAYLOAD_BYTES, R.PAYLOAD_TOO_LARGE, "payload", "at most 65536"),
        ("ok", {"a\x00": 1}, R.PAYLOAD_NUL, "payload", "NUL"),
        ("ok", ["\x00"], R.PAYLOAD_NUL, "payload", "NUL"),
        ("ok", [float("nan")], R.PAYLOAD_NOT_FINITE, "payload", "JSON cannot hold"),
        ("ok", 10**30, R.PAYLOAD_NOT_STORABLE, "payload", "64-bit"),
    ],
)
def test_each_refusal_has_its_code_field_and_message(event_type, payload, code, field, words):
    with pytest.raises(InvalidEvent, match=words) as refused:
        check_event(event_type, payload)
    assert (refused.value.code, refused.value.field) == (code, field)
    assert refused.value.reason == str(refused.value)


def test_a_nested_payload_too_deep_is_refused_with_its_code():
    deep: list = []
    for _ in range(100_000):
        deep = [deep]
    with pytest.raises(InvalidEvent) as refused:
        check_event("ok", deep)
    assert refused.value.code == R.PAYLOAD_TOO_DEEP


def test_an_event_within_the_rule_is_the_json_stored():
    assert check_event("order.approved:v2", {"by": "ann", "n": [1, 2.5]}) == (
        b'{"by":"ann","n":[1,2.5]}'
    )
    assert check_event("t" * MAX_EVENT_TYPE_CHARS, None) == b"null"
