"""Acting on instances: pause, resume, terminate, restart, retry from the failed step,
fork, send an event, and bulk operations by filter. Every action needs
``instances:control`` and the CSRF token, and goes through a confirmation page first
(the form posts again with ``confirm=yes``)."""

from __future__ import annotations

import logging
from typing import Any
from urllib.parse import quote

import orjson
from fastapi import APIRouter, Depends, HTTPException, Request
from fastapi.responses import RedirectResponse, Response

from console.deps import Console, ConsoleDep, ControlForm, Operator, reader, render
from console.forms import Form
from console.metrics import ACTIONS
from onceflow.vocabulary import BulkAction
from workflow_engine.store import operations
from workflow_engine.store.views import InstanceFilter, count_matching, describe_instance

log = logging.getLogger(__name__)
router = APIRouter()

_CONTROL = {
    "pause": operations.pause,
    "resume": operations.resume,
    "terminate": operations.terminate,
    "restart": operations.restart,
    "retry": operations.retry,
}


def _confirmed(form: Form) -> bool:
    return form.get("confirm") == "yes"


@router.post("/instances/{job_id}/send-event")
def send_event(
    request: Request,
    job_id: str,
    form: ControlForm,
    c: ConsoleDep,
    actor: Operator,
) -> Response:
    view = describe_instance(c.db, job_id)
    if view is None:
        raise HTTPException(404, f"no instance with job id {job_id!r}")
    event_type, raw = form.get("event_type").strip(), form.get("payload").strip() or "null"
    error = None
    payload: Any = None
    try:
        payload = orjson.loads(raw)
        # The store's rule (type pattern, size caps), shown on the confirmation page;
        # operations.send_event applies it again when the event is sent.
        operations.check_event(event_type, payload)
    except orjson.JSONDecodeError as exc:
        error = f"the payload is not JSON: {exc}"
    except operations.InvalidEvent as exc:
        error = str(exc)
    fields = {"event_type": event_type, "payload": raw}
    if error or not _confirmed(form):
        return render(
            request,
            "confirm.html",
            {
                "title": f"Send event {event_type!r} to {job_id}",
                "action_url": request.url.path,
                "fields": fields,
                "summary": f"Send a {event_type!r} event to {view.workflow} instance {job_id}.",
                "detail": raw,
                "error": error,
                "back": f"/instances/{quote(job_id)}",
            },
            400 if error else 200,
        )
    event_id = operations.send_event(c.db, view.workflow, job_id, event_type, payload, actor=actor)
    ACTIONS.labels("send-event").inc()
    log.info("event sent", extra={"event": "console.send_event", "job_id": job_id})
    return RedirectResponse(
        f"/instances/{quote(job_id)}?done={quote(f'event {event_id} sent')}", status_code=303
    )


def _fork_request(form: Form) -> tuple[dict[str, Any], str | None]:
    """The fork form's fields as ``operations.fork`` takes them, or why they are not."""
    raw, number = form.get("params").strip(), form.get("number").strip() or "1"
    fields: dict[str, Any] = {"from_step": form.get("from_step"), "number": 1, "params": None}
    if not number.isdigit() or int(number) < 1:
        return fields, f"the fork number {number!r} is not a whole number of 1 or more"
    fields["number"] = int(number)
    if raw:
        try:
            params = orjson.loads(raw)  # as the console reads an event's payload
        except orjson.JSONDecodeError as exc:
            return fields, f"the params are not JSON: {exc}"
        if not isinstance(params, dict):
            return fields, "the params must be a JSON object"
        fields["params"] = params
    return fields, None


