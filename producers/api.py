"""The ingest HTTP API: ``POST /v1/jobs`` (one job or a batch).

202 means every job in the answer is durably in Kafka (delivery report received,
acks=all). If Kafka does not acknowledge them all, the answer is 503 with
``Retry-After``, listing which jobs *were* acknowledged and which were not; resubmitting
the whole request is safe, since duplicates collapse downstream.
"""

from __future__ import annotations

import asyncio
import logging
import math
import re
from collections.abc import AsyncIterator
from contextlib import asynccontextmanager
from datetime import UTC, datetime

import orjson
from fastapi import Depends, FastAPI, Request, Response

from onceflow.core.envelope import JobEnvelope
from onceflow.core.errors import ConfigurationError
from onceflow.core.ids import new_job_id, new_request_id, new_traceparent
from onceflow.core.settings import Settings
from producers.auth import Authenticator
from producers.kafka import JobProducer
from producers.limits import ClientLimiter
from producers.metrics import JOBS_ACCEPTED, JOBS_REJECTED, REQUESTS
from producers.models import (
    Accepted,
    BatchIn,
    ErrorBody,
    JobAccepted,
    JobIn,
    JobRejected,
    RequestError,
    parse_jobs,
)

log = logging.getLogger(__name__)
_REQUEST_ID_RE = re.compile(r"[A-Za-z0-9_.:-]{1,100}")

_BODY_SCHEMA = {
    "requestBody": {
        "required": True,
        "content": {
            "application/json": {
                "schema": {
                    "oneOf": [
                        {"$ref": "#/components/schemas/JobIn"},
                        {"$ref": "#/components/schemas/BatchIn"},
                    ]
                }
            }
        },
    }
}


