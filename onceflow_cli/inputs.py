"""What the CLI reads from its arguments, under the rules the HTTP edge applies."""

from __future__ import annotations

from typing import Any

from onceflow.errors import OnceflowError


def exact_json(text: bytes, what: str) -> dict[str, Any]:
    """A JSON object under the rule every front end applies to what a user sends
    (``producers.models.exact_json_object``: valid JSON, each key once, every number
    stored as written), or one line saying what is wrong with ``what``."""
    from producers.models import RequestError, exact_json_object

    try:
        return exact_json_object(text)
    except RequestError as exc:
        where = "; ".join(f"{f.field}: {f.reason}" for f in exc.body.fields)
        raise OnceflowError(
            f"{what} refused: {exc.body.message}" + (f" ({where})" if where else "")
        ) from None
