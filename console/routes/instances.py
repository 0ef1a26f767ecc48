"""``/instances`` (filtered, keyset-paged list) and ``/instances/{job_id}``."""

from __future__ import annotations

from typing import Any
from urllib.parse import urlencode

from fastapi import APIRouter, Depends, HTTPException, Request
from fastapi.responses import Response

from console.deps import ConsoleDep, reader, render
from onceflow.errors import OnceflowError
from onceflow.event_reader import read_job_events
from onceflow.vocabulary import TERMINAL_STATUSES, InstanceStatus
from workflow_engine.store.views import (
    SORTS,
    ActionFilter,
    InstanceFilter,
    count_matching,
    dead_letters_for,
    describe_instance,
    job_trace,
    list_actions,
    list_page,
    pending_events,
    step_results,
)

router = APIRouter(dependencies=[Depends(reader)])

COUNT_CAP = 100_000  # beyond this the list says "100000+" instead of counting on
OPERATOR_ACTIONS_SHOWN = 20  # an instance's latest operator actions; /audit has the rest


@router.get("/instances")
def instances_page(request: Request, c: ConsoleDep) -> Response:
    query = dict(request.query_params)
    f = InstanceFilter.from_params(query)
    sort = query.get("sort", "created")
    if sort not in SORTS:
        sort = "created"
    cursor = query.get("cursor") or None
    page = list_page(c.db, f, sort=sort, cursor=cursor)  # type: ignore[arg-type]
    count = count_matching(c.db, f, cap=COUNT_CAP)
    params = f.as_params()
    next_url = None
    if page.next_cursor:
        next_url = "/instances?" + urlencode({**params, "sort": sort, "cursor": page.next_cursor})
    context: dict[str, Any] = {
        "f": f,
        "params": params,
        "sort": sort,
        "sorts": SORTS,
        "page": page,
        "count": count,
        "capped": count >= COUNT_CAP,
        "next_url": next_url,
        "first_url": "/instances?" + urlencode({**params, "sort": sort}),
        "paged": cursor is not None,
        "statuses": list(InstanceStatus),
        "form": query,
    }
    return render(request, "instances.html", context)


@router.get("/instances/{job_id}")
def instance_page(request: Request, job_id: str, c: ConsoleDep, done: str = "") -> Response:
    view = describe_instance(c.db, job_id)
    if view is None:
        raise HTTPException(404, f"no instance with job id {job_id!r}")
    context = {
        "view": view,
        "outputs": step_results(c.db, job_id),
        "trace": job_trace(c.db, job_id),
        "dead_letters": dead_letters_for(c.db, job_id),
        "operator_actions": list_actions(
            c.db, ActionFilter(job_id=job_id), limit=OPERATOR_ACTIONS_SHOWN
        ),
        "terminal": view.status in TERMINAL_STATUSES,
        "paused": view.status == InstanceStatus.PAUSED,
        "sql": f"SELECT * FROM job_trace('{job_id.replace(chr(39), chr(39) * 2)}');",
        "done": done,
    }
    return render(request, "instance.html", context)


EVENTS_SHOWN = 500  # an instance's lifecycle events read back from the topic, at most


@router.get("/instances/{job_id}/events")
def instance_events(request: Request, job_id: str, c: ConsoleDep) -> Response:
    """The instance's lifecycle events: those published (read back from the events
    topic, bounded) and those still in the outbox (not yet published). Loaded after the
    page (htmx), so a slow or absent Kafka never slows the instance page."""
    view = describe_instance(c.db, job_id)
    if view is None:
        raise HTTPException(404, f"no instance with job id {job_id!r}")
    context: dict[str, Any] = {"job_id": job_id, "read": None, "error": None}
    try:
        context["read"] = read_job_events(
            c.settings.kafka_bootstrap_servers,
            c.settings.events_topic,
            job_id,
            since=view.created_at,
            limit=EVENTS_SHOWN,
        )
    except OnceflowError as exc:
        context["error"] = str(exc)
    context["pending"] = pending_events(c.db, job_id)
    return render(request, "_events.html", context)
