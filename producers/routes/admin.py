"""The HTTP admin API: inspect and control instances (mounted when
``ONCEFLOW_ADMIN_API_ENABLED``).

    GET  /v1/instances?workflow=&status=&created_from=&created_to=&job_id=&prefix=
                      &has_duplicates=&payload_mismatch=&error_contains=&version=
                      &sort=created|updated&cursor=&limit=&count=true
         -> {"instances": [...], "next_cursor": "..." | null, "count": n | null}
    POST /v1/instances/bulk/{pause|resume|terminate|restart|retry}
                      {"filter": "...", "dry_run": false}
         -> 202 the operation (it runs in a background thread); dry run: 200 the count
    GET  /v1/instances/bulk              the latest bulk operations
    GET  /v1/instances/bulk/{id}         one bulk operation's progress
    GET  /v1/instances/{workflow}/{job_id}
    POST /v1/instances/{workflow}/{job_id}/{pause|resume|terminate|restart|retry}
    POST /v1/instances/{workflow}/{job_id}/fork
                      {"from_step": "..." | "from_position": n, "number": 1,
                       "new_job_id": null, "params": null}      -> 201 the fork
    POST /v1/instances/{workflow}/{job_id}/events      {"type": "...", "payload": ...}
    POST /v1/instances/{workflow}/{job_id}/webhooks/redrive   -> {"job_id", "requeued": n}

Endpoints are plain functions: FastAPI runs them in its thread pool, so the blocking
database calls never stall the event loop that answers job submissions. The bulk
routes are declared before ``/{workflow}/{job_id}``, so ``bulk`` is not a workflow name
here.
"""

from __future__ import annotations

import logging
from collections.abc import Callable
from dataclasses import asdict
from datetime import UTC, datetime
from typing import Annotated, Any, Literal, TypeVar

from fastapi import APIRouter, Depends, Request
from fastapi.responses import JSONResponse
from pydantic import BaseModel, Field, field_validator

from onceflow.vocabulary import BulkAction, InstanceStatus, OperatorAction
from producers.deps import DbDep, IngestDep, exact_body, operator, require
from producers.errors import error_responses
from producers.models import FieldError, RequestError
from workflow_engine.store import operations, views
from workflow_engine.store.operations import (
    MAX_EVENT_PAYLOAD_BYTES,
    MAX_EVENT_TYPE_CHARS,
    Actor,
    InvalidEvent,
)
from workflow_engine.store.views import describe_instance, tick_of

log = logging.getLogger(__name__)

T = TypeVar("T")

router = APIRouter(
    prefix="/v1/instances",
    tags=["instances"],
    responses=error_responses(400, 401, 403, 404, 409, 422),
)
# A refused request is recorded in the operators' audit trail (a read as "request"; a
# control request as its action, by the ``operator`` dependency that names the actor).
_READ = [Depends(require("jobs:read", audit_as=OperatorAction.REQUEST))]


def _bulk_action_of(request: Request) -> OperatorAction:
    try:
        return OperatorAction.of_bulk(BulkAction(request.path_params.get("action", "")))
    except ValueError:
        return OperatorAction.REQUEST


BulkOperator = Annotated[Actor, Depends(operator(_bulk_action_of))]
EventOperator = Annotated[Actor, Depends(operator(OperatorAction.SEND_EVENT))]
RedriveOperator = Annotated[Actor, Depends(operator(OperatorAction.REDRIVE))]
ForkOperator = Annotated[Actor, Depends(operator(OperatorAction.FORK))]


class EventIn(BaseModel):
    # Checked by the store (operations.send_event applies operations.check_event), the
    # one rule every front end applies: a refusal is a 422 naming the field.
    type: str = Field(
        description=f"Letters, digits and _ . : - (at most {MAX_EVENT_TYPE_CHARS} characters)."
    )
    payload: Any = Field(
        default=None, description=f"Any JSON, at most {MAX_EVENT_PAYLOAD_BYTES} bytes."
    )


class ControlOut(BaseModel):
    job_id: str
    status: str
    requested: str | None = None
    note: str | None = None  # what a retry runs again


class ForkIn(BaseModel):
    """Where to fork from (a step's name or a history position, one of them), the
    fork's id (``<job id>~fork<number>``, or ``new_job_id``) and, optionally, new params
    (they apply from that position on; the copied steps stay as recorded)."""

    from_step: str | None = Field(default=None, max_length=500)
    from_position: int | None = Field(default=None, ge=0, le=2**31 - 1)
    number: int = Field(default=1, ge=1, le=1_000_000)
    new_job_id: str | None = Field(default=None, max_length=100)
    params: dict[str, Any] | None = None


