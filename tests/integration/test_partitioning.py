"""Time-partitioned history (migration 0012) on real PostgreSQL: partitions are made
ahead, retention drops whole partitions but never the history of a live instance, and
the job id stays globally unique whatever time range its rows fall in."""

from __future__ import annotations

import itertools
import time
import uuid
from collections.abc import Callable, Iterator
from concurrent.futures import ThreadPoolExecutor
from datetime import datetime, timedelta

import pytest
import sqlalchemy as sa
from sqlalchemy.engine import Engine, make_url

from onceflow.envelope import JobEnvelope
from onceflow_tools.stack import database_url_for, recreate_database
from workflow_engine.model import Delivery
from workflow_engine.store import (
    available_migrations,
    constraint_of,
    grant_app_role,
    make_engine,
    migrate,
    sqlalchemy_url,
    writes,
)
from workflow_engine.store import partitions as parts
from workflow_engine.store.writes import create_instances, prune
from workflow_engine.store.writes.requests import apply_restart

DAY = timedelta(days=1)
WEEK, MONTH = 7 * 86400, 30 * 86400


@pytest.fixture
def fresh_db(base_settings) -> Iterator[tuple[Engine, str]]:
    """An empty database (no migrations at all) and its URL."""
    name = f"onceflow_s_{uuid.uuid4().hex[:10]}"
    url = recreate_database(base_settings.database_url, name)
    db = make_engine(url, pool_size=2)
    yield db, url
    db.dispose()
    admin = make_engine(database_url_for(base_settings.database_url, "postgres"), pool_size=1)
    with admin.connect().execution_options(isolation_level="AUTOCOMMIT") as conn:
        conn.execute(sa.text(f'DROP DATABASE IF EXISTS "{name}" WITH (FORCE)'))
    admin.dispose()


def _now(db: Engine) -> datetime:
    with db.connect() as conn:
        return conn.execute(sa.text("SELECT now()")).scalar_one()


def _partitions(db: Engine, parent: str) -> list[writes.Partition]:
    with db.connect() as conn, conn.begin():
        return writes.partitions(conn, parent)


def _add_old_partition(db: Engine, parent: str, days_ago: float) -> str:
    """The daily partition holding the instant ``days_ago`` days back."""
    lower = writes.aligned(_now(db) - days_ago * DAY, DAY)
    with db.connect() as conn, conn.begin():
        name = writes.add_partition(conn, parent, lower, lower + DAY)
    assert name
    return name


def _exists(db: Engine, relation: str) -> bool:
    with db.connect() as conn:
        return conn.execute(sa.text("SELECT to_regclass(:r)"), {"r": relation}).scalar() is not None


def _where(db: Engine, sql: str, **params) -> list:
    with db.connect() as conn:
        return list(conn.execute(sa.text(sql), params).all())


def _instance_with_old_attempt(
    db: Engine, job_id: str, offset: int, status: str, finished_days_ago: float | None
) -> None:
    """An instance whose one step's attempt started 19.5 days ago."""
    create_instances(db, [Delivery(JobEnvelope(job_id, "order-workflow", {}), "t", 0, offset)])
    finished = (
        "NULL" if finished_days_ago is None else f"now() - interval '{finished_days_ago} days'"
    )
    with db.begin() as conn:
        conn.execute(
            sa.text(
                f"UPDATE onceflow_instances SET status = :s, finished_at = {finished}"
                " WHERE job_id = :j"
            ),
            {"s": status, "j": job_id},
        )
        conn.execute(
            sa.text(
                "INSERT INTO onceflow_steps (job_id, position, name, status, attempts,"
                " started_at, finished_at)"
                " VALUES (:j, 0, 'charge', 'complete', 1, now() - interval '19.5 days',"
                " now() - interval '19.4 days')"
            ),
            {"j": job_id},
        )
        conn.execute(
            sa.text(
                "INSERT INTO onceflow_step_attempts (job_id, position, attempt, engine_id,"
                " started_at, finished_at, outcome)"
                " VALUES (:j, 0, 1, 'e1', now() - interval '19.5 days',"
                " now() - interval '19.4 days', 'complete')"
            ),
            {"j": job_id},
        )


