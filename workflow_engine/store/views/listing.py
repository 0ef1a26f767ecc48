"""Read models of the console, the admin API and the CLI: filtered instance lists (the
one list API, :func:`list_page`), counts, overview.

A filter (:class:`InstanceFilter`) has one text form (``workflow=order-workflow,
status=errored,created_to=2026-11-30T10:00:00+00:00``) shared by the CLI
(``--filter``), the admin API and the bulk operations (which record it), and one
query-string form (:meth:`InstanceFilter.as_params`) for URLs.

Searchable attributes (migration 0022) are one term per key, ``attr.<key>=<value>``, in
both forms (``attr.tenant=acme,attr.tier=gold``: AND); a value matches the attribute's
string, or its number or boolean when the text is one (``attr.tier=2`` finds 2 and
"2"). Each becomes ``attributes @> …``, which the GIN index of migration 0022 serves.

Lists are newest first and paged by keyset (the cursor is the last row's sort key and
job id), never by OFFSET: a deep page costs what the first one does. The indexes of
migration 0008 (``(created_at, job_id)``, ``(updated_at, job_id)`` and
``(workflow, created_at, job_id)``) serve every sort; :func:`explain_list` shows the
plan. Only the conditions a filter sets enter the statement, so the planner sees a
query it can use an index for (``:x IS NULL OR col = :x`` would hide it).
"""

from __future__ import annotations

import base64
import binascii
import math
import re
from collections.abc import Mapping
from dataclasses import dataclass, field, fields, replace
from datetime import UTC, datetime
from decimal import Decimal
from typing import Any, Literal

import orjson
import sqlalchemy as sa
from sqlalchemy.engine import Engine

from onceflow.envelope import ATTRIBUTE_KEY_PATTERN, MAX_ATTRIBUTE_VALUE_CHARS, MAX_ATTRIBUTES
from onceflow.errors import OnceflowError
from onceflow.vocabulary import InstanceStatus

Sort = Literal["created", "updated"]
SORTS: tuple[Sort, ...] = ("created", "updated")
_SORT_COLUMN: dict[str, str] = {"created": "created_at", "updated": "updated_at"}
MAX_LIMIT = 1000


class InvalidFilter(OnceflowError):
    """A filter text, query parameter or cursor that cannot be understood."""


# Accepted spellings of each filter key; the first one is the canonical one.
_ALIASES: dict[str, tuple[str, ...]] = {
    "workflow": ("workflow", "wf"),
    "status": ("status",),
    "created_from": ("created_from", "created_after", "since", "from"),
    "created_to": ("created_to", "created_before", "until", "to"),
    "job_id": ("job_id", "id"),
    "job_id_prefix": ("job_id_prefix", "prefix"),
    "has_duplicates": ("has_duplicates", "duplicates"),
    "payload_mismatch": ("payload_mismatch", "mismatch"),
    "error_contains": ("error_contains", "error"),
    "version": ("version",),
    "scheduled": ("scheduled",),
    "reused": ("reused",),
}
_KEY_OF: dict[str, str] = {alias: key for key, names in _ALIASES.items() for alias in names}
#: A filter term on a searchable attribute: ``attr.<key>=<value>``.
ATTR_PREFIX = "attr."
_ATTR_KEY = re.compile(ATTRIBUTE_KEY_PATTERN)
_JSON_NUMBER = re.compile(r"-?(?:0|[1-9][0-9]*)(?:\.[0-9]+)?(?:[eE][+-]?[0-9]+)?")
_TRUE = {"true", "yes", "1", "on"}
_FALSE = {"false", "no", "0", "off"}


