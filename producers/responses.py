"""The ingest API's JSON answers, serialised with orjson (faster than FastAPI's
encoder on the hot path), and its error answers in the one ``ErrorBody`` shape."""

from __future__ import annotations

import orjson
from fastapi import Response

from producers.metrics import REQUESTS
from producers.models import ErrorBody


class JsonResponse(Response):
    """A JSON answer whose raw headers are written out directly: Starlette's
    ``init_headers`` (a scan of the given headers for content-length and -type, a list
    built per answer) was ~3% of a single-job request (BENCHMARKS.md, "Single-job
    requests")."""

    media_type = "application/json"

    def __init__(self, content: bytes, status: int, headers: dict[str, str] | None) -> None:
        self.status_code = status
        self.body = content
        self.background = None
        raw = [(b"content-length", b"%d" % len(content)), (b"content-type", b"application/json")]
        if headers:
            raw += [(k.lower().encode("latin-1"), v.encode("latin-1")) for k, v in headers.items()]
        self.raw_headers = raw


def json_response(body: object, status: int, headers: dict[str, str] | None = None) -> Response:
    return JsonResponse(orjson.dumps(body), status, headers)


def error_response(
    status: int, body: ErrorBody, headers: dict[str, str] | None = None, count: bool = True
) -> Response:
    """An ``ErrorBody`` answer, counted in ``onceflow_ingest_requests_total`` (which
    counts the submit path's answers only) unless ``count`` is false."""
    if count:
        REQUESTS.labels(str(status)).inc()
    return json_response(body.model_dump(), status, headers)