def test_partitions_are_created_ahead_and_take_the_new_rows(db):
    pruned = prune(db, WEEK, MONTH, partitions_ahead=5)
    now = _now(db)
    for parent in writes.PARTITIONED_TABLES:
        found = _partitions(db, parent)
        assert found[-1].upper >= now + 5 * DAY, (parent, found[-1])
        # contiguous: no gap a row could fall into between now and the horizon
        ahead = [p for p in found if p.upper > now]
        assert all(a.upper == b.lower for a, b in itertools.pairwise(ahead))
    assert pruned["partitions_created"] >= 2  # migration made 3 days ahead, we asked 5
    assert prune(db, WEEK, MONTH, partitions_ahead=5)["partitions_created"] == 0

    create_instances(db, [Delivery(JobEnvelope("p1", "order-workflow", {}), "t", 0, 1)])
    create_instances(db, [Delivery(JobEnvelope("p1", "order-workflow", {}), "t", 0, 2)])
    [(where,)] = _where(db, "SELECT tableoid::regclass::text FROM onceflow_duplicate_deliveries")
    assert where.startswith("onceflow_duplicate_deliveries_p2"), where


def test_retention_drops_expired_attempt_partitions_but_keeps_live_history(db):
    old = _add_old_partition(db, writes.STEP_ATTEMPTS, 19.5)
    _instance_with_old_attempt(db, "gone", 1, "complete", finished_days_ago=19)
    _instance_with_old_attempt(db, "asleep", 2, "sleeping", finished_days_ago=None)
    _instance_with_old_attempt(db, "recent", 3, "complete", finished_days_ago=1)
    assert _where(db, "SELECT DISTINCT tableoid::regclass::text FROM onceflow_step_attempts") == [
        (old,)
    ]

    pruned = prune(db, WEEK, MONTH)

    assert not _exists(db, old)
    assert pruned["partitions_dropped"] >= 1
    assert pruned["partition_rows_kept"] == 2
    assert pruned["instances"] == 1
    kept = _where(
        db,
        "SELECT job_id, tableoid::regclass::text, outcome FROM onceflow_step_attempts"
        " ORDER BY job_id",
    )
    assert kept == [
        ("asleep", "onceflow_step_attempts_default", "complete"),
        ("recent", "onceflow_step_attempts_default", "complete"),
    ]
    assert _where(db, "SELECT job_id FROM onceflow_instances ORDER BY 1") == [
        ("asleep",),
        ("recent",),
    ]
    # No foreign key cascades into the partitioned table: the next round deletes the
    # kept rows whose step is gone, from the default partition.
    with db.begin() as conn:
        conn.execute(sa.text("DELETE FROM onceflow_instances WHERE job_id = 'recent'"))
    assert prune(db, WEEK, MONTH)["partition_rows_orphaned"] == 1
    assert _where(db, "SELECT job_id FROM onceflow_step_attempts") == [("asleep",)]


def _wait_for(condition: Callable[[], bool], what: str, timeout: float = 30.0) -> None:
    deadline = time.monotonic() + timeout
    while not condition():
        assert time.monotonic() < deadline, f"timed out waiting for {what}"
        time.sleep(0.02)


def _detach_waits(db: Engine) -> bool:
    """Whether a retire waits for the parent's ACCESS EXCLUSIVE (its DETACH)."""
    return bool(
        _where(
            db,
            "SELECT 1 FROM pg_locks WHERE NOT granted AND mode = 'AccessExclusiveLock'"
            " AND relation = 'onceflow_step_attempts'::regclass"
            " AND database = (SELECT oid FROM pg_database WHERE datname = current_database())",
        )
    )


def _live_with_attempt_today(db: Engine, job_id: str, offset: int) -> None:
    """A live instance whose step's attempt started now (today's partition)."""
    create_instances(db, [Delivery(JobEnvelope(job_id, "order-workflow", {}), "t", 0, offset)])
    with db.begin() as conn:
        conn.execute(
            sa.text(
                "UPDATE onceflow_instances SET status = 'sleeping' WHERE job_id = :j;"
                "INSERT INTO onceflow_steps (job_id, position, name, status, attempts)"
                " VALUES (:j, 0, 'charge', 'running', 1);"
                "INSERT INTO onceflow_step_attempts (job_id, position, attempt, engine_id)"
                " VALUES (:j, 0, 1, 'e1')"
            ),
            {"j": job_id},
        )


# The engine's attempt UPDATE (execution._FINISH_STEPS): keyed on job id, position and
# attempt, never on started_at, so it locks every partition of the table.
_FINISH_ATTEMPT = (
    "UPDATE onceflow_step_attempts SET outcome = 'failed', error = 'late', finished_at = now()"
    " WHERE job_id = :j AND position = 0 AND attempt = 1"
)


