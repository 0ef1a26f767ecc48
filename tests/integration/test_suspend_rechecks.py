"""A suspension re-checks every wake condition under the instance's row lock, in the
transaction that suspends (issue 23, case 3).

A run decides to wait from what an earlier transaction saw ("no event yet"); an event
or an operator's request that comes in before its suspend commits must not be lost.
Each case pauses the run exactly in that window (a failpoint), lets the other actor in
through the same store function the admin API, the console and the CLI call, releases
the run, and waits (with a deadline) for the outcome.
"""

from __future__ import annotations

import pytest

import onceflow_examples  # noqa: F401  (registers approval-workflow in this process)
from onceflow import failpoints
from onceflow.envelope import JobEnvelope
from onceflow.settings import get_settings
from tests.integration.interleavings import (
    EngineHarness,
    check_history,
    rows,
    scalar,
    status,
    wait_for,
)
from workflow_engine import workflow
from workflow_engine.model import Delivery
from workflow_engine.store import operations
from workflow_engine.store.views import describe_instance
from workflow_engine.store.writes import create_instances

#: The two boundaries between "the wait found no event" and "the suspend committed".
WINDOW = ["engine.after_consume_event", "engine.before_suspend"]
#: How long a woken instance may take to finish (it is woken at once, not by a timer).
SETTLED = 10.0


@workflow("test-await-approval")
async def await_approval(ctx, params):
    decision = await ctx.wait_for_event("approval", type="approved")  # no timeout
    return {"approved": True, "by": decision["by"]}


@pytest.fixture(autouse=True)
def _disarm():
    yield
    failpoints.disarm_all()


@pytest.fixture
def sample_settings(settings, monkeypatch):
    """The samples' step code writes its side effects through the process's settings
    (``get_settings``, read once): point them at this test's database."""
    monkeypatch.setenv("ONCEFLOW_DATABASE_URL", settings.database_url)
    get_settings.cache_clear()
    yield settings
    get_settings.cache_clear()


def create(db, job_id, name, params=None):
    create_instances(db, [Delivery(JobEnvelope(job_id, name, params or {}), "t", 0, 0)])


def reaches(db, job_id, wanted):
    """Wait (at most ``SETTLED`` s) for ``job_id`` to reach status ``wanted``; if it does
    not, say where it stands instead."""
    try:
        wait_for(lambda: status(db, job_id) == wanted, f"{job_id} {wanted}", SETTLED)
    except AssertionError:
        (row,) = rows(
            db,
            "SELECT status, run_after, requested_action, (SELECT count(*) FROM onceflow_events"
            " e WHERE e.job_id = i.job_id AND e.consumed_at IS NULL) AS unconsumed"
            " FROM onceflow_instances i WHERE job_id = :j",
            j=job_id,
        )
        raise AssertionError(
            f"{job_id} not {wanted} within {SETTLED} s: it is {row.status}, run_after"
            f" {row.run_after}, requested_action {row.requested_action},"
            f" {row.unconsumed} unconsumed event(s)"
        ) from None


def consumed(db, event_id):
    """(consumed, the history position that took it) of one event."""
    return rows(
        db,
        "SELECT consumed_at IS NOT NULL, consumed_by FROM onceflow_events WHERE id = :e",
        e=event_id,
    )[0]


@pytest.mark.parametrize("point", WINDOW)
def test_an_event_sent_while_the_run_decides_to_wait_wakes_it(settings, db, point):
    create(db, "ev1", "test-await-approval")
    paused = failpoints.arm(point, "pause", job_id="ev1")
    with EngineHarness(settings, db):
        paused.wait_reached()
        event_id = operations.send_event(
            db, "test-await-approval", "ev1", "approved", {"by": "ann"}
        )
        paused.release()
        reaches(db, "ev1", "complete")
    assert describe_instance(db, "ev1").result == {"approved": True, "by": "ann"}
    assert consumed(db, event_id) == (True, 0)
    assert check_history(db) == []


@pytest.mark.parametrize("point", WINDOW)
def test_an_event_in_the_window_of_a_timed_wait_arrives_before_the_timeout(
    sample_settings, db, point
):
    """The sample approval-workflow waits an hour; the fake clock never gets there, so
    only the event can finish it."""
    create(db, "ev2", "approval-workflow", {"timeout_seconds": 3600, "step_seconds": 0})
    paused = failpoints.arm(point, "pause", job_id="ev2")
    with EngineHarness(sample_settings, db):
        paused.wait_reached()
        event_id = operations.send_event(db, "approval-workflow", "ev2", "approved", {"by": "bo"})
        paused.release()
        reaches(db, "ev2", "complete")
    assert describe_instance(db, "ev2").result == {"approved": True, "by": "bo"}
    assert consumed(db, event_id) == (True, 1)
    effects = rows(db, "SELECT step FROM onceflow_demo_side_effects WHERE job_id = 'ev2'")
    assert sorted(step for (step,) in effects) == ["fulfil", "request approval"]
    assert check_history(db) == []


@pytest.mark.parametrize(
    ("point", "action"),
    [(point, action) for point in WINDOW for action in ("pause", "terminate")],
)
def test_a_control_request_in_the_window_is_applied_not_waited_over(settings, db, point, action):
    create(db, "ct1", "test-await-approval")
    paused = failpoints.arm(point, "pause", job_id="ct1")
    with EngineHarness(settings, db):
        paused.wait_reached()
        asked = getattr(operations, action)(db, "test-await-approval", "ct1")
        assert asked.requested == action  # running: asked of the engine
        paused.release()
        final = "paused" if action == "pause" else "terminated"
        reaches(db, "ct1", final)
        requested = "SELECT requested_action FROM onceflow_instances WHERE job_id = 'ct1'"
        assert scalar(db, requested) is None
        if action == "pause":  # and it resumes into its wait, where the event finds it
            operations.resume(db, "test-await-approval", "ct1")
            reaches(db, "ct1", "waiting")
            operations.send_event(db, "test-await-approval", "ct1", "approved", {"by": "cy"})
            reaches(db, "ct1", "complete")
    assert check_history(db) == []
