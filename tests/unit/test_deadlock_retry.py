"""retry_on_deadlock: a transaction PostgreSQL chose as a deadlock's victim runs again;
any other error is the caller's at once."""

from __future__ import annotations

import psycopg2.errorcodes
import pytest
import sqlalchemy as sa

from workflow_engine.store import retry_on_deadlock


class _Orig(Exception):
    def __init__(self, pgcode: str) -> None:
        super().__init__(pgcode)
        self.pgcode = pgcode


def _error(pgcode: str) -> sa.exc.OperationalError:
    return sa.exc.OperationalError("UPDATE ...", {}, _Orig(pgcode))


def test_a_deadlock_victim_runs_again_until_it_commits():
    calls = []

    @retry_on_deadlock
    def operation() -> str:
        calls.append(1)
        if len(calls) < 3:
            raise _error(psycopg2.errorcodes.DEADLOCK_DETECTED)
        return "done"

    assert operation() == "done"
    assert len(calls) == 3


def test_other_errors_are_not_retried():
    calls = []

    @retry_on_deadlock
    def operation() -> None:
        calls.append(1)
        raise _error(psycopg2.errorcodes.UNIQUE_VIOLATION)

    with pytest.raises(sa.exc.OperationalError):
        operation()
    assert len(calls) == 1


def test_a_deadlock_that_keeps_coming_back_is_raised_after_five_attempts():
    calls = []

    @retry_on_deadlock
    def operation() -> None:
        calls.append(1)
        raise _error(psycopg2.errorcodes.DEADLOCK_DETECTED)

    with pytest.raises(sa.exc.OperationalError):
        operation()
    assert len(calls) == 5
