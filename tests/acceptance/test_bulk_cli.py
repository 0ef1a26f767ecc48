"""Bulk operations, filtered lists and dead letters through the real ``onceflow`` CLI."""

from __future__ import annotations

import orjson
import pytest
import sqlalchemy as sa

from onceflow.envelope import HEADER_DLQ_REASON, HEADER_DLQ_TRUNCATED, JobEnvelope
from tests.acceptance.test_demo import run_cli
from tests.conftest import settings_env
from tests.integration.kafka_helpers import consume_all, produce
from workflow_engine.model import Delivery
from workflow_engine.store.writes import create_instances


def _statuses(db):
    with db.connect() as conn:
        return dict(conn.execute(sa.text("SELECT job_id, status FROM onceflow_instances")).all())


@pytest.mark.timeout(180)
def test_bulk_pause_and_resume_with_a_filter(settings, db):
    env = settings_env(settings)
    create_instances(
        db,
        [Delivery(JobEnvelope(f"bk_{i}", "approval-workflow", {}), "t", 0, i) for i in range(5)]
        + [Delivery(JobEnvelope("other", "order-workflow", {}), "t", 0, 9)],
    )

    def cli(*args, ok=True):
        result = run_cli(*args, env=env)
        assert (result.returncode == 0) == ok, (result.stdout, result.stderr)
        return result

    flt = "workflow=approval-workflow,prefix=bk_"
    dry = cli("instances", "pause", "--filter", flt, "--dry-run").stdout
    assert "would pause 5 instance(s)" in dry
    assert set(_statuses(db).values()) == {"queued"}  # a dry run changes nothing

    # no --yes and no terminal to answer: aborted, nothing changed
    cli("instances", "pause", "--filter", flt, ok=False)
    assert set(_statuses(db).values()) == {"queued"}

    out = cli("instances", "pause", "--filter", flt, "--yes", "--batch", "2").stdout
    lines = out.strip().splitlines()
    assert lines[0].startswith("bulk pause #") and "on 5 instance(s)" in lines[0]
    assert [ln.strip().split(" ")[0] for ln in lines[1:-1]] == ["2/5", "4/5", "5/5"]
    assert "complete, 5 done, 0 skipped of 5" in lines[-1]
    after = _statuses(db)
    assert {after[f"bk_{i}"] for i in range(5)} == {"paused"} and after["other"] == "queued"

    listed = cli("instances", "list", "--filter", "status=paused", "--json").stdout
    rows = [orjson.loads(line) for line in listed.splitlines()]
    assert sorted(r["job_id"] for r in rows) == [f"bk_{i}" for i in range(5)]

    out = cli("instances", "resume", "--filter", "prefix=bk_,status=paused", "--yes").stdout
    assert "5 done" in out
    # the single-instance form still works, and a bad filter is one clear line
    assert cli("instances", "pause", "approval-workflow", "bk_0").stdout.strip() == "bk_0: paused"
    bad = cli("instances", "terminate", "--filter", "colour=red", "--yes", ok=False)
    assert "unknown filter key 'colour'" in bad.stderr and "Traceback" not in bad.stderr
    everything = cli("instances", "terminate", "--filter", "", "--yes", ok=False)
    assert "narrow it" in everything.stderr


@pytest.mark.timeout(180)
def test_dead_letters_list_and_redrive(settings, db):
    env = settings_env(settings)
    good = JobEnvelope("dl_good", "order-workflow", {})
    cut = JobEnvelope("dl_cut", "order-workflow", {})
    produce(
        settings.kafka_bootstrap_servers,
        settings.dlq_topic,
        [
            (good.key(), good.encode(), [(HEADER_DLQ_REASON, b"database_refused")]),
            (
                cut.key(),
                cut.encode()[:10],
                [(HEADER_DLQ_REASON, b"too_large"), (HEADER_DLQ_TRUNCATED, b"true")],
            ),
        ],
    )

    def cli(*args, ok=True):
        result = run_cli(*args, env=env)
        assert (result.returncode == 0) == ok, (result.stdout, result.stderr)
        return result.stdout

    letters = [orjson.loads(x) for x in cli("dead-letters", "list", "--json").splitlines()]
    assert sorted(x["key"] for x in letters) == ["dl_cut", "dl_good"]
    only = cli("dead-letters", "list", "--reason", "too_large").strip().splitlines()
    assert len(only) == 1 and "dl_cut" in only[0] and "(truncated)" in only[0]

    dry = cli("dead-letters", "redrive", "--all", "--dry-run")
    assert "would be re-driven 1, skipped 0, refused 1, failed 0" in dry
    good_at = next(x["position"] for x in letters if x["key"] == "dl_good")
    out = cli("dead-letters", "redrive", "--offset", good_at)
    assert "re-driven 1, skipped 0, refused 0, failed 0" in out
    assert "delivered again (no instance or task run)" in out
    out = cli("dead-letters", "redrive", "--reason", "too_large")
    assert "re-driven 0, skipped 0, refused 1" in out
    records = consume_all(settings.kafka_bootstrap_servers, settings.jobs_topic, 1)
    assert [m.key() for m in records] == [b"dl_good"]
    assert "exactly one of" in run_cli("dead-letters", "redrive", env=env).stderr
