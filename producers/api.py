"""The ingest HTTP API: ``POST /v1/jobs`` (one job or a batch).

202 means every job in the answer is durably in Kafka (delivery report received,
acks=all). If Kafka does not acknowledge them all, the answer is 503 with
``Retry-After``, listing which jobs *were* acknowledged and which were not; resubmitting
the whole request is safe, since duplicates collapse downstream.
"""

from __future__ import annotations

import logging
from collections.abc import AsyncIterator
from contextlib import asynccontextmanager
from datetime import UTC, datetime

import orjson
from fastapi import FastAPI, Request, Response

from onceflow.envelope import JobEnvelope
from onceflow.ids import new_job_id, new_request_id, new_traceparent
from onceflow.settings import Settings
from producers.kafka import JobProducer
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
            413: {"model": ErrorBody},
            415: {"model": ErrorBody},
            422: {"model": ErrorBody},
            503: {"model": ErrorBody},
        },
        openapi_extra=_BODY_SCHEMA,
        summary="Submit one job or a batch",
    )
    async def submit(request: Request):
        content_type = request.headers.get("content-type", "")
        if content_type.split(";")[0].strip().lower() != "application/json":
            JOBS_REJECTED.labels("content_type").inc()
            return error(
                415,
                ErrorBody(
                    error="unsupported_media_type", message="content-type must be application/json"
                ),
            )
        body = await request.body()
        try:
            jobs = parse_jobs(body, settings.ingest_max_batch, settings.ingest_max_params_bytes)
        except RequestError as exc:
            JOBS_REJECTED.labels(exc.body.error).inc()
            return error(exc.status, exc.body)

        request_id = request.headers.get("x-request-id") or new_request_id()
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

    if settings.admin_api_enabled:
        from sqlalchemy.engine import Engine

        from workflow_engine.db import shared_engine
        from workflow_engine.http import admin_router, jobs_router

        def db() -> Engine:
            return shared_engine(settings.database_url)

        app.include_router(admin_router(db))
        app.include_router(jobs_router(db, lambda job_id: lag_for_job(settings, job_id)))

    @app.get("/healthz", include_in_schema=False)
    async def healthz() -> dict[str, str]:
        return {"status": "ok"}

    @app.get("/readyz", include_in_schema=False)
    async def readyz(request: Request):
        import asyncio

        ok = await asyncio.to_thread(request.app.state.producer.ready)
        return _json({"kafka": "ok" if ok else "unavailable"}, 200 if ok else 503)

    return app


def _json(body: object, status: int, headers: dict[str, str] | None = None) -> Response:
    return Response(
        orjson.dumps(body), status_code=status, headers=headers, media_type="application/json"
    )


def lag_for_job(settings: Settings, job_id: str) -> dict[str, object]:
    """The streams workers' lag in total and on the partition this job id lands on."""
    from onceflow.lag import consumer_lag
    from onceflow.partitioning import partition_for

    lags = consumer_lag(
        settings.kafka_bootstrap_servers, settings.consumer_group, settings.jobs_topic, timeout=5.0
    )
    partition = partition_for(job_id, len(lags)) if lags else None
    return {
        "total": sum(p.lag for p in lags),
        "partition": partition,
        "partition_lag": next((p.lag for p in lags if p.partition == partition), None),
    }
