"""Request and response bodies of the ingest API, and their validation."""

from __future__ import annotations

import re
from datetime import UTC, datetime
from typing import Any

import orjson
from pydantic import BaseModel, ConfigDict, Field, ValidationError

from onceflow.envelope import (
    DEFAULT_PRIORITY,
    MAX_START_DELAY_SECONDS,
    PRIORITY_HIGHEST,
    PRIORITY_LOWEST,
    check_attributes,
    id_reuse_policy,
    start_time,
    time_limit,
)
from onceflow.exact_numbers import Inexact, exact_loads, may_be_inexact, scan
from onceflow.ids import JOB_ID_PATTERN
from onceflow.webhooks import ENDPOINT_NAME_PATTERN, callback_problem

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
    priority: int = Field(
        default=DEFAULT_PRIORITY,
        ge=PRIORITY_HIGHEST,
        le=PRIORITY_LOWEST,
        strict=True,
        description="1 (claimed first) to 5 (last); aged by time waited (README, Flow control).",
    )
    callback: str | None = Field(
        default=None,
        pattern=ENDPOINT_NAME_PATTERN,
        description="A configured webhook endpoint's name (never a URL): it gets this job's"
        " final lifecycle events, signed (README, Webhooks).",
        examples=["billing"],
    )
    run_at: str | None = Field(
        default=None,
        max_length=64,
        description="Start no earlier than this RFC 3339 time (with its offset); a past"
        " one starts now. At most a year ahead. Not with start_after.",
        examples=["2026-11-29T18:00:00Z"],
    )
    start_after: float | None = Field(
        default=None,
        ge=0,
        le=MAX_START_DELAY_SECONDS,
        strict=True,
        description="Start no earlier than this many seconds after submission (at most a"
        " year). Not with run_at.",
        examples=[90],
    )
    attributes: dict[str, Any] | None = Field(
        default=None,
        description="Searchable attributes of the instance: at most 16 keys matching"
        " [a-z][a-z0-9_.-]{0,63}, each a string (at most 256 characters), a number within"
        " ±(2**53 - 1) or a boolean, at most 2048 bytes as JSON (numbers in plain decimal);"
        " refused (422), never trimmed, beyond that."
        " Filter lists and bulk operations with attr.<key>=<value> (README).",
        examples=[{"tenant": "acme", "tier": "gold"}],
    )
    start_within: float | None = Field(
        default=None,
        strict=True,
        description="Error the instance as start_timeout if it has not started this many"
        " seconds after its start time (more than 0, at most a year); overrides the"
        " workflow's own start_within (README, Time limits).",
        examples=[300],
    )
    id_reuse: str | None = Field(
        default=None,
        max_length=32,
        description="This submission's id reuse policy: never, after_failure or"
        " after_completion; at most as loose as the workflow's own (README, Flow control)."
        " Whether a resubmission of a finished job id starts a new run of it.",
        examples=["never"],
    )


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
    """The one shape of every error answer, on every route (see producers/errors.py)."""

    error: str = Field(description="A machine-readable code, e.g. invalid_request, not_found.")
    message: str = Field(description="What went wrong and what to do, for a person.")
    fields: list[FieldError] = Field(default_factory=list)
    accepted: list[JobAccepted] = Field(default_factory=list)
    rejected: list[JobRejected] = Field(default_factory=list)
    details: dict[str, Any] = Field(
        default_factory=dict,
        description="Route-specific facts, e.g. the consumer lag on a job-status 404.",
    )


class RequestError(Exception):
    """A 4xx answer: status, machine-readable code, message and the fields at fault."""

    def __init__(
        self,
        status: int,
        error: str,
        message: str,
        fields: list[FieldError] | None = None,
        headers: dict[str, str] | None = None,
        details: dict[str, Any] | None = None,
    ) -> None:
        super().__init__(message)
        self.status = status
        self.body = ErrorBody(
            error=error, message=message, fields=fields or [], details=details or {}
        )
        self.headers = headers


def field_path(loc: tuple[Any, ...], prefix: str) -> str:
    path = prefix
    for part in loc:
        path += f"[{part}]" if isinstance(part, int) else (f".{part}" if path else str(part))
    return path or "body"


def parse_jobs(
    body: bytes,
    max_batch: int,
    max_params_bytes: int,
    known_types: frozenset[str] | None = None,
    known_callbacks: frozenset[str] | None = None,
) -> list[JobIn]:
    """Parse a body holding one job or ``{"jobs": [...]}``; raise RequestError if bad.

    ``known_types`` / ``known_callbacks``: the workflow and task names, and the webhook
    endpoint names, a job may name (None: not checked here; the worker dead-letters)."""
    return parse_submission(body, max_batch, max_params_bytes, known_types, known_callbacks)[0]


