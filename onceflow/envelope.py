"""The job envelope: the small Kafka record one accepted job becomes.

Key: the job id (UTF-8). Value: compact JSON (below). Headers repeat the ids so that
a consumer, a DLQ reader or ``kcat`` can see them without parsing the value.

    {"v": 1, "job_id": "job_01J…", "workflow": "order-workflow", "params": {…},
     "request_id": "req_01J…", "submitted_at": "2026-11-29T16:00:00.123+00:00",
     "traceparent": "00-…-…-01", "priority": 2, "callback": "billing",
     "run_at": "2026-11-29T18:00:00+00:00", "attributes": {"tenant": "acme", "tier": 2}}

Only ``job_id``, ``workflow`` and ``params`` are required: a producer writing the topic
directly (kcat, a Java or Go client) may leave out ``v`` (1), ``submitted_at`` (the
Kafka record's timestamp), ``priority`` (3; 1 is the highest, 5 the lowest) and
``callback`` (none: the name of a configured webhook endpoint that gets the job's final
lifecycle events, never a URL), and may send the record without a key. A delayed start
is ``run_at`` (an RFC 3339 time with its offset) or ``start_after`` (seconds after
``submitted_at``), at most a year ahead; ingest always writes ``run_at``. ``attributes``
are the instance's searchable attributes (:func:`check_attributes` has their bounds),
refused whole, never trimmed, when they do not fit. A start limit
is ``start_within`` (seconds, more than 0 and at most a year): an instance not started
by its start time + that long is errored as ``start_timeout``. ``id_reuse`` (``never``,
``after_failure``, ``after_completion``: :func:`id_reuse_policy`) is the job's own id
reuse policy, at most as loose as its workflow's (the worker's check). The README's "The
record format" section is the documentation of this module, including the rule for
evolving ``v``.

Provenance: ingest stamps every record with the ``onceflow-request-id`` header. A
record without it was produced directly to Kafka: its envelope has ``request_id``
None and ``origin`` :attr:`Origin.KAFKA`.
"""

from __future__ import annotations

import hashlib
import math
import re
from collections.abc import Sequence
from dataclasses import dataclass, field
from datetime import UTC, datetime, timedelta
from decimal import Decimal
from typing import Any

import orjson

from onceflow.errors import InvalidEnvelope
from onceflow.exact_numbers import exact_loads, first_inexact, floats_in, may_be_inexact
from onceflow.ids import is_valid_job_id
from onceflow.vocabulary import DeadLetterReason, IdReuse, Origin
from onceflow.webhooks import callback_problem

#: The newest record format this code reads and the one it writes. Records without
#: ``v`` are version 1; a higher version is dead-lettered (``unsupported_version``).
ENVELOPE_VERSION = 1

#: Job priorities: 1 is claimed first, 5 last (aged by time waited: README "Flow control").
PRIORITY_HIGHEST = 1
PRIORITY_LOWEST = 5
DEFAULT_PRIORITY = 3

#: The furthest ahead a job may be scheduled to start (``run_at``, ``start_after``).
MAX_START_DELAY_SECONDS = 365 * 24 * 3600
#: The longest time limit (``start_within``, ``execution_timeout``): a year.
MAX_TIME_LIMIT_SECONDS = 365 * 24 * 3600

#: Searchable attributes (issue 26, item 7): at most this many keys, each matching
#: ATTRIBUTE_KEY_PATTERN, each value a string of at most MAX_ATTRIBUTE_VALUE_CHARS
#: characters, a number (integer or float) within +-MAX_ATTRIBUTE_INT or a boolean, and
#: the object at most MAX_ATTRIBUTES_BYTES as compact UTF-8 JSON (numbers counted in the
#: plain decimal jsonb stores them in).
MAX_ATTRIBUTES = 16
ATTRIBUTE_KEY_PATTERN = r"[a-z][a-z0-9_.-]{0,63}"
MAX_ATTRIBUTE_VALUE_CHARS = 256
MAX_ATTRIBUTE_INT = 2**53 - 1  # exact in every JSON reader (JavaScript's safe integers)
MAX_ATTRIBUTES_BYTES = 2048
_ATTRIBUTE_KEY = re.compile(ATTRIBUTE_KEY_PATTERN)
AttributeValue = str | int | float | bool
Attributes = dict[str, AttributeValue]

