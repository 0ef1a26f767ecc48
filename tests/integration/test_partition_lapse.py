"""Partition maintenance under load, on real PostgreSQL: after a maintenance lapse the
range that covers now is being written while it would be attached (23514 on
ccfa842, every round); a partition that meets any error waits for the next round
while the round does the rest of its work."""

from __future__ import annotations

import itertools
from concurrent.futures import Future, ThreadPoolExecutor
from datetime import datetime, timedelta
from typing import Any

import pytest
import sqlalchemy as sa
from sqlalchemy.engine import Connection, Engine

from onceflow.envelope import JobEnvelope
from tests.integration.test_partitioning import (
    DAY,
    MONTH,
    WEEK,
    _add_old_partition,
    _detach_waits,
    _exists,
    _instance_with_old_attempt,
    _live_with_attempt_today,
    _now,
    _partitions,
    _wait_for,
    _where,
)
from workflow_engine.model import Delivery
from workflow_engine.store import partitions as parts
from workflow_engine.store import writes
from workflow_engine.store.writes import create_instances, prune


def _lapse(db: Engine) -> None:
    """Maintenance did not run for longer than its partitions ahead: yesterday's
    partition is the newest one, nothing covers now (rows for now go to default)."""
    for parent in writes.PARTITIONED_TABLES:
        _add_old_partition(db, parent, 1)
        with db.begin() as conn:
            for p in writes.partitions(conn, parent):
                if p.upper > _now(db):  # test-made names from the catalog, no input
                    conn.execute(sa.text(f"ALTER TABLE {parent} DETACH PARTITION {p.name}"))
                    conn.execute(sa.text(f"DROP TABLE {p.name}"))
    for parent in writes.PARTITIONED_TABLES:
        assert _partitions(db, parent)[-1].upper <= _now(db)


def _waits_on_the_default_partition(db: Engine) -> bool:
    """Whether a maintenance statement waits for a lock on the attempts' default
    partition (an ATTACH: it must not miss a row a writer still has in flight)."""
    return bool(
        _where(
            db,
            "SELECT 1 FROM pg_locks WHERE NOT granted"
            " AND relation = 'onceflow_step_attempts_default'::regclass"
            " AND database = (SELECT oid FROM pg_database WHERE datname = current_database())",
        )
    )


def _round(db: Engine, pool: ThreadPoolExecutor, ahead: int = 3) -> Future[dict[str, int]]:
    return pool.submit(prune, db, WEEK, MONTH, partitions_ahead=ahead)


def _attempt_in_flight(writer: Connection, job_id: str, started_at: Any = None) -> None:
    """An engine's transaction that has written a step attempt and not yet committed."""
    writer.execute(
        sa.text(
            "UPDATE onceflow_instances SET status = 'sleeping' WHERE job_id = :j;"
            "INSERT INTO onceflow_steps (job_id, position, name, status, attempts)"
            " VALUES (:j, 0, 'charge', 'running', 1);"
            "INSERT INTO onceflow_step_attempts (job_id, position, attempt, engine_id,"
            " started_at) VALUES (:j, 0, 1, 'e1', coalesce(CAST(:at AS timestamptz), now()))"
        ),
        {"j": job_id, "at": started_at},
    )


def _where_is(db: Engine, job_id: str) -> str:
    [(where,)] = _where(
        db,
        "SELECT tableoid::regclass::text FROM onceflow_step_attempts WHERE job_id = :j",
        j=job_id,
    )
    return str(where)


def test_after_a_lapse_the_range_being_written_is_not_attached_and_the_round_goes_on(
    db, monkeypatch
):
    """ccfa842 created the partition covering now: its move took the rows committed in
    the default partition, then the ATTACH found one an engine committed meanwhile
    (23514) and the whole round failed, every round while the load lasted. Now a new
    partition starts ahead of the clock, where no row can be yet, and the range that
    is being written stays in the default partition."""
    monkeypatch.setattr(parts, "LOCK_TIMEOUT", "20s")  # the interleaving, not a timeout
    _lapse(db)
    _instance_with_old_attempt(db, "gone", 1, "complete", finished_days_ago=19)  # to prune
    _live_with_attempt_today(db, "today", 2)  # committed in the default partition
    create_instances(db, [Delivery(JobEnvelope("busy", "order-workflow", {}), "t", 0, 3)])
    with db.connect() as writer, ThreadPoolExecutor(1) as pool:
        writer.execute(sa.text("SET lock_timeout = '20s'"))  # a regression fails, not hangs
        _attempt_in_flight(writer, "busy")  # started now, not committed yet
        first = _round(db, pool)
        _wait_for(
            lambda: _waits_on_the_default_partition(db) or first.done(),
            "the round's attach to wait for the writer",
        )
        assert not first.done(), "the attach did not wait for the writer's transaction"
        writer.commit()  # the engine's transaction commits while the attach waits
        pruned = first.result(timeout=60)

    assert pruned["instances"] == 1  # the rest of the round was done
    now = _now(db)
    for parent in writes.PARTITIONED_TABLES:
        found = _partitions(db, parent)
        ahead = [p for p in found if p.upper > now]
        assert ahead and now < ahead[0].lower <= now + timedelta(minutes=10), (parent, ahead)
        assert all(a.upper == b.lower for a, b in itertools.pairwise(ahead))
        assert ahead[-1].upper >= now + 3 * DAY
        assert ahead[1].lower == writes.aligned(ahead[1].lower, DAY)  # back on day bounds
    assert _where_is(db, "today") == _where_is(db, "busy") == "onceflow_step_attempts_default"

    again = prune(db, WEEK, MONTH)
    assert again["partitions_created"] == 0
    # A row from the first new partition's start lands in it.
    first_new = next(p for p in _partitions(db, writes.STEP_ATTEMPTS) if p.upper > now)
    create_instances(db, [Delivery(JobEnvelope("later", "order-workflow", {}), "t", 0, 4)])
    with db.begin() as conn:
        _attempt_in_flight(conn, "later", first_new.lower)
    assert _where_is(db, "later") == first_new.name


