"""The ingest HTTP app: one factory wiring the route modules to what they need.

    producers/routes/jobs.py    POST /v1/jobs, GET /v1/jobs/{job_id}
    producers/routes/job_streams.py  GET /v1/jobs/{job_id}/stream (Server-Sent Events)
    producers/routes/results.py  start and wait: Prefer: wait, GET /v1/jobs/{job_id}/result
    producers/routes/admin.py   /v1/instances (inspect and control instances)
    producers/routes/schedules.py  /v1/schedules (create, pause, backfill schedules)
    producers/routes/audit.py   /v1/admin/audit (the operators' audit trail)
    producers/routes/health.py  /healthz, /readyz
    /docs                       the API's documentation, from assets this package ships

What the ASGI server calls is :class:`IngestFront`: ``POST /v1/jobs`` goes straight to
the route module's raw ASGI app (``jobs.SubmitApp``), everything else to the FastAPI
app, which also serves the OpenAPI document (the submit route is declared there).

Every error answer, whichever route or layer refuses, is one ``ErrorBody``
(producers/errors.py). What the routes share (settings, producer, authenticator, limiter) is one
:class:`producers.deps.Ingest` on ``app.state``, handed to them with ``Depends``.
"""

from __future__ import annotations

import logging
from collections.abc import AsyncIterator
from contextlib import asynccontextmanager
from functools import partial
from typing import Any

from fastapi import FastAPI
from fastapi.telemetry import TelemetryConfig
from fastapi_offline import FastAPIOffline
from starlette._utils import get_route_path
from starlette.types import ASGIApp, Receive, Scope, Send
from uvicorn.middleware.proxy_headers import ProxyHeadersMiddleware

from onceflow import tracing
from onceflow.errors import ConfigurationError
from onceflow.settings import Settings
from producers.deps import Ingest
from producers.errors import install_error_handlers
from producers.kafka import JobProducer, JobSender
from producers.models import BatchIn, ErrorBody, JobIn
from producers.responses import error_response
from producers.routes import admin, audit, health, job_streams, jobs, results, schedules
from producers.tracing import TracedSender, TraceRequests
from workflow_engine.definitions import load_workflow_modules
from workflow_engine.model import Registry

log = logging.getLogger(__name__)


_NO_TELEMETRY: TelemetryConfig = {"tracing": False, "metrics": False, "logs": False}


def create_app(
    settings: Settings, producer: JobSender | None = None, registry: Registry | None = None
) -> IngestFront:
    """The ingest app; ``producer`` stands in for the Kafka one (created at startup).
    ``registry``: the workflows and tasks it accepts (with ``ingest_validate_types``);
    None: those of the configured workflow modules (:func:`ingest_registry`)."""
    if not settings.auth_disabled and not settings.api_keys:
        raise ConfigurationError(
            "no API keys configured: set ONCEFLOW_API_KEYS (make one with `onceflow keys"
            " new`), or ONCEFLOW_AUTH_DISABLED=true for local development only"
        )
    if registry is None:
        registry = ingest_registry(settings)
    ingest = Ingest.from_settings(settings, registry, producer)
    # FastAPI's own /docs loads Swagger UI from a CDN: a blank page without internet
    # access. fastapi-offline (MIT) serves the Swagger UI 5 bundle (Apache-2.0) from
    # files in its wheel, under /static-offline-docs. No /redoc: ReDoc 2 still fetches
    # its logo from cdn.redoc.ly (tests/browser catches any request off loopback).
    app = FastAPIOffline(
        redoc_url=None,
        title="onceflow ingest",
        version="1",
        description="Submit jobs; each becomes one Kafka record keyed by its job id.",
        lifespan=_lifespan,
        # Swagger UI would send the spec to validator.swagger.io for a badge.
        swagger_ui_parameters={"validatorUrl": None},
        # FastAPI's own OpenTelemetry hooks: with onceflow's tracing off there is
        # nothing to report to, yet their per-request check (provider and environment
        # lookups) was ~5% of ingest's samples under load; with tracing on they stay.
        telemetry=None if tracing.enabled() else _NO_TELEMETRY,
    )
    install_error_handlers(app)
    app.state.ingest = ingest
    if tracing.enabled() and ingest.producer is not None:
        ingest.producer = TracedSender(ingest.producer, settings.jobs_topic)
    app.include_router(jobs.router)
    if settings.admin_api_enabled:
        app.include_router(admin.router)
        app.include_router(schedules.router)
        app.include_router(audit.router)
        app.include_router(jobs.status_router)
        app.include_router(job_streams.router)
        app.include_router(results.result_router)
    app.include_router(health.router)
    app.openapi = partial(_openapi, app, ingest.known_types)  # type: ignore[method-assign]
    # Decided once here: with tracing off, no per-request hook.
    front = TracedFront if tracing.enabled() else IngestFront
    return front(app, jobs.SubmitApp(ingest))


def ingest_registry(settings: Settings) -> Registry:
    """What ingest checks a submission's type against: the configured workflow modules'
    registry when it checks types (``ingest_validate_types``), else an empty one: an
    ingest that accepts any type never imports the workflow code (its image may not
    hold it)."""
    if not settings.ingest_validate_types:
        return Registry()
    return load_workflow_modules(settings.workflow_modules)


