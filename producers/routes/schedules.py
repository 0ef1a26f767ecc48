"""The HTTP admin API of schedules (mounted with the admin API).

    GET    /v1/schedules                       every schedule
    POST   /v1/schedules                       {"name", "workflow", "cron" | "every_seconds",
                                                "timezone", "params", "catchup", "overlap",
                                                "max_catchup"} -> 201 the schedule
    GET    /v1/schedules/{name}
    POST   /v1/schedules/{name}/pause | resume
    DELETE /v1/schedules/{name}                -> 204
    POST   /v1/schedules/{name}/backfill       {"start", "end", "dry_run"}
           -> {"count", "first", "last", "created", "existing", "dry_run"}

Reading needs ``jobs:read``; changing needs ``instances:control``. Errors have the one
error body: 404 ``not_found``, 409 ``conflict`` (the name is taken), 400
``invalid_schedule`` (a bad cron, time zone or range).
"""

from __future__ import annotations

from collections.abc import Callable
from dataclasses import asdict
from datetime import UTC, datetime
from typing import Any, TypeVar

from fastapi import APIRouter, Depends, Response
from pydantic import BaseModel, Field, field_validator

from onceflow.ticks import MAX_EVERY_SECONDS, SCHEDULE_NAME_PATTERN, InvalidSchedule, TickSpec
from onceflow.vocabulary import CatchupPolicy, OperatorAction, OverlapPolicy
from producers.deps import DbDep, exact_body, require
from producers.errors import error_responses
from producers.models import RequestError, params_problem
from workflow_engine.model import ScheduleDef, ScheduleError
from workflow_engine.store import operations, views

T = TypeVar("T")

router = APIRouter(
    prefix="/v1/schedules",
    tags=["schedules"],
    responses=error_responses(400, 401, 403, 404, 409, 422),
)
# A refused request is recorded in the operators' audit trail as a "request" (method
# and path in its detail); the schedule changes themselves are not recorded yet.
_READ = [Depends(require("jobs:read", audit_as=OperatorAction.REQUEST))]
_CONTROL = [Depends(require("instances:control", audit_as=OperatorAction.REQUEST))]


class ScheduleIn(BaseModel):
    name: str = Field(pattern=SCHEDULE_NAME_PATTERN)
    workflow: str = Field(min_length=1, max_length=200)
    cron: str | None = Field(default=None, description="5 fields, e.g. '*/5 * * * *'")
    every_seconds: int | None = Field(default=None, ge=1, le=MAX_EVERY_SECONDS)
    timezone: str = "UTC"
    params: dict[str, Any] = Field(default_factory=dict)
    catchup: CatchupPolicy = CatchupPolicy.RUN_ONCE
    overlap: OverlapPolicy = OverlapPolicy.SKIP
    max_catchup: int = Field(default=100, ge=1, le=1000)

    @field_validator("workflow", "timezone", "cron")
    @classmethod
    def _no_nul(cls, value: str | None) -> str | None:
        # PostgreSQL text cannot hold NUL: a 422 here, not a driver error (a 500) later
        if value is not None and "\x00" in value:
            raise ValueError("contains a NUL character (\\u0000)")
        return value

    @field_validator("params")
    @classmethod
    def _storable(cls, value: dict[str, Any]) -> dict[str, Any]:
        problem = params_problem(value)  # the same rule as a job's params
        if problem is not None:
            raise ValueError(f"params {problem}")
        return value


class BackfillIn(BaseModel):
    start: datetime
    end: datetime
    dry_run: bool = False


def _guarded(op: Callable[[], T]) -> T:
    """Run a schedule operation, its domain errors becoming 404, 409 and 400."""
    try:
        return op()
    except operations.ScheduleNotFound as exc:
        raise RequestError(404, "not_found", str(exc)) from None
    except operations.ScheduleExists as exc:
        raise RequestError(409, "conflict", str(exc)) from None
    except (InvalidSchedule, ScheduleError) as exc:
        raise RequestError(400, "invalid_schedule", str(exc)) from None


def _body(view: views.ScheduleView) -> dict[str, Any]:
    return view.to_dict()


@router.get("", dependencies=_READ)
def list_schedules(db: DbDep) -> list[dict[str, Any]]:
    return [_body(v) for v in views.list_schedules(db)]


@router.post("", dependencies=[*_CONTROL, Depends(exact_body)], status_code=201)
def create_schedule(body: ScheduleIn, db: DbDep) -> dict[str, Any]:
    """Create a schedule; it first fires at its first tick after now."""

    def create() -> views.ScheduleView:
        spec = TickSpec(body.cron, body.every_seconds, body.timezone)
        d = ScheduleDef(
            body.name,
            body.workflow,
            spec,
            body.params,
            body.catchup,
            body.overlap,
            body.max_catchup,
        )
        return operations.create_schedule(db, d)

    return _body(_guarded(create))


@router.get("/{name}", dependencies=_READ)
def get_schedule(name: str, db: DbDep) -> dict[str, Any]:
    return _body(_guarded(lambda: views.get_schedule(db, name)))


@router.post("/{name}/pause", dependencies=_CONTROL)
def pause_schedule(name: str, db: DbDep) -> dict[str, Any]:
    return _body(_guarded(lambda: operations.pause_schedule(db, name)))


@router.post("/{name}/resume", dependencies=_CONTROL)
def resume_schedule(name: str, db: DbDep) -> dict[str, Any]:
    return _body(_guarded(lambda: operations.resume_schedule(db, name)))


@router.delete("/{name}", dependencies=_CONTROL, status_code=204)
def delete_schedule(name: str, db: DbDep) -> Response:
    _guarded(lambda: operations.delete_schedule(db, name))
    return Response(status_code=204)


@router.post("/{name}/backfill", dependencies=_CONTROL)
def backfill(name: str, body: BackfillIn, db: DbDep) -> dict[str, Any]:
    """One instance per tick of ``[start, end]``; ``dry_run`` only counts them."""
    start, end = _utc(body.start), _utc(body.end)
    result = _guarded(lambda: operations.backfill(db, name, start, end, body.dry_run))
    return asdict(result)


def _utc(moment: datetime) -> datetime:
    try:  # PostgreSQL takes offsets up to ±15:59 only: hand it UTC
        return moment.astimezone(UTC) if moment.tzinfo else moment.replace(tzinfo=UTC)
    except OverflowError:
        raise RequestError(400, "invalid_schedule", "the backfill range is out of bounds") from None