@dataclass(frozen=True, slots=True)
class InstanceFilter:
    """Which instances: every field set narrows the set (AND); all None is everything."""

    workflow: str | None = None
    status: InstanceStatus | None = None
    created_from: datetime | None = None  # inclusive
    created_to: datetime | None = None  # exclusive
    job_id: str | None = None  # exact
    job_id_prefix: str | None = None
    has_duplicates: bool | None = None
    payload_mismatch: bool | None = None  # params or workflow mismatch recorded
    error_contains: str | None = None  # case-insensitive substring of the error
    version: str | None = None  # the definition version it was created with
    # a delayed start not reached yet (queued, never started, claimable only later)
    scheduled: bool | None = None
    # an id reuse started a later run of it (run > 1, migration 0027)
    reused: bool | None = None
    # searchable attributes: (key, value text) pairs sorted by key, each must match
    attributes: tuple[tuple[str, str], ...] | None = None

    @classmethod
    def parse(cls, text: str) -> InstanceFilter:
        """Parse ``key=value,key=value``; raise :class:`InvalidFilter` saying what is wrong.

        Keys: ``workflow``, ``status``, ``created_from`` (or ``created_after``,
        ``since``), ``created_to`` (or ``created_before``, ``until``), ``job_id``,
        ``job_id_prefix`` (or ``prefix``), ``has_duplicates``, ``payload_mismatch``,
        ``error_contains`` (or ``error``), ``version``, ``scheduled``, ``reused`` (a later
        run of an id reuse), and ``attr.<key>`` for each searchable attribute. A comma or
        backslash inside a value is written ``\\,`` / ``\\\\``.
        The empty text is the empty filter (everything).
        """
        pairs: dict[str, str] = {}
        for part in _split(text):
            if not part.strip():
                continue
            name, sep, value = part.partition("=")
            if not sep:
                raise InvalidFilter(f"filter term {part!r} is not key=value")
            key = _canonical(name.strip())
            if key in pairs:
                raise InvalidFilter(f"filter key {key!r} given twice")
            pairs[key] = value.strip()
        return cls._build(pairs)

    def describe(self) -> str:
        """The canonical text form: ``parse(f.describe()) == f``; ``""`` for everything."""
        return ",".join(f"{key}={_escape(value)}" for key, value in self.as_params().items())

    def as_params(self) -> dict[str, str]:
        """The set fields as query-string parameters (canonical keys, text values)."""
        out: dict[str, str] = {}
        for f in fields(self):
            value = getattr(self, f.name)
            if value is None:
                continue
            if f.name == "attributes":
                out.update((ATTR_PREFIX + k, v) for k, v in value)
            elif isinstance(value, bool):
                out[f.name] = "true" if value else "false"
            elif isinstance(value, datetime):
                out[f.name] = value.isoformat()
            else:
                out[f.name] = str(value)
        return out

    @classmethod
    def from_params(cls, params: Mapping[str, str]) -> InstanceFilter:
        """Build from query parameters; keys naming no filter field (``cursor``,
        ``sort``, ``limit`` … travel in the same query string) are ignored. Empty values
        count as not given."""
        pairs: dict[str, str] = {}
        for name, value in params.items():
            if value is None or not str(value).strip():
                continue
            if name == "attributes":  # the console's one field: "tenant=acme, tier=gold"
                for key, text in _attribute_terms(str(value)):
                    if key in pairs:
                        raise InvalidFilter(f"filter key {key!r} given twice")
                    pairs[key] = text
                continue
            canonical = _KEY_OF.get(name) or (name if name.startswith(ATTR_PREFIX) else None)
            if canonical is None:
                continue
            if canonical in pairs:
                raise InvalidFilter(f"filter key {canonical!r} given twice")
            pairs[canonical] = str(value).strip()
        return cls._build(pairs)

    @property
    def empty(self) -> bool:
        return not self.as_params()

    def with_attributes(self, terms: list[str]) -> InstanceFilter:
        """This filter narrowed by ``key=value`` terms (the CLI's ``--attr``)."""
        split = []
        for term in terms:
            name, sep, value = term.partition("=")
            if not sep:
                raise InvalidFilter(f"attribute term {term!r} is not key=value")
            split.append((name, value))
        return self.with_attribute_pairs(split)

    def with_attribute_pairs(self, terms: list[tuple[str, str]]) -> InstanceFilter:
        """This filter narrowed by ``(key, value)`` terms (the admin API's ``attr.<key>``
        query parameters, whose key is taken whole: an ``=`` in it is a bad key)."""
        pairs = {ATTR_PREFIX + k: v for k, v in self.attributes or ()}
        for name, value in terms:
            key = ATTR_PREFIX + name.strip()
            if key in pairs:
                raise InvalidFilter(f"filter key {key!r} given twice")
            pairs[key] = value.strip()
        return replace(self, attributes=_attribute_filter(pairs))

    @classmethod
    def _build(cls, pairs: Mapping[str, str]) -> InstanceFilter:
        values: dict[str, Any] = {}
        attributes = {k: v for k, v in pairs.items() if k.startswith(ATTR_PREFIX)}
        if attributes:
            values["attributes"] = _attribute_filter(attributes)
        for key, raw in pairs.items():
            if key.startswith(ATTR_PREFIX):
                continue
            if key == "status":
                values[key] = _status(raw)
            elif key in ("created_from", "created_to"):
                values[key] = _when(key, raw)
            elif key in ("has_duplicates", "payload_mismatch", "scheduled", "reused"):
                values[key] = _flag(key, raw)
            else:
                if not raw:
                    raise InvalidFilter(f"filter key {key!r} needs a value")
                values[key] = raw
        built = cls(**values)
        if built.created_from and built.created_to and built.created_from >= built.created_to:
            raise InvalidFilter("created_from must be before created_to")
        return built


