"""The audit trail of operator actions: who did what, to which instance, and how it went.

Every front end (the admin API, the console, the CLI) hands the store functions that act
an :class:`Actor` (``actor=`` on :mod:`~workflow_engine.store.operations`' pause,
resume, terminate, restart and send_event,
:func:`~workflow_engine.store.operations.bulk.start_bulk`,
:func:`~workflow_engine.store.operations.redrives.redrive_letters`); the engine and the
tests leave it out and nothing is recorded. Each recorded action is one row of
``onceflow_operator_actions`` (migration 0016) and one JSON log line
(``event="operator.<action>"``, with ``actor``, ``front_end``, ``job_id``, ``result``).

Where the action is one store transaction, its row is written inside it
(:func:`record` on the transaction's connection), so the action and its row commit
together or not at all, and the log line follows the commit (:func:`announce`). A
refusal or an error is recorded afterwards in a transaction of its own
(:func:`failures_recorded`, :func:`record_quietly`), best effort: when the database
cannot take the row either, the log line still goes out (``audit_id: null``) and the
caller's own answer (the refusal, the error) is what it would have been.

Successful reads are not recorded; refusals at the door (401/403) are, without a rate
limit, so every value stored is bounded (:func:`_bounded`), as the table's CHECKs
require.
"""

from __future__ import annotations

import logging
from collections.abc import Iterator, Mapping
from contextlib import contextmanager
from dataclasses import dataclass, field, fields, replace
from datetime import datetime
from typing import Any

import orjson
import sqlalchemy as sa
from sqlalchemy.engine import Connection, Engine, Row

from onceflow.errors import OnceflowError, ServiceUnavailable
from onceflow.vocabulary import ActionResult, FrontEnd, OperatorAction

log = logging.getLogger(__name__)

MAX_ACTOR_CHARS = 200
MAX_NAME_CHARS = 200  # a workflow name or a job id (a tick's child ids reach 200)
MAX_CLIENT_CHARS = 100
MAX_DETAIL_CHARS = 1000
MAX_FILTER_BYTES = 4096  # the filter as JSON text; the table allows 8 kB stored
MAX_LIMIT = 500


class InvalidAuditFilter(OnceflowError):
    """A filter or cursor of the trail that cannot be understood (a 400 / 422)."""


@dataclass(frozen=True, slots=True)
class Actor:
    """Who acts, and from where: an API key's name (admin API), ``console:<key name>``,
    ``cli:<OS user>``; ``client`` is the peer address of an HTTP request."""

    name: str
    front_end: FrontEnd
    client: str | None = None

    @classmethod
    def admin_api(cls, key_name: str, client: str | None = None) -> Actor:
        return cls(key_name, FrontEnd.ADMIN_API, client)

    @classmethod
    def console(cls, key_name: str, client: str | None = None) -> Actor:
        return cls(f"console:{key_name}", FrontEnd.CONSOLE, client)

    @classmethod
    def cli(cls, os_user: str) -> Actor:
        return cls(f"cli:{os_user}", FrontEnd.CLI)


@dataclass(frozen=True, slots=True)
class ActionEntry:
    """One row of the trail (``id`` and ``at`` are None until the database gave them)."""

    actor: str
    front_end: FrontEnd
    action: OperatorAction
    result: ActionResult
    workflow: str | None = None
    job_id: str | None = None
    filter: dict[str, Any] | None = None
    bulk_id: int | None = None
    client: str | None = None
    detail: str | None = None
    id: int | None = None
    at: datetime | None = None

    def to_dict(self) -> dict[str, Any]:
        doc = {f.name: getattr(self, f.name) for f in fields(self)}
        doc["at"] = self.at.isoformat() if self.at else None
        return doc

    def target(self) -> str:
        """The instance, filter or nothing it acted on, in words (the log message)."""
        if self.job_id:
            return f"{self.workflow or '?'}/{self.job_id}"
        if self.filter is not None:
            return orjson.dumps(self.filter).decode()
        return "-"


def _bounded(text: str | None, limit: int) -> str | None:
    """At most ``limit`` characters, NUL characters dropped (text holds none)."""
    if text is None:
        return None
    text = text.replace("\x00", "")
    return text if len(text) <= limit else text[: limit - 1] + "…"


def _name(value: str | None) -> str | None:
    """A workflow name or job id as given, or None when it is too long (or holds a
    NUL): a cut-off id would name another instance."""
    if value is None or len(value) > MAX_NAME_CHARS or "\x00" in value:
        return None
    return value


