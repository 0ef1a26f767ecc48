"""Text as PostgreSQL can hold it.

An error message is anything the code that raised it put there: a downstream's binary
answer, bytes decoded with ``surrogateescape``. PostgreSQL's ``text`` and ``jsonb``
hold neither U+0000 nor a lone surrogate, and psycopg2 refuses such a string before the
server sees it (``ValueError``, ``UnicodeEncodeError``: no SQLSTATE, so no database
error ``workflow_engine.store.db.classify`` could call the row's fault). Written as
given, a workflow's error failed its instance's finish on every claim, forever.
"""

from __future__ import annotations


def storable_text(text: str) -> str:
    """``text`` with a NUL character and a lone surrogate replaced by their escapes
    (``\\x00``, ``\\udcff``); any other text is returned as it is."""
    if "\x00" in text:
        text = text.replace("\x00", "\\x00")
    try:
        text.encode()
    except UnicodeEncodeError:
        text = text.encode("utf-8", "backslashreplace").decode()
    return text