def test_retiring_a_partition_neither_blocks_nor_loses_a_concurrent_checkpoint(db, monkeypatch):
    """0012 locked the partition SHARE while it looked for the rows to keep: the
    checkpoint below then waited on it while holding the parent the detach needs - a
    deadlock. Now the checkpoint goes through, and the kept row is the updated one."""
    monkeypatch.setattr(parts, "LOCK_TIMEOUT", "20s")  # the interleaving, not a timeout
    old = _add_old_partition(db, writes.STEP_ATTEMPTS, 19.5)
    _instance_with_old_attempt(db, "live", 1, "sleeping", finished_days_ago=None)
    _instance_with_old_attempt(db, "gone", 2, "complete", finished_days_ago=19)
    _live_with_attempt_today(db, "today", 3)
    today = writes.aligned(_now(db), DAY)
    cutoff = _now(db) - WEEK * timedelta(seconds=1)

    def retire() -> writes.Retired:
        with db.connect() as conn:
            return writes.retire_expired(conn, writes.STEP_ATTEMPTS, cutoff)

    with db.connect() as engine_tx, ThreadPoolExecutor(1) as pool:
        engine_tx.execute(sa.text("SET lock_timeout = '10s'"))  # a regression fails, not hangs
        # An open engine transaction already holds the parent (here through today's
        # partition alone: pruned on started_at, like the INSERT of a new attempt).
        engine_tx.execute(
            sa.text(_FINISH_ATTEMPT + " AND started_at >= :today"), {"j": "today", "today": today}
        )
        retired = pool.submit(retire)
        _wait_for(lambda: _detach_waits(db) or retired.done(), "the retire to reach its detach")
        # The checkpoint of the live instance lands in the retiring partition after
        # the retire read it, while the detach waits for this transaction.
        engine_tx.execute(sa.text(_FINISH_ATTEMPT), {"j": "live"})
        engine_tx.commit()
        result = retired.result(timeout=60)

    assert result == writes.Retired((old,), kept_rows=1, skipped=0)
    assert not _exists(db, old)
    rows = _where(
        db,
        "SELECT job_id, tableoid::regclass::text, outcome, error, finished_at > now() - interval"
        " '1 hour' FROM onceflow_step_attempts ORDER BY job_id",
    )
    assert [r[0] for r in rows] == ["live", "today"]  # "gone" went with the partition
    assert rows[0][1:] == ("onceflow_step_attempts_default", "failed", "late", True)
    assert rows[1][2:] == ("failed", "late", True)


def test_a_busy_partition_is_postponed_then_retired_with_its_live_rows(db, monkeypatch):
    """An engine transaction holding the attempts table makes the detach time out: the
    round goes on without error, the next one retires the partition."""
    monkeypatch.setattr(parts, "LOCK_TIMEOUT", "200ms")
    old = _add_old_partition(db, writes.STEP_ATTEMPTS, 19.5)
    _instance_with_old_attempt(db, "live", 1, "sleeping", finished_days_ago=None)
    with db.connect() as engine_tx:
        engine_tx.execute(sa.text(_FINISH_ATTEMPT), {"j": "live"})
        postponed = prune(db, WEEK, MONTH)
        assert postponed["partitions_dropped"] == 0
        assert _exists(db, old)
        engine_tx.commit()

    retired = prune(db, WEEK, MONTH)

    assert retired["partitions_dropped"] >= 1
    assert retired["partition_rows_kept"] == 1
    assert not _exists(db, old)
    assert _where(
        db, "SELECT tableoid::regclass::text, outcome, error FROM onceflow_step_attempts"
    ) == [("onceflow_step_attempts_default", "failed", "late")]


