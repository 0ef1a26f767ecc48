"""The ``Prefer`` request header (RFC 7240), as far as ingest honours it: ``wait``.

``Prefer: wait=5`` (also within a list, ``Prefer: respond-async, wait=5``, with
parameters, ``wait=5;x=y``, or quoted, ``wait="5"``) asks to wait up to 5 seconds for a
synchronous answer. The value is delta-seconds: digits only. Following the RFC (section
2: a preference the server does not understand is ignored, never an error), a malformed
``wait`` (``wait=abc``, ``wait=-1``, ``wait=1.5``) is ignored: the request is answered
as if it had none, a plain 202, without ``Preference-Applied``. Only the first ``wait``
counts (RFC 7240, section 2: a repeated preference's first occurrence wins); only the
request's first ``Prefer`` header is read.
"""

from __future__ import annotations

#: More digits than any wait we would grant (the cap applies after parsing).
_MAX_DIGITS = 9


def wait_preference(header: str | None) -> int | None:
    """The seconds of the header's ``wait`` preference; None when it has none, or a
    malformed one."""
    if not header:
        return None
    for preference in header.split(","):
        name, _, value = preference.split(";", 1)[0].partition("=")
        if name.strip().lower() != "wait":
            continue
        value = value.strip()
        if len(value) >= 2 and value[0] == value[-1] == '"':
            value = value[1:-1]
        if value.isascii() and value.isdigit() and len(value) <= _MAX_DIGITS:
            return int(value)
        return None
    return None