def _attribute_terms(text: str) -> list[tuple[str, str]]:
    """``tenant=acme, tier=gold`` as ``[("attr.tenant", "acme"), …]``."""
    terms = []
    for part in _split(text):
        if not part.strip():
            continue
        name, sep, value = part.partition("=")
        if not sep:
            raise InvalidFilter(f"attribute term {part.strip()!r} is not key=value")
        terms.append((ATTR_PREFIX + name.strip(), value.strip()))
    return terms


def _attribute_filter(pairs: Mapping[str, str]) -> tuple[tuple[str, str], ...]:
    """``attr.<key>`` terms as the filter's sorted pairs; InvalidFilter for a key no
    attribute can have, an empty or too long value, or too many terms."""
    if len(pairs) > MAX_ATTRIBUTES:
        raise InvalidFilter(f"at most {MAX_ATTRIBUTES} attribute terms (an instance has no more)")
    out = []
    for name, value in pairs.items():
        key = name[len(ATTR_PREFIX) :]
        if _ATTR_KEY.fullmatch(key) is None:
            raise InvalidFilter(
                f"attribute key {key[:80]!r} does not match {ATTRIBUTE_KEY_PATTERN}"
            )
        if not value:
            raise InvalidFilter(f"filter key {name!r} needs a value")
        if len(value) > MAX_ATTRIBUTE_VALUE_CHARS or "\x00" in value:
            raise InvalidFilter(
                f"{name}: a value of at most {MAX_ATTRIBUTE_VALUE_CHARS} characters, no NUL"
            )
        if not value.isascii():
            try:  # a lone surrogate (a command line's undecodable bytes) is no text
                value.encode()
            except UnicodeEncodeError:
                raise InvalidFilter(f"{name}: the value is not valid UTF-8 text") from None
        out.append((key, value))
    return tuple(sorted(out))


def attribute_matches(key: str, text: str) -> list[bytes]:
    """The ``@>`` documents a filter term matches: the value as a string, and as the
    number or boolean it spells (``2`` finds 2 and "2"; ``true`` finds true and "true").

    The number goes into the document as written, so jsonb compares it as the exact
    ``numeric`` it is (``1e2`` is 100; ``1e-400`` is not 0, as a float parse would make
    it). One no attribute can hold (beyond a 64-bit float's range: only workflow code's
    floats and ingest's exact numbers are stored) matches as a string only."""
    docs = [orjson.dumps({key: text})]
    if text in ("true", "false"):
        docs.append(orjson.dumps({key: text == "true"}))
    elif _JSON_NUMBER.fullmatch(text) and _storable_number(text):
        docs.append(b"{" + orjson.dumps(key) + b":" + text.encode() + b"}")
    return docs


