"""Connections to PostgreSQL (SQLAlchemy 2 Core over psycopg2).

High availability (docs/operations.md, "PostgreSQL high availability"): a libpq multi-host
URL (``postgresql://h1:p1,h2:p2/db?target_session_attrs=read-write``) lets libpq find
whichever server is the primary now. After a failover, a pooled connection is either
dead (the pre-ping replaces it) or, if its server was demoted but lives on, read-only:
that error is marked a disconnect here, so SQLAlchemy drops the whole pool and the
caller's retry connects to the new primary.

Errors are classified here, once, by SQLSTATE (:func:`classify`), never by exception
class: psycopg2 raises "index row too large" (54000) as an ``OperationalError``, the
same class as a dropped connection, and retrying the first forever wedges whoever
retries it. :func:`is_transient` is the test the worker and the engine use to decide
"wait and retry" against "this write is wrong".
"""

from __future__ import annotations

from enum import StrEnum
from functools import lru_cache
from urllib.parse import quote

import psycopg2.errorcodes
import psycopg2.extensions
import sqlalchemy as sa
from sqlalchemy.engine import Engine, ExceptionContext
from tenacity import retry, retry_if_exception, stop_after_attempt, wait_random_exponential

from onceflow.errors import ServiceUnavailable
from workflow_engine.store.lifecycle import session_options

# SQLSTATEs that mean "this server is not (or no longer) the primary": retry elsewhere.
NOT_PRIMARY = frozenset(
    {
        psycopg2.errorcodes.READ_ONLY_SQL_TRANSACTION,  # 25006, a demoted or standby server
        psycopg2.errorcodes.ADMIN_SHUTDOWN,  # 57P01, terminated by a demotion or stop
        psycopg2.errorcodes.CANNOT_CONNECT_NOW,  # 57P03, starting up or in recovery
    }
)


def sqlalchemy_url(database_url: str) -> str:
    """Accept plain ``postgresql://`` URLs (as libpq and psql do) and pick the driver.

    A multi-host URL (``h1:p1,h2:p2``) becomes SQLAlchemy's form for it, one ``host=``
    query parameter each; psycopg2 hands them to libpq as ``host=h1,h2 port=p1,p2``."""
    if database_url.startswith("postgres://"):
        database_url = "postgresql://" + database_url[len("postgres://") :]
    if database_url.startswith("postgresql://"):
        database_url = "postgresql+psycopg2://" + database_url[len("postgresql://") :]
    return _hosts_as_query(database_url)


def _hosts_as_query(url: str) -> str:
    scheme, sep, rest = url.partition("://")
    authority, _, tail = rest.partition("/")
    userinfo, at, hosts = authority.rpartition("@")
    if not sep or "," not in hosts:
        return url
    path, _, query = tail.partition("?")
    params = "&".join(f"host={quote(h, safe='')}" for h in hosts.split(","))
    query = f"{params}&{query}" if query else params
    return f"{scheme}://{userinfo}{at}/{path}?{query}"


def make_engine(database_url: str, pool_size: int = 8, *, lifecycle_events: bool = True) -> Engine:
    """A pooled engine. ``lifecycle_events=False`` (``ONCEFLOW_LIFECYCLE_EVENTS``) makes
    its sessions write no lifecycle events (``store.lifecycle``: the session setting
    ``onceflow.lifecycle_events`` that the statements test)."""
    options = session_options(lifecycle_events)
    db = sa.create_engine(
        sqlalchemy_url(database_url),
        pool_size=pool_size,
        max_overflow=pool_size,
        pool_pre_ping=True,
        future=True,
        connect_args={"options": options} if options else {},
    )
    sa.event.listen(db, "handle_error", _lost_session_is_a_disconnect)
    return db


#: A session whose prepared statements (``store.prepared``) no longer fit it: one
#: prepared twice (42P05) or missing (26000) when the pooled connection's record of
#: them is wrong, or a plan cached before a migration changed a result type (0A000).
_STALE_SESSION = frozenset(
    {
        psycopg2.errorcodes.DUPLICATE_PREPARED_STATEMENT,  # 42P05
        psycopg2.errorcodes.INVALID_SQL_STATEMENT_NAME,  # 26000
    }
)
_STALE_PLAN = "cached plan must not change result type"
#: The server function that raises it: the message is translated under a non-English
#: ``lc_messages``, the function's name is not.
_STALE_PLAN_SOURCE = "RevalidateCachedQuery"