def parse_submission(
    body: bytes,
    max_batch: int,
    max_params_bytes: int,
    known_types: frozenset[str] | None = None,
    known_callbacks: frozenset[str] | None = None,
    batched: frozenset[str] = frozenset(),
) -> tuple[list[JobIn], bool]:
    """:func:`parse_jobs`, and whether the body was a batch (``{"jobs": [...]}``, even
    of one job): a start-and-wait answer has the batch's shape then. ``batched``: the
    workflows whose jobs run in batches (a member takes no ``start_within``)."""
    doc, check_params = _json_object(body)
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
        errors = exc.errors(include_url=False)
        fields = [
            FieldError(field=field_path(tuple(e["loc"]), ""), reason=e["msg"]) for e in errors
        ]
        # attributes that are not an object get the code every other bad attributes get
        code = (
            "invalid_attributes" if errors[0]["loc"][-1:] == ("attributes",) else "invalid_request"
        )
        raise RequestError(
            422, code, f"invalid {fields[0].field}: {fields[0].reason}", fields
        ) from None
    for i, job in enumerate(jobs):
        _check_job(job, i if is_batch else None, max_params_bytes, known_types, check_params)
        if job.callback is not None and known_callbacks is not None:
            _check_callback(job.callback, i if is_batch else None, known_callbacks)
        if job.start_within is not None and job.workflow in batched:
            field = _field(i if is_batch else None, "start_within")
            reason = f"{job.workflow!r} runs its jobs in batches: a member never starts on its own"
            raise RequestError(
                422,
                "invalid_start_within",
                f"{field}: {reason}",
                [FieldError(field=field, reason=reason)],
            )
    return jobs, is_batch


def _check_callback(callback: str, index: int | None, known: frozenset[str]) -> None:
    problem = callback_problem(callback, known)
    if problem is not None:
        field = _field(index, "callback")
        raise RequestError(
            422, problem[0], f"{field}: {problem[1]}", [FieldError(field=field, reason=problem[0])]
        )


def exact_json_object(body: bytes) -> dict[str, Any]:
    """``body``'s JSON object under the rule job submissions follow: valid JSON (no NaN,
    no lone surrogate), each key once, every number stored as written; RequestError
    (400 ``malformed_json``, 422 naming the field) otherwise. For the routes whose body
    FastAPI parses with Python's json, which takes all of those and changes them."""
    return _json_object(body)[0]


def _json_object(body: bytes) -> tuple[dict[str, Any], bool]:
    """The body's object, and whether its params need :func:`params_problem`'s walk
    (the body holds a NUL escape or is nested deeper than params may be)."""
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
    keys, floats, suspect, depth = scan(doc)
    if suspect or keys != _key_tokens(body) or (floats and may_be_inexact(body)):
        _exact_check(body)
    return doc, depth > MAX_PARAMS_DEPTH or b"\\u0000" in body


# orjson keeps the last of duplicate keys, and turns an integer beyond 64 bits into a
# float (123456789012345678901234567890 -> 1.2345678901234568e+29); a negative zero, a
# number below the float's range (1e-400 -> 0.0) or with more digits than a float keeps
# would be stored as another number (onceflow.exact_numbers): all would change a payload
# silently. The hot path proves none happened with two byte counts over the body, one
# walk of the parsed tree and, when the walk met a float, one pass over the bytes; only
# a body that fails that proof is parsed again, exactly, to name the field at fault. For
# a 100-job batch (15 kB) the walk and counts cost ~130 us and skip params_problem's
# per-job walk (~450 us) that only a NUL escape or deep nesting needs: parse_jobs went
# from ~950 to ~650 us.
_SPACED_KEY_TOKEN = re.compile(rb'"[ \t\n\r]*:')


def _key_tokens(body: bytes) -> int:
    """An upper bound on the keys written in ``body``: every key ends in a quote,
    optional JSON whitespace and a colon (a string value can only add to the count).
    Equal to the keys orjson kept, so no key was dropped as a duplicate."""
    quoted = body.count(b'":')
    if quoted == body.count(b":"):  # every colon follows a quote: no spaced key
        return quoted
    if b" :" in body or b"\n:" in body or b"\t:" in body or b"\r:" in body:
        return len(_SPACED_KEY_TOKEN.findall(body))
    return quoted


class _Pairs(dict[str, Any]):
    """An object from the exact parse, remembering which keys it saw twice."""

    duplicates: list[str]


def _pairs(pairs: list[tuple[str, Any]]) -> _Pairs:
    obj = _Pairs(pairs)
    seen: set[str] = set()
    obj.duplicates = [k for k, _ in pairs if k in seen or seen.add(k)]  # type: ignore[func-returns-value]
    return obj