class ForkOut(BaseModel):
    job_id: str
    forked_from: str
    position: int
    copied: int


def _guarded(op: Callable[[], T]) -> T:
    """Run a control operation, its domain errors becoming 404 and 409."""
    try:
        return op()
    except operations.InstanceNotFound as exc:
        raise RequestError(404, "not_found", str(exc)) from None
    except InvalidEvent as exc:
        field = FieldError(field=f"body.{exc.field}", reason=exc.reason)
        raise RequestError(422, "invalid_request", str(exc), [field]) from None
    except operations.ControlError as exc:
        raise RequestError(409, "conflict", str(exc)) from None


@router.get("", dependencies=_READ)
def list_instances(
    request: Request,
    db: DbDep,
    workflow: str | None = None,
    status: InstanceStatus | None = None,
    created_from: datetime | None = None,
    created_to: datetime | None = None,
    since: datetime | None = None,  # the older name of created_from
    job_id: str | None = None,
    prefix: str | None = None,
    has_duplicates: bool | None = None,
    payload_mismatch: bool | None = None,
    error_contains: str | None = None,
    version: str | None = None,
    sort: Literal["created", "updated"] = "created",
    cursor: str | None = None,
    limit: int = 100,
    count: bool = False,
) -> dict[str, Any]:
    """A page of instances, newest first; ``next_cursor`` fetches the next one, and
    ``count=true`` adds how many match in all. ``attr.<key>=<value>`` (repeatable, one
    per key: all must match) filters on the searchable attributes."""
    f = views.InstanceFilter(
        workflow=workflow or None,
        status=status,
        created_from=_utc(created_from or since, "created_from"),
        created_to=_utc(created_to, "created_to"),
        job_id=job_id or None,
        job_id_prefix=prefix or None,
        has_duplicates=has_duplicates,
        payload_mismatch=payload_mismatch,
        error_contains=error_contains or None,
        version=version or None,
    )
    f = _filtered(lambda: _with_attributes(f, request))
    limit = max(1, min(limit, views.MAX_LIMIT))
    page = _filtered(lambda: views.list_page(db, f, sort, cursor or None, limit))
    return {
        "instances": [asdict(row) for row in page.rows],
        "next_cursor": page.next_cursor,
        "count": views.count_matching(db, f) if count else None,
    }


def _with_attributes(f: views.InstanceFilter, request: Request) -> views.InstanceFilter:
    """``f`` narrowed by the query's ``attr.<key>=<value>`` parameters (InvalidFilter
    for a bad key or value, or one key twice)."""
    prefix = views.ATTR_PREFIX
    terms = [
        (name[len(prefix) :], value)
        for name, value in request.query_params.multi_items()
        if name.startswith(prefix)
    ]
    return f.with_attribute_pairs(terms) if terms else f


def _filtered(op: Callable[[], T]) -> T:
    """Run a listing or bulk call, a bad filter or cursor becoming a 400."""
    try:
        return op()
    except views.InvalidFilter as exc:
        raise RequestError(400, "invalid_filter", str(exc)) from None


def _utc(moment: datetime | None, name: str) -> datetime | None:
    if moment is None:
        return None
    try:  # PostgreSQL takes offsets up to ±15:59 only: hand it UTC
        return moment.astimezone(UTC) if moment.tzinfo else moment.replace(tzinfo=UTC)
    except OverflowError:
        raise RequestError(
            422,
            "invalid_request",
            f"{name} is out of range",
            [FieldError(field=f"query.{name}", reason="out of range")],
        ) from None


class BulkIn(BaseModel):
    filter: str = Field(
        min_length=1,
        max_length=2000,
        description="An instance filter, e.g. workflow=order-workflow,status=errored.",
    )
    dry_run: bool = False

    @field_validator("filter")
    @classmethod
    def _no_nul(cls, text: str) -> str:
        # PostgreSQL's text holds no NUL: a 422 here, not a 500 in the listing query.
        if "\x00" in text:
            raise ValueError("the filter holds a NUL character")
        return text


def _op_body(op: operations.BulkOperation) -> dict[str, Any]:
    body = asdict(op)
    body["created_at"] = op.created_at.isoformat()
    body["finished_at"] = op.finished_at.isoformat() if op.finished_at else None
    return body


