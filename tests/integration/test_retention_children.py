"""Retention and child workflows on real PostgreSQL: a finished child whose parent is
still live is kept until the parent has finished (issue 23, case 6)."""

from __future__ import annotations

import sqlalchemy as sa

from tests.integration.test_children import Harness, q
from tests.integration.test_engine_durable import create, status, wait_for
from workflow_engine.store import operations
from workflow_engine.store.views import describe_instance
from workflow_engine.store.writes import prune

#: Retention that keeps nothing (no partitions touched: the interval is a day).
NOW = {"instance_seconds": 0.0, "job_id_seconds": 0.0}


def _age(db, *job_ids):
    """As if they had finished a month ago: past any retention plus its interval."""
    with db.begin() as conn:
        conn.execute(
            sa.text(
                "UPDATE onceflow_instances SET finished_at = now() - interval '30 days'"
                " WHERE job_id = ANY(:ids)"
            ),
            {"ids": list(job_ids)},
        )


def test_retention_keeps_a_finished_child_until_its_live_parent_has_taken_it(settings, db):
    # The child holds until it gets "release"; the parent waits for the child.
    create(db, "rk", "test-parent", {"child": {"hold": True, "amount": 3}})
    child = "rk__charge"
    with Harness(settings, db):
        wait_for(lambda: status(db, child) == "waiting", "the child waiting for its event")
        wait_for(lambda: status(db, "rk") == "waiting", "the parent waiting for its child")
        # Paused, the parent does not collect the child when it finishes: the window.
        operations.pause(db, "test-parent", "rk")
        operations.send_event(db, "test-child", child, "release")
        wait_for(lambda: status(db, child) == "complete", "the child complete")
        _age(db, child)
        pruned = prune(db, **NOW)
        assert status(db, child) == "complete", pruned  # kept: its parent is live
        assert pruned["instances"] == 0
        operations.resume(db, "test-parent", "rk")
        wait_for(lambda: status(db, "rk") in ("complete", "errored"), "the parent finished")
        view = describe_instance(db, "rk")
        assert (view.status, view.error) == ("complete", None)
        assert view.result["child"]["amount"] == 3
    # Once the parent has finished, both go in the same round.
    _age(db, "rk", child)
    assert prune(db, **NOW)["instances"] == 2
    assert q(db, "SELECT job_id FROM onceflow_instances WHERE job_id LIKE 'rk%'") == []
