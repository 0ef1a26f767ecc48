"""Bulk runners (issue 23, case 8): a runner gone or stopped between batches (the
failpoint ``bulk.between_batches``) leaves its operation to the next one, which resumes
it after its last committed batch; one lease per operation. The real processes:
``test_bulk_sigkill.py``."""

from __future__ import annotations

import threading
import time

import pytest
import sqlalchemy as sa

from onceflow import failpoints
from onceflow.envelope import JobEnvelope
from onceflow.vocabulary import BulkAction, BulkStatus
from workflow_engine.model import Delivery
from workflow_engine.store.operations import BulkRunner, bulk
from workflow_engine.store.views import InstanceFilter
from workflow_engine.store.writes import create_instances


@pytest.fixture(autouse=True)
def _disarm():
    yield
    failpoints.disarm_all()


def _create(db, job_ids):
    for start in range(0, len(job_ids), 500):
        chunk = job_ids[start : start + 500]
        deliveries = [
            Delivery(JobEnvelope(j, "approval-workflow", {}), "t", 0, start + n)
            for n, j in enumerate(chunk)
        ]
        create_instances(db, deliveries)


def _op(db, op_id) -> bulk.BulkOperation:
    found = bulk.bulk_status(db, op_id)
    assert found is not None
    return found


def _until(predicate, what, timeout=30.0):
    deadline = time.monotonic() + timeout
    while time.monotonic() < deadline:
        if predicate():
            return
        time.sleep(0.05)
    raise AssertionError(f"timed out waiting for {what}")


def _statuses(db, prefix):
    with db.connect() as conn:
        rows = conn.execute(
            sa.text(
                "SELECT status, restart_count, count(*) FROM onceflow_instances"
                " WHERE job_id LIKE :p GROUP BY 1, 2"
            ),
            {"p": prefix + "%"},
        ).all()
    return {(status, restarts): n for status, restarts, n in rows}


def _lease_pid(db, op_id) -> int | None:
    with db.connect() as conn:
        return conn.execute(
            sa.text(
                "SELECT pid FROM pg_locks WHERE locktype = 'advisory' AND granted"
                " AND classid::bigint = :space AND objid::bigint = :id AND objsubid = 2"
            ),
            {"space": bulk.LEASE_LOCK_SPACE, "id": op_id},
        ).scalar()


def test_a_runner_gone_between_batches_is_taken_over_and_no_batch_runs_twice(db):
    ids = [f"bt_{i:03d}" for i in range(50)]
    _create(db, ids)
    paused = failpoints.arm("bulk.between_batches", "pause")
    a = BulkRunner(db, poll_seconds=0.1, batch=10)
    b = BulkRunner(db, poll_seconds=0.1, batch=10)
    try:
        op = a.submit(BulkAction.RESTART, InstanceFilter(job_id_prefix="bt_"))
        paused.wait_reached()  # runner A: one batch committed, holding the lease
        b.start()
        assert _op(db, op.id).done == 10
        assert bulk.unleased(db) == []  # B sees A's lease and leaves the operation alone
        pid = _lease_pid(db, op.id)
        assert pid is not None
        with db.connect() as conn:  # runner A's process is gone: its session ends
            conn.execute(sa.text("SELECT pg_terminate_backend(:p)"), {"p": pid})
        _until(lambda: _op(db, op.id).finished, "runner B finishing the operation")
        paused.release()  # A wakes up on a dead connection: it writes nothing
    finally:
        paused.release()
        a.stop()
        b.stop()
    final = _op(db, op.id)
    assert (final.status, final.done, final.skipped) == ("complete", 50, 0)
    assert _statuses(db, "bt_") == {("queued", 1): 50}  # each restarted exactly once


def test_a_runner_stopped_between_batches_leaves_the_rest_to_the_next_one(db):
    ids = [f"bs_{i:03d}" for i in range(30)]
    _create(db, ids)
    paused = failpoints.arm("bulk.between_batches", "pause")
    a = BulkRunner(db, poll_seconds=0.1, batch=10)
    a.start()
    op = a.submit(BulkAction.PAUSE, InstanceFilter(job_id_prefix="bs_"))
    paused.wait_reached()
    stopping = threading.Thread(target=a.stop)  # SIGTERM: the lifespan stops the runner
    stopping.start()
    paused.release()
    stopping.join(10)
    assert not a.alive
    cut = _op(db, op.id)
    assert (cut.status, cut.done) == (BulkStatus.RUNNING, 10)
    assert bulk.unleased(db) == [op.id]  # its lease went with the runner
    b = BulkRunner(db, poll_seconds=0.1, batch=10)
    b.start()
    try:
        _until(lambda: _op(db, op.id).finished, "the next runner finishing it")
    finally:
        b.stop()
    final = _op(db, op.id)
    assert (final.status, final.done, final.skipped) == ("complete", 30, 0)
    assert _statuses(db, "bs_") == {("paused", 0): 30}


def test_the_cli_follows_an_operation_another_runner_took_up(db):
    """``run_bulk`` (the CLI's foreground run) of an operation whose lease another
    process holds reports that one's progress instead of running it beside it."""
    _create(db, [f"bf_{i:02d}" for i in range(20)])
    op = bulk.start_bulk(db, BulkAction.PAUSE, InstanceFilter(job_id_prefix="bf_"))
    with bulk.leased(db, op.id) as conn:
        assert conn is not None
        with bulk.leased(db, op.id) as second:
            assert second is None  # one lease per operation
        progress: list[bulk.BulkOperation] = []
        follower = threading.Thread(
            target=lambda: progress.append(bulk.run_bulk(db, op.id, batch=5))
        )
        follower.start()
        final = bulk.run_leased(conn, op.id, 5)
        follower.join(10)
    assert final.status == "complete"
    assert [p.status for p in progress] == ["complete"]
    assert _statuses(db, "bf_") == {("paused", 0): 20}
