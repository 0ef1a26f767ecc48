"""The streams worker's batch handler, by SQLSTATE (issue 23, case 1): a transient error
is retried until the worker stops, a row at fault is isolated and dead-lettered, never
retried; the rest of the batch is created, in order."""

from __future__ import annotations

import threading
import time

import pytest
import sqlalchemy as sa

import streams.batch
from onceflow.envelope import JobEnvelope
from onceflow.settings import Settings
from onceflow.vocabulary import DeadLetterReason
from streams.batch import BatchHandler, StoppedRetrying
from workflow_engine.model import CreateResult, Delivery, Registry


class _Orig(Exception):
    def __init__(self, pgcode: str | None, message: str) -> None:
        super().__init__(message)
        self.pgcode = pgcode


def _refused() -> sa.exc.OperationalError:
    """What psycopg2 raises for a value too large for an index: an OperationalError."""
    return sa.exc.OperationalError("INSERT", {}, _Orig("54000", "index row requires 20016 bytes"))


def _unreachable() -> sa.exc.OperationalError:
    return sa.exc.OperationalError("INSERT", {}, _Orig(None, "connection refused"))


@pytest.fixture
def handler(monkeypatch) -> BatchHandler:
    monkeypatch.setattr(streams.batch, "_backoff", lambda attempt: 0.01)
    return BatchHandler(Settings(), None, lambda: None, Registry())  # type: ignore[arg-type]


def _delivery(job_id: str, offset: int) -> Delivery:
    return Delivery(JobEnvelope(job_id, "order-workflow", {}), "jobs", 0, offset)


def test_a_transient_error_is_retried_until_the_database_answers(handler) -> None:
    calls = []

    def create() -> str:
        calls.append(1)
        if len(calls) < 4:
            raise _unreachable()
        return "committed"

    assert handler.with_db_retry(create) == "committed"
    assert len(calls) == 4


def test_a_row_at_fault_is_raised_at_once_not_retried(handler) -> None:
    calls = []

    def create() -> None:
        calls.append(1)
        raise _refused()

    with pytest.raises(sa.exc.OperationalError):
        handler.with_db_retry(create)
    assert len(calls) == 1


def test_a_stopping_worker_stops_retrying_and_says_so(handler, monkeypatch) -> None:
    """Not a DBAPIError: the batch is abandoned, never taken for refused records."""
    monkeypatch.setattr(streams.batch, "_backoff", lambda attempt: 60.0)
    calls = []

    def create() -> None:
        calls.append(1)
        raise _unreachable()

    threading.Timer(0.2, handler.stop_retrying).start()
    started = time.monotonic()
    with pytest.raises(StoppedRetrying) as stopped:
        handler.with_db_retry(create)
    assert time.monotonic() - started < 10  # the 60 s wait ended when the stop came
    assert not isinstance(stopped.value, sa.exc.DBAPIError)
    assert "connection refused" in str(stopped.value)
    assert len(calls) == 1


def test_the_refused_records_are_isolated_and_the_rest_created_in_order(
    handler, monkeypatch
) -> None:
    chunk = [_delivery(f"job_{i}", i) for i in range(16)]
    poison = {"job_5", "job_11"}
    transactions: list[list[str]] = []

    def create_instances(db, deliveries):
        ids = [d.envelope.job_id for d in deliveries]
        transactions.append(ids)
        if poison & set(ids):
            raise _refused()
        return CreateResult(created=len(ids), created_ids=ids)

    letters = []
    monkeypatch.setattr(streams.batch, "create_instances", create_instances)
    monkeypatch.setattr(handler, "_dead_letter", letters.extend)
    monkeypatch.setattr(handler, "_report", lambda chunk, result: None)

    result = handler._create(chunk)

    assert result.created_ids == [f"job_{i}" for i in range(16) if f"job_{i}" not in poison]
    assert [(letter.job_id, letter.reason) for letter in letters] == [
        ("job_5", DeadLetterReason.DATABASE_REFUSED),
        ("job_11", DeadLetterReason.DATABASE_REFUSED),
    ]
    assert letters[0].detail == (
        "database rejected: SQLSTATE 54000: index row requires 20016 bytes"
    )
    assert len(transactions) < len(chunk)  # halves, not one transaction per record
    committed = [ids for ids in transactions if not poison & set(ids)]
    assert [i for ids in committed for i in ids] == result.created_ids  # in order
