"""``GET /v1/jobs/{job_id}/stream``: an instance's output streams as Server-Sent Events.

Each value workflow code emitted (``ctx.emit(stream, value)``) is one event: ``id`` its
seq in the instance, ``event`` its stream's name, ``data`` its JSON. The answer resumes
after ``Last-Event-ID`` (or ``?after=N``), is filtered by ``?stream=name``, and ends with
``event: end`` (``data``: the instance's final status) once the instance is final and
every value was sent. A reader may connect before the instance exists (its job still in
Kafka): the request waits up to ``ingest_stream_wait_seconds`` for it before the 404.
Readers wait without a database connection and without polling on their own
(:mod:`producers.stream_hub`).
"""

from __future__ import annotations

import asyncio
import logging
import time
from collections.abc import AsyncIterator
from typing import Annotated

import orjson
from fastapi import APIRouter, Depends, Query, Request, Response
from sqlalchemy.engine import Engine
from sse_starlette import EventSourceResponse, ServerSentEvent
from starlette.background import BackgroundTask
from starlette.concurrency import run_in_threadpool

from onceflow.output_streams import END_EVENT, InvalidStreamValue, check_stream_name
from onceflow.vocabulary import OperatorAction
from producers.deps import DbDep, Ingest, IngestDep, require
from producers.errors import error_responses
from producers.models import FieldError, RequestError
from producers.stream_hub import StreamHub, Waiter
from workflow_engine.store.views import StreamRead, dead_letters_for, job_status, read_values

log = logging.getLogger(__name__)
#: Values read per statement; a reader that is behind reads page after page.
PAGE = 500
#: A reader waiting for its instance checks this often whether its client went away.
_DISCONNECT_CHECK_SECONDS = 2.0
#: Seconds between SSE comments that keep an idle connection open through proxies.
PING_SECONDS = 15

router = APIRouter(
    prefix="/v1/jobs", tags=["jobs"], responses=error_responses(400, 401, 403, 404, 410, 422, 503)
)


@router.get(
    "/{job_id}/stream",
    dependencies=[Depends(require("jobs:read", audit_as=OperatorAction.REQUEST))],
    response_class=EventSourceResponse,
    summary="Follow a job's output streams (Server-Sent Events)",
)
async def stream_job(
    job_id: str,
    request: Request,
    ingest: IngestDep,
    db: DbDep,
    stream: Annotated[str | None, Query(description="Only this stream's values.")] = None,
    after: Annotated[int | None, Query(ge=0, description="Resume after this seq.")] = None,
) -> Response:
    """The values the job's workflow emits, as they are committed, then ``end``."""
    _check_stream(stream)
    start = _resume_point(request, after)
    hub = ingest.stream_hub(db)
    if not hub.admit():
        raise RequestError(
            503,
            "too_many_streams",
            f"this ingest process serves {hub.max_readers} streams at once"
            " (ONCEFLOW_INGEST_STREAM_MAX_READERS); retry later",
            headers={"Retry-After": "1"},
        )
    waiter = hub.subscribe(job_id)
    try:
        first = await _first_page(request, db, job_id, start, stream, waiter, ingest)
    except BaseException:
        hub.leave(waiter)
        raise
    return EventSourceResponse(
        _events(db, hub, waiter, first, start, stream),
        ping=PING_SECONDS,
        headers={"X-Job-Id": job_id},
        background=BackgroundTask(hub.leave, waiter),
    )


def _check_stream(stream: str | None) -> None:
    if stream is None:
        return
    try:
        check_stream_name(stream)
    except InvalidStreamValue as exc:
        raise RequestError(
            422,
            "invalid_request",
            exc.reason,
            fields=[FieldError(field="query.stream", reason=exc.reason)],
        ) from None


