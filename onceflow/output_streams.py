"""What a value appended to an instance's output stream may be: the one rule.

Workflow code appends with ``ctx.emit(stream, value)`` (or ``emit()`` in step code);
the engine checks both here before anything is written, and ingest checks the
``?stream=`` filter of ``GET /v1/jobs/{id}/stream`` by the same name rule, so a name
the engine could never write is refused at once instead of being waited for.

A stream name is an SSE ``event:`` field and part of an index entry: letters, digits
and ``_ . : -`` (no line break can end the field early), at most
:data:`MAX_STREAM_NAME_CHARS`. ``end`` is the reader's last event (the instance's final
status), so no stream may take that name. A value is stored as ``jsonb``, which holds
no NUL character and no NaN or infinity (orjson would write ``null`` for those: a
value other than the one emitted), and is bounded in size.
"""

from __future__ import annotations

import math
import re
from enum import StrEnum
from typing import Any

import orjson

from onceflow.errors import OnceflowError

STREAM_NAME_PATTERN = r"[A-Za-z0-9_.:-]+"
MAX_STREAM_NAME_CHARS = 200
#: The SSE event a reader gets last, once the instance has finished.
END_EVENT = "end"
_NAME = re.compile(STREAM_NAME_PATTERN)
_QUOTED = 60


class StreamRefusal(StrEnum):
    """Why an emit is refused before anything is written."""

    NAME_MISSING = "stream_name_missing"
    NAME_TOO_LONG = "stream_name_too_long"
    NAME_CHARACTERS = "stream_name_characters"
    NAME_RESERVED = "stream_name_reserved"
    VALUE_NOT_JSON = "stream_value_not_json"
    VALUE_TOO_DEEP = "stream_value_too_deep"
    VALUE_NUL = "stream_value_nul"
    VALUE_NOT_FINITE = "stream_value_not_finite"
    VALUE_TOO_LARGE = "stream_value_too_large"


class InvalidStreamValue(OnceflowError):
    """An emit refused by the rule: ``code`` says why, the message in words."""

    def __init__(self, code: StreamRefusal, reason: str) -> None:
        super().__init__(reason)
        self.code = code
        self.reason = reason


def check_stream_name(name: Any) -> str:
    """``name`` if it is a valid stream name, else :class:`InvalidStreamValue`."""
    if not isinstance(name, str) or not name:
        raise InvalidStreamValue(StreamRefusal.NAME_MISSING, "a stream needs a name")
    if len(name) > MAX_STREAM_NAME_CHARS:
        raise InvalidStreamValue(
            StreamRefusal.NAME_TOO_LONG,
            f"stream name {name[:_QUOTED]!r}... is {len(name)} characters; at most"
            f" {MAX_STREAM_NAME_CHARS} are accepted",
        )
    if not _NAME.fullmatch(name):
        raise InvalidStreamValue(
            StreamRefusal.NAME_CHARACTERS,
            f"stream name {name[:_QUOTED]!r}: use letters, digits and _ . : - only",
        )
    if name == END_EVENT:
        raise InvalidStreamValue(
            StreamRefusal.NAME_RESERVED,
            f"stream name {END_EVENT!r} is the readers' last event; choose another",
        )
    return name


def encode_stream_value(value: Any, max_bytes: int) -> bytes:
    """``value`` as the JSON that will be stored and sent, or :class:`InvalidStreamValue`."""
    try:
        _check_storable(value)
    except RecursionError:
        raise InvalidStreamValue(
            StreamRefusal.VALUE_TOO_DEEP, "the stream value is nested too deeply"
        ) from None
    try:
        data = orjson.dumps(value)
    except (TypeError, orjson.JSONEncodeError) as exc:
        raise InvalidStreamValue(
            StreamRefusal.VALUE_NOT_JSON, f"the stream value is not JSON: {exc}"
        ) from None
    if len(data) > max_bytes:
        raise InvalidStreamValue(
            StreamRefusal.VALUE_TOO_LARGE,
            f"the stream value is {len(data)} bytes as JSON; at most {max_bytes} are accepted"
            " (ONCEFLOW_STREAM_VALUE_MAX_BYTES)",
        )
    return data


def _check_storable(value: Any) -> None:
    """Refuse what ``jsonb`` cannot hold as given: a NUL character, NaN, an infinity."""
    if isinstance(value, str):
        if "\x00" in value:
            raise InvalidStreamValue(
                StreamRefusal.VALUE_NUL, "the stream value holds a NUL character"
            )
    elif isinstance(value, float):
        if not math.isfinite(value):
            raise InvalidStreamValue(
                StreamRefusal.VALUE_NOT_FINITE, f"the stream value holds {value}"
            )
    elif isinstance(value, dict):
        for key, item in value.items():
            if isinstance(key, str) and "\x00" in key:
                raise InvalidStreamValue(
                    StreamRefusal.VALUE_NUL, "a key in the stream value holds a NUL character"
                )
            _check_storable(item)
    elif isinstance(value, list | tuple):
        for item in value:
            _check_storable(item)