def _lost_session_is_a_disconnect(context: ExceptionContext) -> None:
    """A server that is no longer the primary answers ``SELECT 1`` (so the pre-ping keeps
    its connections) but refuses writes: treat that as a lost connection, which makes
    SQLAlchemy invalidate the pool. The same for a session whose prepared statements no
    longer fit it (the pool for a migration's stale plans, which every session has; the
    one connection otherwise): new connections prepare them afresh, where retrying on
    this one would fail the same way forever (and dead-letter every record of the
    worker's batches)."""
    orig = context.original_exception
    code = getattr(orig, "pgcode", None)
    if code in NOT_PRIMARY or _stale_plan(orig, code):
        context.is_disconnect = True
    elif code in _STALE_SESSION:
        # one session's record gone wrong: replace this connection only
        context.is_disconnect = True
        context.invalidate_pool_on_disconnect = False


def _stale_plan(orig: BaseException, code: str | None) -> bool:
    """A plan cached before a migration changed a result type: every session has it."""
    if code != psycopg2.errorcodes.FEATURE_NOT_SUPPORTED:
        return False
    source = getattr(getattr(orig, "diag", None), "source_function", None)
    return source == _STALE_PLAN_SOURCE or _STALE_PLAN in str(orig)


class ErrorClass(StrEnum):
    """What to do about a database error (:func:`classify`)."""

    #: The database cannot answer right now (down, unreachable, failing over, not the
    #: primary, out of resources): wait and retry; never record it as the job's failure.
    TRANSIENT = "transient"
    #: PostgreSQL rolled the transaction back to resolve a conflict (serialization
    #: failure, deadlock): run the whole transaction again.
    RETRY_TRANSACTION = "retry_transaction"
    #: The row or the statement is at fault (bad data, a constraint, a value too large
    #: for an index, a bad statement): retrying changes nothing. Dead-letter the record,
    #: fail the step or the instance, and go on with the rest.
    ROW_AT_FAULT = "row_at_fault"


#: SQLSTATE classes (first two characters) that are the server's state, not the row's:
#: 08 connection exception, 53 insufficient resources (disk full, out of memory, too
#: many connections), 58 system error (I/O).
_TRANSIENT_CLASSES = frozenset({"08", "53", "58"})
_TRANSIENT_CODES = frozenset(
    {
        psycopg2.errorcodes.READ_ONLY_SQL_TRANSACTION,  # 25006, a demoted or standby server
        psycopg2.errorcodes.ADMIN_SHUTDOWN,  # 57P01
        psycopg2.errorcodes.CRASH_SHUTDOWN,  # 57P02
        psycopg2.errorcodes.CANNOT_CONNECT_NOW,  # 57P03, starting up or in recovery
        # A statement cancelled (statement_timeout, pg_cancel_backend) or a lock not
        # had in time (lock_timeout): a busy server, not a bad row; failing the rows for
        # it would dead-letter or error every job of a slow minute.
        psycopg2.errorcodes.QUERY_CANCELED,  # 57014
        psycopg2.errorcodes.LOCK_NOT_AVAILABLE,  # 55P03
    }
)
_RETRY_TRANSACTION_CODES = frozenset(
    {
        psycopg2.errorcodes.SERIALIZATION_FAILURE,  # 40001
        psycopg2.errorcodes.DEADLOCK_DETECTED,  # 40P01
    }
)


def sqlstate(exc: BaseException) -> str | None:
    """The SQLSTATE PostgreSQL answered with, if the error came from the server."""
    orig = getattr(exc, "orig", exc)
    code = getattr(orig, "pgcode", None)
    return code if isinstance(code, str) and code else None


