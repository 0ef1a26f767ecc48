"""Retry from the failed step (issue 26, item 6) on two engines, one SIGKILLed while the
retried runs go on: no completed step runs again, whichever engine replays the
instance (the one that errored it, the other one, or the rescuer of the killed one's
runs), and every retried instance completes. Engines are real subprocesses; every
execution of step code is a row in the test's database (tests/integration/retry_workflows.py)."""

from __future__ import annotations

import json
import signal

import pytest

from onceflow.envelope import JobEnvelope
from onceflow_tools.processes import ProcessGroup
from tests.conftest import settings_env
from tests.integration.engine_processes import start_engine
from tests.integration.interleavings import check_history, rows, scalar, wait_for
from tests.integration.retry_workflows import CREATE_EXECUTIONS, WORKFLOW
from workflow_engine.model import Delivery
from workflow_engine.store.operations import retry
from workflow_engine.store.writes import create_instances

N = 100


def _count(db, status):
    return scalar(db, "SELECT count(*) FROM onceflow_instances WHERE status = :s", s=status)


POLL_SECONDS = 0.2


@pytest.mark.timeout(240)
def test_retried_runs_through_a_sigkill_never_rerun_a_completed_step(settings, db, tmp_path):
    with db.begin() as conn:
        conn.execute(CREATE_EXECUTIONS)
    jobs = [f"rc_{i:03d}" for i in range(N)]
    create_instances(
        db,
        [
            Delivery(JobEnvelope(job, WORKFLOW, {"step_seconds": 0.2}), "jobs", 0, i)
            for i, job in enumerate(jobs)
        ],
    )
    env = {
        **settings_env(settings),
        "ONCEFLOW_WORKFLOW_MODULES": json.dumps(
            [*settings.workflow_modules, "tests.integration.retry_workflows"]
        ),
    }
    with ProcessGroup(env, tmp_path / "logs") as group:
        start_engine(group, "engine-0", POLL_SECONDS)
        start_engine(group, "engine-1", POLL_SECONDS)
        wait_for(lambda: _count(db, "errored") == N, "every first run errored at step two", 120)
        for job in jobs:
            assert retry(db, WORKFLOW, job).status == "queued"
        # killed while the retried runs replay "one" and run "two" and "three"
        wait_for(
            lambda: (
                scalar(db, "SELECT count(*) FROM test_chaos_executions WHERE step = 'two'")
                >= N + N // 5
            ),
            "a fifth of the retried runs past step two",
            60,
        )
        done_at_kill, running_at_kill = _count(db, "complete"), _count(db, "running")
        group.stop("engine-0", sig=signal.SIGKILL)
        wait_for(lambda: _count(db, "complete") == N, "every retried run complete", 120)
    executions = {
        (job, step): n
        for job, step, n in rows(
            db, "SELECT job_id, step, count(*) FROM test_chaos_executions GROUP BY 1, 2"
        )
    }
    print(
        f"retry through a SIGKILL ({done_at_kill}/{N} complete, {running_at_kill} running"
        " at the kill):"
        f" executions of 'two' {sum(n for (_, s), n in executions.items() if s == 'two')},"
        f" of 'three' {sum(n for (_, s), n in executions.items() if s == 'three')}"
    )
    assert done_at_kill < N and running_at_kill > 0, "the kill cut no run"
    # "one" completed in the first run: neither the retry nor any replay ran it again
    assert [j for j in jobs if executions[(j, "one")] != 1] == []
    # "two" ran once failing, then again; a second run of it (or of "three") can only be
    # one cut by the kill, never one whose checkpoint had committed
    assert all(executions[(j, "two")] >= 2 and executions[(j, "three")] >= 1 for j in jobs)
    results = dict(rows(db, "SELECT job_id, result FROM onceflow_instances"))
    assert all(results[j]["one"] == 1 and results[j]["two"] >= 2 for j in jobs)
    assert check_history(db) == []
