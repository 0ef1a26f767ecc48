"""``POST /v1/jobs`` (one job or a batch) and ``GET /v1/jobs/{job_id}``.

202 means every job in the answer is durably in Kafka (delivery report received,
acks=all). If Kafka does not acknowledge them all, the answer is 503 with
``Retry-After``, listing which jobs *were* acknowledged and which were not; resubmitting
the whole request is safe, since duplicates collapse downstream. With ``Prefer: wait=N``
the acknowledged request may then wait for its outcome (producers/routes/results.py).
"""

from __future__ import annotations

import logging
import math
import re
from datetime import UTC, datetime
from typing import Any

from fastapi import APIRouter, Depends, Response
from starlette.requests import ClientDisconnect
from starlette.types import Receive, Scope, Send

from onceflow.envelope import JobEnvelope, id_reuse_policy
from onceflow.ids import new_job_id, new_request_id, new_traceparents
from onceflow.logs import EventLog
from onceflow.settings import Settings
from onceflow.vocabulary import OperatorAction
from producers.broker_link import KafkaUnreachable
from producers.deps import DbDep, Ingest, IngestDep, require
from producers.errors import error_responses, internal_error
from producers.kafka import Ack
from producers.metrics import JOBS_ACCEPTED, JOBS_REJECTED
from producers.models import (
    Accepted,
    ErrorBody,
    JobAccepted,
    JobIn,
    JobRejected,
    RequestError,
    job_start,
    parse_submission,
)
from producers.responses import error_response
from producers.routes import results
from producers.routes.unknown import not_found
from workflow_engine.store.views import job_status

log = logging.getLogger(__name__)
_ACCEPTED_LOG = EventLog(log, "job.accepted", "job accepted")
_REQUEST_ID_RE = re.compile(r"[A-Za-z0-9_.:-]{1,100}")

# The body is parsed by hand (one job and a batch share one endpoint, with precise
# field errors), so its schema is declared here; create_app adds the two models.
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
_ERRORS = error_responses(400, 401, 403, 413, 415, 422, 429, 503)

router = APIRouter(tags=["jobs"])
#: Mounted with the admin API only (it reads the database).
status_router = APIRouter(
    prefix="/v1/jobs", tags=["jobs"], responses=error_responses(400, 401, 403, 404, 410, 422)
)


@router.post(
    "/v1/jobs",
    status_code=202,
    response_model=Accepted,
    responses=_ERRORS,
    openapi_extra=_BODY_SCHEMA,
    summary="Submit one job or a batch",
)
async def submit() -> Response:
    # Declares the endpoint for the OpenAPI document (and, by being there, gives other
    # methods their 405 and ``/v1/jobs/`` its redirect); no docstring, which would be
    # the document's description. :class:`SubmitApp`, in front of the FastAPI app
    # (``producers.api.IngestFront``), answers every request this route would match,
    # so this body never runs.
    raise RuntimeError("POST /v1/jobs is answered by the submit front, not by FastAPI")


class Submission:
    """One ``POST /v1/jobs`` as the ASGI server handed it: what the submit path reads of
    it, looked up once (a dict of the headers, the first of repeated ones, as
    Starlette's ``Headers.get`` gives) and the body read straight from ``receive``.
    Starlette's ``Request`` per-lookup header scans and body stream were ~10% of a
    single-job request's CPU (BENCHMARKS.md, "Single-job requests")."""

    __slots__ = ("headers", "host", "receive")

    def __init__(self, scope: Scope, receive: Receive) -> None:
        self.headers = {k.decode("latin-1"): v.decode("latin-1") for k, v in scope["headers"][::-1]}
        client = scope.get("client")
        self.host: str | None = client[0] if client else None
        self.receive = receive

    async def body(self, limit: int) -> bytes | None:
        """The body, or None as soon as it is known to exceed ``limit`` bytes; raises
        Starlette's ``ClientDisconnect`` if the client went away first."""
        declared = self.headers.get("content-length")
        if declared is not None and declared.isdigit() and int(declared) > limit:
            return None
        chunks, size, more = [], 0, True
        while more:
            message = await self.receive()
            if message["type"] == "http.disconnect":
                raise ClientDisconnect()
            chunk = message.get("body", b"")
            size += len(chunk)
            if size > limit:
                return None
            chunks.append(chunk)
            more = message.get("more_body", False)
        return chunks[0] if len(chunks) == 1 else b"".join(chunks)