def _storable_number(text: str) -> bool:
    """Whether the JSON number ``text`` is one an attribute could hold: zero, or a
    finite 64-bit float that is not zero (its exponent within what numeric takes)."""
    number = Decimal(text)
    as_float = float(number)
    return number.is_zero() or (math.isfinite(as_float) and as_float != 0.0)


def _split(text: str) -> list[str]:
    parts, current, chars = [], [], iter(text)
    for ch in chars:
        if ch == "\\":
            current.append(next(chars, "\\"))
        elif ch == ",":
            parts.append("".join(current))
            current = []
        else:
            current.append(ch)
    parts.append("".join(current))
    return parts


def _escape(value: str) -> str:
    return value.replace("\\", "\\\\").replace(",", "\\,")


def _canonical(name: str) -> str:
    if name.startswith(ATTR_PREFIX):
        return name
    key = _KEY_OF.get(name.lower())
    if key is None:
        known = ", ".join(_ALIASES)
        raise InvalidFilter(
            f"unknown filter key {name!r} (known: {known}, {ATTR_PREFIX}<attribute key>)"
        )
    return key


def _status(raw: str) -> InstanceStatus:
    try:
        return InstanceStatus(raw.lower())
    except ValueError:
        known = ", ".join(InstanceStatus)
        raise InvalidFilter(f"unknown status {raw!r} (one of: {known})") from None


def _when(key: str, raw: str) -> datetime:
    text = raw[:-1] + "+00:00" if raw.endswith(("Z", "z")) else raw
    try:
        at = datetime.fromisoformat(text)
    except ValueError:
        raise InvalidFilter(
            f"{key}: {raw!r} is not an ISO 8601 time (e.g. 2026-11-30T10:00:00Z)"
        ) from None
    utc = as_utc(at)
    if utc is None:
        raise InvalidFilter(f"{key}: {raw!r} is out of range (years 1 to 9999 in UTC)")
    return utc


def as_utc(at: datetime) -> datetime | None:
    """``at`` in UTC (naive: taken as UTC), or None when that falls outside the years
    datetime holds. Python takes UTC offsets up to ±23:59, PostgreSQL only up to ±15:59
    ("time zone displacement out of range", a 500 before): a time reaches SQL in UTC."""
    try:
        return at.astimezone(UTC) if at.tzinfo is not None else at.replace(tzinfo=UTC)
    except OverflowError:  # 0001-01-01T00:00+01:00 is in year 0 in UTC
        return None


def _flag(key: str, raw: str) -> bool:
    low = raw.lower()
    if low in _TRUE:
        return True
    if low in _FALSE:
        return False
    raise InvalidFilter(f"{key}: {raw!r} is not true or false")


def _like_prefix(prefix: str) -> str:
    return prefix.replace("\\", "\\\\").replace("%", "\\%").replace("_", "\\_") + "%"


# The partition key of the job id's duplicate rows (migration 0012), so that only its
# one partition is read instead of every partition's job_id index.
_JOB_RECEIVED = "(SELECT j.received_at FROM onceflow_jobs j WHERE j.job_id = {job_id})"
# has_duplicates and payload_mismatch read the instance's flags (migration 0015), kept
# by the streams worker with the duplicate rows; "duplicated" leads both so that the
# partial indexes of duplicated instances serve them. (EXISTS over the duplicates per
# instance took 2.3-2.5 s a page at 1M instances with the duplicated ones all old.)
_DUPLICATED = {True: "i.duplicated", False: "NOT i.duplicated"}
_MISMATCHED = {True: "i.duplicated AND i.mismatched", False: "NOT i.mismatched"}
# What SCHEDULED_START shows as "starts at": a delayed start (run_at / start_after) whose
# time has not come (the claim takes it then).
_IS_SCHEDULED = "(i.status = 'queued' AND i.started_at IS NULL AND i.run_after > now())"
_SCHEDULED = {True: _IS_SCHEDULED, False: f"NOT {_IS_SCHEDULED}"}