def _resume_point(request: Request, after: int | None) -> int:
    """Where to resume: ``Last-Event-ID`` (a browser's reconnect sends it), else
    ``?after``, else the beginning."""
    given = request.headers.get("last-event-id")
    if given is None or given == "":
        return after or 0
    if not given.isdigit() or len(given) > 19:
        raise RequestError(
            400,
            "invalid_request",
            "Last-Event-ID must be the id of an event of this stream (a seq, digits only)",
            fields=[FieldError(field="header.last-event-id", reason="not a seq")],
        )
    return int(given)


async def _first_page(
    request: Request,
    db: Engine,
    job_id: str,
    after: int,
    stream: str | None,
    waiter: Waiter,
    ingest: Ingest,
) -> StreamRead:
    """The first page, once the instance exists: waits for it (the job may still be in
    Kafka) up to the configured time; 404 after that, or at once for an id that can
    have no instance (a task run, a dead-lettered record: 410)."""
    waiter.event.clear()
    page = await run_in_threadpool(read_values, db, job_id, after, stream, PAGE)
    if page.status is not None:
        return page
    await run_in_threadpool(_refuse_if_known_without_instance, db, job_id)
    deadline = time.monotonic() + ingest.settings.ingest_stream_wait_seconds
    while page.status is None:
        left = deadline - time.monotonic()
        if left <= 0 or await request.is_disconnected():
            raise RequestError(
                404,
                "not_found",
                f"no instance with job id {job_id!r} after waiting"
                f" {ingest.settings.ingest_stream_wait_seconds:g}s: if it was accepted, it"
                " is still in the queue; retry later",
            )
        # Woken by the shared poll once the instance exists (or by its first append):
        # a waiting reader reads nothing on its own, it only checks its client.
        if await waiter.wait(min(left, _DISCONNECT_CHECK_SECONDS)):
            waiter.event.clear()
            page = await run_in_threadpool(read_values, db, job_id, after, stream, PAGE)
    return page


def _refuse_if_known_without_instance(db: Engine, job_id: str) -> None:
    """A job id that became a task run, or whose record was dead-lettered, never gets
    an instance: say so now instead of waiting."""
    found = job_status(db, job_id)
    if found is not None:
        raise RequestError(
            404,
            "not_found",
            f"job {job_id!r} is a {found.get('kind', 'task')}, which has no output streams",
        )
    if dead_letters_for(db, job_id):
        raise RequestError(
            410,
            "dead_lettered",
            f"the record of job {job_id!r} was dead-lettered: it has no instance"
            f" (GET /v1/jobs/{job_id} says why)",
        )


async def _events(
    db: Engine,
    hub: StreamHub,
    waiter: Waiter,
    page: StreamRead,
    after: int,
    stream: str | None,
) -> AsyncIterator[ServerSentEvent]:
    """Every value past ``after`` as it commits, then ``end``. The wake-up is cleared
    before each read, so a value committed during a read wakes the next wait."""
    try:
        while True:
            for value in page.values:
                yield ServerSentEvent(data=value.data, event=value.stream, id=str(value.seq))
                after = value.seq
            if len(page.values) < PAGE:
                if page.final:
                    end = {"job_id": waiter.job_id, "status": str(page.status)}
                    yield ServerSentEvent(data=orjson.dumps(end).decode(), event=END_EVENT)
                    return
                await waiter.wait()
            waiter.event.clear()
            page = await _read(db, waiter.job_id, after, stream, hub)
    finally:
        hub.leave(waiter)


async def _read(
    db: Engine, job_id: str, after: int, stream: str | None, hub: StreamHub
) -> StreamRead:
    """The next page; while PostgreSQL does not answer, retried at the poll's pace (the
    reader keeps its connection and its place)."""
    while True:
        try:
            return await run_in_threadpool(read_values, db, job_id, after, stream, PAGE)
        except Exception as exc:
            log.warning(
                "stream read failed: %s",
                exc,
                extra={"event": "ingest.stream_read_failed", "job_id": job_id},
            )
            await asyncio.sleep(hub.poll_seconds)
