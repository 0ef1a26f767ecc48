"""Re-driving a failed plain task runs its next attempt (issue 23, case 7): real Kafka,
PostgreSQL, the real streams worker and the real ``onceflow dead-letters redrive``."""

from __future__ import annotations

import json

import pytest
import sqlalchemy as sa
from fastapi.testclient import TestClient

from console import create_app
from onceflow.envelope import JobEnvelope
from onceflow.redrive import read_dead_letters
from onceflow_tools.processes import ProcessGroup
from tests.acceptance.test_demo import run_cli
from tests.conftest import settings_env
from tests.integration.kafka_helpers import produce_envelopes
from tests.integration.test_console import csrf_of
from tests.integration.test_streams_worker import scalar, start_worker, wait_until

TASK = "test-flaky-task"  # tests/integration/redrive_tasks.py: 1 retry, then dead-lettered


def _run(db, job_id):
    with db.connect() as conn:
        row = conn.execute(
            sa.text("SELECT status, attempts FROM onceflow_task_runs WHERE job_id = :j"),
            {"j": job_id},
        ).one_or_none()
    return tuple(row) if row is not None else None


@pytest.mark.timeout(240)
def test_redriving_a_failed_task_runs_its_next_attempt_and_says_so(settings, db, tmp_path):
    down = tmp_path / "downstream-down"
    down.touch()
    job = JobEnvelope("flaky_1", TASK, {"job_id": "flaky_1", "broken_while": str(down)})
    env = {
        **settings_env(settings),
        "ONCEFLOW_WORKFLOW_MODULES": json.dumps(
            [*settings.workflow_modules, "tests.integration.redrive_tasks"]
        ),
    }
    produce_envelopes(settings.kafka_bootstrap_servers, settings.jobs_topic, [job])
    with ProcessGroup(env, tmp_path / "logs") as group:
        start_worker(group)
        wait_until(lambda: _run(db, "flaky_1") == ("dead_lettered", 2), 90, "dead-lettered", group)
        wait_until(
            lambda: read_dead_letters(settings, reason="task_failed"), 60, "the letter", group
        )
        down.unlink()  # the cause is fixed: the downstream is back

        redriven = run_cli("dead-letters", "redrive", "--reason", "task_failed", env=env)
        assert redriven.returncode == 0, redriven.stderr
        wait_until(
            lambda: _run(db, "flaky_1") == ("succeeded", 3),
            90,
            f"the re-driven task's attempt 3 (the run is {_run(db, 'flaky_1')};"
            f" the tool said {redriven.stdout.strip()!r})",
            group,
        )
        assert f"task '{TASK}' attempt 3 queued" in redriven.stdout
        assert "re-driven 1, skipped 0, refused 0, failed 0" in redriven.stdout

        # Again: the task succeeded, so nothing is sent and the tool says why.
        again = run_cli("dead-letters", "redrive", "--reason", "task_failed", env=env)
        assert again.returncode == 0, again.stderr
        assert f"task '{TASK}' already succeeded (attempt 3)" in again.stdout
        assert "re-driven 0, skipped 1" in again.stdout

        # The console's re-drive is the same one: its pages say the same.
        console = TestClient(create_app(settings, db), base_url="http://testserver")
        form = {"csrf_token": csrf_of(console, "/dead-letters"), "reason": "task_failed"}
        form["all"] = "yes"
        ask = console.post("/dead-letters/redrive", data=form)
        assert ask.status_code == 200 and "re-driven 0, skipped 1" in ask.text
        done = console.post("/dead-letters/redrive", data={**form, "confirm": "yes"})
        assert done.status_code == 200
        assert "already succeeded (attempt 3)" in done.text.replace("&#39;", "'")
    assert scalar(db, "SELECT count(*) FROM onceflow_demo_side_effects") == 1
    assert scalar(db, "SELECT count(*) FROM onceflow_dead_letters") == 1
