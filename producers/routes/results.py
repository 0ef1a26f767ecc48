"""Start and wait: ``POST /v1/jobs`` with ``Prefer: wait=N`` and
``GET /v1/jobs/{job_id}/result?wait=N`` (README, "Start and wait").

A submission is answered as before, after Kafka acknowledged it (nothing here runs
before the ack, and the per-client in-flight slot is given back first: a waiting
request holds no submission slot). With a ``wait`` preference (producers/prefer.py,
capped to ``ingest_max_wait_seconds``, the grant said in ``Preference-Applied``) it
then waits (producers/waiters.py) for the jobs' instances to finish:

- one job (the body a job object): **200** with the job's outcome (the fields of
  ``GET /v1/jobs/{job_id}``'s body that say how it ended: ``kind``, ``job_id``,
  ``workflow``, ``status``, ``result``, ``error``, ``version``, ``finished_at``); an
  ``errored``, ``terminated``, ``skipped`` or ``debounced`` end (its ``error``: ``debounced
  into <id>``) is a 200 too: the answer is the outcome, and it is final. Not final in
  time: the usual **202**, with ``Location: /v1/jobs/{id}``.
- a batch (``{"jobs": [...]}``): one deadline for all; **200** when every job is final,
  else **202**; either way the usual accepted body plus ``results``, the outcome of
  each job final by then, in the order of ``accepted``.

A request naming a plain task (which has no lifecycle events), or made with a key
without ``jobs:read`` (an outcome is what that scope guards), is not waited for. A
wait that cannot be watched (the events consumer not ready, PostgreSQL down, over
``ingest_max_waiters``) is the plain 202 at once, without ``Preference-Applied``.
"""

from __future__ import annotations

import asyncio
import logging
from collections.abc import Coroutine, Mapping
from dataclasses import dataclass
from typing import Any

import sqlalchemy as sa
from fastapi import APIRouter, Depends, HTTPException, Query, Request, Response
from starlette.concurrency import run_in_threadpool
from starlette.types import Receive

from onceflow.envelope import JobEnvelope
from onceflow.vocabulary import IdReuse, OperatorAction
from producers.deps import DbDep, Ingest, IngestDep, require
from producers.errors import error_responses
from producers.metrics import REQUESTS
from producers.prefer import wait_preference
from producers.responses import json_response
from producers.routes.unknown import not_found
from producers.waiters import DatabaseUnavailable, Waited, WaitOutcome
from workflow_engine.store.views import Record

log = logging.getLogger(__name__)
_REQUESTS_200 = REQUESTS.labels("200")
_REQUESTS_202 = REQUESTS.labels("202")

_UNWAITED = (WaitOutcome.DEGRADED, WaitOutcome.REFUSED)

result_router = APIRouter(
    prefix="/v1/jobs", tags=["jobs"], responses=error_responses(400, 401, 403, 404, 410, 422, 503)
)


@dataclass(slots=True)
class Submitted:
    """A submission Kafka acknowledged in full: its 202 body and what a wait needs."""

    request_id: str
    body: dict[str, Any]
    envelopes: list[JobEnvelope]
    batch: bool

    @property
    def job_ids(self) -> list[str]:
        return [e.job_id for e in self.envelopes]

    def records(self, may_reuse: frozenset[str] | None, topic: str) -> dict[str, Record]:
        """The records of the jobs whose submission may start a new run of their id
        (their workflow's id reuse policy, or their own, is not ``never``; ``may_reuse``
        None: any workflow's may): a wait answers the run each record belongs to
        (producers/waiters.py)."""
        positions = {a["job_id"]: a for a in self.body["accepted"]}
        return {
            e.job_id: Record(topic, positions[e.job_id]["partition"], positions[e.job_id]["offset"])
            for e in self.envelopes
            if e.id_reuse is not IdReuse.NEVER and (may_reuse is None or e.workflow in may_reuse)
        }

    def names_a_task(self, tasks: frozenset[str]) -> bool:
        """Some job names a plain task (known to this deployment): not waited for."""
        return bool(tasks) and any(e.workflow in tasks for e in self.envelopes)

    def headers(self, applied: float | None = None) -> dict[str, str]:
        headers = {"X-Request-Id": self.request_id}
        if not self.batch:
            headers["Location"] = f"/v1/jobs/{self.envelopes[0].job_id}"
        if applied is not None:
            headers["Preference-Applied"] = f"wait={applied:g}"
        return headers

    def accepted(self) -> Response:
        """The plain 202."""
        _REQUESTS_202.inc()
        return json_response(self.body, 202, self.headers())