def _postponed(caplog: pytest.LogCaptureFixture) -> list[tuple[str, str, str, str]]:
    """(action, table, reason, SQLSTATE) of each partition left for the next round."""
    return [
        (r.action, r.table, r.reason, r.sqlstate)  # type: ignore[attr-defined]
        for r in caplog.records
        if getattr(r, "event", None) == "store.partition_postponed"
    ]


def _newest(db: Engine, parent: str) -> datetime:
    return _partitions(db, parent)[-1].upper


def test_a_partition_that_fails_to_attach_waits_for_the_next_round_alone(db, monkeypatch, caplog):
    """Any error a creation meets (here 23514: a row ahead of the clock, as a failover to
    a server whose clock is behind leaves, committed into the range while its attach
    waited) leaves that table's next partitions for the next round: the other table
    gets its partitions and the round does the rest of its work; the next round moves
    the row and creates them."""
    monkeypatch.setattr(parts, "LOCK_TIMEOUT", "20s")
    _instance_with_old_attempt(db, "gone", 1, "complete", finished_days_ago=19)
    create_instances(db, [Delivery(JobEnvelope("skewed", "order-workflow", {}), "t", 0, 2)])
    attempts_end = _newest(db, writes.STEP_ATTEMPTS)
    ahead_of_clock = attempts_end + timedelta(hours=1)  # in the range the round creates
    with db.connect() as writer, ThreadPoolExecutor(1) as pool:
        writer.execute(sa.text("SET lock_timeout = '20s'"))
        _attempt_in_flight(writer, "skewed", ahead_of_clock)
        first = _round(db, pool, ahead=5)
        _wait_for(
            lambda: _waits_on_the_default_partition(db) or first.done(),
            "the round's attach to wait for the writer",
        )
        assert not first.done(), "the attach did not wait for the writer's transaction"
        writer.commit()
        pruned = first.result(timeout=60)

    assert pruned["instances"] == 1
    assert _newest(db, writes.STEP_ATTEMPTS) == attempts_end  # left for the next round
    assert _postponed(caplog) == [("creation", writes.STEP_ATTEMPTS, "rows_in_range", "23514")]
    assert _newest(db, writes.DUPLICATE_DELIVERIES) >= _now(db) + 5 * DAY  # not held back
    assert _where_is(db, "skewed") == "onceflow_step_attempts_default"

    second = prune(db, WEEK, MONTH, partitions_ahead=5)
    assert second["partitions_created"] >= 1
    assert _newest(db, writes.STEP_ATTEMPTS) >= _now(db) + 5 * DAY
    assert _where_is(db, "skewed") != "onceflow_step_attempts_default"  # moved in


def test_a_retirement_cut_off_by_any_error_waits_for_the_next_round(db, monkeypatch, caplog):
    """A retire whose detach is cancelled (57014: an operator's pg_cancel_backend or a
    statement_timeout) while it waits for an engine's transaction: ccfa842 let the
    error out and the round stopped there; now the partition waits for the next round
    and the round goes on."""
    monkeypatch.setattr(parts, "LOCK_TIMEOUT", "20s")
    old = _add_old_partition(db, writes.STEP_ATTEMPTS, 19.5)
    _instance_with_old_attempt(db, "gone", 1, "complete", finished_days_ago=19)
    _instance_with_old_attempt(db, "live", 2, "sleeping", finished_days_ago=None)
    with db.connect() as engine_tx, ThreadPoolExecutor(1) as pool:
        engine_tx.execute(
            sa.text(
                "UPDATE onceflow_step_attempts SET error = 'late'"
                " WHERE job_id = 'live' AND position = 0 AND attempt = 1"
            )
        )
        first = _round(db, pool)
        _wait_for(lambda: _detach_waits(db) or first.done(), "the retire to reach its detach")
        assert not first.done(), "the detach did not wait for the engine's transaction"
        [(cancelled,)] = _where(
            db,
            "SELECT pg_cancel_backend(pid) FROM pg_stat_activity"
            " WHERE datname = current_database() AND wait_event_type = 'Lock'"
            " AND query LIKE '%onceflow_retire_partition%'",
        )
        assert cancelled
        engine_tx.commit()
        pruned = first.result(timeout=60)

    assert _exists(db, old) and pruned["partitions_dropped"] == 0
    assert pruned["instances"] == 1  # the round went on past the cut-off retire
    assert _postponed(caplog) == [("retirement", writes.STEP_ATTEMPTS, "cancelled", "57014")]
    retired = prune(db, WEEK, MONTH)
    assert retired["partitions_dropped"] == 1 and not _exists(db, old)
    assert _where(db, "SELECT job_id, error FROM onceflow_step_attempts") == [("live", "late")]
