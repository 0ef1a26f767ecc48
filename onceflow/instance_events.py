"""What an event sent to an instance may be: the one rule every front end applies.

An event (``send-event`` in the CLI, the console's form, ``POST
/v1/instances/{workflow}/{job_id}/events``) is stored by
``workflow_engine.store.operations.control.send_event``, which calls :func:`check_event` first, so
whichever way it comes, the same type pattern and size caps hold and a refusal says
the same thing. The type goes into an index (``onceflow_events_pending_idx``), whose
entries PostgreSQL caps at ~2.7 kB: an unbounded type would be refused by the
database (SQLSTATE 54000) instead of by us. The payload is stored as ``jsonb``, which
holds no NUL character and no NaN or infinity.
"""

from __future__ import annotations

import math
import re
from typing import Any

import orjson

from onceflow.errors import OnceflowError

#: Letters, digits and ``_ . : -``: the names workflow code waits for
#: (``ctx.wait_for_event(..., type="approved")``).
EVENT_TYPE_PATTERN = r"[A-Za-z0-9_.:-]+"
MAX_EVENT_TYPE_CHARS = 200
#: The payload as JSON text (UTF-8), at most.
MAX_EVENT_PAYLOAD_BYTES = 64 * 1024
_TYPE = re.compile(EVENT_TYPE_PATTERN)
_QUOTED = 60  # how much of a refused type a message quotes


class InvalidEvent(OnceflowError):
    """An event refused before anything is stored; ``field`` is ``type`` or ``payload``."""

    def __init__(self, field: str, reason: str) -> None:
        super().__init__(reason)
        self.field = field
        self.reason = reason


def check_event(event_type: str, payload: Any) -> bytes:
    """The payload as it will be stored (JSON), or :class:`InvalidEvent` saying why
    the event is refused."""
    check_event_type(event_type)
    try:
        _check_value(payload)
    except RecursionError:
        raise InvalidEvent("payload", "the payload is nested too deeply") from None
    try:
        encoded = orjson.dumps(payload)
    except (TypeError, orjson.JSONEncodeError) as exc:  # e.g. an integer past 64 bits
        raise InvalidEvent("payload", f"the payload cannot be stored as JSON: {exc}") from None
    if len(encoded) > MAX_EVENT_PAYLOAD_BYTES:
        raise InvalidEvent(
            "payload",
            f"the payload is {len(encoded)} bytes as JSON; at most"
            f" {MAX_EVENT_PAYLOAD_BYTES} are accepted",
        )
    return encoded


def check_event_type(event_type: str) -> None:
    """Refuse an event type outside :data:`EVENT_TYPE_PATTERN` or longer than
    :data:`MAX_EVENT_TYPE_CHARS`."""
    if not isinstance(event_type, str) or not event_type:
        raise InvalidEvent("type", "the event needs a type")
    if len(event_type) > MAX_EVENT_TYPE_CHARS:
        raise InvalidEvent(
            "type",
            f"the event type is {len(event_type)} characters; at most"
            f" {MAX_EVENT_TYPE_CHARS} are accepted",
        )
    if not _TYPE.fullmatch(event_type):
        raise InvalidEvent(
            "type",
            f"event type {event_type[:_QUOTED]!r}: use letters, digits and _ . : - only",
        )


def _check_value(value: Any, path: str = "payload") -> None:
    """Refuse what ``jsonb`` cannot hold as given: a NUL character in a string or a
    key, a NaN or an infinite number (orjson would write ``null`` for those)."""
    if isinstance(value, str):
        if "\x00" in value:
            raise InvalidEvent("payload", f"{path} holds a NUL character, which jsonb cannot")
    elif isinstance(value, float):
        if not math.isfinite(value):
            raise InvalidEvent("payload", f"{path} is {value}, which JSON cannot hold")
    elif isinstance(value, dict):
        for key, item in value.items():
            if isinstance(key, str) and "\x00" in key:
                raise InvalidEvent("payload", f"a key in {path} holds a NUL character")
            _check_value(item, f"{path}.{key}")
    elif isinstance(value, list | tuple):
        for n, item in enumerate(value):
            _check_value(item, f"{path}[{n}]")