def test_a_deadlock_postpones_retirement_instead_of_failing_the_round(db, monkeypatch):
    """A lock cycle through the retiring partition (another session wants it exclusively
    while holding the parent): whichever side PostgreSQL aborts, retention raises
    nothing and the partition is retired in this round or the next."""
    monkeypatch.setattr(parts, "LOCK_TIMEOUT", "20s")
    old = _add_old_partition(db, writes.STEP_ATTEMPTS, 19.5)
    _instance_with_old_attempt(db, "live", 1, "sleeping", finished_days_ago=None)
    _live_with_attempt_today(db, "today", 2)
    today = writes.aligned(_now(db), DAY)
    cutoff = _now(db) - WEEK * timedelta(seconds=1)

    def retire() -> writes.Retired:
        with db.connect() as conn:
            return writes.retire_expired(conn, writes.STEP_ATTEMPTS, cutoff)

    with db.connect() as other, ThreadPoolExecutor(1) as pool:
        other.execute(sa.text("SET lock_timeout = '20s'"))
        other.execute(
            sa.text(_FINISH_ATTEMPT + " AND started_at >= :today"), {"j": "today", "today": today}
        )
        retired = pool.submit(retire)
        _wait_for(lambda: _detach_waits(db) or retired.done(), "the retire to reach its detach")
        try:
            other.execute(sa.text(f"LOCK TABLE {old} IN ACCESS EXCLUSIVE MODE"))
        except sa.exc.OperationalError as exc:
            assert getattr(exc.orig, "pgcode", None) == "40P01"  # chosen: the retire goes on
        other.rollback()
        first = retired.result(timeout=60)

    assert first.skipped + len(first.dropped) == 1
    second = writes.Retired() if first.dropped else retire()
    assert (first.dropped or second.dropped) == (old,)
    assert not _exists(db, old)
    assert _where(db, "SELECT job_id FROM onceflow_step_attempts ORDER BY 1") == [
        ("live",),
        ("today",),
    ]


def test_a_restart_forgets_the_attempts_too(db):
    _instance_with_old_attempt(db, "again", 1, "errored", finished_days_ago=1)
    with db.begin() as conn:
        conn.execute(sa.text("UPDATE onceflow_instances SET error = 'x' WHERE job_id = 'again'"))
        apply_restart(conn, "again")
    assert _where(db, "SELECT count(*) FROM onceflow_step_attempts") == [(0,)]
    assert _where(db, "SELECT status FROM onceflow_instances") == [("queued",)]


def test_retention_drops_expired_duplicate_partitions_with_their_job_ids(db):
    old = _add_old_partition(db, writes.DUPLICATE_DELIVERIES, 39.5)
    for n, job_id in enumerate(("forgotten", "still-running")):
        create_instances(db, [Delivery(JobEnvelope(job_id, "order-workflow", {}), "t", 0, n)])
        create_instances(
            db, [Delivery(JobEnvelope(job_id, "order-workflow", {}), "t", 1, n)]
        )  # a resubmission: one duplicate row
    with db.begin() as conn:
        conn.execute(sa.text("DELETE FROM onceflow_instances WHERE job_id = 'forgotten'"))
        conn.execute(sa.text("UPDATE onceflow_jobs SET received_at = now() - interval '39.5 days'"))
        conn.execute(
            sa.text(
                "UPDATE onceflow_duplicate_deliveries SET job_received_at = j.received_at"
                " FROM onceflow_jobs j WHERE j.job_id = onceflow_duplicate_deliveries.job_id"
            )
        )
    assert _where(
        db, "SELECT DISTINCT tableoid::regclass::text FROM onceflow_duplicate_deliveries"
    ) == [(old,)]

    pruned = prune(db, WEEK, MONTH)

    assert not _exists(db, old)
    assert pruned["job_ids"] == 1  # "forgotten": no instance left, past retention
    assert _where(
        db, "SELECT job_id, tableoid::regclass::text FROM onceflow_duplicate_deliveries"
    ) == [("still-running", "onceflow_duplicate_deliveries_default")]


def test_a_job_id_collides_across_time_ranges(db):
    """onceflow_jobs (the one-per-id registry) is not partitioned: a job id first seen
    40 days ago - its duplicate rows in a 40-day-old partition - still collapses a
    submission today, and a redelivered Kafka position still counts once."""
    _add_old_partition(db, writes.DUPLICATE_DELIVERIES, 39.5)
    first = create_instances(db, [Delivery(JobEnvelope("o1", "order-workflow", {}), "t", 0, 1)])
    again = Delivery(JobEnvelope("o1", "order-workflow", {}), "t", 0, 2)
    assert create_instances(db, [again]).duplicates == 1
    with db.begin() as conn:
        conn.execute(sa.text("UPDATE onceflow_jobs SET received_at = now() - interval '39.5 days'"))
        conn.execute(
            sa.text("UPDATE onceflow_duplicate_deliveries SET job_received_at = :at"),
            {"at": _now(db) - timedelta(days=39.5)},
        )

    today = create_instances(
        db, [Delivery(JobEnvelope("o1", "order-workflow", {"x": 1}), "t", 3, 9)]
    )
    redelivered = create_instances(db, [again])

    assert (first.created, today.created, today.duplicates, today.mismatches) == (1, 0, 1, 1)
    assert (redelivered.duplicates, redelivered.already_recorded) == (0, 1)
    assert _where(db, "SELECT count(*) FROM onceflow_instances") == [(1,)]
    assert _where(db, "SELECT count(*) FROM onceflow_duplicate_deliveries") == [(2,)]
    assert _where(db, "SELECT relkind FROM pg_class WHERE relname = 'onceflow_jobs'") == [("r",)]
    with pytest.raises(sa.exc.IntegrityError) as caught, db.begin() as conn:
        conn.execute(
            sa.text(
                "INSERT INTO onceflow_jobs (job_id, type_name, params_digest, source_topic,"
                " source_partition, source_offset, received_at)"
                " VALUES ('o1', 'order-workflow', 'd', 't', 5, 5, now() + interval '2 days')"
            )
        )
    assert constraint_of(caught.value) == "onceflow_jobs_job_id_key"