def _exact_check(body: bytes) -> None:
    """Parse again keeping every key and exact numbers; RequestError 422 naming the
    first duplicate key or number that would not be stored as written (none: the fast
    check was cautious)."""
    try:
        doc = exact_loads(body, object_pairs_hook=_pairs)
    except RecursionError:
        raise RequestError(422, "invalid_request", "the body is nested too deeply") from None
    stack: list[tuple[Any, str]] = [(doc, "")]
    while stack:
        item, path = stack.pop()
        if isinstance(item, _Pairs):
            if item.duplicates:
                field = _join(path, item.duplicates[0])
                raise RequestError(
                    422,
                    "duplicate_key",
                    f"{field} is given more than once; send each key once",
                    [FieldError(field=field, reason="duplicate key")],
                )
            stack.extend((v, _join(path, k)) for k, v in reversed(item.items()))
        elif isinstance(item, list):
            stack.extend((v, f"{path}[{i}]") for i, v in reversed(list(enumerate(item))))
        elif isinstance(item, Inexact):
            field = path or "body"
            raise RequestError(
                422,
                item.code,
                f"{field}: {item.reason}",
                [FieldError(field=field, reason=item.reason)],
            )


def _join(path: str, key: str) -> str:
    return f"{path}.{key}" if path else key


def _field(index: int | None, name: str) -> str:
    """A job's field as an answer names it: ``name`` alone, or ``jobs[index].name``."""
    return name if index is None else f"jobs[{index}].{name}"


def _check_job(
    job: JobIn,
    index: int | None,
    max_params_bytes: int,
    known_types: frozenset[str] | None,
    check_params: bool = True,
) -> None:
    """What the models cannot check: a known type, storable params of bounded size, a
    start time that is a time and within a year. ``index``: the job's place in a batch
    (None: the body is the job)."""
    if job.run_at is not None or job.start_after is not None:
        _check_start(job, index)
    if job.attributes is not None:
        _check_attributes(job.attributes, index)
    if job.start_within is not None:
        _check_start_within(job, index)
    if job.id_reuse is not None:
        _check_id_reuse(job, index)
    if known_types is not None and job.workflow not in known_types:
        field = _field(index, "workflow")
        raise RequestError(
            422,
            "unknown_type",
            f"{field}: no workflow or task is named {job.workflow!r}",
            [FieldError(field=field, reason="unknown workflow or task type")],
        )
    problem = params_problem(job.params) if check_params else None
    if problem is not None:
        field = _field(index, "params")
        raise RequestError(
            422, "invalid_params", f"{field} {problem}", [FieldError(field=field, reason=problem)]
        )
    size = len(orjson.dumps(job.params))
    if size > max_params_bytes:
        field = _field(index, "params")
        raise RequestError(
            422,
            "params_too_large",
            f"{field} is {size} bytes, limit {max_params_bytes}",
            [FieldError(field=field, reason=f"{size} bytes, limit {max_params_bytes}")],
        )


def job_start(job: JobIn, submitted_at: datetime) -> datetime | None:
    """When ``job`` may start (None: at once): the envelope's rule
    (:func:`onceflow.envelope.start_time`), which :func:`_check_job` applied already."""
    if job.run_at is None and job.start_after is None:
        return None
    return start_time(job.run_at, job.start_after, submitted_at)


def _check_start(job: JobIn, index: int | None) -> None:
    try:
        job_start(job, datetime.now(UTC))
    except ValueError as exc:
        field = _field(index, "run_at" if job.run_at is not None else "start_after")
        raise _refusal(field, "invalid_request", f"invalid {field}: {exc}", exc) from None


def _check_attributes(attributes: dict[str, Any], index: int | None) -> None:
    """The envelope's rule (:func:`onceflow.envelope.check_attributes`) as a 422."""
    try:
        check_attributes(attributes)
    except ValueError as exc:
        field = _field(index, "attributes")
        raise _refusal(field, "invalid_attributes", f"invalid {field}: {exc}", exc) from None


def _check_start_within(job: JobIn, index: int | None) -> None:
    """The envelope's rule (:func:`onceflow.envelope.time_limit`), as a 422."""
    try:
        time_limit("start_within", job.start_within)
    except ValueError as exc:
        field = _field(index, "start_within")
        raise _refusal(field, "invalid_request", f"{field}: {exc}", exc) from None


def _check_id_reuse(job: JobIn, index: int | None) -> None:
    """The envelope's rule (:func:`onceflow.envelope.id_reuse_policy`), as a 422."""
    try:
        id_reuse_policy(job.id_reuse)
    except ValueError as exc:
        field = _field(index, "id_reuse")
        raise _refusal(field, "invalid_id_reuse", f"{field}: {exc}", exc) from None


def _refusal(field: str, code: str, message: str, exc: ValueError) -> RequestError:
    """The 422 of one field an envelope rule refused (its reason is the rule's words)."""
    return RequestError(422, code, message, [FieldError(field=field, reason=str(exc))])


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
