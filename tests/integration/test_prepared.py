"""The engine's prepared statements (workflow_engine/store/prepared.py) on a real
PostgreSQL: typed from their CASTs, run with arguments cast to those types (an array of
only NULLs, an empty array), a ``%`` and a ``::`` cast in the text, prepared once per
connection and again on a new one, kept through a rolled-back transaction."""

from __future__ import annotations

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
