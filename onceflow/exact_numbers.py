"""Numbers a JSON text holds that would not be stored as written.

A job's params travel as JSON through orjson (ingest, the worker) into PostgreSQL's
jsonb, whose numbers are ``numeric``. Three kinds of number change on that way without
anyone being told, so ingest refuses them (422) and the worker dead-letters a record
that holds one in its params (``invalid_params``), instead of storing another value:

- **negative zero** (``-0.0``, ``-0e3``): ``numeric`` has no signed zero, so it
  is stored as ``0``;
- **a non-zero number too small for a 64-bit float** (``1e-400`` becomes ``0.0``, a
  subnormal such as ``4e-324`` becomes ``5e-324``);
- **more than 17 significant digits** that a 64-bit float does not keep
  (``3.14159265358979323846`` becomes ``3.141592653589793``), and integers outside the
  64-bit range, which orjson turns into floats.

A float written with at most 17 significant digits in the normal range is kept as the
64-bit float it names (``0.1``; Java's ``5.6843418860808015E-14`` stored as the same
float's shortest form): 17 digits identify a float exactly, so nothing a float-producing
client sent is lost. A caller who needs more digits sends the number as a string. The
integer ``-0`` is the integer zero (no serializer writes it; JavaScript's writes ``0``)
and is kept as ``0``.

Finding them must not cost the hot path a second parse. A negative zero or a subnormal
is seen in the parsed value (:func:`float_suspect`); the rest only where a float was
parsed, by :func:`may_be_inexact` looking at the raw bytes for the only shapes such a
number can have (an exponent below -99, a run of 18 digits). Only a body one of them
cannot clear is parsed again by :func:`exact_loads`, whose number hooks put an
:class:`Inexact` marker in place of every such number, for the caller to report with
the field's path. (Measured on a 100-job batch of 13 kB with a float per job: ~12 us
of parse_jobs' ~200 us; regular expressions over the whole body cost ~200 us.)
"""

from __future__ import annotations

import json
import math
import re
import sys
from collections.abc import Callable
from decimal import Decimal
from typing import Any, NamedTuple

#: Error codes ingest answers with (``ErrorBody.error``).
CODE_OUT_OF_RANGE = "number_out_of_range"
CODE_NOT_EXACT = "number_not_exact"

#: The most significant digits a 64-bit float is taken to mean exactly.
FLOAT_DIGITS = 17
#: The smallest normal 64-bit float: below it a float keeps fewer digits (subnormal).
FLOAT_TINY = sys.float_info.min

_I64_MIN, _U64_MAX = -(2**63), 2**64 - 1
_TEXT_LIMIT = 40  # how much of a number's text a reason quotes

# The raw bytes mapped to a few classes in one C pass (bytes.translate), then searched
# with plain substring search: digits and dots become "0", "e" and "E" become "e", "-"
# stays, everything else becomes a space.
_CLASSES = bytes(
    48 if chr(c) in "0123456789." else 101 if chr(c) in "eE" else 45 if c == 45 else 32
    for c in range(256)
)
# 18 digits (a dot among them): the least a number needs to hold more significant
# digits than a float keeps, to be an integer beyond 64 bits, or to be written with
# 300 zeros.
_DIGIT_RUN = b"0" * (FLOAT_DIGITS + 1)
# A negative exponent of three or more digits after a digit: the only way to write a
# number below the float's normal range (2.2e-308) in fewer than 300 characters.
_SMALL_EXPONENT = re.compile(rb"\d[eE]-\d{3}")


def float_suspect(value: float) -> bool:
    """Whether a parsed float is a negative zero or a subnormal: written as it was only
    if the text says so (``-0.0`` never is). Cheap enough for a walk over every value."""
    return -FLOAT_TINY < value < FLOAT_TINY and (value != 0.0 or math.copysign(1.0, value) < 0)


class Scan(NamedTuple):
    """What one walk over parsed JSON finds (:func:`scan`)."""

    keys: int  # object keys, all levels
    floats: bool  # holds a float (one orjson made of an integer out of its range, too)
    suspect: bool  # one of them is :func:`float_suspect`
    depth: int