# Kafka record headers as confluent-kafka takes them.
KafkaHeaders = list[tuple[str, str | bytes | None]]

HEADER_JOB_ID = "onceflow-job-id"
HEADER_REQUEST_ID = "onceflow-request-id"
HEADER_SUBMITTED_AT = "onceflow-submitted-at"
HEADER_WORKFLOW = "onceflow-workflow"
HEADER_TRACEPARENT = "traceparent"
# On dead letters (the DLQ topic): the reason code, the human text, where it came from.
HEADER_DLQ_REASON = "onceflow-dlq-reason"
HEADER_DLQ_DETAIL = "onceflow-dlq-detail"
HEADER_DLQ_SOURCE = "onceflow-dlq-source"
# ... and the original value's size and sha256, and whether only a prefix was kept.
HEADER_DLQ_ORIGINAL_SIZE = "onceflow-dlq-original-size"
HEADER_DLQ_SHA256 = "onceflow-dlq-sha256"
HEADER_DLQ_TRUNCATED = "onceflow-dlq-truncated"


def params_digest(params: Any) -> str:
    """A stable digest of a job's params (key order does not matter).

    Two submissions of one job id are "the same job" only if their digests match;
    otherwise the later one is recorded as a payload mismatch.
    """
    return hashlib.sha256(orjson.dumps(params, option=orjson.OPT_SORT_KEYS)).hexdigest()[:32]


def _now() -> datetime:
    return datetime.now(UTC)


_last_iso: tuple[datetime | None, str] = (None, "")  # one pair, swapped whole


def _iso(at: datetime) -> str:
    """``at`` as the record writes it. ``isoformat`` was a quarter of encoding one
    record and ran twice per record (value and header); ingest stamps every record of
    a request with one ``datetime``, so the last one's text is kept (BENCHMARKS.md,
    "Third round")."""
    global _last_iso
    last = _last_iso
    if last[0] is at:
        return last[1]
    text = at.isoformat(timespec="microseconds")
    _last_iso = (at, text)
    return text