@router.post("/bulk/{action}", status_code=202)
def start_bulk(
    action: BulkAction, body: BulkIn, db: DbDep, ingest: IngestDep, actor: BulkOperator
) -> Any:
    """Apply ``action`` to every instance the filter matches, in the background (the
    process's bulk runner, which also resumes operations a dead process left running);
    poll ``GET /v1/instances/bulk/{id}``. With ``dry_run``, only count them (200). An
    empty filter is refused (400), as everywhere: by the store when the operation
    starts, which records the refusal in the audit trail (a dry run is not recorded)."""
    f = _filtered(lambda: views.InstanceFilter.parse(body.filter))
    if body.dry_run:
        n = views.count_matching(db, _filtered(lambda: operations.refuse_empty(f)))
        return JSONResponse(
            {"action": str(action), "filter": f.describe(), "dry_run": True, "count": n}
        )
    op = _filtered(lambda: ingest.bulk_runner(db).submit(action, f, actor=actor))
    return _op_body(op)


@router.get("/bulk", dependencies=_READ)
def recent_bulk(db: DbDep, limit: int = 20) -> list[dict[str, Any]]:
    return [_op_body(op) for op in operations.recent_bulk(db, max(1, min(limit, 200)))]


@router.get("/bulk/{op_id}", dependencies=_READ)
def bulk_progress(op_id: int, db: DbDep) -> dict[str, Any]:
    op = operations.bulk_status(db, op_id)
    if op is None:
        raise RequestError(404, "not_found", f"no bulk operation #{op_id}")
    return _op_body(op)


@router.get("/{workflow}/{job_id}", dependencies=_READ)
def describe(workflow: str, job_id: str, db: DbDep) -> dict[str, Any]:
    view = describe_instance(db, job_id)
    if view is None or view.workflow != workflow:
        raise RequestError(404, "not_found", f"no instance of {workflow!r} with job id {job_id!r}")
    tick = tick_of(db, job_id)  # which schedule and tick created it, if one did
    return {**view.to_dict(), "schedule_tick": asdict(tick) if tick else None}


def _add_control_route(name: str, operation: Callable[..., Any]) -> None:
    # A default, not an Annotated alias: the annotations are strings (PEP 563) that
    # FastAPI resolves in the module's globals, where a local alias is not.
    acting = Depends(operator(OperatorAction(name)))

    def op(workflow: str, job_id: str, db: DbDep, actor: Actor = acting) -> ControlOut:
        result = _guarded(lambda: operation(db, workflow, job_id, actor=actor))
        return ControlOut(**result.__dict__)

    router.add_api_route(
        f"/{{workflow}}/{{job_id}}/{name}",
        op,
        methods=["POST"],
        response_model=ControlOut,
        name=f"{name}_instance",
        summary=f"{name.capitalize()} an instance",
    )


_add_control_route("pause", operations.pause)
_add_control_route("resume", operations.resume)
_add_control_route("terminate", operations.terminate)
_add_control_route("restart", operations.restart)
_add_control_route("retry", operations.retry)


@router.post("/{workflow}/{job_id}/fork", status_code=201, response_model=ForkOut)
def fork_instance(
    workflow: str,
    job_id: str,
    body: ForkIn,
    db: DbDep,
    actor: ForkOperator,
    _exact: Annotated[None, Depends(exact_body)],  # after the key is checked
) -> ForkOut:
    """Fork an instance from a step (or position) into a new job id: the history before
    it is copied, the rest runs in the fork. The same fork twice is a 409."""
    made = _guarded(
        lambda: operations.fork(
            db,
            workflow,
            job_id,
            from_step=body.from_step,
            from_position=body.from_position,
            number=body.number,
            new_job_id=body.new_job_id,
            params=body.params,
            actor=actor,
        )
    )
    return ForkOut(**made.__dict__)


@router.post("/{workflow}/{job_id}/events", status_code=202)
def send_event(
    workflow: str,
    job_id: str,
    event: EventIn,
    db: DbDep,
    actor: EventOperator,
    _exact: Annotated[None, Depends(exact_body)],  # after the key is checked
) -> dict[str, Any]:
    event_id = _guarded(
        lambda: operations.send_event(db, workflow, job_id, event.type, event.payload, actor=actor)
    )
    return {"job_id": job_id, "event_id": event_id, "type": event.type}


@router.post("/{workflow}/{job_id}/webhooks/redrive")
def redrive_webhooks(
    workflow: str, job_id: str, db: DbDep, ingest: IngestDep, actor: RedriveOperator
) -> dict[str, Any]:
    """Re-queue the instance's dead webhook deliveries (``onceflow webhooks redrive
    --job``): due now, with a new retry window, audited."""
    view = describe_instance(db, job_id)
    if view is None or view.workflow != workflow:
        raise RequestError(404, "not_found", f"no instance of {workflow!r} with job id {job_id!r}")
    done = operations.redrive_webhooks(
        db, ingest.settings.webhook_retry_seconds, job_id=job_id, actor=actor
    )
    return {"job_id": job_id, "requeued": done.requeued}