def where_clause(f: InstanceFilter) -> tuple[str, dict[str, Any]]:
    """The SQL condition on ``onceflow_instances i`` for ``f`` and its bind parameters.

    Used by the lists here and by :mod:`workflow_engine.store.operations.bulk`; ``TRUE`` for the
    empty filter. Only the set fields appear, so each shape of filter gets its own plan.
    """
    terms: list[str] = []
    params: dict[str, Any] = {}
    if f.workflow is not None:
        terms.append("i.workflow = :f_workflow")
        params["f_workflow"] = f.workflow
    if f.status is not None:
        terms.append("i.status = :f_status")
        params["f_status"] = str(f.status)
    if f.created_from is not None:
        terms.append("i.created_at >= :f_from")
        params["f_from"] = f.created_from
    if f.created_to is not None:
        terms.append("i.created_at < :f_to")
        params["f_to"] = f.created_to
    if f.job_id is not None:
        terms.append("i.job_id = :f_job_id")
        params["f_job_id"] = f.job_id
    if f.job_id_prefix is not None:
        terms.append("i.job_id LIKE :f_prefix ESCAPE '\\'")
        params["f_prefix"] = _like_prefix(f.job_id_prefix)
    if f.has_duplicates is not None:
        terms.append(_DUPLICATED[f.has_duplicates])
    if f.payload_mismatch is not None:
        terms.append(_MISMATCHED[f.payload_mismatch])
    if f.scheduled is not None:
        terms.append(_SCHEDULED[f.scheduled])
    if f.reused is not None:
        terms.append("i.run > 1" if f.reused else "i.run = 1")
    if f.error_contains is not None:
        terms.append("strpos(lower(i.error), lower(:f_error)) > 0")
        params["f_error"] = f.error_contains
    if f.version is not None:  # a plain AND: the created/updated index still orders the page
        terms.append("i.version = :f_version")
        params["f_version"] = f.version
    for n, (key, text) in enumerate(f.attributes or ()):
        # containment, which the GIN index (jsonb_path_ops, migration 0022) serves; a
        # number's or boolean's spelling matches either type (a BitmapOr of two scans)
        matches = []
        for m, doc in enumerate(attribute_matches(key, text)):
            matches.append(f"i.attributes @> CAST(:f_attr_{n}_{m} AS jsonb)")
            params[f"f_attr_{n}_{m}"] = doc.decode()
        terms.append(matches[0] if len(matches) == 1 else "(" + " OR ".join(matches) + ")")
    return (" AND ".join(terms) or "TRUE"), params


@dataclass(frozen=True, slots=True)
class InstanceRow:
    job_id: str
    workflow: str
    status: InstanceStatus
    created_at: datetime
    updated_at: datetime
    duplicates: int  # later deliveries of the job id (redeliveries and resubmissions)
    mismatches: int  # of those, how many had other params or another workflow
    error: str | None
    finished_at: datetime | None
    version: str | None  # the definition version it was created with
    # A delayed start not reached yet (run_at / start_after): when it becomes claimable.
    scheduled_start: datetime | None = None
    attributes: dict[str, Any] = field(default_factory=dict)  # searchable (migration 0022)
    run: int = 1  # the job id's current run (id reuse, migration 0027)


#: When a queued instance that has never run will become claimable, if that is still
#: ahead (a delayed start; migration 0021): NULL otherwise. Status stays ``queued``.
SCHEDULED_START = f"CASE WHEN {_IS_SCHEDULED} THEN i.run_after END"


@dataclass(frozen=True, slots=True)
class Page:
    rows: list[InstanceRow]
    next_cursor: str | None  # opaque; None on the last page


def encode_cursor(sort: Sort, at: datetime, job_id: str) -> str:
    raw = orjson.dumps({"s": sort, "t": at.isoformat(), "j": job_id})
    return base64.urlsafe_b64encode(raw).decode().rstrip("=")


_BAD_CURSOR = "invalid cursor (take it from a previous page)"