@dataclass(slots=True)
class JobEnvelope:
    """One job as its Kafka record carries it. Treat it as a value: nothing changes one
    after it is built (``dataclasses.replace`` makes a changed copy). Not ``frozen``:
    ingest builds one per job and a frozen dataclass's ``__init__`` (an
    ``object.__setattr__`` per field) cost 2.7 us of a batch's per-job work against
    0.5 us (BENCHMARKS.md, "Batches: where the time goes")."""

    job_id: str
    workflow: str
    params: dict[str, Any]
    request_id: str | None = None  # None: not through ingest (produced directly to Kafka)
    submitted_at: datetime = field(default_factory=_now)
    traceparent: str = ""
    priority: int = DEFAULT_PRIORITY
    #: A webhook endpoint's name (ONCEFLOW_WEBHOOK_ENDPOINTS); None: no callback.
    callback: str | None = None
    #: Not claimable before this time (a delayed start); None: at once.
    run_at: datetime | None = None
    #: The instance's searchable attributes (:func:`check_attributes`); {} for none.
    attributes: Attributes = field(default_factory=dict)
    #: Errored as ``start_timeout`` if not started this many seconds after its start
    #: time; None: the workflow's own ``start_within``, if any.
    start_within: float | None = None
    #: The job's id reuse policy (only as strict as its workflow's, or stricter); None:
    #: the workflow's (``@workflow(id_reuse=)``).
    id_reuse: IdReuse | None = None

    @property
    def origin(self) -> Origin:
        """``http`` for a record ingest wrote (it has a request id), else ``kafka``."""
        return Origin.HTTP if self.request_id else Origin.KAFKA

    def key(self) -> bytes:
        return self.job_id.encode()

    def encode(self) -> bytes:
        doc: dict[str, Any] = {
            "v": ENVELOPE_VERSION,
            "job_id": self.job_id,
            "workflow": self.workflow,
            "params": self.params,
        }
        if self.request_id:
            doc["request_id"] = self.request_id
        doc["submitted_at"] = _iso(self.submitted_at)
        if self.traceparent:
            doc["traceparent"] = self.traceparent
        if self.priority != DEFAULT_PRIORITY:
            doc["priority"] = self.priority
        if self.callback is not None:
            doc["callback"] = self.callback
        if self.run_at is not None:
            doc["run_at"] = self.run_at.isoformat(timespec="microseconds")
        if self.attributes:
            doc["attributes"] = self.attributes
        if self.start_within is not None:
            doc["start_within"] = self.start_within
        if self.id_reuse is not None:
            doc["id_reuse"] = str(self.id_reuse)
        return orjson.dumps(doc)

    def headers(self) -> KafkaHeaders:
        headers: KafkaHeaders = [
            (HEADER_JOB_ID, self.job_id.encode()),
            (HEADER_WORKFLOW, self.workflow.encode()),
        ]
        if self.request_id:
            headers.append((HEADER_REQUEST_ID, self.request_id.encode()))
        headers.append((HEADER_SUBMITTED_AT, _iso(self.submitted_at).encode()))
        if self.traceparent:
            headers.append((HEADER_TRACEPARENT, self.traceparent.encode()))
        return headers

    @classmethod
    def decode(
        cls,
        key: bytes | None,
        value: bytes | None,
        headers: Sequence[tuple[str, Any]] | None = None,
        timestamp: float | None = None,
    ) -> JobEnvelope:
        """Parse and validate a record; raise :class:`InvalidEnvelope` saying why not.

        ``headers`` are the record's headers: the request id (and so the origin) is
        read from ``onceflow-request-id``; when they are not given at all, from the
        body. ``timestamp`` (seconds) is the Kafka record's timestamp, the default of
        ``submitted_at``.
        """
        doc = _json_object(value)
        _check_version(doc.get("v", ENVELOPE_VERSION))
        job_id = doc.get("job_id")
        if not isinstance(job_id, str) or not is_valid_job_id(job_id):
            raise InvalidEnvelope(DeadLetterReason.INVALID_JOB_ID, f"invalid job_id {job_id!r}")
        if key is not None and key != job_id.encode():
            raise InvalidEnvelope(
                DeadLetterReason.KEY_MISMATCH,
                f"record key {key[:200]!r} does not match job_id {job_id!r}",
            )
        workflow = doc.get("workflow")
        if not isinstance(workflow, str) or not workflow:
            raise InvalidEnvelope(DeadLetterReason.MISSING_WORKFLOW, "missing workflow")
        params = doc.get("params")
        if not isinstance(params, dict):
            raise InvalidEnvelope(DeadLetterReason.INVALID_PARAMS, "params must be a JSON object")
        _check_numbers(value, params)
        attributes = _attributes(value, doc.get("attributes"))
        submitted_at = _submitted_at(doc.get("submitted_at"), timestamp)
        try:
            run_at = start_time(doc.get("run_at"), doc.get("start_after"), submitted_at)
        except ValueError as exc:
            raise InvalidEnvelope(DeadLetterReason.INVALID_RUN_AT, str(exc)) from None
        try:
            start_within = time_limit("start_within", doc.get("start_within"))
        except ValueError as exc:
            raise InvalidEnvelope(DeadLetterReason.INVALID_START_WITHIN, str(exc)) from None
        return cls(
            job_id=job_id,
            workflow=workflow,
            params=params,
            request_id=_request_id(doc, headers),
            submitted_at=submitted_at,
            traceparent=str(doc.get("traceparent") or ""),
            priority=_priority(doc.get("priority", DEFAULT_PRIORITY)),
            callback=_callback(doc.get("callback")),
            run_at=run_at,
            attributes=attributes,
            start_within=start_within,
            id_reuse=_id_reuse(doc.get("id_reuse")),
        )


def _json_object(value: bytes | None) -> dict[str, Any]:
    if value is None:
        raise InvalidEnvelope(DeadLetterReason.NO_VALUE, "record has no value")
    try:
        doc = orjson.loads(value)
    except orjson.JSONDecodeError as exc:
        raise InvalidEnvelope(DeadLetterReason.NOT_JSON, f"value is not JSON: {exc}") from None
    if not isinstance(doc, dict):
        raise InvalidEnvelope(DeadLetterReason.NOT_AN_OBJECT, "value is not a JSON object")
    return doc


