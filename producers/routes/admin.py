"""The HTTP admin API: inspect and control instances (mounted by the ingest service).

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
from typing import Any, Literal

from fastapi import APIRouter, Depends, HTTPException
from pydantic import BaseModel, Field
from sqlalchemy.engine import Engine

from workflow_engine.store import control
from workflow_engine.store.instances import describe_instance, job_status

Status = Literal[
    "queued", "running", "sleeping", "waiting", "paused", "complete", "errored", "terminated"
]


class EventIn(BaseModel):
    type: str = Field(min_length=1, max_length=200, pattern=r"^[A-Za-z0-9_.:-]+$")
    payload: Any = None


class ControlOut(BaseModel):
    job_id: str
    status: str
    requested: str | None = None


def _open(scope: str) -> Callable[..., Any]:
    return lambda: None


def admin_router(
    engine: Callable[[], Engine], require: Callable[[str], Callable[..., Any]] = _open
) -> APIRouter:
    """``require(scope)`` gives the dependency that checks a caller's credentials."""
    router = APIRouter(prefix="/v1/instances", tags=["instances"])
    read = [Depends(require("jobs:read"))]
    may_control = [Depends(require("instances:control"))]

    def guard(op: Callable[[], Any]) -> Any:
        try:
            return op()
        except control.InstanceNotFound as exc:
            raise HTTPException(404, {"error": "not_found", "message": str(exc)}) from None
        except control.ControlError as exc:
            raise HTTPException(409, {"error": "conflict", "message": str(exc)}) from None

    @router.get("", dependencies=read)
    def list_instances(
        workflow: str | None = None,
        status: Status | None = None,
        since: datetime | None = None,
        prefix: str | None = None,
        limit: int = 100,
    ) -> list[dict[str, Any]]:
        limit = max(1, min(limit, 1000))
        if since is not None:
            try:  # PostgreSQL takes offsets up to ±15:59 only: hand it UTC
                since = since.astimezone(UTC) if since.tzinfo else since.replace(tzinfo=UTC)
            except OverflowError:
                raise HTTPException(
                    422, {"error": "invalid_request", "message": "since is out of range"}
                ) from None
        rows = control.list_instances(engine(), workflow, status, since, prefix, limit)
        return [row.__dict__ for row in rows]

    @router.get("/{workflow}/{job_id}", dependencies=read)
    def describe(workflow: str, job_id: str) -> dict[str, Any]:
        view = describe_instance(engine(), job_id)
        if view is None or view.workflow != workflow:
            raise HTTPException(
                404,
                {
                    "error": "not_found",
                    "message": f"no instance of {workflow!r} with job id {job_id!r}",
                },
            )
        return view.to_dict()

    def make_op(name: str) -> None:
        def op(workflow: str, job_id: str) -> ControlOut:
            result = guard(lambda: getattr(control, name)(engine(), workflow, job_id))
            return ControlOut(**result.__dict__)

        router.add_api_route(
            f"/{{workflow}}/{{job_id}}/{name}",
            op,
            methods=["POST"],
            response_model=ControlOut,
            name=f"{name}_instance",
            dependencies=may_control,
            summary=f"{name.capitalize()} an instance",
        )

    for name in ("pause", "resume", "terminate", "restart"):
        make_op(name)

    @router.post("/{workflow}/{job_id}/events", status_code=202, dependencies=may_control)
    def send_event(workflow: str, job_id: str, event: EventIn) -> dict[str, Any]:
        event_id = guard(
            lambda: control.send_event(engine(), workflow, job_id, event.type, event.payload)
        )
        return {"job_id": job_id, "event_id": event_id, "type": event.type}

    return router


def jobs_router(
    engine: Callable[[], Engine],
    lag: Callable[[str], dict[str, Any]],
    require: Callable[[str], Callable[..., Any]] = _open,
) -> APIRouter:
    """``GET /v1/jobs/{job_id}``: what became of a job, or how far the queue is behind."""
    router = APIRouter(prefix="/v1/jobs", tags=["jobs"])

    @router.get("/{job_id}", dependencies=[Depends(require("jobs:read"))])
    def get_job(job_id: str) -> Any:
        found = job_status(engine(), job_id)
        if found is not None:
            return found
        try:
            lag_info: dict[str, Any] | None = lag(job_id)
        except Exception as exc:  # Kafka down: still answer the question we can
            lag_info = {"error": str(exc)}
        raise HTTPException(
            404,
            {
                "error": "not_found",
                "job_id": job_id,
                "message": "no instance or task run with this job id (yet): if it was accepted,"
                " it is still in the queue behind consumer_lag records; retry later",
                "consumer_lag": lag_info,
            },
        )

    return router