def classify(exc: BaseException) -> ErrorClass | None:
    """How to handle ``exc``; None when it is not a database error at all (a bug, or a
    value the driver could not send, which the caller decides about)."""
    if isinstance(exc, sa.exc.DisconnectionError):
        return ErrorClass.TRANSIENT
    if not isinstance(exc, sa.exc.DBAPIError):
        return None
    if exc.connection_invalidated:  # a lost connection, or marked so (a demoted primary)
        return ErrorClass.TRANSIENT
    code = sqlstate(exc)
    if code is None:
        # No SQLSTATE: the driver's own error. A lost socket or a refused connection is
        # an OperationalError or an InterfaceError ("connection already closed");
        # anything else (a parameter it cannot adapt) is the statement's fault.
        if isinstance(exc, sa.exc.OperationalError | sa.exc.InterfaceError):
            return ErrorClass.TRANSIENT
        return ErrorClass.ROW_AT_FAULT
    if code in _RETRY_TRANSACTION_CODES:
        return ErrorClass.RETRY_TRANSACTION
    if code[:2] in _TRANSIENT_CLASSES or code in _TRANSIENT_CODES:
        return ErrorClass.TRANSIENT
    return ErrorClass.ROW_AT_FAULT


def constraint_of(exc: BaseException) -> str | None:
    """The name of the constraint PostgreSQL says ``exc`` violated (every constraint on
    the product tables is named, so a violation maps to a domain error by this name);
    None when the error names none or is not the server's."""
    orig = getattr(exc, "orig", exc)
    name = getattr(getattr(orig, "diag", None), "constraint_name", None)
    return name if isinstance(name, str) and name else None


def is_transient(exc: BaseException) -> bool:
    """The database cannot answer right now (down, failing over, not the primary): the
    caller should wait and retry, never record the failure as the job's."""
    return classify(exc) is ErrorClass.TRANSIENT


def is_row_at_fault(exc: BaseException) -> bool:
    """The database refused this write for good: retrying it changes nothing."""
    return classify(exc) is ErrorClass.ROW_AT_FAULT


def refusal(exc: BaseException, max_chars: int = 500) -> str:
    """A database error as one short line: ``SQLSTATE 54000: index row requires ...``
    (the server's primary message, not SQLAlchemy's text, which repeats the statement
    and every parameter, the 20 kB value that caused it included)."""
    orig = getattr(exc, "orig", None) or exc
    diag = getattr(orig, "diag", None)
    message = getattr(diag, "message_primary", None) or str(orig).strip().split("\n")[0]
    code = sqlstate(exc)
    text = f"SQLSTATE {code}: {message}" if code else f"{type(orig).__name__}: {message}"
    return text if len(text) <= max_chars else text[: max_chars - 1] + "…"


def libpq_dsn(db: Engine) -> str:
    """The engine's connection parameters as a libpq DSN, multi-host included (for the
    connections that do not go through the pool: LISTEN)."""
    _, params = db.dialect.create_connect_args(db.url)
    return psycopg2.extensions.make_dsn(**params)


@lru_cache(maxsize=8)
def shared_engine(database_url: str, lifecycle_events: bool = True) -> Engine:
    """One pooled engine per URL per process."""
    return make_engine(database_url, lifecycle_events=lifecycle_events)


_PING = sa.text("SELECT 1")
# A plain string for exec_driver_sql: the readiness probe goes straight to the driver,
# with nothing for SQLAlchemy to compile.
_DRIVER_PING = "SELECT 1"


def check_connection(db: Engine) -> None:
    try:
        with db.connect() as conn:
            conn.execute(_PING)
    except sa.exc.OperationalError as exc:
        raise ServiceUnavailable(f"PostgreSQL unreachable at {db.url!r}: {exc.orig}") from None


def database_ready(database_url: str) -> bool:
    """Readiness check: can this process reach PostgreSQL right now?"""
    try:
        with shared_engine(database_url).connect() as conn:
            conn.exec_driver_sql(_DRIVER_PING)
        return True
    except Exception:
        return False


def _must_rerun(exc: BaseException) -> bool:
    return classify(exc) is ErrorClass.RETRY_TRANSACTION


#: Run a whole transaction again when PostgreSQL rolled it back to resolve a conflict
#: (a deadlock's victim, a serialization failure): it was rolled back, so running it
#: again is safe. Control operations lock a parent, then its children; an engine
#: finishing a child locks the child, then its parent: the two orders can meet, and the
#: operator's request should not answer 500 for it.
retry_on_deadlock = retry(
    retry=retry_if_exception(_must_rerun),
    stop=stop_after_attempt(5),
    wait=wait_random_exponential(multiplier=0.02, max=0.5),
    reraise=True,
)
