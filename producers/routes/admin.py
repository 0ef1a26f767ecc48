"""The HTTP admin API: inspect and control instances (mounted when
``ONCEFLOW_ADMIN_API_ENABLED``).

    GET  /v1/instances?workflow=&status=&since=&prefix=&limit=
    GET  /v1/instances/{workflow}/{job_id}
    POST /v1/instances/{workflow}/{job_id}/{pause|resume|terminate|restart}
    POST /v1/instances/{workflow}/{job_id}/events      {"type": "...", "payload": ...}

Endpoints are plain functions: FastAPI runs them in its thread pool, so the blocking
database calls never stall the event loop that answers job submissions.
"""

from __future__ import annotations

from collections.abc import Callable
from datetime import UTC, datetime
from typing import Any, TypeVar

from fastapi import APIRouter, Depends
from pydantic import BaseModel, Field
from sqlalchemy.engine import Engine

from onceflow.vocabulary import InstanceStatus
from producers.deps import DbDep, require
from producers.errors import error_responses
from producers.models import FieldError, RequestError
from workflow_engine.store import control
from workflow_engine.store.instances import describe_instance

T = TypeVar("T")

router = APIRouter(
    prefix="/v1/instances",
    tags=["instances"],
    responses=error_responses(400, 401, 403, 404, 409, 422),
)
_READ = [Depends(require("jobs:read"))]
_CONTROL = [Depends(require("instances:control"))]


class EventIn(BaseModel):
    type: str = Field(min_length=1, max_length=200, pattern=r"^[A-Za-z0-9_.:-]+$")
    payload: Any = None


class ControlOut(BaseModel):
    job_id: str
    status: str
    requested: str | None = None


def _guarded(op: Callable[[], T]) -> T:
    """Run a control operation, its domain errors becoming 404 and 409."""
    try:
        return op()
    except control.InstanceNotFound as exc:
        raise RequestError(404, "not_found", str(exc)) from None
    except control.ControlError as exc:
        raise RequestError(409, "conflict", str(exc)) from None


@router.get("", dependencies=_READ)
def list_instances(
    engine: DbDep,
    workflow: str | None = None,
    status: InstanceStatus | None = None,
    since: datetime | None = None,
    prefix: str | None = None,
    limit: int = 100,
) -> list[dict[str, Any]]:
    limit = max(1, min(limit, 1000))
    if since is not None:
        since = _utc(since)
    rows = control.list_instances(engine, workflow, status, since, prefix, limit)
    return [row.__dict__ for row in rows]


def _utc(moment: datetime) -> datetime:
    try:  # PostgreSQL takes offsets up to ±15:59 only: hand it UTC
        return moment.astimezone(UTC) if moment.tzinfo else moment.replace(tzinfo=UTC)
    except OverflowError:
        raise RequestError(
            422,
            "invalid_request",
            "since is out of range",
            [FieldError(field="query.since", reason="out of range")],
        ) from None


@router.get("/{workflow}/{job_id}", dependencies=_READ)
def describe(workflow: str, job_id: str, engine: DbDep) -> dict[str, Any]:
    view = describe_instance(engine, job_id)
    if view is None or view.workflow != workflow:
        raise RequestError(404, "not_found", f"no instance of {workflow!r} with job id {job_id!r}")
    return view.to_dict()


def _add_control_route(name: str, operation: Callable[[Engine, str, str], Any]) -> None:
    def op(workflow: str, job_id: str, engine: DbDep) -> ControlOut:
        result = _guarded(lambda: operation(engine, workflow, job_id))
        return ControlOut(**result.__dict__)

    router.add_api_route(
        f"/{{workflow}}/{{job_id}}/{name}",
        op,
        methods=["POST"],
        response_model=ControlOut,
        name=f"{name}_instance",
        dependencies=_CONTROL,
        summary=f"{name.capitalize()} an instance",
    )


_add_control_route("pause", control.pause)
_add_control_route("resume", control.resume)
_add_control_route("terminate", control.terminate)
_add_control_route("restart", control.restart)


@router.post("/{workflow}/{job_id}/events", status_code=202, dependencies=_CONTROL)
def send_event(workflow: str, job_id: str, event: EventIn, engine: DbDep) -> dict[str, Any]:
    event_id = _guarded(
        lambda: control.send_event(engine, workflow, job_id, event.type, event.payload)
    )
    return {"job_id": job_id, "event_id": event_id, "type": event.type}
