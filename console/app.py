"""The console's FastAPI application: one router per area, static files served by the
process itself (no CDN), errors as pages (:mod:`console.pages`), the CSRF cookie and
security headers from one middleware."""

from __future__ import annotations

from collections.abc import AsyncIterator
from contextlib import asynccontextmanager
from pathlib import Path
from urllib.parse import unquote

from fastapi import FastAPI, Request
from fastapi.responses import JSONResponse, Response
from fastapi.staticfiles import StaticFiles
from sqlalchemy.engine import Engine

from console.auth import CSRF_COOKIE, Gatekeeper, is_https
from console.deps import Console, render
from console.pages import install_error_pages
from console.routes import actions, audit, dead_letters, instances, login, overview
from onceflow.settings import Settings
from workflow_engine.store import shared_engine
from workflow_engine.store.operations import BulkRunner

STATIC = Path(__file__).parent / "static"


def create_app(settings: Settings, db: Engine | None = None) -> FastAPI:
    if not settings.auth_disabled and not settings.api_keys:
        raise ValueError(
            "the console needs API keys (ONCEFLOW_API_KEYS; `onceflow keys new`)"
            " or ONCEFLOW_AUTH_DISABLED=true for development"
        )
    db = db if db is not None else shared_engine(settings.database_url, settings.lifecycle_events)
    state = Console(settings, db, Gatekeeper(settings), BulkRunner(db))

    @asynccontextmanager
    async def lifespan(app: FastAPI) -> AsyncIterator[None]:
        state.bulk.start()  # also resumes operations another process left running
        yield
        state.bulk.stop()  # the batch in progress commits; the rest resumes elsewhere

    app = FastAPI(
        title="onceflow console", docs_url=None, redoc_url=None, openapi_url=None, lifespan=lifespan
    )
    app.state.console = state
    app.mount("/static", StaticFiles(directory=str(STATIC)), name="static")
    for module in (login, overview, instances, actions, dead_letters, audit):
        app.include_router(module.router)
    app.middleware("http")(csrf_cookie_and_headers)
    app.middleware("http")(refuse_nul)  # added last: runs first
    install_error_pages(app)
    app.add_api_route("/favicon.ico", _no_favicon, include_in_schema=False)
    app.add_api_route("/api/ping", _ping, include_in_schema=False)
    return app


async def csrf_cookie_and_headers(request: Request, call_next) -> Response:
    """Hand out the CSRF cookie a request was given a token for, and set the headers
    every page carries (no framing, no sniffing, no cross-site referrer)."""
    response: Response = await call_next(request)
    new = getattr(request.state, "new_csrf", None)
    if new and not request.cookies.get(CSRF_COOKIE):
        response.set_cookie(
            CSRF_COOKIE, new, httponly=True, samesite="strict", secure=is_https(request)
        )
    response.headers.setdefault("X-Frame-Options", "DENY")
    response.headers.setdefault("X-Content-Type-Options", "nosniff")
    response.headers.setdefault("Referrer-Policy", "same-origin")
    return response


async def refuse_nul(request: Request, call_next) -> Response:
    """400 for a NUL character in the path or the query (``/instances/%00``): PostgreSQL's
    text holds none, so every query it reached answered 500."""
    if "\x00" in request.scope["path"] or "\x00" in unquote(request.url.query):
        return _nul_page(request)
    response: Response = await call_next(request)
    return response


def _nul_page(request: Request) -> Response:
    message = "NUL characters are not allowed in the URL"
    return render(request, "error.html", {"title": "Bad request", "message": message}, 400)


def _no_favicon() -> Response:
    return Response(status_code=204)


def _ping() -> JSONResponse:
    return JSONResponse({"ok": True})