def test_the_app_role_can_run_retention(db, db_url):
    role = f"onceflow_app_{uuid.uuid4().hex[:8]}"
    with db.connect().execution_options(isolation_level="AUTOCOMMIT") as conn:
        conn.exec_driver_sql(f'CREATE ROLE "{role}" LOGIN')  # test-made name, no input
    grant_app_role(db, role)
    url = make_url(sqlalchemy_url(db_url)).set(username=role, password=None)
    app = make_engine(url.render_as_string(hide_password=False), pool_size=1)
    try:
        old = _add_old_partition(db, writes.STEP_ATTEMPTS, 19.5)
        assert prune(app, WEEK, MONTH, partitions_ahead=6)["partitions_created"] >= 1
        assert not _exists(db, old)
        with pytest.raises(sa.exc.ProgrammingError, match="must be owner"), app.begin() as c:
            c.exec_driver_sql(f"DROP TABLE {_partitions(db, writes.STEP_ATTEMPTS)[-1].name}")
    finally:
        app.dispose()
        with db.connect().execution_options(isolation_level="AUTOCOMMIT") as conn:
            conn.exec_driver_sql(f'DROP OWNED BY "{role}"')
            conn.exec_driver_sql(f'DROP ROLE "{role}"')


def test_the_migration_converts_existing_history_in_place(fresh_db, monkeypatch):
    db, _ = fresh_db
    before = [m for m in available_migrations() if m.version < 12]
    monkeypatch.setattr("workflow_engine.store.schema.available_migrations", lambda *_: before)
    migrate(db)
    with db.begin() as conn:
        conn.execute(
            sa.text(
                "INSERT INTO onceflow_jobs (job_id, type_name, params_digest, source_topic,"
                " source_partition, source_offset, received_at)"
                " SELECT 'm' || g, 'wf', 'd', 't', 0, g, now() - g * interval '1 day'"
                " FROM generate_series(0, 9) g;"
                "INSERT INTO onceflow_instances (job_id, workflow, params)"
                " SELECT job_id, 'wf', '{}' FROM onceflow_jobs;"
                "INSERT INTO onceflow_steps (job_id, position, name)"
                " SELECT job_id, 0, 's' FROM onceflow_jobs;"
                "INSERT INTO onceflow_step_attempts (job_id, position, attempt, engine_id,"
                " started_at) SELECT job_id, 0, 1, 'e', received_at FROM onceflow_jobs;"
                "INSERT INTO onceflow_duplicate_deliveries (job_id, source_topic,"
                " source_partition, source_offset, params_digest, params_match, redelivery)"
                " SELECT job_id, 't', 1, source_offset, 'd', true, false FROM onceflow_jobs"
            )
        )
    monkeypatch.undo()
    assert [m.version for m in migrate(db)] == [
        m.version for m in available_migrations() if m.version >= 12
    ]
    counts = _where(
        db,
        "SELECT (SELECT count(DISTINCT tableoid) FROM onceflow_step_attempts),"
        " (SELECT count(*) FROM onceflow_step_attempts),"
        " (SELECT count(DISTINCT tableoid) FROM onceflow_duplicate_deliveries),"
        " (SELECT count(*) FROM onceflow_duplicate_deliveries),"
        " (SELECT max(id) FROM onceflow_duplicate_deliveries)",
    )
    # ten days of rows -> ten daily partitions each (plus the days ahead, empty)
    assert counts == [(10, 10, 10, 10, 10)]
    # the identity continues after the moved rows
    create_instances(db, [Delivery(JobEnvelope("m0", "wf", {}), "t", 2, 0)])
    assert _where(db, "SELECT max(id) FROM onceflow_duplicate_deliveries") == [(11,)]
