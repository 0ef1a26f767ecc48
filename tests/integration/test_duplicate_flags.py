"""The instances list's has_duplicates and payload_mismatch filters read flags on the
instance, kept by the worker where it records a duplicate (issue 23: the filter took
3.2-3.4 s a page at 1M instances, probing the duplicates table per instance). On real
PostgreSQL: the plan's shape, the flags on every way a duplicate is recorded (a second
worker's instance committed while this one waited included), and the migration's
backfill."""

from __future__ import annotations

import threading
import time
import uuid
from collections.abc import Iterator

import pytest
import sqlalchemy as sa

from onceflow.envelope import JobEnvelope, params_digest
from onceflow.vocabulary import JobKind
from onceflow_tools.benchsql import seed_for_bench
from onceflow_tools.stack import database_url_for, recreate_database
from workflow_engine.model import CreateResult, Delivery
from workflow_engine.store import available_migrations, make_engine, migrate
from workflow_engine.store.views import InstanceFilter, count_matching, explain_list, list_page
from workflow_engine.store.writes import create_instances, create_instances_in

_offsets = iter(range(1_000, 10**7))


def _deliver(
    job_id: str, params=None, workflow="order-workflow", kind=JobKind.WORKFLOW, offset=None
):
    envelope = JobEnvelope(job_id, workflow, params or {}, "req_1")
    return Delivery(envelope, "t", 0, next(_offsets) if offset is None else offset, kind)


def _flags(db, *job_ids: str) -> dict[str, tuple[bool, bool]]:
    with db.connect() as conn:
        rows = conn.execute(
            sa.text(
                "SELECT job_id, duplicated, mismatched FROM onceflow_instances"
                " WHERE job_id = ANY(:j)"
            ),
            {"j": list(job_ids)},
        )
        return {j: (d, m) for j, d, m in rows}


def test_a_duplicates_page_reads_the_partial_index_of_duplicated_instances(db):
    seed_for_bench(db, 20_000, prefix="px_")
    old = [f"px_{n:010d}" for n in (19_990, 19_991, 19_992)]  # among the oldest
    with db.begin() as conn:  # the bench's registry rows carry no real digest
        conn.execute(
            sa.text("UPDATE onceflow_jobs SET params_digest = :d WHERE job_id = ANY(:j)"),
            {"d": params_digest({}), "j": old},
        )
    create_instances(db, [_deliver(old[0], workflow="bench-wf-2", offset=1)])  # same params
    create_instances(db, [_deliver(old[1], {"other": 1}, "bench-wf-3", offset=2)])
    create_instances(db, [_deliver(old[2], workflow="bench-wf-0", offset=3)])
    for f in (InstanceFilter(has_duplicates=True), InstanceFilter(payload_mismatch=True)):
        for sort in ("created", "updated"):
            plan = explain_list(db, f, sort)  # type: ignore[arg-type]
            assert "Index Scan Backward using onceflow_instances_duplicated_" in plan, plan
            # the filter is the flag: no probe of the duplicates per instance scanned
            assert "Seq Scan on onceflow_instances" not in plan, plan
            assert "SubPlan" not in plan.split("->  Aggregate")[0], plan
    assert [r.job_id for r in list_page(db, InstanceFilter(has_duplicates=True)).rows] == old
    assert [r.job_id for r in list_page(db, InstanceFilter(payload_mismatch=True)).rows] == [old[1]]
    assert count_matching(db, InstanceFilter(has_duplicates=False)) == 20_000 - 3
    assert count_matching(db, InstanceFilter(payload_mismatch=False)) == 20_000 - 1


def test_the_flags_follow_every_way_a_duplicate_is_recorded(db):
    creating = _deliver("fl_redelivered")
    create_instances(
        db,
        [
            creating,
            _deliver("fl_plain"),
            _deliver("fl_batch"),
            _deliver("fl_batch"),  # a duplicate in the batch that creates it
            _deliver("fl_task", workflow="send-email", kind=JobKind.TASK),
        ],
    )
    assert set(_flags(db, "fl_plain", "fl_batch").values()) >= {(False, False), (True, False)}
    create_instances(
        db,
        [
            creating,  # the creating record again: a redelivery
            _deliver("fl_plain", {"amount": 2}),  # other params
            _deliver("fl_task", workflow="send-email", kind=JobKind.TASK),  # a task: no instance
            _deliver("fl_batch", workflow="refund-workflow"),  # another workflow
        ],
    )
    assert _flags(db, "fl_redelivered", "fl_plain", "fl_batch") == {
        "fl_redelivered": (True, False),
        "fl_plain": (True, True),
        "fl_batch": (True, True),
    }
    create_instances(db, [_deliver("fl_plain")])  # same params: a mismatch stays one
    assert _flags(db, "fl_plain") == {"fl_plain": (True, True)}


