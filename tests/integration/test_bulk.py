"""Bulk control operations on real PostgreSQL: snapshot, batches, per-instance rules."""

from __future__ import annotations

import sqlalchemy as sa

from onceflow.envelope import JobEnvelope
from onceflow.vocabulary import BulkAction, BulkStatus, ControlAction, InstanceStatus
from workflow_engine.model import Delivery
from workflow_engine.store import operations
from workflow_engine.store.operations import bulk_status, recent_bulk, run_bulk, start_bulk
from workflow_engine.store.views import InstanceFilter
from workflow_engine.store.writes import create_instances


def _create(db, job_ids, workflow="approval-workflow"):
    create_instances(
        db, [Delivery(JobEnvelope(j, workflow, {}), "t", 0, n) for n, j in enumerate(job_ids)]
    )


def _statuses(db):
    with db.connect() as conn:
        rows = conn.execute(
            sa.text("SELECT job_id, status, requested_action FROM onceflow_instances")
        ).all()
    return {r.job_id: (r.status, r.requested_action) for r in rows}


def _make_running(db, job_id):
    with db.begin() as conn:
        conn.execute(
            sa.text(
                "UPDATE onceflow_instances SET status = 'running', lease_owner = 'eng-1',"
                " lease_expires_at = now() + interval '1 minute' WHERE job_id = :j"
            ),
            {"j": job_id},
        )


def test_pause_in_batches_records_progress_and_follows_the_control_rules(db):
    ids = [f"b_{i:02d}" for i in range(7)]
    _create(db, ids)
    _create(db, ["other_1"], workflow="order-workflow")
    _make_running(db, "b_00")
    operations.terminate(db, "approval-workflow", "b_01")
    operations.pause(db, "approval-workflow", "b_02")

    op = start_bulk(db, BulkAction.PAUSE, InstanceFilter(workflow="approval-workflow"))
    assert (op.total, op.done, op.skipped, op.status) == (7, 0, 0, BulkStatus.RUNNING)
    assert op.filter == "workflow=approval-workflow"
    # created after the start: not in the operation's snapshot
    _create(db, ["b_late"])

    progress = []
    final = run_bulk(db, op.id, batch=3, on_progress=progress.append)
    assert [(p.done + p.skipped) for p in progress] == [3, 6, 7]
    assert (final.status, final.total, final.done, final.skipped) == ("complete", 7, 5, 2)
    assert final.finished_at is not None and final.error is None
    after = _statuses(db)
    assert after["b_00"] == ("running", ControlAction.PAUSE)  # the engine applies it
    assert after["b_01"] == ("terminated", None)  # skipped: finished
    assert after["b_02"] == ("paused", None)  # skipped: already paused
    assert all(after[j] == ("paused", None) for j in ids[3:])
    assert after["b_late"] == ("queued", None)
    assert after["other_1"] == ("queued", None)
    # running it again changes nothing
    assert run_bulk(db, op.id) == final
    assert bulk_status(db, op.id) == final
    with db.connect() as conn:
        left = conn.execute(sa.text("SELECT count(*) FROM onceflow_bulk_operation_items"))
        assert left.scalar() == 0


def test_resume_skips_what_is_not_paused_and_restart_requeues_finished(db):
    _create(db, ["r_1", "r_2", "r_3"])
    operations.pause(db, "approval-workflow", "r_1")
    _make_running(db, "r_2")
    operations.pause(db, "approval-workflow", "r_2")  # running: pause requested
    op = run_bulk(db, start_bulk(db, BulkAction.RESUME, InstanceFilter(job_id_prefix="r_")).id)
    assert (op.done, op.skipped) == (2, 1)
    after = _statuses(db)
    assert after["r_1"] == ("queued", None)
    assert after["r_2"] == ("running", None)  # the pending pause withdrawn
    assert after["r_3"] == ("queued", None)

    operations.terminate(db, "approval-workflow", "r_3")
    terminated = InstanceFilter(status=InstanceStatus.TERMINATED)
    op = run_bulk(db, start_bulk(db, BulkAction.RESTART, terminated).id)
    assert (op.total, op.done, op.skipped) == (1, 1, 0)
    with db.connect() as conn:
        row = conn.execute(
            sa.text("SELECT status, restart_count FROM onceflow_instances WHERE job_id = 'r_3'")
        ).one()
    assert (row.status, row.restart_count) == ("queued", 1)

    op = run_bulk(db, start_bulk(db, BulkAction.TERMINATE, InstanceFilter(job_id_prefix="r_")).id)
    assert (op.done, op.skipped) == (3, 0)
    assert _statuses(db)["r_2"] == ("running", ControlAction.TERMINATE)


def test_an_operation_matching_nothing_is_complete_at_once_and_listed(db):
    op = start_bulk(db, BulkAction.TERMINATE, InstanceFilter(workflow="nothing-here"))
    assert (op.total, op.status) == (0, BulkStatus.COMPLETE)
    assert run_bulk(db, op.id).status == BulkStatus.COMPLETE
    assert [o.id for o in recent_bulk(db)] == [op.id]
    assert bulk_status(db, op.id + 1000) is None


def test_an_instance_deleted_since_the_start_counts_as_skipped(db):
    _create(db, ["d_1", "d_2"])
    op = start_bulk(db, BulkAction.PAUSE, InstanceFilter(job_id_prefix="d_"))
    with db.begin() as conn:
        conn.execute(sa.text("DELETE FROM onceflow_jobs WHERE job_id = 'd_1'"))
    final = run_bulk(db, op.id)
    assert (final.total, final.done, final.skipped) == (2, 1, 1)
