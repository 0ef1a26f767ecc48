"""The engine's prepared statements (workflow_engine/store/prepared.py) on a real
PostgreSQL: typed from their CASTs, run with arguments cast to those types (an array of
only NULLs, an empty array), a ``%`` and a ``::`` cast in the text, prepared once per
connection and again on a new one, kept through a rolled-back transaction."""

from __future__ import annotations

import pytest
import sqlalchemy as sa

from workflow_engine.store.prepared import execute_prepared

STATEMENT = sa.text(
    """
SELECT t.n, t.label, t.at, CAST('{}' AS text)::text AS literal, '100%' AS pct
FROM unnest(CAST(:ns AS int[]), CAST(:labels AS text[]), CAST(:ats AS timestamptz[]))
    AS t(n, label, at)
WHERE :floor <= coalesce(t.n, 0) + CAST(:floor AS int)
ORDER BY t.n NULLS FIRST
"""
)


def _prepared(conn) -> int:
    return conn.execute(
        sa.text("SELECT count(*) FROM pg_prepared_statements WHERE name LIKE 'onceflow_%'")
    ).scalar_one()


def test_a_prepared_statement_runs_what_the_text_would(db):
    params = {"ns": [2, None, 1], "labels": ["b", None, "a"], "ats": [None] * 3, "floor": 0}
    with db.connect() as conn:
        expected = conn.execute(STATEMENT, params).all()
        assert [tuple(r) for r in execute_prepared(conn, STATEMENT, params)] == [
            tuple(r) for r in expected
        ]
        assert expected[0][0] is None and expected[0][3:] == ("{}", "100%")
        # only NULLs in the int array, and empty arrays: cast to the parameter's type
        only_nulls = {**params, "ns": [None, None], "labels": ["x", "y"], "ats": [None] * 2}
        assert len(execute_prepared(conn, STATEMENT, only_nulls).all()) == 2
        empty = {"ns": [], "labels": [], "ats": [], "floor": 0}
        assert execute_prepared(conn, STATEMENT, empty).all() == []
        assert _prepared(conn) == 1  # prepared once on this connection
        conn.rollback()
        assert len(execute_prepared(conn, STATEMENT, params).all()) == 3  # kept
        assert _prepared(conn) == 1
        conn.invalidate()  # a new DBAPI connection: its info is new, prepared again
        conn.rollback()
        assert len(execute_prepared(conn, STATEMENT, params).all()) == 3
        assert _prepared(conn) == 1


def test_a_statement_without_parameters(db):
    plain = sa.text("SELECT '5%' AS pct, CAST('x' AS text)::text")
    with db.connect() as conn:
        assert tuple(execute_prepared(conn, plain, {}).one()) == ("5%", "x")
        assert tuple(execute_prepared(conn, plain, {}).one()) == ("5%", "x")


def test_a_prepare_whose_types_query_failed_is_still_known(db):
    """PREPARE done, then the transaction failed before the parameters' types were
    read: the session keeps the statement, so the next use must not prepare it again
    (42P05 on every later batch, found in review)."""
    from workflow_engine.store import prepared

    statement = sa.text("SELECT CAST(:n AS int) + 1 AS m")
    form = prepared._form(statement)
    prepared._EXECUTES.pop(form.name, None)
    original = prepared._TYPES
    with db.connect() as conn:
        prepared._TYPES = sa.text("SELECT 1 / 0")
        try:
            with pytest.raises(sa.exc.DataError):
                execute_prepared(conn, statement, {"n": 1})
        finally:
            prepared._TYPES = original
        conn.rollback()
        assert _prepared(conn) == 1  # the server kept it
        assert execute_prepared(conn, statement, {"n": 1}).scalar_one() == 2


def test_a_session_whose_prepared_statements_no_longer_fit_is_a_lost_connection(db):
    """A migration that changes a result column's type leaves every pooled session's
    cached plan unusable (0A000), and a session whose record of its statements is wrong
    fails with 42P05 or 26000: the pool replaces the connection and the caller retries,
    instead of taking it for the row's fault (and dead-lettering every batch)."""
    from workflow_engine.store import is_transient

    with db.begin() as conn:
        conn.execute(sa.text("CREATE TABLE prep_probe (v int)"))
        conn.execute(sa.text("INSERT INTO prep_probe VALUES (1)"))
    statement = sa.text("SELECT v FROM prep_probe WHERE v >= CAST(:floor AS int)")
    try:
        with db.connect() as conn:
            assert execute_prepared(conn, statement, {"floor": 0}).scalar_one() == 1
            conn.rollback()
            with db.begin() as other:
                other.execute(sa.text("ALTER TABLE prep_probe ALTER COLUMN v TYPE bigint"))
            with pytest.raises(sa.exc.DBAPIError) as stale:
                execute_prepared(conn, statement, {"floor": 0})
            assert stale.value.connection_invalidated and is_transient(stale.value)
            # recognised by the raising function too, whatever language the server speaks
            assert stale.value.orig.diag.source_function == "RevalidateCachedQuery"
            conn.rollback()
            # a new session: prepared afresh, with the new type
            assert execute_prepared(conn, statement, {"floor": 0}).scalar_one() == 1
            conn.connection.info.clear()  # the record lost: PREPARE again fails 42P05
            with pytest.raises(sa.exc.DBAPIError) as twice:
                execute_prepared(conn, statement, {"floor": 0})
            assert twice.value.connection_invalidated and is_transient(twice.value)
    finally:
        with db.begin() as conn:
            conn.execute(sa.text("DROP TABLE prep_probe"))
