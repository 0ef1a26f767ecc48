"""One error shape on every route: whatever refuses a request (our own ``RequestError``,
FastAPI's validation, an ``HTTPException`` from a route or from Starlette's routing, an
unexpected exception), the answer is an :class:`~producers.models.ErrorBody`.

``install_error_handlers`` wires the handlers into an app; ``error_responses`` declares
the shape in the OpenAPI spec for the statuses a route can answer.
"""

from __future__ import annotations

import logging
from http import HTTPStatus
from typing import Any

from fastapi import FastAPI, Request, Response
from fastapi.exceptions import RequestValidationError
from starlette.exceptions import HTTPException

from producers.models import ErrorBody, FieldError, RequestError, field_path
from producers.responses import error_response

log = logging.getLogger(__name__)

#: The one path whose answers ``onceflow_ingest_requests_total`` counts.
_COUNTED_PATH = "/v1/jobs"


def error_responses(*statuses: int) -> dict[int | str, dict[str, Any]]:
    """``responses=`` for a route or router: these statuses answer an ``ErrorBody``."""
    return {
        status: {"model": ErrorBody, "description": HTTPStatus(status).phrase}
        for status in statuses
    }


def install_error_handlers(app: FastAPI) -> None:
    app.add_exception_handler(RequestError, _request_error)  # type: ignore[arg-type]
    app.add_exception_handler(HTTPException, _http_exception)  # type: ignore[arg-type]
    app.add_exception_handler(RequestValidationError, _validation_error)  # type: ignore[arg-type]
    app.add_exception_handler(Exception, unexpected_error)


def _answer(request: Request, status: int, body: ErrorBody, headers: Any = None) -> Response:
    return error_response(status, body, headers, count=request.url.path == _COUNTED_PATH)


async def _request_error(request: Request, exc: RequestError) -> Response:
    return _answer(request, exc.status, exc.body, exc.headers)


def _code(status: int) -> str:
    try:
        return HTTPStatus(status).phrase.lower().replace(" ", "_").replace("-", "_")
    except ValueError:
        return "error"


async def _http_exception(request: Request, exc: HTTPException) -> Response:
    """A route's ``HTTPException``: a dict detail keeps its ``error`` and ``message``,
    its other keys go to ``details``; a text detail (Starlette's 404, 405) becomes the
    message."""
    detail = exc.detail
    if isinstance(detail, dict):
        rest = {k: v for k, v in detail.items() if k not in ("error", "message")}
        body = ErrorBody(
            error=str(detail.get("error") or _code(exc.status_code)),
            message=str(detail.get("message") or HTTPStatus(exc.status_code).phrase),
            details=rest,
        )
    else:
        body = ErrorBody(error=_code(exc.status_code), message=str(detail))
    return _answer(request, exc.status_code, body, exc.headers)


async def _validation_error(request: Request, exc: RequestValidationError) -> Response:
    fields = [
        FieldError(field=field_path(tuple(e.get("loc", ())), ""), reason=str(e.get("msg", "")))
        for e in exc.errors()
    ] or [FieldError(field="request", reason="invalid")]
    body = ErrorBody(
        error="invalid_request",
        message=f"invalid {fields[0].field}: {fields[0].reason}",
        fields=fields,
    )
    return _answer(request, 422, body)


async def unexpected_error(request: Request, exc: Exception) -> Response:
    """The FastAPI app's handler of any exception a route did not expect."""
    return internal_error(request.method, request.url.path, exc)


def internal_error(method: str, path: str, exc: Exception) -> Response:
    """The 500 of any route, the submit front's included, logged with its traceback."""
    log.error(
        "unexpected error on %s %s", method, path, exc_info=exc, extra={"event": "ingest.error"}
    )
    body = ErrorBody(error="internal_error", message="an unexpected error; it is logged")
    return error_response(500, body, count=path == _COUNTED_PATH)
