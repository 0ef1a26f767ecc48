"""Connections to PostgreSQL (SQLAlchemy 2 Core over psycopg2)."""

from __future__ import annotations

from functools import lru_cache

import sqlalchemy as sa
from sqlalchemy.engine import Engine

from onceflow.errors import ServiceUnavailable


def sqlalchemy_url(database_url: str) -> str:
    """Accept plain ``postgresql://`` URLs (as libpq and psql do) and pick the driver."""
    if database_url.startswith("postgres://"):
        database_url = "postgresql://" + database_url[len("postgres://") :]
    if database_url.startswith("postgresql://"):
        database_url = "postgresql+psycopg2://" + database_url[len("postgresql://") :]
    return database_url


def make_engine(database_url: str, pool_size: int = 8) -> Engine:
    return sa.create_engine(
        sqlalchemy_url(database_url),
        pool_size=pool_size,
        max_overflow=pool_size,
        pool_pre_ping=True,
        future=True,
    )


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