async def _submit(request: Submission, ingest: Ingest, client: str) -> Response:
    try:
        _check_rate(ingest, client)
        with ingest.limiter.slot(client) as admitted:
            if not admitted:
                raise RequestError(
                    429,
                    "too_many_requests",
                    f"over {ingest.settings.ingest_max_inflight_per_client} requests in"
                    " flight for this client",
                    headers={"Retry-After": "1"},
                )
            jobs, batch = await _read_jobs(request, ingest)
            accepted = await _accept(request, ingest, jobs, batch)
    except RequestError as exc:
        JOBS_REJECTED.labels(exc.body.error).inc()
        return error_response(exc.status, exc.body, exc.headers)
    if isinstance(accepted, Response):
        return accepted
    # After the in-flight slot: a request waiting for its outcome holds none.
    return await results.answer(ingest, request.headers, accepted, request.receive)


class SubmitApp:
    """The one entry of ``POST /v1/jobs`` (one job or a batch): a plain ASGI app that
    ``producers.api.IngestFront`` hands the endpoint's requests to, past FastAPI's
    routing, dependency solving and middleware, which for a single-job request cost
    more CPU than the submission itself (py-spy; BENCHMARKS.md, "Single-job requests:
    where the time goes"). Its answers are the API's: the authenticator's 401/403
    (counted, not a rejected job), everything else from :func:`_submit`, and an
    unexpected exception the one 500 (:func:`producers.errors.internal_error`)."""

    def __init__(self, ingest: Ingest) -> None:
        self.ingest = ingest

    async def __call__(self, scope: Scope, receive: Receive, send: Send) -> None:
        request = Submission(scope, receive)
        try:
            try:
                client = self.ingest.auth.check(request.headers, request.host, "jobs:submit")
            except RequestError as exc:
                response = error_response(exc.status, exc.body, exc.headers)
            else:
                response = await _submit(request, self.ingest, client)
        except ClientDisconnect:
            return  # nobody to answer; nothing was sent to Kafka
        except Exception as exc:
            response = internal_error(scope["method"], scope["path"], exc)
        await response(scope, receive, send)


def _check_rate(ingest: Ingest, client: str) -> None:
    wait = ingest.limiter.retry_after(client)
    if wait is not None:
        raise RequestError(
            429,
            "rate_limited",
            f"over {ingest.settings.ingest_rate_limit_per_second:g} requests/s for this"
            " client; slow down",
            headers={"Retry-After": str(max(1, math.ceil(wait)))},
        )


async def _read_jobs(request: Submission, ingest: Ingest) -> tuple[list[JobIn], bool]:
    """The request's jobs and whether it was a batch, or RequestError (415, 413, 400,
    422) saying what is wrong."""
    settings = ingest.settings
    content_type = request.headers.get("content-type", "")
    if content_type.split(";")[0].strip().lower() != "application/json":
        raise RequestError(415, "unsupported_media_type", "content-type must be application/json")
    body = await request.body(settings.ingest_max_body_bytes)
    if body is None:
        raise RequestError(
            413,
            "body_too_large",
            f"the body is over {settings.ingest_max_body_bytes} bytes; send fewer jobs per request",
        )
    return parse_submission(
        body,
        settings.ingest_max_batch,
        settings.ingest_max_params_bytes,
        ingest.known_types,
        ingest.known_callbacks,
        ingest.batched,
    )


async def _accept(
    request: Submission, ingest: Ingest, jobs: list[JobIn], batch: bool
) -> Response | results.Submitted:
    """The 503 when Kafka did not acknowledge every job, else what the answer needs."""
    # A caller's own request id is kept (it ties their logs to ours) if it is sane.
    given = request.headers.get("x-request-id", "")
    request_id = given if _REQUEST_ID_RE.fullmatch(given) else new_request_id()
    envelopes, duplicates = _envelopes(jobs, request_id)
    try:
        acks = await ingest.sender().send(envelopes)
    except KafkaUnreachable as exc:
        return _kafka_unreachable(exc, envelopes, request_id)
    # An acknowledged record always has its partition and offset. Plain dicts in the
    # shape of ``Accepted`` (the response model the route declares): building and
    # dumping the pydantic models cost more than encoding these.
    accepted = [
        {"job_id": job_id, "partition": partition, "offset": offset}
        for job_id, partition, offset, error in acks
        if error is None and partition is not None and offset is not None
    ]
    JOBS_ACCEPTED.inc(len(accepted))
    _log_accepted(accepted, request_id)
    if len(accepted) < len(acks):
        return _kafka_refused(ingest.settings, acks, accepted, request_id)
    body = {"request_id": request_id, "accepted": accepted, "duplicates_in_request": duplicates}
    return results.Submitted(request_id, body, envelopes, batch)


