"""Errors as pages: each domain error the console can meet becomes a rendered page
with the right status (a 401 on a page view becomes a redirect to the login page)."""

from __future__ import annotations

from urllib.parse import quote

from fastapi import FastAPI, Request
from fastapi.exceptions import RequestValidationError
from fastapi.responses import RedirectResponse, Response
from starlette.exceptions import HTTPException as StarletteHTTPException

from console.auth import Denied
from console.deps import render
from onceflow.errors import OnceflowError, ServiceUnavailable
from workflow_engine.store.operations import ControlError
from workflow_engine.store.views import InvalidFilter


def _page(request: Request, title: str, message: str, status: int) -> Response:
    return render(request, "error.html", {"title": title, "message": message}, status)


async def denied(request: Request, exc: Exception) -> Response:
    assert isinstance(exc, Denied)
    if exc.status == 401 and request.method == "GET" and not _is_htmx(request):
        target = request.url.path + (f"?{request.url.query}" if request.url.query else "")
        return RedirectResponse(f"/login?next={quote(target)}", status_code=303)
    return _page(request, "Not allowed", exc.message, exc.status)


async def refused(request: Request, exc: Exception) -> Response:
    return _page(request, "Not possible", str(exc), 409)


async def unavailable(request: Request, exc: Exception) -> Response:
    return _page(request, "Unavailable", str(exc), 503)


async def bad_request(request: Request, exc: Exception) -> Response:
    return _page(request, "Bad request", str(exc), 400)


async def invalid_filter(request: Request, exc: Exception) -> Response:
    return _page(request, "Invalid filter", str(exc), 400)


async def invalid_request(request: Request, exc: Exception) -> Response:
    """A path or query parameter of the wrong type (``/bulk/abc``): a page, like every
    other refusal, not FastAPI's JSON."""
    assert isinstance(exc, RequestValidationError)
    reasons = "; ".join(
        f"{'.'.join(str(p) for p in e.get('loc', ()))}: {e.get('msg', 'invalid')}"
        for e in exc.errors()
    )
    return _page(request, "Bad request", reasons or "invalid request", 400)


async def http_error(request: Request, exc: Exception) -> Response:
    assert isinstance(exc, StarletteHTTPException)
    title = "Not found" if exc.status_code == 404 else "Error"
    return _page(request, title, str(exc.detail), exc.status_code)


def install_error_pages(app: FastAPI) -> None:
    # Most specific first is not needed: Starlette picks the handler by the exception's
    # class hierarchy (InvalidFilter before OnceflowError, and so on).
    app.add_exception_handler(Denied, denied)
    app.add_exception_handler(ControlError, refused)
    app.add_exception_handler(ServiceUnavailable, unavailable)
    app.add_exception_handler(InvalidFilter, invalid_filter)
    app.add_exception_handler(OnceflowError, bad_request)
    app.add_exception_handler(StarletteHTTPException, http_error)
    app.add_exception_handler(RequestValidationError, invalid_request)


def _is_htmx(request: Request) -> bool:
    return request.headers.get("hx-request") == "true"
