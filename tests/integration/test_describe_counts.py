"""What describe and ``onceflow workflows`` say, on real PostgreSQL (issue 23): the hold
reason names the priority once, and "runnable" counts only instances due to run (a
sleeper hours from its timer, or an instance waiting for an event, is not stuck)."""

from __future__ import annotations

import importlib

import pytest
import sqlalchemy as sa
from click.testing import CliRunner

from onceflow.envelope import JobEnvelope
from workflow_engine.model import Delivery
from workflow_engine.store.views import Stranded, instances_without_engine
from workflow_engine.store.writes import create_instances


@pytest.fixture
def cli(settings, monkeypatch):
    main = importlib.import_module("onceflow_cli.main")  # the package exports main()
    monkeypatch.setattr(main, "_settings", lambda: settings)

    def run(*args: str) -> str:
        result = CliRunner().invoke(main.cli, list(args))
        assert result.exit_code == 0, result.output
        return result.output

    return run


def _create(db, job_id: str, priority: int = 3, version: str | None = None) -> None:
    env = JobEnvelope(job_id, "order-workflow", {}, "req_1", priority=priority)
    create_instances(db, [Delivery(env, "jobs", 0, abs(hash(job_id)) % 10**6, version=version)])


def _set(db, job_id: str, status: str, seconds_from_now: float | None) -> None:
    """``seconds_from_now`` None: run_after infinity (waiting for an event, no timeout)."""
    with db.begin() as conn:
        conn.execute(
            sa.text(
                "UPDATE onceflow_instances SET status = :s,"
                " run_after = coalesce(now() + make_interval(secs => :secs), 'infinity')"
                " WHERE job_id = :j"
            ),
            {"s": status, "secs": seconds_from_now, "j": job_id},
        )


def test_describe_says_the_priority_once(db, cli):
    _create(db, "turn_1", priority=2)
    held = [line for line in cli("instances", "describe", "order-workflow", "turn_1").splitlines()]
    assert "held back: waiting for its turn (priority 2)" in held
    assert not any("(priority 2) (priority 2)" in line for line in held)


def test_runnable_counts_only_instances_due_to_run(db, cli):
    for job_id in ("due_1", "sleeps_1", "waits_1"):
        _create(db, job_id, version="v-gone")  # no live engine has it
    _set(db, "sleeps_1", "sleeping", 3600)
    _set(db, "waits_1", "waiting", None)
    said = cli("workflows")
    assert "1 runnable instances of order-workflow version v-gone" in said, said
    assert "2 instances of order-workflow version v-gone sleeping or waiting" in said, said
    assert instances_without_engine(db, 60.0) == [Stranded("order-workflow", "v-gone", 1, 2)]

    _set(db, "sleeps_1", "sleeping", -1)  # its timer is due
    assert instances_without_engine(db, 60.0) == [Stranded("order-workflow", "v-gone", 2, 1)]