def _attributes(value: bytes | None, raw: Any) -> Attributes:
    """The record's attributes under :func:`check_attributes`, or InvalidEnvelope
    (``invalid_attributes``); a number the parse changed (1e-400 read as 0.0) too."""
    if raw is None:
        return {}
    try:
        attributes = check_attributes(raw)
    except ValueError as exc:
        raise InvalidEnvelope(DeadLetterReason.INVALID_ATTRIBUTES, str(exc)) from None
    floats, suspect = floats_in(attributes)
    if value is not None and (suspect or (floats and may_be_inexact(value))):
        found = first_inexact(exact_loads(value).get("attributes"), "attributes")
        if found is not None:
            path, inexact = found
            raise InvalidEnvelope(DeadLetterReason.INVALID_ATTRIBUTES, f"{path}: {inexact.reason}")
    return attributes


def check_attributes(value: Any) -> Attributes:
    """``value`` as searchable attributes, or ValueError saying what does not fit: not
    an object, more than :data:`MAX_ATTRIBUTES` keys, a key not matching
    :data:`ATTRIBUTE_KEY_PATTERN`, a value that is not a string (at most
    :data:`MAX_ATTRIBUTE_VALUE_CHARS` characters, no NUL), a number (an integer or a
    finite float, not a negative zero) within ±:data:`MAX_ATTRIBUTE_INT` or a boolean
    (null, lists and objects are refused), or more than :data:`MAX_ATTRIBUTES_BYTES`
    bytes as compact JSON with each number as jsonb stores it (plain decimal: a float
    past 2**53 would be read back as an integer past the bound, ``1e-300`` costs 302
    bytes), so what passes fits the column's check and passes again when merged.
    Nothing is trimmed. The one rule of ingest's 422, the worker's dead letter
    (``invalid_attributes``) and ``ctx.set_attributes``."""
    if not isinstance(value, dict):
        raise ValueError(f"attributes must be a JSON object, not {type(value).__name__}")
    if len(value) > MAX_ATTRIBUTES:
        raise ValueError(f"attributes has {len(value)} keys, at most {MAX_ATTRIBUTES} allowed")
    for key, item in value.items():
        if not isinstance(key, str) or _ATTRIBUTE_KEY.fullmatch(key) is None:
            raise ValueError(
                f"attribute key {str(key)[:80]!r} does not match {ATTRIBUTE_KEY_PATTERN}"
            )
        problem = _attribute_value_problem(item)
        if problem is not None:
            raise ValueError(f"attribute {key!r}: {problem}")
    size = _stored_size(value)
    if size > MAX_ATTRIBUTES_BYTES:
        raise ValueError(
            f"attributes are {size} bytes as JSON, at most {MAX_ATTRIBUTES_BYTES} allowed"
        )
    return dict(value)


def _stored_size(value: dict[str, Any]) -> int:
    """The bytes of ``value`` as compact JSON, each float counted as jsonb stores and
    prints it: in plain decimal (``1e-300`` is 302 characters there, not 6)."""
    try:
        size = len(orjson.dumps(value))
    except orjson.JSONEncodeError as exc:  # a lone surrogate in a string from code
        raise ValueError(f"attributes cannot be written as JSON: {exc}") from None
    for item in value.values():
        if isinstance(item, float):
            size += len(format(Decimal(repr(item)), "f")) - len(orjson.dumps(item))
    return size


def _attribute_value_problem(item: Any) -> str | None:
    if isinstance(item, str):
        if len(item) > MAX_ATTRIBUTE_VALUE_CHARS:
            return f"value is {len(item)} characters, at most {MAX_ATTRIBUTE_VALUE_CHARS}"
        if "\x00" in item:
            return "value contains a NUL character (\\u0000), which cannot be stored"
        return None
    if isinstance(item, bool):
        return None
    if isinstance(item, int):
        if abs(item) > MAX_ATTRIBUTE_INT:
            return f"integer {item} is beyond ±{MAX_ATTRIBUTE_INT} (2**53 - 1)"
        return None
    if isinstance(item, float):
        if not math.isfinite(item):
            return f"number {item} is not finite"
        if abs(item) > MAX_ATTRIBUTE_INT:  # jsonb would read it back as a larger integer
            return f"number {item!r} is beyond ±{MAX_ATTRIBUTE_INT} (2**53 - 1)"
        if item == 0.0 and math.copysign(1.0, item) < 0:
            return "negative zero would be stored as 0 (PostgreSQL numbers have no signed zero)"
        return None
    kind = "null" if item is None else type(item).__name__
    return f"value must be a string, a number or a boolean, not {kind}"


