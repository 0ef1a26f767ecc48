"""Request and response bodies of the ingest API, and their validation."""

from __future__ import annotations

from typing import Any

import orjson
from pydantic import BaseModel, ConfigDict, Field, ValidationError

from onceflow.core.ids import JOB_ID_PATTERN

WORKFLOW_NAME_PATTERN = r"^[A-Za-z0-9][A-Za-z0-9_.-]{0,99}$"


class JobIn(BaseModel):
    """One job. ``job_id`` is optional: when absent the service generates ``job_<ULID>``."""

    model_config = ConfigDict(extra="forbid")

    job_id: str | None = Field(
        default=None,
        pattern=JOB_ID_PATTERN,
        description="Client-chosen id; resubmitting the same id never starts a second workflow.",
        examples=["order_1001"],
    )
    workflow: str = Field(pattern=WORKFLOW_NAME_PATTERN, examples=["order-workflow"])
    params: dict[str, Any] = Field(default_factory=dict, examples=[{"amount": 42}])


class BatchIn(BaseModel):
    model_config = ConfigDict(extra="forbid")

    jobs: list[JobIn] = Field(min_length=1)


class JobAccepted(BaseModel):
    job_id: str
    partition: int
    offset: int


class JobRejected(BaseModel):
    job_id: str
    reason: str


class Accepted(BaseModel):
    request_id: str
    accepted: list[JobAccepted]
    duplicates_in_request: int = Field(
        description="Jobs in this request whose id appeared earlier in the same request "
        "(collapsed: written to Kafka once)."
    )


class FieldError(BaseModel):
    field: str
    reason: str


class ErrorBody(BaseModel):
    error: str
    message: str
    fields: list[FieldError] = Field(default_factory=list)
    accepted: list[JobAccepted] = Field(default_factory=list)
    rejected: list[JobRejected] = Field(default_factory=list)


class RequestError(Exception):
    """A 4xx answer: status, machine-readable code, message and the fields at fault."""

    def __init__(
        self,
        status: int,
        error: str,
        message: str,
        fields: list[FieldError] | None = None,
        headers: dict[str, str] | None = None,
    ) -> None:
        super().__init__(message)
        self.status = status
        self.body = ErrorBody(error=error, message=message, fields=fields or [])
        self.headers = headers


def _field_path(loc: tuple[Any, ...], prefix: str) -> str:
    path = prefix
    for part in loc:
        path += f"[{part}]" if isinstance(part, int) else (f".{part}" if path else str(part))
    return path or "body"


def parse_jobs(
    body: bytes,
    max_batch: int,
    max_params_bytes: int,
    known_types: frozenset[str] | None = None,
) -> list[JobIn]:
    """Parse a body holding one job or ``{"jobs": [...]}``; raise RequestError if bad."""
    doc = _json_object(body)
    is_batch = "jobs" in doc
    if is_batch and isinstance(doc["jobs"], list) and len(doc["jobs"]) > max_batch:
        raise RequestError(
            422,
            "batch_too_large",
            f"at most {max_batch} jobs per request",
            [FieldError(field="jobs", reason=f"{len(doc['jobs'])} jobs, limit {max_batch}")],
        )
    try:
        jobs = BatchIn.model_validate(doc).jobs if is_batch else [JobIn.model_validate(doc)]
    except ValidationError as exc:
        fields = [
            FieldError(field=_field_path(tuple(e["loc"]), ""), reason=e["msg"])
            for e in exc.errors(include_url=False)
        ]
        raise RequestError(
            422, "invalid_request", f"invalid {fields[0].field}: {fields[0].reason}", fields
        ) from None
    for i, job in enumerate(jobs):
        _check_job(job, f"jobs[{i}]." if is_batch else "", max_params_bytes, known_types)
    return jobs


def _json_object(body: bytes) -> dict[str, Any]:
    try:
        doc = orjson.loads(body)
    except orjson.JSONDecodeError as exc:
        raise RequestError(400, "malformed_json", f"body is not valid JSON: {exc}") from None
    if not isinstance(doc, dict):
        raise RequestError(
            422,
            "invalid_request",
            "body must be a JSON object",
            [FieldError(field="body", reason="expected an object")],
        )
    return doc


def _check_job(
    job: JobIn, prefix: str, max_params_bytes: int, known_types: frozenset[str] | None
) -> None:
    """What the models cannot check: a known type, storable params of bounded size."""
    if known_types is not None and job.workflow not in known_types:
        field = f"{prefix}workflow"
        raise RequestError(
            422,
            "unknown_type",
            f"{field}: no workflow or task is named {job.workflow!r}",
            [FieldError(field=field, reason="unknown workflow or task type")],
        )
    field = f"{prefix}params"
    problem = params_problem(job.params)
    if problem is not None:
        raise RequestError(
            422, "invalid_params", f"{field} {problem}", [FieldError(field=field, reason=problem)]
        )
    size = len(orjson.dumps(job.params))
    if size > max_params_bytes:
        raise RequestError(
            422,
            "params_too_large",
            f"{field} is {size} bytes, limit {max_params_bytes}",
            [FieldError(field=field, reason=f"{size} bytes, limit {max_params_bytes}")],
        )


MAX_PARAMS_DEPTH = 32


def params_problem(value: Any) -> str | None:
    """Why ``params`` cannot be stored, or None: too deeply nested, or a NUL character
    (PostgreSQL's jsonb cannot hold one). Iterative, so no input can exhaust the stack."""
    stack: list[tuple[Any, int]] = [(value, 0)]
    while stack:
        item, depth = stack.pop()
        if isinstance(item, str):
            if "\x00" in item:
                return "contains a NUL character (\\u0000), which cannot be stored"
        elif isinstance(item, dict | list):
            if depth >= MAX_PARAMS_DEPTH:
                return f"nested deeper than {MAX_PARAMS_DEPTH} levels"
            children = [*item.keys(), *item.values()] if isinstance(item, dict) else item
            stack.extend((child, depth + 1) for child in children)
    return None
