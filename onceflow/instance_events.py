"""What an event sent to an instance may be: the one rule every front end applies.

An event (``send-event`` in the CLI, the console's form, ``POST
/v1/instances/{workflow}/{job_id}/events``) is stored by the store's
``operations.send_event``, which calls :func:`check_event` first, so whichever way it
comes, the same type pattern and size caps hold and a refusal says the same thing: one
:class:`InvalidEvent` with a code (:class:`EventRefusal`) and a message, which each
front end turns into its own answer (a 422 naming the field, the console's 400 page,
one CLI line). The front ends reach the rule only through the store's operations face
(an import-linter contract); it sits here, in the core, because it is pure and the
engine's bound on the type a workflow waits for
(``workflow_engine.definitions.check_name``) is this one.

The type goes into an index (``onceflow_events_pending_idx``), whose entries
PostgreSQL caps at ~2.7 kB: an unbounded type would be refused by the database
(SQLSTATE 54000) instead of by us. The payload is stored as ``jsonb``, which
holds no NUL character and no NaN or infinity.
"""

from __future__ import annotations

import math
import re
from enum import StrEnum
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


class EventRefusal(StrEnum):
    """Why an event is refused: the code; the message says it for a person."""

    MISSING_TYPE = "missing_type"
    TYPE_TOO_LONG = "type_too_long"
    TYPE_CHARACTERS = "type_characters"  # outside EVENT_TYPE_PATTERN
    PAYLOAD_TOO_DEEP = "payload_too_deep"
    PAYLOAD_NOT_STORABLE = "payload_not_storable"  # not JSON, e.g. an integer past 64 bits
    PAYLOAD_TOO_LARGE = "payload_too_large"
    PAYLOAD_NUL = "payload_nul"  # jsonb holds no NUL character
    PAYLOAD_NOT_FINITE = "payload_not_finite"  # NaN or an infinity

    @property
    def field(self) -> str:
        """The part of the event at fault: ``type`` or ``payload``."""
        return "payload" if self.value.startswith("payload") else "type"


class InvalidEvent(OnceflowError):
    """An event refused before anything is stored: ``code`` says why, ``field`` (``type``
    or ``payload``) where, ``reason`` (the message) in words."""

    def __init__(self, code: EventRefusal, reason: str) -> None:
        super().__init__(reason)
        self.code = code
        self.field = code.field
        self.reason = reason


def check_event(event_type: str, payload: Any) -> bytes:
    """The payload as it will be stored (JSON), or :class:`InvalidEvent` saying why
    the event is refused."""
    check_event_type(event_type)
    try:
        _check_value(payload)
    except RecursionError:
        raise InvalidEvent(
            EventRefusal.PAYLOAD_TOO_DEEP, "the payload is nested too deeply"
        ) from None
    try:
        encoded = orjson.dumps(payload)
    except (TypeError, orjson.JSONEncodeError) as exc:  # e.g. an integer past 64 bits
        raise InvalidEvent(
            EventRefusal.PAYLOAD_NOT_STORABLE, f"the payload cannot be stored as JSON: {exc}"
        ) from None
    if len(encoded) > MAX_EVENT_PAYLOAD_BYTES:
        raise InvalidEvent(
            EventRefusal.PAYLOAD_TOO_LARGE,
            f"the payload is {len(encoded)} bytes as JSON; at most"
            f" {MAX_EVENT_PAYLOAD_BYTES} are accepted",
        )
    return encoded


def check_event_type(event_type: str) -> None:
    """Refuse an event type outside :data:`EVENT_TYPE_PATTERN` or longer than
    :data:`MAX_EVENT_TYPE_CHARS`."""
    if not isinstance(event_type, str) or not event_type:
        raise InvalidEvent(EventRefusal.MISSING_TYPE, "the event needs a type")
    if len(event_type) > MAX_EVENT_TYPE_CHARS:
        raise InvalidEvent(
            EventRefusal.TYPE_TOO_LONG,
            f"the event type is {len(event_type)} characters; at most"
            f" {MAX_EVENT_TYPE_CHARS} are accepted",
        )
    if not _TYPE.fullmatch(event_type):
        raise InvalidEvent(
            EventRefusal.TYPE_CHARACTERS,
            f"event type {event_type[:_QUOTED]!r}: use letters, digits and _ . : - only",
        )


def _check_value(value: Any, path: str = "payload") -> None:
    """Refuse what ``jsonb`` cannot hold as given: a NUL character in a string or a
    key, a NaN or an infinite number (orjson would write ``null`` for those)."""
    if isinstance(value, str):
        if "\x00" in value:
            raise InvalidEvent(
                EventRefusal.PAYLOAD_NUL, f"{path} holds a NUL character, which jsonb cannot"
            )
    elif isinstance(value, float):
        if not math.isfinite(value):
            raise InvalidEvent(
                EventRefusal.PAYLOAD_NOT_FINITE, f"{path} is {value}, which JSON cannot hold"
            )
    elif isinstance(value, dict):
        for key, item in value.items():
            if isinstance(key, str) and "\x00" in key:
                raise InvalidEvent(
                    EventRefusal.PAYLOAD_NUL, f"a key in {path} holds a NUL character"
                )
            _check_value(item, f"{path}.{key}")
    elif isinstance(value, list | tuple):
        for n, item in enumerate(value):
            _check_value(item, f"{path}[{n}]")
