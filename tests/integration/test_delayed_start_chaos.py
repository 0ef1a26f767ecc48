"""Delayed start (issue 26, item 5) on two engines, one SIGKILLed while delayed jobs are
coming due: every job still starts once, never before its time and within a second of
it, and completes. Engines are real subprocesses (``onceflow engine``) on the real clock;
times are the database's own (``started_at`` is the first claim's, kept by a rescue)."""

from __future__ import annotations

import signal
import statistics
import time
from datetime import UTC, datetime, timedelta

import pytest

from onceflow.envelope import JobEnvelope
from onceflow_tools.processes import ProcessGroup
from tests.conftest import settings_env
from tests.integration.engine_processes import start_engine
from tests.integration.interleavings import rows, scalar, wait_for
from workflow_engine.model import Delivery
from workflow_engine.store.views import ENGINE_STALE_SECONDS, live_engines
from workflow_engine.store.writes import create_instances

N = 200


# a 30 s poll, far longer than the delays: what starts a job is the wait for its timer
POLL_SECONDS = 30


@pytest.mark.timeout(180)
def test_delayed_jobs_start_on_time_through_a_sigkilled_engine(settings, db, tmp_path):
    with ProcessGroup(settings_env(settings), tmp_path / "logs") as group:
        start_engine(group, "engine-0", POLL_SECONDS)
        start_engine(group, "engine-1", POLL_SECONDS)
        wait_for(lambda: len(live_engines(db, ENGINE_STALE_SECONDS)) == 2, "both engines up", 60)
        base = datetime.now(UTC)
        due = {f"dsk_{i:03d}": base + timedelta(seconds=3 + (i % 50) * 0.1) for i in range(N)}
        create_instances(
            db,
            [
                Delivery(
                    JobEnvelope(job, "order-workflow", {"step_seconds": 0.05}, run_at=at),
                    "jobs",
                    0,
                    i,
                )
                for i, (job, at) in enumerate(due.items())
            ],
        )
        assert scalar(db, "SELECT count(*) FROM onceflow_instances WHERE started_at IS NULL") == N
        # killed in the middle of the window in which the jobs come due (3 to 8 s)
        time.sleep(max(0.0, (base + timedelta(seconds=5.5) - datetime.now(UTC)).total_seconds()))
        started_at_kill = scalar(
            db, "SELECT count(*) FROM onceflow_instances WHERE started_at IS NOT NULL"
        )
        group.stop("engine-0", sig=signal.SIGKILL)
        wait_for(
            lambda: (
                scalar(db, "SELECT count(*) FROM onceflow_instances WHERE status = 'complete'") == N
            ),
            "every delayed job complete",
            120,
        )
    started = dict(
        rows(db, "SELECT job_id, started_at FROM onceflow_instances WHERE job_id LIKE 'dsk_%'")
    )
    assert len(started) == N  # one instance per job id
    offsets = sorted((started[job] - at).total_seconds() for job, at in due.items())
    print(
        f"delayed start through a SIGKILL ({started_at_kill} started at the kill):"
        f" from its time p50 {statistics.median(offsets):+.3f} s,"
        f" min {offsets[0]:+.3f} s, max {offsets[-1]:+.3f} s"
    )
    # the latest: (seconds late, when due after the start, job id)
    late = sorted(
        (round((started[job] - at).total_seconds(), 3), round((at - base).total_seconds(), 2), job)
        for job, at in due.items()
    )[-4:]
    assert 0 < started_at_kill < N  # the kill came while jobs were coming due
    assert offsets[0] >= 0, "a job started before its time"
    assert offsets[-1] <= 1.0, f"jobs started late: {late}"