def merge_attributes(current: Attributes, update: Any) -> Attributes:
    """``current`` with ``update`` merged in (a key set to None is removed), under
    :func:`check_attributes`: ValueError if the update or the result does not fit."""
    if not isinstance(update, dict):
        raise ValueError(f"attributes must be a dict, not {type(update).__name__}")
    merged = {**current, **{k: v for k, v in update.items() if v is not None}}
    for key, item in update.items():
        if item is None:
            if not isinstance(key, str) or _ATTRIBUTE_KEY.fullmatch(key) is None:
                raise ValueError(
                    f"attribute key {str(key)[:80]!r} does not match {ATTRIBUTE_KEY_PATTERN}"
                )
            merged.pop(key, None)
    return check_attributes(merged)


def _check_numbers(value: bytes | None, params: dict[str, Any]) -> None:
    """InvalidEnvelope (``invalid_params``) if the params hold a number that would not
    be stored as written (a negative zero, 1e-400, 20 digits: onceflow.exact_numbers):
    a producer writing the topic directly gets the same rule as ingest's 422. The bytes
    and the params' floats are looked at first; only a record they cannot clear is
    parsed again."""
    floats, suspect = floats_in(params)
    if value is None or not (suspect or (floats and may_be_inexact(value))):
        return
    try:
        found = first_inexact(exact_loads(value).get("params"), "params")
    except RecursionError:  # nested deeper than Python's parser goes (orjson went on):
        return  # no number of it was changed by being nested
    if found is not None:
        path, inexact = found
        raise InvalidEnvelope(DeadLetterReason.INVALID_PARAMS, f"{path}: {inexact.reason}")


def _check_version(v: Any) -> None:
    # bool is an int in Python: `"v": true` is not version 1.
    if type(v) is not int or not 1 <= v <= ENVELOPE_VERSION:
        raise InvalidEnvelope(
            DeadLetterReason.UNSUPPORTED_VERSION,
            f"unsupported envelope version {v!r} (this worker reads 1..{ENVELOPE_VERSION})",
        )


def _priority(value: Any) -> int:
    # bool is an int in Python: `"priority": true` is not priority 1.
    if type(value) is not int or not PRIORITY_HIGHEST <= value <= PRIORITY_LOWEST:
        raise InvalidEnvelope(
            DeadLetterReason.INVALID_PRIORITY,
            f"invalid priority {str(value)[:20]!r} (an integer from 1, highest, to 5)",
        )
    return value


def _callback(value: Any) -> str | None:
    """The callback's endpoint name, or InvalidEnvelope (``invalid_callback``) when it is
    not one (a URL, say): whether a configured endpoint has that name is the worker's
    check (``unknown_callback``), against its own settings."""
    if value is None:
        return None
    problem = callback_problem(value, None)
    if problem is not None:
        raise InvalidEnvelope(DeadLetterReason.INVALID_CALLBACK, problem[1])
    return str(value)


def _id_reuse(value: Any) -> IdReuse | None:
    try:
        return id_reuse_policy(value)
    except ValueError as exc:
        raise InvalidEnvelope(DeadLetterReason.INVALID_ID_REUSE, str(exc)) from None


def id_reuse_policy(value: Any) -> IdReuse | None:
    """An id reuse policy by its name (None: not given), or ValueError saying why not:
    the one rule of ingest's 422, the worker's dead letter (``invalid_id_reuse``) and
    ``@workflow(id_reuse=)``'s check at registration."""
    if value is None:
        return None
    if isinstance(value, str) and value in _ID_REUSE_NAMES:
        return IdReuse(value)
    names = ", ".join(p.value for p in IdReuse)
    raise ValueError(f"invalid id_reuse {str(value)[:40]!r}: one of {names}")


