"""The ingest API's JSON answers, serialised with orjson (faster than FastAPI's
encoder on the hot path), and its error answers in the one ``ErrorBody`` shape."""

from __future__ import annotations

import orjson
from fastapi import Response

from producers.metrics import REQUESTS
from producers.models import ErrorBody


def json_response(body: object, status: int, headers: dict[str, str] | None = None) -> Response:
    return Response(
        orjson.dumps(body), status_code=status, headers=headers, media_type="application/json"
    )


def error_response(
    status: int, body: ErrorBody, headers: dict[str, str] | None = None, count: bool = True
) -> Response:
    """An ``ErrorBody`` answer, counted in ``onceflow_ingest_requests_total`` (which
    counts the submit path's answers only) unless ``count`` is false."""
    if count:
        REQUESTS.labels(str(status)).inc()
    return json_response(body.model_dump(), status, headers)
