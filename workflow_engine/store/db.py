"""Connections to PostgreSQL (SQLAlchemy 2 Core over psycopg2).

High availability (docs/operations.md, "PostgreSQL high availability"): a libpq multi-host
URL (``postgresql://h1:p1,h2:p2/db?target_session_attrs=read-write``) lets libpq find
whichever server is the primary now. After a failover, a pooled connection is either
dead (the pre-ping replaces it) or, if its server was demoted but lives on, read-only:
that error is marked a disconnect here, so SQLAlchemy drops the whole pool and the
caller's retry connects to the new primary. :func:`is_transient` is the one test the
worker and the engine use to decide "wait and retry" against "this write is wrong".
"""

from __future__ import annotations

from functools import lru_cache
from urllib.parse import quote

import psycopg2.errorcodes
import psycopg2.extensions
import sqlalchemy as sa
from sqlalchemy.engine import Engine, ExceptionContext
from tenacity import retry, retry_if_exception, stop_after_attempt, wait_random_exponential

from onceflow.errors import ServiceUnavailable

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


def make_engine(database_url: str, pool_size: int = 8) -> Engine:
    engine = sa.create_engine(
        sqlalchemy_url(database_url),
        pool_size=pool_size,
        max_overflow=pool_size,
        pool_pre_ping=True,
        future=True,
    )
    sa.event.listen(engine, "handle_error", _not_primary_is_a_disconnect)
    return engine


def _not_primary_is_a_disconnect(context: ExceptionContext) -> None:
    """A server that is no longer the primary answers ``SELECT 1`` (so the pre-ping keeps
    its connections) but refuses writes: treat that as a lost connection, which makes
    SQLAlchemy invalidate the pool."""
    code = getattr(context.original_exception, "pgcode", None)
    if code in NOT_PRIMARY:
        context.is_disconnect = True


def is_transient(exc: BaseException) -> bool:
    """The database cannot answer right now (down, failing over, not the primary): the
    caller should wait and retry, never record the failure as the job's."""
    if isinstance(exc, sa.exc.OperationalError | sa.exc.InterfaceError | sa.exc.DisconnectionError):
        return True
    return isinstance(exc, sa.exc.DBAPIError) and exc.connection_invalidated


def libpq_dsn(engine: Engine) -> str:
    """The engine's connection parameters as a libpq DSN, multi-host included (for the
    connections that do not go through the pool: LISTEN)."""
    _, params = engine.dialect.create_connect_args(engine.url)
    return psycopg2.extensions.make_dsn(**params)


@lru_cache(maxsize=8)
def shared_engine(database_url: str) -> Engine:
    """One pooled engine per URL per process."""
    return make_engine(database_url)


def check_connection(engine: Engine) -> None:
    try:
        with engine.connect() as conn:
            conn.execute(sa.text("SELECT 1"))
    except sa.exc.OperationalError as exc:
        raise ServiceUnavailable(f"PostgreSQL unreachable at {engine.url!r}: {exc.orig}") from None


def database_ready(database_url: str) -> bool:
    """Readiness check: can this process reach PostgreSQL right now?"""
    try:
        with shared_engine(database_url).connect() as conn:
            conn.exec_driver_sql("SELECT 1")
        return True
    except Exception:
        return False


def _deadlocked(exc: BaseException) -> bool:
    code = getattr(getattr(exc, "orig", None), "pgcode", None)
    return code == psycopg2.errorcodes.DEADLOCK_DETECTED


#: Run a whole transaction again when PostgreSQL chose it as a deadlock's victim (it
#: was rolled back, so running it again is safe). Control operations lock a parent,
#: then its children; an engine finishing a child locks the child, then its parent:
#: the two orders can meet, and the operator's request should not answer 500 for it.
retry_on_deadlock = retry(
    retry=retry_if_exception(_deadlocked),
    stop=stop_after_attempt(5),
    wait=wait_random_exponential(multiplier=0.02, max=0.5),
    reraise=True,
)