_ID_REUSE_NAMES = frozenset(p.value for p in IdReuse)


def start_time(run_at: Any, start_after: Any, submitted_at: datetime) -> datetime | None:
    """When a job may start (None: at once), from the job's ``run_at`` (an RFC 3339 time
    with its UTC offset: ``2026-11-29T18:00:00Z``) or ``start_after`` (a number of
    seconds after ``submitted_at``), at most one of them; a time in the past is "now".
    ValueError saying what is wrong: both given, not a time with an offset, not a
    number, negative, or more than :data:`MAX_START_DELAY_SECONDS` after submission.
    The one rule of ingest's 422 and the worker's dead letter (``invalid_run_at``)."""
    if run_at is None and start_after is None:
        return None
    if run_at is not None and start_after is not None:
        raise ValueError("give run_at or start_after, not both")
    if start_after is not None:
        # bool is an int in Python: `"start_after": true` is not one second.
        if type(start_after) not in (int, float) or not 0 <= start_after <= MAX_START_DELAY_SECONDS:
            raise ValueError(
                f"invalid start_after {str(start_after)[:40]!r}: a number of seconds from 0"
                f" to {MAX_START_DELAY_SECONDS} (a year)"
            )
        at = submitted_at + timedelta(seconds=start_after)
    else:
        at = parse_run_at(run_at)
    if at - submitted_at > timedelta(seconds=MAX_START_DELAY_SECONDS):
        raise ValueError(
            f"start time {at.isoformat()} is more than {MAX_START_DELAY_SECONDS // 86400} days"
            " after the job was submitted"
        )
    return at


def time_limit(name: str, value: Any) -> float | None:
    """A time limit in seconds (``start_within``, ``execution_timeout``): a number more
    than 0 and at most :data:`MAX_TIME_LIMIT_SECONDS` (a year); None: no limit given.
    ValueError saying what is wrong otherwise (not a number, a bool, 0 or less, more
    than a year). The one rule of ingest's 422, the worker's dead letter
    (``invalid_start_within``) and ``@workflow``'s check at registration."""
    if value is None:
        return None
    # bool is an int in Python: `"start_within": true` is not one second.
    if type(value) not in (int, float) or not 0 < value <= MAX_TIME_LIMIT_SECONDS:
        raise ValueError(
            f"invalid {name} {str(value)[:40]!r}: a number of seconds more than 0 and at"
            f" most {MAX_TIME_LIMIT_SECONDS} (a year)"
        )
    return float(value)


def parse_run_at(value: Any) -> datetime:
    """An RFC 3339 time with its offset (ValueError otherwise: a date alone, a time
    without ``Z`` or ``±hh:mm``, not a string)."""
    try:
        if not isinstance(value, str) or "T" not in value.upper():
            raise ValueError
        at = datetime.fromisoformat(value)
    except (ValueError, OverflowError):
        raise ValueError(
            f"invalid run_at {str(value)[:60]!r}: an RFC 3339 time with its offset"
            " (2026-11-29T18:00:00Z) expected"
        ) from None
    if at.tzinfo is None:
        raise ValueError(f"run_at {value[:60]!r} has no UTC offset (add Z or +hh:mm)")
    return at


def _request_id(doc: dict[str, Any], headers: Sequence[tuple[str, Any]] | None) -> str | None:
    if headers is None:
        return str(doc.get("request_id") or "") or None
    for name, raw in headers:
        if name == HEADER_REQUEST_ID and raw:
            text = raw.decode(errors="replace") if isinstance(raw, bytes) else str(raw)
            return text or None
    return None


def _submitted_at(raw: Any, timestamp: float | None) -> datetime:
    if raw is None:
        return datetime.fromtimestamp(timestamp, UTC) if timestamp else _now()
    try:
        at = datetime.fromisoformat(raw)
    except (TypeError, ValueError):
        raise InvalidEnvelope(
            DeadLetterReason.INVALID_SUBMITTED_AT,
            f"invalid submitted_at {str(raw)[:100]!r} (ISO 8601 expected)",
        ) from None
    return at if at.tzinfo is not None else at.replace(tzinfo=UTC)
