"""Durable sleeps, retry delays, events, control and limits, with an injectable clock.

The engine runs in-process on real PostgreSQL; a FakeClock drives every timer, so an
hour-long sleep is tested in milliseconds and deterministically.
"""

from __future__ import annotations

import asyncio
import threading
import time
from datetime import UTC, datetime, timedelta

import pytest
import sqlalchemy as sa

from onceflow.envelope import JobEnvelope
from workflow_engine import RetryPolicy, current_step, workflow
from workflow_engine.clock import FakeClock
from workflow_engine.definitions import REGISTRY
from workflow_engine.engine.runner import EngineRunner
from workflow_engine.errors import EventTimeout
from workflow_engine.model import Delivery
from workflow_engine.store import operations
from workflow_engine.store.views import describe_instance
from workflow_engine.store.writes import create_instances, prune

RAN: list[str] = []


def mark(label: str) -> str:
    RAN.append(label)
    return label


@workflow("test-sleepy")
async def sleepy(ctx, params):
    await ctx.step("before", mark, f"{ctx.job_id}:before")
    await ctx.sleep("nap", timedelta(hours=1))
    await ctx.step("after", mark, f"{ctx.job_id}:after")
    return "rested"


@workflow("test-sleep-until")
async def sleep_until(ctx, params):
    await ctx.sleep_until("alarm", datetime.fromisoformat(params["when"]))
    return await ctx.step("wake", mark, f"{ctx.job_id}:wake")


@workflow("test-backoff")
async def backoff(ctx, params):
    def fails_once():
        if current_step().attempt == 1:
            raise TimeoutError("upstream slow")
        return "ok"

    return await ctx.step("call", fails_once, retries=RetryPolicy(limit=2, delay=60))


@workflow("test-approval")
async def approval(ctx, params):
    try:
        decision = await ctx.wait_for_event("wait", type="approved", timeout=3600)
    except EventTimeout:
        return {"approved": False}
    return {"approved": True, "decision": decision}


@workflow("test-slow-steps")
async def slow_steps(ctx, params):
    for i in range(3):
        await ctx.step(f"s{i}", time.sleep, 0.3)
    return "done"


@workflow("test-limited", concurrency=2)
async def limited(ctx, params):
    await ctx.step("work", time.sleep, 0.2)


def create(db, job_id, name, params=None):
    create_instances(db, [Delivery(JobEnvelope(job_id, name, params or {}), "t", 0, 0)])


def status(db, job_id):
    with db.connect() as conn:
        return conn.execute(
            sa.text("SELECT status FROM onceflow_instances WHERE job_id = :j"), {"j": job_id}
        ).scalar()


class Harness:
    """An engine running in a background thread's event loop, with a fake clock."""

    def __init__(self, settings, db):
        self.clock = FakeClock(datetime.now(UTC) + timedelta(seconds=1))
        self.runner = EngineRunner(
            settings.model_copy(update={"engine_poll_interval_seconds": 0.05}),
            REGISTRY,
            db=db,
            clock=self.clock,
        )
        self.loop = asyncio.new_event_loop()
        self.thread = threading.Thread(target=self._run, daemon=True)

    def _run(self):
        self.loop.run_until_complete(self.runner.run())

    def __enter__(self):
        self.thread.start()
        return self

    def __exit__(self, *exc):
        self.loop.call_soon_threadsafe(self.runner.stop)
        self.thread.join(30)

    def inflight(self) -> int:
        return len(self.runner._inflight)


def wait_for(predicate, what, timeout=20.0):
    deadline = time.monotonic() + timeout
    while time.monotonic() < deadline:
        if predicate():
            return
        time.sleep(0.02)
    raise AssertionError(f"timed out waiting for {what}")


def test_sleep_holds_no_worker_and_survives_until_due(settings, db):
    RAN.clear()
    create(db, "s1", "test-sleepy")
    with Harness(settings, db) as h:
        wait_for(lambda: status(db, "s1") == "sleeping", "sleeping")
        assert RAN == ["s1:before"]
        wait_for(lambda: h.inflight() == 0, "worker released")
        h.clock.advance(1800)
        time.sleep(0.3)
        assert status(db, "s1") == "sleeping" and RAN == ["s1:before"]
        h.clock.advance(1801)
        wait_for(lambda: status(db, "s1") == "complete", "complete")
    assert RAN == ["s1:before", "s1:after"]  # "before" did not run again on resume
    view = describe_instance(db, "s1")
    assert [(s.kind, s.name, s.status) for s in view.steps] == [
        ("step", "before", "complete"),
        ("sleep", "nap", "complete"),
        ("step", "after", "complete"),
    ]


def test_sleep_until(settings, db):
    RAN.clear()
    with Harness(settings, db) as h:
        when = h.clock.db_now() + timedelta(days=2)
        create(db, "u1", "test-sleep-until", {"when": when.isoformat()})
        wait_for(lambda: status(db, "u1") == "sleeping", "sleeping")
        h.clock.advance(2 * 86400 + 1)
        wait_for(lambda: status(db, "u1") == "complete", "complete")
    assert RAN == ["u1:wake"]


def test_retry_delay_is_a_durable_sleep(settings, db):
    create(db, "b1", "test-backoff")
    with Harness(settings, db) as h:
        wait_for(lambda: status(db, "b1") == "sleeping", "backing off")
        wait_for(lambda: h.inflight() == 0, "worker released")
        h.clock.advance(59)
        time.sleep(0.3)
        assert status(db, "b1") == "sleeping"
        h.clock.advance(2)
        wait_for(lambda: status(db, "b1") == "complete", "complete")
    view = describe_instance(db, "b1")
    assert view.result == "ok" and view.steps[0].attempts == 2