def _filter(value: Mapping[str, Any] | None) -> dict[str, Any] | None:
    if value is None:
        return None
    text = orjson.dumps(value, default=str).decode().replace("\\u0000", "")
    if len(text.encode()) <= MAX_FILTER_BYTES:
        return orjson.loads(text)
    return {"truncated": _bounded(text, MAX_FILTER_BYTES // 2)}


def entry(
    actor: Actor,
    action: OperatorAction,
    result: ActionResult = ActionResult.OK,
    *,
    workflow: str | None = None,
    job_id: str | None = None,
    filter: Mapping[str, Any] | None = None,
    bulk_id: int | None = None,
    detail: str | None = None,
) -> ActionEntry:
    """An entry with every value bounded as the table requires."""
    return ActionEntry(
        actor=_bounded(actor.name, MAX_ACTOR_CHARS) or "-",
        front_end=FrontEnd(actor.front_end),
        action=OperatorAction(action),
        result=ActionResult(result),
        workflow=_name(workflow),
        job_id=_name(job_id),
        filter=_filter(filter),
        bulk_id=bulk_id,
        client=_bounded(actor.client, MAX_CLIENT_CHARS),
        detail=_bounded(detail, MAX_DETAIL_CHARS),
    )


_INSERT = sa.text(
    "INSERT INTO onceflow_operator_actions"
    " (actor, front_end, action, result, workflow, job_id, filter, bulk_id, client, detail)"
    " VALUES (:actor, :front_end, :action, :result, :workflow, :job_id,"
    " CAST(:filter AS jsonb), :bulk_id, :client, :detail) RETURNING id, at"
)


def insert(conn: Connection, e: ActionEntry) -> ActionEntry:
    """Write ``e`` on ``conn``'s transaction; the entry with its id and time."""
    params = {f.name: getattr(e, f.name) for f in fields(e) if f.name not in ("id", "at")}
    params["filter"] = orjson.dumps(e.filter).decode() if e.filter is not None else None
    row = conn.execute(_INSERT, params).one()
    return replace(e, id=int(row.id), at=row.at)


def record(
    target: Connection | Engine, actor: Actor, action: OperatorAction, **kw: Any
) -> ActionEntry:
    """Record an action (keywords: those of :func:`entry`). On a ``Connection``, the row
    joins its open transaction and the caller calls :func:`announce` once it has
    committed; on an ``Engine``, the row is committed in its own transaction and
    announced here."""
    e = entry(actor, action, **kw)
    if isinstance(target, Connection):
        return insert(target, e)
    with target.begin() as conn:
        e = insert(conn, e)
    announce(e)
    return e


def record_quietly(db: Engine, e: ActionEntry) -> ActionEntry:
    """Commit ``e`` in its own transaction and announce it; when the database cannot
    take it, announce it anyway (``audit_id: null``) and say why, never raise: a
    refusal or an error stays what it was for the caller."""
    try:
        with db.begin() as conn:
            e = insert(conn, e)
    except Exception as exc:
        log.warning(
            "operator action not recorded: %s",
            type(exc).__name__,
            extra={"event": "operator.audit_unrecorded", "action": str(e.action)},
        )
    announce(e)
    return e


def announce(e: ActionEntry | None) -> None:
    """The action's log line (nothing for None: no actor, nothing recorded)."""
    if e is None:
        return
    level = logging.INFO if e.result == ActionResult.OK else logging.WARNING
    log.log(
        level,
        "%s %s %s: %s",
        e.actor,
        e.action,
        e.target(),
        e.result,
        extra={
            "event": f"operator.{e.action}",
            "actor": e.actor,
            "front_end": str(e.front_end),
            "job_id": e.job_id,
            "workflow": e.workflow,
            "bulk_id": e.bulk_id,
            "result": str(e.result),
            "detail": e.detail,
            "client": e.client,
            "audit_id": e.id,
        },
    )


def outcome_of(exc: BaseException) -> ActionResult:
    """A refusal (an operation that does not apply, an input refused: onceflow's own
    errors) or an error (the database or Kafka failed on the way)."""
    if isinstance(exc, OnceflowError) and not isinstance(exc, ServiceUnavailable):
        return ActionResult.REFUSED
    return ActionResult.ERROR


def failure_detail(exc: BaseException) -> str:
    if outcome_of(exc) == ActionResult.REFUSED:
        return str(exc)
    return f"{type(exc).__name__}: {exc}"


@contextmanager
def failures_recorded(
    db: Engine, actor: Actor | None, action: OperatorAction, **kw: Any
) -> Iterator[None]:
    """Record the block's exception (refused or error, :func:`outcome_of`) for ``actor``
    in its own transaction, and re-raise it. The block's own transaction has rolled
    back by then, so the action and this row never both exist."""
    try:
        yield
    except Exception as exc:
        if actor is not None:
            failed = entry(actor, action, outcome_of(exc), detail=failure_detail(exc), **kw)
            record_quietly(db, failed)
        raise


# --- reading the trail --------------------------------------------------------------------


@dataclass(frozen=True, slots=True)
class ActionFilter:
    """Which rows: every field set narrows (AND); all None is the whole trail."""

    actor: str | None = None
    action: OperatorAction | None = None
    job_id: str | None = None
    front_end: FrontEnd | None = None
    result: ActionResult | None = None

    @classmethod
    def from_params(cls, params: Mapping[str, str]) -> ActionFilter:
        """From query parameters or CLI options (empty values count as not given);
        :class:`InvalidAuditFilter` names what is wrong."""

        def given(name: str) -> str | None:
            value = (params.get(name) or "").strip()
            if "\x00" in value:
                raise InvalidAuditFilter(f"{name} holds a NUL character")
            if len(value) > MAX_NAME_CHARS:
                raise InvalidAuditFilter(f"{name} is over {MAX_NAME_CHARS} characters")
            return value or None

        return cls(
            actor=given("actor"),
            action=_closed(OperatorAction, "action", given("action")),
            job_id=given("job_id"),
            front_end=_closed(FrontEnd, "front_end", given("front_end")),
            result=_closed(ActionResult, "result", given("result")),
        )

    def as_params(self) -> dict[str, str]:
        return {f.name: str(v) for f in fields(self) if (v := getattr(self, f.name)) is not None}


def _closed(vocabulary: Any, name: str, value: str | None) -> Any:
    if value is None:
        return None
    try:
        return vocabulary(value)
    except ValueError:
        allowed = ", ".join(v.value for v in vocabulary)
        raise InvalidAuditFilter(f"unknown {name} {value!r} (one of: {allowed})") from None


@dataclass(frozen=True, slots=True)
class ActionPage:
    rows: list[ActionEntry] = field(default_factory=list)
    next_cursor: str | None = None  # the next (older) page, or None at the end


def _cursor(text: str | None) -> int | None:
    if text is None or text == "":
        return None
    if not text.isdigit() or len(text) > 18:
        raise InvalidAuditFilter(f"invalid cursor {text[:40]!r}")
    return int(text)


def _row(r: Row) -> ActionEntry:
    return ActionEntry(
        actor=r.actor,
        front_end=FrontEnd(r.front_end),
        action=OperatorAction(r.action),
        result=ActionResult(r.result),
        workflow=r.workflow,
        job_id=r.job_id,
        filter=r.filter,
        bulk_id=r.bulk_id,
        client=r.client,
        detail=r.detail,
        id=int(r.id),
        at=r.at,
    )


def _page_sql(where: list[str]) -> sa.TextClause:
    """A page of the trail under the conditions ``where``; built per call, since only
    the conditions a filter sets enter the statement (so each is served by its index)."""
    return sa.text(
        "SELECT id, at, actor, front_end, action, result, workflow, job_id, filter,"
        " bulk_id, client, detail FROM onceflow_operator_actions"
        f" WHERE {' AND '.join(where)} ORDER BY id DESC LIMIT :n"
    )


def list_actions(
    db: Engine, f: ActionFilter | None = None, cursor: str | None = None, limit: int = 50
) -> ActionPage:
    """A page of the trail, newest first; ``next_cursor`` fetches the older one. Only
    the conditions ``f`` sets enter the statement, so a job id or an actor is served by
    its index, the rest by the primary key's backward scan."""
    f = f or ActionFilter()
    limit = max(1, min(limit, MAX_LIMIT))
    before = _cursor(cursor)
    given = f.as_params()
    params: dict[str, Any] = {**given, "n": limit + 1}
    # the column names are the filter's own field names, never input
    where = ["TRUE", *(f"{name} = :{name}" for name in given)]
    if before is not None:
        where.append("id < :id_before")
        params["id_before"] = before
    with db.connect() as conn:
        rows = conn.execute(_page_sql(where), params).all()
    page = [_row(r) for r in rows[:limit]]
    more = len(rows) > limit
    return ActionPage(page, str(page[-1].id) if more and page else None)


_DELETE_OLDER = sa.text("DELETE FROM onceflow_operator_actions WHERE at < :before")


def delete_older_than(conn: Connection, before: datetime) -> int:
    """Retention (:func:`workflow_engine.store.writes.maintenance.prune`): rows older than
    ``before``, in ``conn``'s transaction; how many."""
    return conn.execute(_DELETE_OLDER, {"before": before}).rowcount
