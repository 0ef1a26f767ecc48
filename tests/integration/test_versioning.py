"""Safe deploys on real PostgreSQL: instances run on the definition version they were
created with, engines (subprocesses loading different workflow code) claim only the
versions they have, ``ctx.patched`` changes new instances only, and a replay mismatch
stops an instance with an error naming the step and the versions."""

from __future__ import annotations

import json
import subprocess
import sys
import time
from collections.abc import Callable

import httpx
import pytest
import sqlalchemy as sa

from onceflow.envelope import JobEnvelope
from onceflow_tools.processes import ProcessGroup, free_port
from tests.conftest import settings_env
from workflow_engine.model import Delivery
from workflow_engine.store import operations
from workflow_engine.store.views import describe_instance
from workflow_engine.store.writes import create_instances

NAME = "test-versioned"  # registered by the tests/integration/versioned_*.py modules
_offsets = iter(range(10**6))


def create(db, job_ids: list[str], version: str) -> None:
    create_instances(
        db,
        [
            Delivery(JobEnvelope(j, NAME, {}), "t", 0, next(_offsets), version=version)
            for j in job_ids
        ],
    )


def statuses(db, job_ids: list[str]) -> dict[str, str]:
    with db.connect() as conn:
        rows = conn.execute(
            sa.text("SELECT job_id, status FROM onceflow_instances WHERE job_id = ANY(:j)"),
            {"j": job_ids},
        )
        return dict(rows.all())


def steps(db, job_id: str) -> list[tuple[str, str, int]]:
    with db.connect() as conn:
        return [
            tuple(r)
            for r in conn.execute(
                sa.text(
                    "SELECT name, kind, attempts FROM onceflow_steps WHERE job_id = :j"
                    " ORDER BY position"
                ),
                {"j": job_id},
            )
        ]


def wait_for(group: ProcessGroup, cond: Callable[[], bool], what: str, timeout=60.0) -> None:
    deadline = time.monotonic() + timeout
    while not cond():
        assert time.monotonic() < deadline, f"timed out waiting for {what}"
        group.check_alive()
        time.sleep(0.1)


def all_in(db, job_ids: list[str], status: str) -> Callable[[], bool]:
    return lambda: set(statuses(db, job_ids).values()) == {status}


def start_engine(group: ProcessGroup, name: str, module: str) -> int:
    port = free_port()
    group.start(
        name,
        "engine",
        env={
            "ONCEFLOW_ENGINE_METRICS_PORT": str(port),
            "ONCEFLOW_WORKFLOW_MODULES": json.dumps([f"tests.integration.{module}"]),
            "ONCEFLOW_ENGINE_LEASE_SECONDS": "3",
            "ONCEFLOW_ENGINE_POLL_INTERVAL_SECONDS": "0.2",
        },
    )
    group.wait_http(f"http://127.0.0.1:{port}/metrics")
    return port


def approve(db, job_ids: list[str]) -> None:
    for job_id in job_ids:
        operations.send_event(db, NAME, job_id, "approved", {"by": "test"})


def gauge(port: int, version: str) -> float | None:
    text = httpx.get(f"http://127.0.0.1:{port}/metrics", timeout=2).text
    for line in text.splitlines():
        if (
            line.startswith("onceflow_engine_instances_without_engine{")
            and f'workflow="{NAME}"' in line
            and f'version="{version}"' in line
        ):
            return float(line.rsplit(" ", 1)[1])
    return None


def cli(settings, *args: str) -> str:
    out = subprocess.run(
        [sys.executable, "-m", "onceflow_cli", *args],
        env={**settings_env(settings), "PATH": "/usr/bin:/bin"},
        capture_output=True,
        text=True,
        timeout=60,
    )
    assert out.returncode == 0, out.stderr
    return out.stdout