def test_event_sent_while_waiting_wakes_the_instance(settings, db):
    create(db, "e1", "test-approval")
    with Harness(settings, db):
        wait_for(lambda: status(db, "e1") == "waiting", "waiting")
        operations.send_event(db, "test-approval", "e1", "other-type", {"ignored": True})
        time.sleep(0.3)
        assert status(db, "e1") == "waiting"  # not the type it waits for
        operations.send_event(db, "test-approval", "e1", "approved", {"by": "ann"})
        wait_for(lambda: status(db, "e1") == "complete", "complete")
    assert describe_instance(db, "e1").result == {"approved": True, "decision": {"by": "ann"}}


def test_event_sent_before_the_wait_is_kept(settings, db):
    create(db, "e2", "test-approval")
    operations.send_event(db, "test-approval", "e2", "approved", "early")
    with Harness(settings, db):
        wait_for(lambda: status(db, "e2") == "complete", "complete")
    assert describe_instance(db, "e2").result == {"approved": True, "decision": "early"}


def test_event_wait_times_out(settings, db):
    create(db, "e3", "test-approval")
    with Harness(settings, db) as h:
        wait_for(lambda: status(db, "e3") == "waiting", "waiting")
        h.clock.advance(3601)
        wait_for(lambda: status(db, "e3") == "complete", "complete")
    view = describe_instance(db, "e3")
    assert view.result == {"approved": False}
    assert view.steps[0].status == "failed" and "timed out" in view.steps[0].error


def test_pause_resume_terminate_restart(settings, db):
    RAN.clear()
    create(db, "c1", "test-sleepy")
    create(db, "c2", "test-approval")
    with Harness(settings, db) as h:
        wait_for(lambda: status(db, "c1") == "sleeping", "c1 sleeping")
        wait_for(lambda: status(db, "c2") == "waiting", "c2 waiting")
        assert operations.terminate(db, "test-approval", "c2").status == "terminated"
        with pytest.raises(operations.ControlError, match="takes no more events"):
            operations.send_event(db, "test-approval", "c2", "approved")

        assert operations.pause(db, "test-sleepy", "c1").status == "paused"
        h.clock.advance(7200)
        time.sleep(0.3)
        assert status(db, "c1") == "paused"  # a paused sleeper does not wake
        assert operations.resume(db, "test-sleepy", "c1").status == "queued"
        wait_for(lambda: status(db, "c1") == "complete", "c1 complete")

        assert operations.restart(db, "test-sleepy", "c1").status == "queued"
        wait_for(lambda: status(db, "c1") == "sleeping", "c1 sleeping again")
        h.clock.advance(3601)
        wait_for(lambda: status(db, "c1") == "complete", "c1 complete again")
    assert RAN == ["c1:before", "c1:after", "c1:before", "c1:after"]
    assert describe_instance(db, "c1").restart_count == 1
    with pytest.raises(operations.ControlError, match="no instance"):
        operations.pause(db, "test-sleepy", "nope")


def test_control_of_a_running_instance_applies_at_the_next_step(settings, db):
    create(db, "r1", "test-slow-steps")
    create(db, "r2", "test-slow-steps")
    with Harness(settings, db):
        wait_for(
            lambda: (
                any(st.status == "running" for st in describe_instance(db, "r1").steps)
                and status(db, "r2") == "running"
            ),
            "r1 mid-step",
        )
        assert operations.pause(db, "test-slow-steps", "r1").requested == "pause"
        assert operations.terminate(db, "test-slow-steps", "r2").requested == "terminate"
        wait_for(lambda: status(db, "r1") == "paused", "r1 paused")
        wait_for(lambda: status(db, "r2") == "terminated", "r2 terminated")
        steps = describe_instance(db, "r1").steps
        # the step in flight finished; the pause took effect before the next one
        assert 1 <= len(steps) < 3
        assert all(st.status == "complete" for st in steps)
        operations.resume(db, "test-slow-steps", "r1")
        wait_for(lambda: status(db, "r1") == "complete", "r1 complete")


def test_per_workflow_concurrency_limit(settings, db):
    for i in range(6):
        create(db, f"l{i}", "test-limited")
    peak = 0
    with Harness(settings, db):
        deadline = time.monotonic() + 20
        while time.monotonic() < deadline:
            with db.connect() as conn:
                running, done = conn.execute(
                    sa.text(
                        "SELECT count(*) FILTER (WHERE status = 'running'),"
                        " count(*) FILTER (WHERE status = 'complete') FROM onceflow_instances"
                    )
                ).one()
            peak = max(peak, running)
            if done == 6:
                break
            time.sleep(0.01)
    assert done == 6
    assert peak == 2


def test_retention_keeps_the_job_id_so_a_late_duplicate_still_collapses(settings, db):
    create(db, "old", "test-limited")
    with db.begin() as conn:
        conn.execute(
            sa.text(
                "UPDATE onceflow_instances SET status = 'complete', finished_at = now() - interval"
                " '8 days', started_at = now() - interval '8 days' WHERE job_id = 'old'"
            )
        )
    assert prune(db, 7 * 86400, 30 * 86400)["instances"] == 1
    assert status(db, "old") is None
    late = create_instances(db, [Delivery(JobEnvelope("old", "test-limited", {}), "t", 0, 9)])
    assert (late.created, late.duplicates) == (0, 1)
    with db.begin() as conn:
        conn.execute(sa.text("UPDATE onceflow_jobs SET received_at = now() - interval '31 days'"))
    assert prune(db, 7 * 86400, 30 * 86400)["job_ids"] == 1