def decode_cursor(cursor: str, sort: Sort) -> tuple[datetime, str]:
    """The (sort key, job id) a cursor points after; :class:`InvalidFilter` if it is
    not one of ours or was made for another sort."""
    try:
        doc = orjson.loads(base64.urlsafe_b64decode(cursor + "=" * (-len(cursor) % 4)))
        at, job_id, made_for = datetime.fromisoformat(doc["t"]), str(doc["j"]), doc["s"]
    except (binascii.Error, ValueError, KeyError, TypeError, orjson.JSONDecodeError):
        raise InvalidFilter(_BAD_CURSOR) from None
    utc = as_utc(at)
    if utc is None:  # not one we made: ours are in the session's zone, in range
        raise InvalidFilter(_BAD_CURSOR)
    if made_for != sort:
        raise InvalidFilter(f"the cursor was made for sort {made_for!r}, not {sort!r}")
    return utc, job_id


def _check_sort(sort: str) -> str:
    if sort not in _SORT_COLUMN:
        raise InvalidFilter(f"unknown sort {sort!r} (one of: {', '.join(SORTS)})")
    return _SORT_COLUMN[sort]


def _list_sql(
    f: InstanceFilter, sort: Sort, after: tuple[datetime, str] | None, *, explain: bool = False
) -> tuple[sa.TextClause, dict[str, Any]]:
    """The page query for ``f`` (``EXPLAIN`` of it with ``explain``) and its parameters;
    built per call, since the WHERE clause, the sort column and the keyset are the
    filter's own."""
    column = _check_sort(sort)
    where, params = where_clause(f)
    if after is not None:
        # A row comparison: the (column, job_id) index serves it as one range.
        where += f" AND (i.{column}, i.job_id) < (:c_at, :c_job)"
        params["c_at"], params["c_job"] = after
    page = (
        "SELECT i.job_id, i.workflow, i.status, i.created_at, i.updated_at, i.error,"
        f" i.finished_at, i.version, {SCHEDULED_START} AS scheduled_start, i.attributes,"
        f" i.run FROM onceflow_instances i WHERE {where}"
        f" ORDER BY i.{column} DESC, i.job_id DESC LIMIT :limit"
    )
    # Duplicate counts only for the rows of the page.
    sql = (
        "SELECT p.*, coalesce(d.n, 0) AS duplicates, coalesce(d.m, 0) AS mismatches"
        f" FROM ({page}) p LEFT JOIN LATERAL (SELECT count(*) AS n, count(*) FILTER"
        " (WHERE NOT d.params_match OR d.workflow_match IS FALSE) AS m"
        " FROM onceflow_duplicate_deliveries d WHERE d.job_id = p.job_id"
        f" AND d.job_received_at = {_JOB_RECEIVED.format(job_id='p.job_id')}) d ON true"
        f" ORDER BY p.{column} DESC, p.job_id DESC"
    )
    return sa.text(("EXPLAIN " if explain else "") + sql), params


def list_page(
    db: Engine,
    f: InstanceFilter,
    sort: Sort = "created",
    cursor: str | None = None,
    limit: int = 50,
) -> Page:
    """One page of the matching instances, newest first by ``sort``; pass the page's
    ``next_cursor`` back for the next one (keyset: as cheap deep as on top)."""
    if not 1 <= limit <= MAX_LIMIT:
        raise InvalidFilter(f"limit must be between 1 and {MAX_LIMIT}")
    after = decode_cursor(cursor, sort) if cursor else None
    sql, params = _list_sql(f, sort, after)
    params["limit"] = limit + 1  # one more: is there a next page?
    with db.connect() as conn:
        found = conn.execute(sql, params).all()
    rows = [
        InstanceRow(
            job_id=r.job_id,
            workflow=r.workflow,
            status=InstanceStatus(r.status),
            created_at=r.created_at,
            updated_at=r.updated_at,
            duplicates=int(r.duplicates),
            mismatches=int(r.mismatches),
            error=r.error,
            finished_at=r.finished_at,
            version=r.version,
            scheduled_start=r.scheduled_start,
            attributes=r.attributes,
            run=r.run,
        )
        for r in found[:limit]
    ]
    next_cursor = None
    if len(found) > limit:
        last = rows[-1]
        at = last.created_at if sort == "created" else last.updated_at
        next_cursor = encode_cursor(sort, at, last.job_id)
    return Page(rows, next_cursor)