def create_app(settings: Settings, producer: JobProducer | None = None) -> FastAPI:
    if not settings.auth_disabled and not settings.api_keys:
        raise ConfigurationError(
            "no API keys configured: set ONCEFLOW_API_KEYS (make one with `onceflow keys"
            " new`), or ONCEFLOW_AUTH_DISABLED=true for local development only"
        )
    known_types = _known_types(settings) if settings.ingest_validate_types else None
    auth = Authenticator(settings)
    limiter = ClientLimiter(
        settings.ingest_rate_limit_per_second,
        settings.ingest_rate_limit_burst,
        settings.ingest_max_inflight_per_client,
    )

    @asynccontextmanager
    async def lifespan(app: FastAPI) -> AsyncIterator[None]:
        app.state.producer = producer or JobProducer(settings)
        yield
        remaining = app.state.producer.close()
        log.info("producer flushed", extra={"event": "ingest.stopped", "undelivered": remaining})

    app = FastAPI(
        title="onceflow ingest",
        version="1",
        description="Submit jobs; each becomes one Kafka record keyed by its job id.",
        lifespan=lifespan,
    )

    # Make the body models appear in the OpenAPI components (the body is parsed by hand
    # so that one job and a batch share one endpoint with precise field errors).
    def _components() -> dict:
        schema = app.openapi_schema
        if schema is None:
            schema = FastAPI.openapi(app)
            comps = schema.setdefault("components", {}).setdefault("schemas", {})
            for model in (JobIn, BatchIn):
                model_schema = model.model_json_schema(ref_template="#/components/schemas/{model}")
                comps.update(model_schema.pop("$defs", {}))
                comps[model.__name__] = model_schema
            if known_types is not None:
                # The types this deployment knows, so clients (and the fuzzer) see them.
                comps["JobIn"]["properties"]["workflow"]["enum"] = sorted(known_types)
            app.openapi_schema = schema
        return schema

    app.openapi = _components  # type: ignore[method-assign]

    def error(status: int, body: ErrorBody, headers: dict[str, str] | None = None) -> Response:
        REQUESTS.labels(str(status)).inc()
        return _json(body.model_dump(), status, headers)

    @app.post(
        "/v1/jobs",
        status_code=202,
        response_model=Accepted,
        responses={
            400: {"model": ErrorBody},
            401: {"model": ErrorBody},
            403: {"model": ErrorBody},
            413: {"model": ErrorBody},
            429: {"model": ErrorBody},
            415: {"model": ErrorBody},
            422: {"model": ErrorBody},
            503: {"model": ErrorBody},
        },
        openapi_extra=_BODY_SCHEMA,
        summary="Submit one job or a batch",
    )
    async def submit(request: Request, client: str = Depends(auth.require("jobs:submit"))):
        try:
            wait = limiter.retry_after(client)
            if wait is not None:
                raise RequestError(
                    429,
                    "rate_limited",
                    f"over {settings.ingest_rate_limit_per_second:g} requests/s for this"
                    " client; slow down",
                    headers={"Retry-After": str(max(1, math.ceil(wait)))},
                )
            with limiter.slot(client) as admitted:
                if not admitted:
                    raise RequestError(
                        429,
                        "too_many_requests",
                        f"over {settings.ingest_max_inflight_per_client} requests in flight"
                        " for this client",
                        headers={"Retry-After": "1"},
                    )
                return await accept(request, await read_jobs(request))
        except RequestError as exc:
            JOBS_REJECTED.labels(exc.body.error).inc()
            return error(exc.status, exc.body, exc.headers)

    async def read_jobs(request: Request) -> list[JobIn]:
        """The request's jobs, or RequestError (415, 413, 400, 422) saying what is wrong."""
        content_type = request.headers.get("content-type", "")
        if content_type.split(";")[0].strip().lower() != "application/json":
            raise RequestError(
                415, "unsupported_media_type", "content-type must be application/json"
            )
        body = await _read_body(request, settings.ingest_max_body_bytes)
        if body is None:
            raise RequestError(
                413,
                "body_too_large",
                f"the body is over {settings.ingest_max_body_bytes} bytes; send fewer jobs"
                " per request",
            )
        return parse_jobs(
            body, settings.ingest_max_batch, settings.ingest_max_params_bytes, known_types
        )

    async def accept(request: Request, jobs: list[JobIn]) -> Response:
        # A caller's own request id is kept (it ties their logs to ours) if it is sane.
        given = request.headers.get("x-request-id", "")
        request_id = given if _REQUEST_ID_RE.fullmatch(given) else new_request_id()
        now = datetime.now(UTC)
        envelopes: list[JobEnvelope] = []
        seen: set[str] = set()
        duplicates = 0
        for job in jobs:
            job_id = job.job_id or new_job_id()
            if job_id in seen:
                duplicates += 1  # same id twice in one request: written once, first wins
                continue
            seen.add(job_id)
            envelopes.append(
                JobEnvelope(job_id, job.workflow, job.params, request_id, now, new_traceparent())
            )

        acks = await request.app.state.producer.send(envelopes)
        accepted = [
            JobAccepted(job_id=a.job_id, partition=a.partition, offset=a.offset)
            for a in acks
            if a.ok
        ]
        rejected = [JobRejected(job_id=a.job_id, reason=a.error or "") for a in acks if not a.ok]
        JOBS_ACCEPTED.inc(len(accepted))
        for a in accepted:
            log.info(
                "job accepted",
                extra={
                    "event": "job.accepted",
                    "job_id": a.job_id,
                    "request_id": request_id,
                    "partition": a.partition,
                    "offset": a.offset,
                },
            )
        if rejected:
            JOBS_REJECTED.labels("kafka").inc(len(rejected))
            return error(
                503,
                ErrorBody(
                    error="kafka_unavailable",
                    message=f"Kafka did not acknowledge {len(rejected)} of {len(acks)} "
                    "jobs; retry the request (duplicates are safe)",
                    accepted=accepted,
                    rejected=rejected,
                ),
                headers={
                    "Retry-After": str(settings.ingest_retry_after_seconds),
                    "X-Request-Id": request_id,
                },
            )
        REQUESTS.labels("202").inc()
        log.info(
            "accepted %d jobs",
            len(accepted),
            extra={
                "event": "ingest.accepted",
                "request_id": request_id,
                "count": len(accepted),
                "job_id": accepted[0].job_id,
            },
        )
        return _json(
            Accepted(
                request_id=request_id, accepted=accepted, duplicates_in_request=duplicates
            ).model_dump(),
            202,
            {"X-Request-Id": request_id},
        )

    @app.middleware("http")
    async def refuse_nul(request: Request, call_next):
        # PostgreSQL cannot hold NUL characters, and they have no business in an id.
        if "\x00" in request.url.path or "%00" in request.url.query:
            return _json(
                {
                    "error": "invalid_request",
                    "message": "NUL characters are not allowed in the URL",
                },
                400,
            )
        return await call_next(request)

    if settings.admin_api_enabled:
        from sqlalchemy.engine import Engine

        from producers.routes.admin import admin_router, jobs_router
        from workflow_engine.store.db import shared_engine

        def db() -> Engine:
            return shared_engine(settings.database_url)

        app.include_router(admin_router(db, auth.require))
        app.include_router(
            jobs_router(db, lambda job_id: lag_for_job(settings, job_id), auth.require)
        )

    @app.get("/healthz", include_in_schema=False)
    async def healthz() -> dict[str, str]:
        return {"status": "ok"}

    @app.get("/readyz", include_in_schema=False)
    async def readyz(request: Request):
        ok = await asyncio.to_thread(request.app.state.producer.ready)
        return _json({"kafka": "ok" if ok else "unavailable"}, 200 if ok else 503)

    return app


def _known_types(settings: Settings) -> frozenset[str] | None:
    """Workflow and task names registered by the configured modules (None: no check)."""
    from workflow_engine.definitions import (
        load_workflow_modules,
        registered_tasks,
        registered_workflows,
    )

    load_workflow_modules(settings.workflow_modules)
    names = frozenset(registered_workflows()) | frozenset(registered_tasks())
    return names or None


async def _read_body(request: Request, limit: int) -> bytes | None:
    """The request body, or None as soon as it is known to exceed ``limit`` bytes."""
    declared = request.headers.get("content-length")
    if declared is not None and declared.isdigit() and int(declared) > limit:
        return None
    chunks, size = [], 0
    async for chunk in request.stream():
        size += len(chunk)
        if size > limit:
            return None
        chunks.append(chunk)
    return b"".join(chunks)


def _json(body: object, status: int, headers: dict[str, str] | None = None) -> Response:
    return Response(
        orjson.dumps(body), status_code=status, headers=headers, media_type="application/json"
    )


def lag_for_job(settings: Settings, job_id: str) -> dict[str, object]:
    """The streams workers' lag in total and on the partition this job id lands on."""
    from onceflow.core.lag import consumer_lag
    from onceflow.core.partitioning import partition_for

    lags = consumer_lag(
        settings.kafka_bootstrap_servers, settings.consumer_group, settings.jobs_topic, timeout=5.0
    )
    partition = partition_for(job_id, len(lags)) if lags else None
    return {
        "total": sum(p.lag for p in lags),
        "partition": partition,
        "partition_lag": next((p.lag for p in lags if p.partition == partition), None),
    }