def _envelopes(jobs: list[JobIn], request_id: str) -> tuple[list[JobEnvelope], int]:
    """One envelope per distinct job id (the first wins), and how many were repeats."""
    now = datetime.now(UTC)
    envelopes: list[JobEnvelope] = []
    seen: set[str] = set()
    traceparents = new_traceparents(len(jobs))
    for job, traceparent in zip(jobs, traceparents, strict=True):
        job_id = job.job_id or new_job_id()
        if job_id in seen:
            continue  # same id twice in one request: written once
        seen.add(job_id)
        envelopes.append(
            JobEnvelope(
                job_id,
                job.workflow,
                job.params,
                request_id,
                now,
                traceparent,
                job.priority,
                job.callback,
                job_start(job, now),
                job.attributes or {},
                job.start_within,
                id_reuse_policy(job.id_reuse),
            )
        )
    return envelopes, len(jobs) - len(envelopes)


def _log_accepted(accepted: list[dict[str, Any]], request_id: str) -> None:
    """The job-id trail: one ``job.accepted`` line per accepted job, and for a batch one
    ``ingest.accepted`` line for the request. A single-job request gets the one line
    (its ``job.accepted`` names the request too). Through :class:`EventLog`: the
    stdlib's record, formatter and write per line were a quarter of ingest's CPU per
    single-job request (BENCHMARKS.md, "Single-job requests")."""
    if not _ACCEPTED_LOG.enabled():
        return
    _ACCEPTED_LOG.info_each({"request_id": request_id}, accepted)
    if len(accepted) > 1:
        log.info(
            "accepted %d jobs",
            len(accepted),
            extra={
                "event": "ingest.accepted",
                "request_id": request_id,
                "count": len(accepted),
                "job_id": accepted[0]["job_id"],
            },
        )


def _kafka_refused(
    settings: Settings, acks: list[Ack], accepted: list[dict[str, Any]], request_id: str
) -> Response:
    """The 503 naming which jobs Kafka acknowledged and which it did not."""
    rejected = [JobRejected(job_id=a.job_id, reason=a.error or "") for a in acks if not a.ok]
    JOBS_REJECTED.labels("kafka").inc(len(rejected))
    body = ErrorBody(
        error="kafka_unavailable",
        message=f"Kafka did not acknowledge {len(rejected)} of {len(acks)} jobs; retry the"
        " request (duplicates are safe)",
        accepted=[JobAccepted(**a) for a in accepted],
        rejected=rejected,
    )
    headers = {
        "Retry-After": str(settings.ingest_retry_after_seconds),
        "X-Request-Id": request_id,
    }
    return error_response(503, body, headers)


def _kafka_unreachable(
    exc: KafkaUnreachable, envelopes: list[JobEnvelope], request_id: str
) -> Response:
    """The 503 given at once while Kafka is known to be unable to take a write (no
    broker connected, or it cannot confirm one: broker_link): nothing was written."""
    code = str(exc.why)
    rejected = [JobRejected(job_id=e.job_id, reason=code) for e in envelopes]
    JOBS_REJECTED.labels(code).inc(len(rejected))
    body = ErrorBody(
        error=code,
        message=f"{exc.why.text} for {exc.down_for:.1f}s, nothing was written;"
        f" retry after {exc.retry_after}s (duplicates are safe)",
        rejected=rejected,
        details={"kafka": exc.reason},
    )
    headers = {"Retry-After": str(exc.retry_after), "X-Request-Id": request_id}
    return error_response(503, body, headers)


@status_router.get(
    "/{job_id}", dependencies=[Depends(require("jobs:read", audit_as=OperatorAction.REQUEST))]
)
def get_job(job_id: str, ingest: IngestDep, db: DbDep) -> Any:
    """What became of a job: its instance or task run; 410 when its record was
    dead-lettered (why and where); else how far the queue is behind (404 with the lag)."""
    found = job_status(db, job_id)
    if found is not None:
        return found
    not_found(ingest, db, job_id)