def _count_sql(where: str, capped: bool) -> sa.TextClause:
    """The count for a filter's WHERE clause (``capped``: stopping at ``:cap``); built
    per call, since the WHERE clause is the filter's own."""
    if not capped:
        return sa.text(f"SELECT count(*) FROM onceflow_instances i WHERE {where}")
    return sa.text(
        f"SELECT count(*) FROM (SELECT 1 FROM onceflow_instances i WHERE {where} LIMIT :cap) s"
    )


def count_matching(db: Engine, f: InstanceFilter, cap: int | None = None) -> int:
    """How many instances match; with ``cap``, stop counting there (``min(n, cap)``),
    which keeps a console's "10,000+" cheap on a big table."""
    where, params = where_clause(f)
    if cap is not None:
        params["cap"] = max(cap, 0)
    with db.connect() as conn:
        return int(conn.execute(_count_sql(where, cap is not None), params).scalar_one())


def explain_list(db: Engine, f: InstanceFilter, sort: Sort = "created") -> str:
    """The ``EXPLAIN`` text of :func:`list_page`'s first-page query for ``f``."""
    sql, params = _list_sql(f, sort, None, explain=True)
    params["limit"] = 51
    with db.connect() as conn:
        lines = conn.execute(sql, params).scalars().all()
    return "\n".join(lines)


@dataclass(frozen=True, slots=True)
class Overview:
    counts: dict[str, dict[InstanceStatus, int]]  # workflow -> status -> n
    created_per_minute: list[tuple[datetime, int]]  # oldest first, every minute present
    finished_per_minute: list[tuple[datetime, int]]
    dead_letters_by_reason: dict[str, int]


_PER_MINUTE = """
SELECT m.minute, count(i.job_id) AS n
FROM generate_series(date_trunc('minute', now()) - make_interval(mins => :minutes - 1),
                     date_trunc('minute', now()), interval '1 minute') AS m(minute)
LEFT JOIN onceflow_instances i
  ON i.{column} >= m.minute AND i.{column} < m.minute + interval '1 minute'
 AND i.{column} >= date_trunc('minute', now()) - make_interval(mins => :minutes - 1)
GROUP BY m.minute ORDER BY m.minute
"""
_CREATED_PER_MINUTE = sa.text(_PER_MINUTE.format(column="created_at"))
_FINISHED_PER_MINUTE = sa.text(_PER_MINUTE.format(column="finished_at"))
_STATUS_COUNTS = sa.text(
    "SELECT workflow, status, count(*) AS n FROM onceflow_instances"
    " GROUP BY workflow, status ORDER BY workflow, status"
)
_DEAD_LETTER_REASONS = sa.text(
    "SELECT reason, count(*) AS n FROM onceflow_dead_letters GROUP BY reason ORDER BY reason"
)


def overview(db: Engine, minutes: int = 15) -> Overview:
    """Instances per workflow and status, created and finished per minute over the last
    ``minutes`` minutes (the current one included), and dead letters per reason."""
    if not 1 <= minutes <= 24 * 60:
        raise InvalidFilter("minutes must be between 1 and 1440")
    counts: dict[str, dict[InstanceStatus, int]] = {}
    with db.connect() as conn:
        for r in conn.execute(_STATUS_COUNTS):
            counts.setdefault(r.workflow, {})[InstanceStatus(r.status)] = int(r.n)
        created = conn.execute(_CREATED_PER_MINUTE, {"minutes": minutes}).all()
        finished = conn.execute(_FINISHED_PER_MINUTE, {"minutes": minutes}).all()
        dead = conn.execute(_DEAD_LETTER_REASONS).all()
    return Overview(
        counts=counts,
        created_per_minute=[(r.minute, int(r.n)) for r in created],
        finished_per_minute=[(r.minute, int(r.n)) for r in finished],
        dead_letters_by_reason={r.reason: int(r.n) for r in dead},
    )
