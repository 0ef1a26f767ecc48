"""The console's FastAPI application: one router per area, static files served by the
process itself (no CDN), errors as pages."""

from __future__ import annotations

from collections.abc import AsyncIterator
from contextlib import asynccontextmanager
from pathlib import Path
from urllib.parse import quote

from fastapi import FastAPI, Request
from fastapi.responses import JSONResponse, RedirectResponse, Response
from fastapi.staticfiles import StaticFiles
from sqlalchemy.engine import Engine
from starlette.exceptions import HTTPException as StarletteHTTPException

from console.auth import CSRF_COOKIE, Denied, Gatekeeper, is_https
from console.bulk_runner import BulkRunner
from console.deps import Console, render
from console.routes import actions, dead_letters, instances, login, overview
from onceflow.errors import OnceflowError, ServiceUnavailable
from onceflow.settings import Settings
from workflow_engine.store.control import ControlError
from workflow_engine.store.db import shared_engine
from workflow_engine.store.listing import InvalidFilter

STATIC = Path(__file__).parent / "static"


def create_app(settings: Settings, engine: Engine | None = None) -> FastAPI:
    if not settings.auth_disabled and not settings.api_keys:
        raise ValueError(
            "the console needs API keys (ONCEFLOW_API_KEYS; `onceflow keys new`)"
            " or ONCEFLOW_AUTH_DISABLED=true for development"
        )
    engine = engine if engine is not None else shared_engine(settings.database_url)
    state = Console(settings, engine, Gatekeeper(settings), BulkRunner(engine))

    @asynccontextmanager
    async def lifespan(app: FastAPI) -> AsyncIterator[None]:
        yield
        state.bulk.stop()  # let running bulk batches finish their transaction

    app = FastAPI(
        title="onceflow console", docs_url=None, redoc_url=None, openapi_url=None, lifespan=lifespan
    )
    app.state.console = state
    app.mount("/static", StaticFiles(directory=str(STATIC)), name="static")
    for module in (login, overview, instances, actions, dead_letters):
        app.include_router(module.router)

    @app.middleware("http")
    async def csrf_cookie(request: Request, call_next):
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

    @app.exception_handler(Denied)
    async def denied(request: Request, exc: Denied) -> Response:
        if exc.status == 401 and request.method == "GET" and not _is_htmx(request):
            target = request.url.path + (f"?{request.url.query}" if request.url.query else "")
            return RedirectResponse(f"/login?next={quote(target)}", status_code=303)
        return render(
            request, "error.html", {"title": "Not allowed", "message": exc.message}, exc.status
        )

    @app.exception_handler(ControlError)
    async def refused(request: Request, exc: ControlError) -> Response:
        return render(request, "error.html", {"title": "Not possible", "message": str(exc)}, 409)

    @app.exception_handler(ServiceUnavailable)
    async def unavailable(request: Request, exc: ServiceUnavailable) -> Response:
        return render(request, "error.html", {"title": "Unavailable", "message": str(exc)}, 503)

    @app.exception_handler(OnceflowError)
    async def bad_request(request: Request, exc: OnceflowError) -> Response:
        return render(request, "error.html", {"title": "Bad request", "message": str(exc)}, 400)

    @app.exception_handler(StarletteHTTPException)
    async def http_error(request: Request, exc: StarletteHTTPException) -> Response:
        title = "Not found" if exc.status_code == 404 else "Error"
        return render(
            request, "error.html", {"title": title, "message": str(exc.detail)}, exc.status_code
        )

    @app.exception_handler(InvalidFilter)
    async def invalid(request: Request, exc: InvalidFilter) -> Response:
        return render(request, "error.html", {"title": "Invalid filter", "message": str(exc)}, 400)

    @app.get("/favicon.ico", include_in_schema=False)
    def favicon() -> Response:
        return Response(status_code=204)

    @app.get("/api/ping", include_in_schema=False)
    def ping() -> JSONResponse:
        return JSONResponse({"ok": True})

    return app


def _is_htmx(request: Request) -> bool:
    return request.headers.get("hx-request") == "true"
