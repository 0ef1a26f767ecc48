"""What the templates show: times in UTC (local time on hover), bounded JSON."""

from __future__ import annotations

from datetime import UTC, datetime
from typing import Any

import orjson
from markupsafe import Markup, escape

VALUE_LIMIT = 4096  # characters of a step output, params or record value shown at once


def utc(value: datetime | None) -> Markup:
    """``<time>`` in UTC; console.js puts the reader's local time in its title."""
    if value is None:
        return Markup("<span class=muted>—</span>")
    if value.tzinfo is None:
        value = value.replace(tzinfo=UTC)
    at = value.astimezone(UTC)
    iso = at.isoformat()
    text = at.strftime("%Y-%m-%d %H:%M:%S UTC")
    return Markup(f'<time datetime="{escape(iso)}" title="{escape(text)}">{escape(text)}</time>')


def from_ms(ms: int | None) -> datetime | None:
    return datetime.fromtimestamp(ms / 1000, UTC) if ms is not None else None


def pretty(value: Any) -> str:
    try:
        return orjson.dumps(value, option=orjson.OPT_INDENT_2, default=str).decode()
    except TypeError:
        return repr(value)


def bounded(text: str | bytes | None, limit: int = VALUE_LIMIT) -> str:
    """At most ``limit`` characters, saying how much was left out."""
    if text is None:
        return ""
    if isinstance(text, bytes):
        text = text.decode("utf-8", "replace")
    if len(text) <= limit:
        return text
    return f"{text[:limit]}\n… ({len(text) - limit} more characters not shown)"


def position(topic: str, partition: int | None, offset: int | None) -> str:
    if partition is None or offset is None:
        return f"{topic}/?"
    return f"{topic}/{partition}@{offset}"
