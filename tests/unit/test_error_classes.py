"""Database errors are classified by SQLSTATE in one place (workflow_engine.store.db),
never by exception class (issue 23): psycopg2 raises "index row too large" (54000) as an
``OperationalError``, the class of a dropped connection, and retrying it forever wedged
the streams worker."""

from __future__ import annotations

import psycopg2
import pytest
import sqlalchemy as sa

from workflow_engine import store
from workflow_engine.store import is_transient, retry_on_deadlock

# The names of the classes; the table below compares store.classify's answers to them (by
# name, so that the table also runs, and fails, on code from before the classifier).
T, RERUN, ROW = "transient", "retry_transaction", "row_at_fault"


def classify(exc: BaseException) -> str | None:
    answer = store.classify(exc)
    return None if answer is None else str(answer)


def is_row_at_fault(exc: BaseException) -> bool:
    return bool(store.is_row_at_fault(exc))


class _Diag:
    def __init__(self, message: str) -> None:
        self.message_primary = message


class _Orig(Exception):
    """A driver error as psycopg2 raises it for a server's answer (pgcode, diag)."""

    def __init__(self, pgcode: str | None, message: str = "refused") -> None:
        super().__init__(f"{message}\nDETAIL: more")
        self.pgcode = pgcode
        self.diag = _Diag(message)


def _error(
    cls: type[sa.exc.DBAPIError], pgcode: str | None, invalidated: bool = False
) -> sa.exc.DBAPIError:
    return cls("INSERT ...", {}, _Orig(pgcode), connection_invalidated=invalidated)


@pytest.mark.parametrize(
    ("cls", "pgcode", "expected"),
    [
        # the server cannot answer now: connection exceptions, shutdowns, recovery
        (sa.exc.OperationalError, "08006", T),  # connection failure
        (sa.exc.OperationalError, "08001", T),  # could not connect
        (sa.exc.OperationalError, "57P01", T),  # admin shutdown
        (sa.exc.OperationalError, "57P02", T),  # crash shutdown
        (sa.exc.OperationalError, "57P03", T),  # cannot connect now (recovery)
        (sa.exc.OperationalError, "53300", T),  # too many connections
        (sa.exc.OperationalError, "53100", T),  # disk full
        (sa.exc.OperationalError, "53200", T),  # out of memory
        (sa.exc.OperationalError, "58030", T),  # I/O error
        (sa.exc.InternalError, "25006", T),  # read-only transaction: a demoted primary
        (sa.exc.OperationalError, "57014", T),  # statement timeout / cancelled
        (sa.exc.OperationalError, "55P03", T),  # lock timeout
        # the server rolled the transaction back to resolve a conflict: run it again
        (sa.exc.OperationalError, "40001", RERUN),  # serialization failure
        (sa.exc.OperationalError, "40P01", RERUN),  # deadlock detected
        # the row or the statement is at fault, whatever the exception class
        (sa.exc.OperationalError, "54000", ROW),  # index row too large: OperationalError!
        (sa.exc.OperationalError, "54001", ROW),  # statement too complex
        (sa.exc.DataError, "22P05", ROW),  # \u0000 in jsonb
        (sa.exc.DataError, "22001", ROW),  # string too long for its column
        (sa.exc.IntegrityError, "23505", ROW),  # unique violation
        (sa.exc.IntegrityError, "23514", ROW),  # check violation
        (sa.exc.ProgrammingError, "42P01", ROW),  # undefined table
        (sa.exc.InternalError, "XX000", ROW),  # anything else the server says
        (sa.exc.InternalError, "P0001", ROW),  # raised by a function
        # no SQLSTATE: the driver's own error
        (sa.exc.OperationalError, None, T),  # lost socket, connection refused
        (sa.exc.InterfaceError, None, T),  # connection already closed
        (sa.exc.ProgrammingError, None, ROW),  # can't adapt a parameter
        (sa.exc.DataError, None, ROW),
    ],
)
def test_the_classification_table(cls, pgcode, expected) -> None:
    exc = _error(cls, pgcode)
    assert is_transient(exc) is (expected == T)
    assert classify(exc) == expected
    assert is_row_at_fault(exc) is (expected == ROW)


def test_a_connection_sqlalchemy_invalidated_is_transient_whatever_its_code() -> None:
    # handle_error marks a write refused by a demoted server a disconnect
    assert classify(_error(sa.exc.InternalError, "25006", invalidated=True)) == T
    assert classify(_error(sa.exc.InternalError, None, invalidated=True)) == T
    assert classify(_error(sa.exc.OperationalError, "54000", invalidated=True)) == T
    assert classify(sa.exc.DisconnectionError("pre-ping failed")) == T


def test_what_is_not_a_database_error_is_not_classified() -> None:
    assert classify(ValueError("A string literal cannot contain NUL (0x00) characters.")) is None
    assert classify(RuntimeError("x")) is None
    assert not is_transient(ValueError("x"))
    assert not is_row_at_fault(ValueError("x"))


def test_a_real_psycopg2_error_without_a_server_answer() -> None:
    exc = sa.exc.OperationalError("SELECT 1", {}, psycopg2.OperationalError("server closed"))
    assert store.sqlstate(exc) is None
    assert classify(exc) == T


def test_refusal_is_one_short_line_with_the_sqlstate() -> None:
    exc = sa.exc.OperationalError(
        "INSERT INTO onceflow_instances ...",
        {"params": "x" * 20_000},
        _Orig("54000", "index row requires 20016 bytes, maximum size is 8191"),
    )
    assert (
        store.refusal(exc) == "SQLSTATE 54000: index row requires 20016 bytes, maximum size is 8191"
    )
    assert len(store.refusal(_error(sa.exc.DataError, "22001"), max_chars=10)) == 10
    assert store.refusal(ValueError("NUL\nsecond line")) == "ValueError: NUL"


def test_a_serialization_failure_reruns_the_transaction_like_a_deadlock() -> None:
    calls = []

    @retry_on_deadlock
    def transaction() -> str:
        calls.append(1)
        if len(calls) < 3:
            raise _error(sa.exc.OperationalError, "40001")
        return "committed"

    assert transaction() == "committed"
    assert len(calls) == 3


class _ConstraintDiag(_Diag):
    def __init__(self, constraint: str | None) -> None:
        super().__init__("violates")
        self.constraint_name = constraint


def test_constraint_of_names_the_violated_constraint_or_none():
    named = _Orig("23505")
    named.diag = _ConstraintDiag("onceflow_steps_name_key")
    unnamed = _Orig("23505")
    unnamed.diag = _ConstraintDiag(None)
    error = sa.exc.IntegrityError("INSERT ...", {}, named)
    assert store.constraint_of(error) == "onceflow_steps_name_key"
    assert store.constraint_of(sa.exc.IntegrityError("INSERT ...", {}, unnamed)) is None
    assert store.constraint_of(_error(sa.exc.OperationalError, "08006")) is None
    assert store.constraint_of(ValueError("not the server's")) is None