@pytest.mark.timeout(240)
def test_engines_claim_only_their_versions(settings, db, tmp_path):
    old = [f"ver_old_{i}" for i in range(3)]
    new = [f"ver_new_{i}" for i in range(2)]
    create(db, old, "v1")
    with ProcessGroup(settings_env(settings), tmp_path / "logs") as group:
        start_engine(group, "engine-v1", "versioned_v1")
        wait_for(group, all_in(db, old, "waiting"), "v1 instances to wait for approval")
        group.stop("engine-v1")

        # The new image: a v2 engine. It runs new (v2) instances and never claims v1 ones.
        port = start_engine(group, "engine-v2", "versioned_v2")
        create(db, new, "v2")
        wait_for(group, all_in(db, new, "waiting"), "v2 instances to wait")
        approve(db, old + new)  # the v1 instances are runnable now, too
        wait_for(group, all_in(db, new, "complete"), "v2 instances to complete")
        for job_id in new:
            assert describe_instance(db, job_id).result == {"path": "v2", "ship": "shipped-v2"}
            assert steps(db, job_id)[-1] == ("ship-express", "step", 1)
        assert set(statuses(db, old).values()) == {"waiting"}  # due, yet not claimed
        assert [s[0] for s in steps(db, old[0])] == ["reserve", "charge", "approval"]

        # Stranded v1 instances are visible: gauge, describe, list --version, workflows.
        wait_for(group, lambda: gauge(port, "v1") == 3.0, "the without-engine gauge")
        view = describe_instance(db, old[0])
        assert view.version == "v1" and view.engine_available is False
        assert "waiting for an engine with version v1" in (view.waiting_for_engine or "")
        described = cli(settings, "instances", "describe", NAME, old[0])
        assert "version: v1" in described
        assert "waiting for an engine with version v1" in described
        listed = cli(settings, "instances", "list", "--version", "v1").splitlines()
        assert sorted(line.split("\t")[0] for line in listed) == old
        assert all(line.endswith("\tv1") for line in listed)
        assert "3 runnable instances of test-versioned version v1" in cli(settings, "workflows")

        # During the rollout, a v1 engine beside the v2 one drains the old instances.
        start_engine(group, "engine-v1-again", "versioned_v1")
        wait_for(group, all_in(db, old, "complete"), "v1 instances to complete on v1")
        wait_for(group, lambda: gauge(port, "v1") is None, "the gauge to clear")
    for job_id in old:
        view = describe_instance(db, job_id)
        assert view.result == {"path": "v1", "charge": "charged-v1", "ship": "shipped-v1"}
        assert view.engine_available is None  # final
        # Nothing ran twice: every step checkpointed on its first attempt.
        assert all(attempts <= 1 for _, _, attempts in steps(db, job_id))


@pytest.mark.timeout(240)
def test_patched_changes_new_instances_only_and_a_mismatch_stops_the_instance(
    settings, db, tmp_path
):
    old = ["pat_old_0", "pat_old_1"]
    stranded = ["pat_renamed"]
    new = ["pat_new_0", "pat_new_1"]
    create(db, old + stranded, "v1")
    with ProcessGroup(settings_env(settings), tmp_path / "logs") as group:
        start_engine(group, "engine-v1", "versioned_v1")
        wait_for(group, all_in(db, old + stranded, "waiting"), "v1 instances to wait")
        group.stop("engine-v1")

        # Same version, patched code: old instances replay the old charge, new take the fix.
        start_engine(group, "engine-patched", "versioned_v1_patched")
        create(db, new, "v1")
        wait_for(group, all_in(db, new, "waiting"), "new instances to wait")
        approve(db, old + new)
        wait_for(group, all_in(db, old + new, "complete"), "all to complete")
        group.stop("engine-patched")

        # Same version string, a step renamed without a patch: replay must stop it.
        start_engine(group, "engine-renamed", "versioned_v1_renamed")
        approve(db, stranded)
        wait_for(group, all_in(db, stranded, "errored"), "the mismatch to stop the instance")

    for job_id in old:
        assert describe_instance(db, job_id).result["charge"] == "charged-v1"
        assert [s[0] for s in steps(db, job_id)] == ["reserve", "charge", "approval", "ship"]
    for job_id in new:
        assert describe_instance(db, job_id).result["charge"] == "charged-patched"
        assert steps(db, job_id)[:3] == [
            ("reserve", "step", 1),
            ("fix-charge", "patch", 0),
            ("charge-with-tax", "step", 1),
        ]
    error = describe_instance(db, stranded[0]).error or ""
    for part in ("'charge-card'", "position 1", "'charge'", "version v1,", "has version v1"):
        assert part in error, error
    # It stopped at the mismatch: no completed step ran again, nothing new was recorded.
    assert steps(db, stranded[0]) == [
        ("reserve", "step", 1),
        ("charge", "step", 1),
        ("approval", "event", 0),
    ]
