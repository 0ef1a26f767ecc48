"""The one-statement batch create on real PostgreSQL."""

from __future__ import annotations

import threading

import sqlalchemy as sa

from onceflow.envelope import JobEnvelope
from workflow_engine.model import Delivery
from workflow_engine.store import constraint_of
from workflow_engine.store.views import describe_instance
from workflow_engine.store.writes import create_instances


def d(job_id, params=None, offset=0, partition=0, topic="jobs"):
    return Delivery(
        JobEnvelope(job_id, "order-workflow", params or {}, "req"), topic, partition, offset
    )


def count(db, sql):
    with db.connect() as conn:
        return conn.execute(sa.text(sql)).scalar()


def test_duplicates_of_the_same_record_collapse(db):
    first = create_instances(db, [d("a", offset=7)])
    again = create_instances(db, [d("a", offset=7)])
    assert (first.created, again.created, again.duplicates, again.redeliveries) == (1, 0, 1, 1)
    assert count(db, "SELECT count(*) FROM onceflow_instances") == 1
    view = describe_instance(db, "a")
    assert (view.duplicates, view.redeliveries, view.mismatches) == (1, 1, 0)


def test_same_id_different_params_creates_nothing_and_is_recorded(db):
    create_instances(db, [d("a", {"amount": 1}, offset=1)])
    result = create_instances(db, [d("a", {"amount": 2}, offset=2)])
    assert (result.created, result.duplicates, result.mismatches) == (0, 1, 1)
    assert result.mismatch_ids == ["a"]
    view = describe_instance(db, "a")
    assert view.params == {"amount": 1}  # the first one wins
    assert view.mismatches == 1


def test_batch_containing_duplicates_of_one_id(db):
    batch = [
        d("a", {"x": 1}, 1),
        d("b", {}, 2),
        d("a", {"x": 1}, 3),
        d("a", {"x": 9}, 4),
        d("c", {}, 5),
    ]
    result = create_instances(db, batch)
    assert sorted(result.created_ids) == ["a", "b", "c"]
    assert (result.duplicates, result.mismatches, result.redeliveries) == (2, 1, 0)
    with db.connect() as conn:
        source = conn.execute(
            sa.text("SELECT source_offset FROM onceflow_jobs WHERE job_id = 'a'")
        ).scalar()
    assert source == 1  # the earliest delivery in the batch wins


def test_concurrent_transactions_for_one_id_create_one_instance(db):
    barrier = threading.Barrier(8)
    results = []

    def worker(i):
        barrier.wait()
        results.append(create_instances(db, [d("same", offset=i, partition=i)]))

    threads = [threading.Thread(target=worker, args=(i,)) for i in range(8)]
    for t in threads:
        t.start()
    for t in threads:
        t.join()
    assert sum(r.created for r in results) == 1
    assert sum(r.duplicates for r in results) == 7
    assert count(db, "SELECT count(*) FROM onceflow_instances") == 1


def test_new_instances_are_queued_and_notify(db):
    import select

    import psycopg2

    listener = psycopg2.connect(db.url.set(drivername="postgresql").render_as_string(False))
    listener.set_isolation_level(0)
    listener.cursor().execute("LISTEN onceflow_runnable")
    create_instances(db, [d("n1")])
    assert select.select([listener], [], [], 5)[0]
    listener.poll()
    assert listener.notifies
    listener.close()
    assert count(db, "SELECT status FROM onceflow_instances WHERE job_id = 'n1'") == "queued"


def test_schema_rejects_an_unknown_status(db):
    create_instances(db, [d("s1")])
    with db.begin() as conn:
        try:
            conn.execute(sa.text("UPDATE onceflow_instances SET status = 'bogus'"))
        except sa.exc.IntegrityError as exc:
            assert constraint_of(exc) == "onceflow_instances_status_check"
        else:
            raise AssertionError("status check constraint did not fire")
