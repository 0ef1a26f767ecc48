"""The database URL forms onceflow accepts, and which errors mean "retry elsewhere"."""

from __future__ import annotations

import psycopg2
import pytest
import sqlalchemy as sa

from workflow_engine.store import is_transient, libpq_dsn, make_engine, sqlalchemy_url

MULTI = "postgresql://postgres@10.0.0.1:5432,10.0.0.2:5433/onceflow?target_session_attrs=read-write"


@pytest.mark.parametrize(
    ("given", "expected"),
    [
        ("postgres://u@h:1/db", "postgresql+psycopg2://u@h:1/db"),
        ("postgresql://u:p@h/db?sslmode=require", "postgresql+psycopg2://u:p@h/db?sslmode=require"),
        (
            MULTI,
            "postgresql+psycopg2://postgres@/onceflow?host=10.0.0.1%3A5432&host=10.0.0.2%3A5433"
            "&target_session_attrs=read-write",
        ),
        ("postgresql://a,b/db", "postgresql+psycopg2:///db?host=a&host=b"),
    ],
)
def test_urls(given: str, expected: str) -> None:
    assert sqlalchemy_url(given) == expected


def test_a_multi_host_url_reaches_libpq_as_host_and_port_lists() -> None:
    db = make_engine(MULTI, pool_size=1)
    dsn = dict(part.split("=", 1) for part in libpq_dsn(db).split())
    assert dsn["host"] == "10.0.0.1,10.0.0.2"
    assert dsn["port"] == "5432,5433"
    assert dsn["target_session_attrs"] == "read-write"
    assert dsn["dbname"] == "onceflow"


def _dbapi_error(cls: type[sa.exc.DBAPIError], invalidated: bool) -> sa.exc.DBAPIError:
    return cls("INSERT", {}, psycopg2.Error("x"), connection_invalidated=invalidated)


def test_which_errors_are_transient() -> None:
    assert is_transient(_dbapi_error(sa.exc.OperationalError, False))
    assert is_transient(_dbapi_error(sa.exc.InterfaceError, False))
    # A refused write on a server that is no longer the primary (marked a disconnect).
    assert is_transient(_dbapi_error(sa.exc.InternalError, True))
    # A constraint violation or a bad statement is the write's own fault.
    assert not is_transient(_dbapi_error(sa.exc.IntegrityError, False))
    assert not is_transient(_dbapi_error(sa.exc.InternalError, False))
    assert not is_transient(ValueError("x"))
