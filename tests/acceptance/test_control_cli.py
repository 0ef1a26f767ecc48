"""Pause, resume, terminate, restart and send-event through the CLI, with a real engine."""

from __future__ import annotations

import time

import orjson
import pytest
import sqlalchemy as sa

from onceflow.envelope import JobEnvelope
from onceflow.vocabulary import InstanceStatus
from onceflow_tools.processes import ProcessGroup, free_port
from tests.acceptance.test_demo import run_cli
from tests.conftest import settings_env
from workflow_engine.model import Delivery
from workflow_engine.store.views import describe_instance
from workflow_engine.store.writes import create_instances


def status(db, job_id):
    view = describe_instance(db, job_id)
    return view.status if view is not None else None


def wait_status(db, job_id, wanted, timeout=30):
    deadline = time.monotonic() + timeout
    while status(db, job_id) != wanted:
        assert time.monotonic() < deadline, f"{job_id} is {status(db, job_id)}, not {wanted}"
        time.sleep(0.1)


@pytest.mark.timeout(120)
def test_control_operations_through_the_cli(settings, db, tmp_path):
    env = {**settings_env(settings), "ONCEFLOW_ENGINE_POLL_INTERVAL_SECONDS": "0.2"}
    for job in ("appr_1", "appr_2"):
        create_instances(
            db,
            [
                Delivery(
                    JobEnvelope(job, "approval-workflow", {"job_id": job, "step_seconds": 0}),
                    "t",
                    0,
                    0,
                )
            ],
        )

    def cli(*args):
        result = run_cli(*args, env=env)
        assert result.returncode == 0, result.stderr
        return result.stdout.strip()

    with ProcessGroup(env, tmp_path / "logs") as group:
        group.start("engine", "engine", env={"ONCEFLOW_ENGINE_METRICS_PORT": str(free_port())})
        wait_status(db, "appr_1", InstanceStatus.WAITING)
        wait_status(db, "appr_2", InstanceStatus.WAITING)
        described = cli("instances", "describe", "approval-workflow", "appr_1")
        assert "status: waiting" in described
        assert "wait \"approval\": waiting for event 'approved'" in described

        assert cli("instances", "pause", "approval-workflow", "appr_1") == "appr_1: paused"
        assert "appr_1" in cli("instances", "list", "--status", "paused")
        # an event to a paused instance is kept, and consumed after resume
        assert "stored" in cli(
            "instances", "send-event", "approval-workflow", "appr_1", "approved", '{"by": "ann"}'
        )
        time.sleep(0.5)
        assert status(db, "appr_1") == InstanceStatus.PAUSED
        assert cli("instances", "resume", "approval-workflow", "appr_1") == "appr_1: queued"
        wait_status(db, "appr_1", InstanceStatus.COMPLETE)
        out = orjson.loads(cli("instances", "describe", "approval-workflow", "appr_1", "--json"))
        assert out["result"] == {"approved": True, "by": "ann"}

        assert cli("instances", "terminate", "approval-workflow", "appr_2") == "appr_2: terminated"
        refused = run_cli(
            "instances", "send-event", "approval-workflow", "appr_2", "approved", env=env
        )
        assert refused.returncode == 1
        assert refused.stderr.strip() == "onceflow: appr_2 is terminated; it takes no more events"

        assert cli("instances", "restart", "approval-workflow", "appr_1") == "appr_1: queued"
        wait_status(db, "appr_1", InstanceStatus.WAITING)
        cli("instances", "send-event", "approval-workflow", "appr_1", "approved")
        wait_status(db, "appr_1", InstanceStatus.COMPLETE)

        bad = run_cli(
            "instances", "send-event", "approval-workflow", "appr_1", "x", "{oops", env=env
        )
        assert bad.returncode == 1 and bad.stderr.startswith("onceflow: payload is not valid")

    listed = [
        orjson.loads(line)
        for line in cli("instances", "list", "--prefix", "appr_", "--json").splitlines()
    ]
    assert {(r["job_id"], r["status"]) for r in listed} == {
        ("appr_1", InstanceStatus.COMPLETE),
        ("appr_2", InstanceStatus.TERMINATED),
    }
    with db.connect() as conn:
        restarts = conn.execute(
            sa.text("SELECT restart_count FROM onceflow_instances WHERE job_id = 'appr_1'")
        ).scalar()
        effects = conn.execute(
            sa.text(
                "SELECT step, count(*) FROM onceflow_demo_side_effects WHERE job_id = 'appr_1'"
                " GROUP BY 1 ORDER BY 1"
            )
        ).all()
    assert restarts == 1
    assert effects == [("fulfil", 2), ("request approval", 2)]  # ran once per run