async def answer(
    ingest: Ingest, headers: Mapping[str, str], submitted: Submitted, receive: Receive
) -> Response:
    """The answer to an acknowledged submission: the plain 202, or, with a ``wait``
    preference, the jobs' outcomes if they finish in time (or the client hangs up:
    ``receive`` says so). An outcome is what ``jobs:read`` guards
    (``GET /v1/jobs/{id}``): a key that may only submit is not waited for (else
    resubmitting any known id would read its result)."""
    prefer = headers.get("prefer")
    if prefer is None:
        return submitted.accepted()
    wanted = wait_preference(prefer)
    waiters = ingest.waiters
    if not wanted or waiters is None or submitted.names_a_task(ingest.task_types):
        return submitted.accepted()
    if not ingest.auth.holds(headers, "jobs:read"):
        return submitted.accepted()
    applied = waiters.applied(wanted)
    job_ids = submitted.job_ids
    records = submitted.records(ingest.may_reuse, ingest.settings.jobs_topic)
    waited = await unless_hung_up(waiters.wait(job_ids, applied, records), receive)
    if waited is None:
        return submitted.accepted()  # to nobody: the client is gone
    if waited.how in _UNWAITED:
        _log_unwaited(submitted, waited)
        return submitted.accepted()
    headers = submitted.headers(applied)
    final = waited.how is WaitOutcome.FINAL
    (_REQUESTS_200 if final else _REQUESTS_202).inc()
    if not submitted.batch:
        outcome = waited.final(job_ids[0])
        if outcome is not None:
            return json_response(outcome.to_dict(), 200, headers)
        return json_response(submitted.body, 202, headers)
    results = [o.to_dict() for o in map(waited.final, job_ids) if o is not None]
    return json_response({**submitted.body, "results": results}, 200 if final else 202, headers)


async def unless_hung_up(waiting: Coroutine[Any, Any, Waited], receive: Receive) -> Waited | None:
    """``waiting``'s outcome, or None as soon as the client closes its connection (the
    wait is cancelled then: its waiters leave the map and its place under
    ``ingest_max_waiters`` is free at once, not when the wait runs out). The body was
    read already, so the ASGI server's next message is ``http.disconnect``."""
    wait = asyncio.ensure_future(waiting)
    gone = asyncio.ensure_future(_hang_up(receive))
    try:
        await asyncio.wait((wait, gone), return_when=asyncio.FIRST_COMPLETED)
    finally:
        gone.cancel()
        if not wait.done():
            wait.cancel()
    return wait.result() if wait.done() and not wait.cancelled() else None


async def _hang_up(receive: Receive) -> None:
    while (await receive())["type"] != "http.disconnect":
        pass


def _log_unwaited(submitted: Submitted, waited: Waited) -> None:
    log.info(
        "answered 202 without waiting (%s)",
        waited.reason or waited.how,
        extra={
            "event": "ingest.wait_skipped",
            "outcome": str(waited.how),
            "job_id": submitted.job_ids[0],
            "request_id": submitted.request_id,
        },
    )


@result_router.get(
    "/{job_id}/result",
    dependencies=[Depends(require("jobs:read", audit_as=OperatorAction.REQUEST))],
    summary="A job's outcome, waiting up to `wait` seconds for it",
)
async def get_result(
    job_id: str,
    request: Request,
    ingest: IngestDep,
    db: DbDep,
    wait: float = Query(0, ge=0, description="seconds to wait (capped to the configured max)"),
) -> Response:
    """200 with the job's outcome once final (as ``Prefer: wait`` gives it); 202 with
    ``Location`` when it is not final after ``wait`` seconds (or at once, when it cannot
    be watched); 404 / 410 as ``GET /v1/jobs/{job_id}`` when there is no instance or
    task run with this id; 503 when PostgreSQL cannot say."""
    waiters = ingest.waiters
    waited: Waited | None = None
    if waiters is not None and wait > 0 and waiters.watchable:
        waited = await unless_hung_up(
            waiters.wait([job_id], waiters.applied(wait)), request.receive
        )
        if waited is None:  # the client is gone
            return Response(status_code=202, headers={"Location": f"/v1/jobs/{job_id}"})
    if waited is None or (waited.how in _UNWAITED and job_id not in waited.outcomes):
        waited = await _read_once(ingest, job_id)
    if job_id not in waited.outcomes:
        await run_in_threadpool(not_found, ingest, db, job_id)
    outcome = waited.final(job_id)
    if outcome is not None:
        return json_response(outcome.to_dict(), 200)
    return json_response(waited.outcomes[job_id].to_dict(), 202, {"Location": f"/v1/jobs/{job_id}"})


async def _read_once(ingest: Ingest, job_id: str) -> Waited:
    """The job's status, read once (no wait): 503 when PostgreSQL does not answer."""
    try:
        if ingest.waiters is not None:
            return Waited(WaitOutcome.DEGRADED, await ingest.waiters.read([job_id]))
        from workflow_engine.store import shared_engine
        from workflow_engine.store.views import job_outcomes

        db = shared_engine(ingest.settings.database_url)
        return Waited(WaitOutcome.DEGRADED, await run_in_threadpool(job_outcomes, db, [job_id]))
    except (DatabaseUnavailable, sa.exc.DBAPIError):
        raise HTTPException(
            503,
            {"error": "database_unavailable", "message": "PostgreSQL cannot be read; retry"},
            headers={"Retry-After": "2"},
        ) from None