@asynccontextmanager
async def _lifespan(app: FastAPI) -> AsyncIterator[None]:
    ingest: Ingest = app.state.ingest
    if ingest.producer is None:
        producer: JobSender = JobProducer(ingest.settings)
        if tracing.enabled():
            producer = TracedSender(producer, ingest.settings.jobs_topic)
        ingest.producer = producer
    if ingest.settings.admin_api_enabled:
        from workflow_engine.store import shared_engine

        # Resumes bulk operations a dead process left running, even before this
        # process is asked to start one.
        ingest.bulk_runner(
            shared_engine(ingest.settings.database_url, ingest.settings.lifecycle_events)
        ).start()
    if ingest.settings.ingest_max_wait_seconds > 0:
        from producers.waiters import Waiters

        ingest.waiters = Waiters(
            ingest.settings,
            lambda: shared_engine(ingest.settings.database_url, ingest.settings.lifecycle_events),
        )
        ingest.waiters.start()
    yield
    if ingest.waiters is not None:
        ingest.waiters.stop()
    if ingest.streams is not None:
        await ingest.streams.stop()
    if ingest.bulk is not None:
        ingest.bulk.stop()  # the batch in progress commits; the rest resumes elsewhere
    remaining = ingest.producer.close()
    log.info("producer flushed", extra={"event": "ingest.stopped", "undelivered": remaining})


def _openapi(app: FastAPI, known_types: frozenset[str] | None) -> dict[str, Any]:
    """FastAPI's schema plus the body models ``POST /v1/jobs`` parses by hand, and the
    types this deployment knows as an enum (so clients, and the fuzzer, see them)."""
    if app.openapi_schema is None:
        schema = FastAPI.openapi(app)
        comps = schema.setdefault("components", {}).setdefault("schemas", {})
        for model in (JobIn, BatchIn):
            model_schema = model.model_json_schema(ref_template="#/components/schemas/{model}")
            comps.update(model_schema.pop("$defs", {}))
            comps[model.__name__] = model_schema
        if known_types is not None:
            comps["JobIn"]["properties"]["workflow"]["enum"] = sorted(known_types)
        app.openapi_schema = schema
    return app.openapi_schema


class IngestFront:
    """The ingest's ASGI app: ``POST /v1/jobs`` to ``submit``, everything else to the
    FastAPI app. The submit path is the hot one, and the FastAPI app's routing,
    dependencies and middleware (Starlette's error middleware, FastAPI's wrappers) cost
    a single-job request about as much as its submission (BENCHMARKS.md, "Single-job
    requests: where the time goes"). The route's match is Starlette's own (the path
    under ``root_path``, the method), so the route declared in the FastAPI app, which
    documents the endpoint, is never reached. With tracing on, :class:`TraceRequests`
    wraps the whole front (:class:`TracedFront`): every request gets its span,
    submissions included.

    Before anything, a NUL character in the URL is a 400, on every route: PostgreSQL
    cannot hold one, and it has no business in an id."""

    def __init__(self, api: FastAPI, submit: ASGIApp) -> None:
        self.api = api
        #: The FastAPI app's state (``state.ingest``), for whoever holds the front.
        self.state = api.state
        self.submit = submit
        self.rest: ASGIApp = api

    def trust_proxies(self, trusted_hosts: list[str] | str) -> None:
        """Behind uvicorn: its proxy-headers middleware (the same trusted addresses) in
        front of what reads the peer address, in place of uvicorn's own around the
        whole app. That is the rest of the API and, with auth off (a submission's client
        is then its address), submissions; with auth on a submission's client is its
        API key's name, and the middleware's per-request work is spared."""
        self.rest = _proxy_headers(self.rest, trusted_hosts)
        if self.state.ingest.auth.disabled:
            self.submit = _proxy_headers(self.submit, trusted_hosts)

    async def __call__(self, scope: Scope, receive: Receive, send: Send) -> None:
        if scope["type"] == "http":
            if "\x00" in scope["path"] or b"%00" in scope.get("query_string", b""):
                body = ErrorBody(
                    error="invalid_request", message="NUL characters are not allowed in the URL"
                )
                await error_response(400, body, count=False)(scope, receive, send)
                return
            if scope["method"] == "POST" and get_route_path(scope) == "/v1/jobs":
                await self.submit(scope, receive, send)
                return
        await self.rest(scope, receive, send)


class TracedFront(IngestFront):
    """:class:`IngestFront` inside :class:`TraceRequests` (tracing on). A subclass
    rather than a flag, so that with tracing off the front's call is the dispatch
    itself, with no hop to decide that there is no span."""

    def __init__(self, api: FastAPI, submit: ASGIApp) -> None:
        super().__init__(api, submit)
        self._traced = TraceRequests(super().__call__)

    async def __call__(self, scope: Scope, receive: Receive, send: Send) -> None:
        await self._traced(scope, receive, send)


def _proxy_headers(app: ASGIApp, trusted_hosts: list[str] | str) -> ASGIApp:
    # uvicorn's precise ASGI types and Starlette's loose ones do not meet
    return ProxyHeadersMiddleware(app, trusted_hosts=trusted_hosts)  # type: ignore[arg-type,return-value]
