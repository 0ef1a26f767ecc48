"""The CLI's one line for a database error comes from its SQLSTATE, not its class
(found in review: a 54000 'index row too large' read 'PostgreSQL unreachable')."""

from __future__ import annotations

import sqlalchemy as sa

from onceflow_cli.main import _explain


class _Diag:
    def __init__(self, message: str) -> None:
        self.message_primary = message


class _Orig(Exception):
    def __init__(self, pgcode: str | None, message: str) -> None:
        super().__init__(message)
        self.pgcode = pgcode
        self.diag = _Diag(message)


def _operational(pgcode: str | None, message: str) -> sa.exc.OperationalError:
    return sa.exc.OperationalError("SELECT 1", {}, _Orig(pgcode, message))


def test_a_row_the_database_refuses_is_not_called_an_outage():
    line = _explain(_operational("54000", "index row requires 20024 bytes"))
    assert line == "the database refused it: SQLSTATE 54000: index row requires 20024 bytes"


def test_a_lost_connection_is_an_outage():
    line = _explain(_operational(None, "could not connect to server: Connection refused"))
    assert line.startswith("PostgreSQL unreachable or not accepting writes: could not connect")


def test_a_missing_schema_says_what_to_run():
    exc = sa.exc.ProgrammingError("SELECT", {}, _Orig("42P01", 'relation "x" does not exist'))
    assert "run `onceflow migrate` first" in _explain(exc)
