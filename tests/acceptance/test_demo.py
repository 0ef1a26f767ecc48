"""The demo scenario, driven as a user would: the CLI as a subprocess, checked with SQL.

100 jobs over HTTP, then the whole batch again, a random subset again from concurrent
clients and one payload mismatch; the three processes run as real subprocesses.
"""

from __future__ import annotations

import os
import subprocess

import orjson
import pytest
import sqlalchemy as sa

from onceflow_tools.processes import onceflow_command
from workflow_engine.store import make_engine


def run_cli(*args, env, timeout=60):
    return subprocess.run(
        [*onceflow_command(), *args],
        env={**os.environ, **env},
        capture_output=True,
        text=True,
        timeout=timeout,
        check=False,
    )


@pytest.fixture
def cli_env(services, tmp_path):
    return {
        "ONCEFLOW_KAFKA_BOOTSTRAP_SERVERS": services.kafka,
        "ONCEFLOW_DATABASE_URL": services.database_url,
        "ONCEFLOW_STATE_DIR": str(tmp_path / "state"),
    }


@pytest.mark.timeout(300)
def test_demo_exactly_one_instance_per_job(cli_env, tmp_path):
    proof_file = tmp_path / "proof.json"
    result = run_cli(
        "demo",
        "--jobs",
        "100",
        "--clients",
        "4",
        "--seed",
        "7",
        "--json-out",
        str(proof_file),
        env=cli_env,
        timeout=280,
    )
    assert result.returncode == 0, result.stdout[-3000:] + result.stderr[-3000:]
    assert "PROPERTY HOLDS" in result.stdout
    assert 'step "charge payment"' in result.stdout  # describe ran while it was running
    proof = orjson.loads(proof_file.read_bytes())
    assert proof["ok"] is True
    assert proof["accepted"] == 100
    assert proof["records_in_topic"] == proof["records_acknowledged"] > 200

    # Re-check independently, with our own SQL, on the database the demo used.
    db = make_engine(proof["database_url"], pool_size=1)
    with db.connect() as conn:

        def q(sql):
            return conn.execute(sa.text(sql)).scalar()

        assert q("SELECT count(*) FROM onceflow_instances") == 100
        assert q("SELECT count(*) FROM onceflow_instances WHERE status = 'complete'") == 100
        assert q("SELECT count(*) FROM onceflow_instances WHERE job_id !~ '^order_[0-9]{4}$'") == 0
        assert (
            q("SELECT count(*) FROM onceflow_duplicate_deliveries")
            == proof["records_in_topic"] - 100
        )
        assert q("SELECT count(*) FROM onceflow_duplicate_deliveries WHERE NOT params_match") == 1
        assert (
            q(
                "SELECT count(*) FROM (SELECT job_id, step FROM onceflow_demo_side_effects"
                " GROUP BY 1, 2 HAVING count(*) <> 1) x"
            )
            == 0
        )
        assert q("SELECT count(*) FROM onceflow_demo_side_effects") == 300
        # the flaky step of every tenth job really was retried, and finished once
        assert (
            q("SELECT count(*) FROM onceflow_steps WHERE name = 'reserve stock' AND attempts = 2")
            == 10
        )
        db_url = proof["database_url"]
    db.dispose()

    described = run_cli(
        "instances",
        "describe",
        "order-workflow",
        "order_0003",
        env={**cli_env, "ONCEFLOW_DATABASE_URL": db_url},
    )
    assert described.returncode == 0, described.stderr
    lines = described.stdout.splitlines()
    assert "status: complete" in lines
    assert 'step "charge payment": complete' in lines
    assert 'step "reserve stock": complete (attempt 2)' in lines
    assert 'step "ship": complete' in lines


def test_cli_errors_are_one_line(cli_env, db_url):
    env = {**cli_env, "ONCEFLOW_DATABASE_URL": db_url}
    result = run_cli("instances", "describe", "order-workflow", "no_such_job", env=env)
    assert result.returncode == 1
    assert result.stderr.strip().splitlines() == [
        "onceflow: no instance of 'order-workflow' with job id 'no_such_job'"
    ]


def test_cli_on_an_unmigrated_database_says_what_to_do(cli_env, base_settings):
    from onceflow_tools.stack import recreate_database

    url = recreate_database(base_settings.database_url, "onceflow_unmigrated_test")
    env = {**cli_env, "ONCEFLOW_DATABASE_URL": url}
    result = run_cli("instances", "describe", "order-workflow", "x", env=env)
    assert result.returncode == 1
    assert result.stderr.strip().splitlines() == [
        "onceflow: the database has no onceflow schema: run `onceflow migrate` first"
    ]


def test_cli_reports_an_unreachable_database_in_one_line(cli_env):
    env = {**cli_env, "ONCEFLOW_DATABASE_URL": "postgresql://postgres@127.0.0.1:1/x"}
    result = run_cli("migrate", env=env)
    assert result.returncode == 1
    lines = result.stderr.strip().splitlines()
    assert len(lines) == 1 and lines[0].startswith("onceflow: PostgreSQL unreachable")