def scan(value: Any) -> Scan:
    """Count the keys of parsed JSON and look at its floats, level by level: no
    recursion, and no tuple per value (it runs on every submitted body)."""
    keys, floats, suspect, depth = 0, False, False, 0
    level = [value]
    while level:
        deeper: list[Any] = []
        for item in level:
            kind = type(item)
            if kind is dict:
                keys += len(item)
                deeper.extend(item.values())
            elif kind is list:
                deeper.extend(item)
            elif kind is float:
                floats = True
                suspect = suspect or float_suspect(item)
        level = deeper
        depth += 1
    return Scan(keys, floats, suspect, depth)


def floats_in(value: Any) -> tuple[bool, bool]:
    """Whether ``value`` (parsed JSON) holds a float, and whether one is
    :func:`float_suspect`."""
    found = scan(value)
    return found.floats, found.suspect


def may_be_inexact(raw: bytes) -> bool:
    """Whether ``raw`` (a JSON text whose parse holds a float, none of them
    :func:`float_suspect`) may hold a number :func:`exact_loads` would mark.

    Cautious: strings and keys can match too, never the other way round (orjson turns
    an integer beyond 64 bits into a float, so that one is covered as well).
    """
    classes = raw.translate(_CLASSES)
    if _DIGIT_RUN in classes:
        return True
    return b"e-" in classes and _SMALL_EXPONENT.search(raw) is not None


class Inexact:
    """Stands in :func:`exact_loads`'s result for a number that would not be stored as
    written: ``code`` (an ingest error code) and ``reason`` (text for a person)."""

    __slots__ = ("code", "reason")

    def __init__(self, code: str, reason: str) -> None:
        self.code = code
        self.reason = reason


def exact_loads(
    raw: bytes, object_pairs_hook: Callable[[list[tuple[str, Any]]], Any] | None = None
) -> Any:
    """Parse ``raw`` with exact numbers: an :class:`Inexact` in place of each number
    that would change on its way to PostgreSQL. RecursionError on deep nesting."""
    return json.loads(raw, parse_float=_float, parse_int=_int, object_pairs_hook=object_pairs_hook)


def first_inexact(value: Any, path: str = "") -> tuple[str, Inexact] | None:
    """The path (``params.a[2].b``) and marker of the first :class:`Inexact` in
    ``value``, depth first in document order; None if there is none."""
    stack: list[tuple[Any, str]] = [(value, path)]
    while stack:
        item, at = stack.pop()
        if isinstance(item, Inexact):
            return at, item
        if isinstance(item, dict):
            stack.extend((v, f"{at}.{k}" if at else k) for k, v in reversed(item.items()))
        elif isinstance(item, list):
            stack.extend((v, f"{at}[{i}]") for i, v in reversed(list(enumerate(item))))
    return None


def _int(text: str) -> int | Inexact:
    value = int(text)
    if not _I64_MIN <= value <= _U64_MAX:
        return Inexact(
            CODE_OUT_OF_RANGE,
            "integer outside the 64-bit range; send it as a string to keep it exact",
        )
    return value


def _float(text: str) -> float | Inexact:
    # Python's float() and orjson both round correctly: this is the float orjson made.
    value = float(text)
    if value == 0.0:
        if text.startswith("-"):
            return _negative_zero()
        if Decimal(text) != 0:
            return _changed(text, value, "is too small for a 64-bit float")
        return value
    if math.isinf(value):
        return _changed(text, value, "is too large for a 64-bit float")
    if Decimal(repr(value)) == Decimal(text):
        return value
    if abs(value) < sys.float_info.min:
        return _changed(text, value, "is too small for a 64-bit float to keep all its digits")
    if _significant_digits(text) > FLOAT_DIGITS:
        return _changed(text, value, f"has more than {FLOAT_DIGITS} significant digits")
    return value


def _negative_zero() -> Inexact:
    return Inexact(
        CODE_NOT_EXACT,
        "negative zero would be stored as 0 (PostgreSQL numbers have no signed zero); "
        "send 0, or a string",
    )


def _changed(text: str, value: float, why: str) -> Inexact:
    shown = text if len(text) <= _TEXT_LIMIT else text[:_TEXT_LIMIT] + "…"
    return Inexact(
        CODE_NOT_EXACT,
        f"{shown} {why} and would be stored as {value!r}; send it as a string to keep it exact",
    )


def _significant_digits(text: str) -> int:
    mantissa = re.split("[eE]", text.lstrip("-"), maxsplit=1)[0]
    return len(mantissa.replace(".", "").lstrip("0"))