@router.post("/instances/{job_id}/fork")
def fork_instance(
    request: Request, job_id: str, form: ControlForm, c: ConsoleDep, actor: Operator
) -> Response:
    view = describe_instance(c.db, job_id)
    if view is None:
        raise HTTPException(404, f"no instance with job id {job_id!r}")
    fields, error = _fork_request(form)
    if error or not _confirmed(form):
        return render(
            request,
            "confirm.html",
            {
                "title": f"Fork {job_id} from step {fields['from_step']!r}?",
                "action_url": request.url.path,
                "fields": {k: form.get(k) for k in ("from_step", "number", "params")},
                "summary": f"Copy the history of {job_id} before step {fields['from_step']!r}"
                f" into {job_id}~fork{fields['number']} and run the rest there.",
                "detail": form.get("params") or None,
                "error": error,
                "back": f"/instances/{quote(job_id)}",
            },
            400 if error else 200,
        )
    made = operations.fork(c.db, view.workflow, job_id, actor=actor, **fields)
    ACTIONS.labels("fork").inc()
    log.info("instance forked", extra={"event": "console.fork", "job_id": job_id})
    return RedirectResponse(f"/instances/{quote(made.job_id)}?done={quote(made.describe())}", 303)


@router.post("/instances/{job_id}/{action}")
def instance_action(
    request: Request,
    job_id: str,
    action: str,
    form: ControlForm,
    c: ConsoleDep,
    actor: Operator,
) -> Response:
    operation = _CONTROL.get(action)
    if operation is None:
        raise HTTPException(404, f"no action {action!r}")
    view = describe_instance(c.db, job_id)
    if view is None:
        raise HTTPException(404, f"no instance with job id {job_id!r}")
    if not _confirmed(form):
        return render(
            request,
            "confirm.html",
            {
                "title": f"{action.capitalize()} {job_id}?",
                "action_url": request.url.path,
                "fields": {},
                "summary": f"{action.capitalize()} {view.workflow} instance {job_id}"
                f" (now {view.status}).",
                "detail": None,
                "error": None,
                "back": f"/instances/{quote(job_id)}",
            },
        )
    result = operation(c.db, view.workflow, job_id, actor=actor)
    ACTIONS.labels(action).inc()
    log.info("instance %s", action, extra={"event": f"console.{action}", "job_id": job_id})
    return RedirectResponse(
        f"/instances/{quote(job_id)}?done={quote(result.describe())}", status_code=303
    )


@router.post("/bulk")
def start_bulk(request: Request, form: ControlForm, c: ConsoleDep, actor: Operator) -> Response:
    try:
        action = BulkAction(form.get("action"))
    except ValueError:
        raise HTTPException(400, f"unknown bulk action {form.get('action')!r}") from None
    # Refused before counting: the empty filter would match every instance.
    f = operations.refuse_empty(InstanceFilter.from_params(form.as_dict()))
    if not _confirmed(form):
        n = count_matching(c.db, f)
        return render(
            request,
            "confirm.html",
            {
                "title": f"{str(action).capitalize()} {n} instances?",
                "action_url": "/bulk",
                "fields": {**f.as_params(), "action": str(action)},
                "summary": f"{str(action).capitalize()} all {n} instances matching {f.describe()}.",
                "count": n,
                "detail": None,
                "error": None,
                "back": "/instances?"
                + "&".join(f"{k}={quote(v)}" for k, v in f.as_params().items()),
            },
        )
    op = c.bulk.submit(action, f, actor=actor)
    ACTIONS.labels(f"bulk-{action}").inc()
    log.info("bulk %s started", action, extra={"event": "console.bulk.start"})
    return RedirectResponse(f"/bulk/{op.id}", status_code=303)


@router.get("/bulk", dependencies=[Depends(reader)])
def bulk_list(request: Request, c: ConsoleDep) -> Response:
    return render(request, "bulk_list.html", {"operations": operations.recent_bulk(c.db)})


def _operation(c: Console, op_id: int) -> Any:
    op = operations.bulk_status(c.db, op_id)
    if op is None:
        raise HTTPException(404, f"no bulk operation {op_id}")
    return op


@router.get("/bulk/{op_id}", dependencies=[Depends(reader)])
def bulk_page(request: Request, op_id: int, c: ConsoleDep) -> Response:
    return render(request, "bulk.html", {"op": _operation(c, op_id)})


@router.get("/bulk/{op_id}/fragment", dependencies=[Depends(reader)])
def bulk_fragment(request: Request, op_id: int, c: ConsoleDep) -> Response:
    return render(request, "_bulk.html", {"op": _operation(c, op_id)})