def _waiting_on_a_lock(db, pid: int) -> bool:
    with db.connect() as conn:
        return bool(
            conn.execute(
                sa.text(
                    "SELECT count(*) FROM pg_stat_activity"
                    " WHERE pid = :pid AND wait_event_type = 'Lock'"
                ),
                {"pid": pid},
            ).scalar()
        )


def test_an_instance_another_worker_committed_meanwhile_is_flagged(db):
    """Two keyless records of one id on two partitions, in two workers' batches: the
    second waits on the first's registry row and must flag the instance it committed."""
    first, second = db.connect(), db.connect()
    pid = second.execute(sa.text("SELECT pg_backend_pid()")).scalar_one()
    second.commit()
    tx = first.begin()
    create_instances_in(first, [_deliver("race_1", offset=1)])  # not committed yet
    done: list[CreateResult] = []

    def second_worker() -> None:
        with second.begin():
            done.append(create_instances_in(second, [_deliver("race_1", offset=2)]))

    worker = threading.Thread(target=second_worker)
    worker.start()
    deadline = time.monotonic() + 30
    while not _waiting_on_a_lock(db, pid):  # paused on the registry row's lock
        assert time.monotonic() < deadline and worker.is_alive(), "the second never waited"
        time.sleep(0.02)
    tx.commit()
    worker.join(30)
    first.close()
    second.close()
    assert [r.duplicates for r in done] == [1]
    assert _flags(db, "race_1") == {"race_1": (True, False)}


@pytest.fixture
def fresh_db(base_settings) -> Iterator[sa.Engine]:
    name = f"onceflow_s_{uuid.uuid4().hex[:10]}"
    db = make_engine(recreate_database(base_settings.database_url, name), pool_size=2)
    yield db
    db.dispose()
    admin = make_engine(database_url_for(base_settings.database_url, "postgres"), pool_size=1)
    with admin.connect().execution_options(isolation_level="AUTOCOMMIT") as conn:
        conn.execute(sa.text(f'DROP DATABASE IF EXISTS "{name}" WITH (FORCE)'))
    admin.dispose()


def test_the_migration_flags_the_duplicates_already_recorded(fresh_db, monkeypatch):
    before = [m for m in available_migrations() if m.version < 15]
    monkeypatch.setattr("workflow_engine.store.schema.available_migrations", lambda *_: before)
    migrate(fresh_db)
    with fresh_db.begin() as conn:
        conn.execute(
            sa.text(
                "INSERT INTO onceflow_jobs (job_id, type_name, params_digest, source_topic,"
                " source_partition, source_offset)"
                " SELECT 'mg_' || g, 'wf', 'd', 't', 0, g FROM generate_series(1, 4) g;"
                "INSERT INTO onceflow_instances (job_id, workflow, params)"
                " SELECT job_id, 'wf', '{}' FROM onceflow_jobs;"
                # mg_1: same params; mg_2: other params; mg_3: a row of an earlier
                # registry row of the id (deleted by retention, submitted again)
                "INSERT INTO onceflow_duplicate_deliveries (job_id, source_topic,"
                " source_partition, source_offset, params_digest, params_match, redelivery,"
                " workflow, workflow_match, job_received_at)"
                " SELECT job_id, 't', 1, source_offset, 'd', job_id <> 'mg_2', false, 'wf',"
                " true, received_at - CASE WHEN job_id = 'mg_3' THEN interval '9 days'"
                " ELSE interval '0' END FROM onceflow_jobs WHERE job_id <> 'mg_4'"
            )
        )
    monkeypatch.undo()
    assert [m.version for m in migrate(fresh_db)] == [
        m.version for m in available_migrations() if m.version >= 15
    ]
    assert _flags(fresh_db, "mg_1", "mg_2", "mg_3", "mg_4") == {
        "mg_1": (True, False),
        "mg_2": (True, True),
        "mg_3": (False, False),
        "mg_4": (False, False),
    }
