"""One job id through everything: SQL, CLI, HTTP and logs tell the same story; the
audit finds exactly the job ids a test breaks by hand."""

from __future__ import annotations

import time
import uuid

import httpx
import orjson
import pytest
import sqlalchemy as sa

from onceflow.envelope import JobEnvelope
from onceflow.vocabulary import InstanceStatus, JobKind
from onceflow_tools.figures import count_instances, duplicate_counts
from onceflow_tools.stack import Stack
from tests.acceptance.test_demo import run_cli


@pytest.fixture
def stack(base_settings, tmp_path):
    s = Stack(base_settings, f"trace-{uuid.uuid4().hex[:8]}", tmp_path / "run").prepare()
    s.start_ingest()
    s.start_worker()
    s.start_engine()
    yield s
    s.close()


def error_details(body):
    """The route-specific facts of an error answer: under ``details`` in the unified
    error body, under FastAPI's ``detail`` before it (error and message included)."""
    return body["details"] if "details" in body else body["detail"]


def log_events(stack, name, job_id):
    path = stack.log_dir / f"{name}.log"
    events = []
    for line in path.read_text().splitlines():
        if job_id in line and line.startswith("{"):
            doc = orjson.loads(line)
            if doc.get("job_id") == job_id:
                events.append(doc["event"])
    return events


@pytest.mark.timeout(240)
def test_sql_cli_http_and_logs_tell_the_same_story(stack):
    jobs = [
        {
            "job_id": f"trace_{i:04d}",
            "workflow": "order-workflow",
            "params": {"amount": i, "step_seconds": 0.02},
        }
        for i in range(20)
    ]
    with stack.client() as client:
        client.submit(jobs)
        client.submit(jobs[:5])  # resubmitted
        client.submit([{**jobs[0], "params": {"amount": 999}}])  # same id, other params
    stack.wait_for(
        lambda: (
            count_instances(stack.db, InstanceStatus.COMPLETE) == 20
            and duplicate_counts(stack.db).total == 6
        ),
        90,
        "all jobs complete and all duplicates consumed",
    )
    job = "trace_0000"

    with stack.db.connect() as conn:
        sql = [
            tuple(r)
            for r in conn.execute(
                sa.text("SELECT event, detail, layer FROM job_trace(:j)"), {"j": job}
            )
        ]
    events = [e for e, _, _ in sql]
    assert events[:3] == ["received", "enqueued", "instance created"]
    # the end comes after every step; a duplicate may arrive even after the end
    done = events.index("instance complete")
    assert done > max(i for i, e in enumerate(events) if e.startswith("step"))
    assert events.count("duplicate collapsed") == 2
    assert sum("PAYLOAD MISMATCH" in d for _, d, _ in sql) == 1
    assert events.count("step started") == 3 and events.count("step complete") == 3
    assert sql[1][1].startswith(f"{stack.settings.jobs_topic}/")

    out = run_cli("trace", job, "--json", env=stack.env)
    assert out.returncode == 0, out.stderr
    cli = [orjson.loads(line) for line in out.stdout.splitlines()]
    assert [(c["event"], c["detail"], c["layer"]) for c in cli] == sql
    table = run_cli("trace", job, env=stack.env).stdout
    assert table.startswith(f"trace of {job}:") and "PAYLOAD MISMATCH" in table

    got = httpx.get(f"{stack.ingest_url}/v1/jobs/{job}", headers=stack.auth_headers).json()
    assert (got["kind"], got["status"], got["duplicates"], got["mismatches"]) == (
        JobKind.WORKFLOW,
        InstanceStatus.COMPLETE,
        2,
        1,
    )
    assert [s["status"] for s in got["steps"]] == ["complete"] * 3
    unknown = httpx.get(f"{stack.ingest_url}/v1/jobs/never_submitted", headers=stack.auth_headers)
    assert unknown.status_code == 404
    lag = error_details(unknown.json())["consumer_lag"]
    assert set(lag) == {"total", "partition", "partition_lag"}
    assert 0 <= lag["total"] <= 26  # everything consumed; offsets commit every few seconds

    def drained():
        body = httpx.get(
            f"{stack.ingest_url}/v1/jobs/never_submitted", headers=stack.auth_headers
        ).json()
        return error_details(body)["consumer_lag"]["total"] == 0

    stack.wait_for(drained, 30, "the committed offsets to catch up")

    time.sleep(0.5)  # let the processes flush their last log lines
    ingest, streams, engine = (log_events(stack, n, job) for n in ("ingest", "streams", "engine"))
    assert ingest.count("job.accepted") == 3  # three submissions were acknowledged
    assert streams.count("instance.created") == 1
    assert streams.count("delivery.duplicate") == events.count("duplicate collapsed")
    assert engine.count("step.complete") == events.count("step complete")
    assert engine.count("instance.complete") == 1


@pytest.mark.timeout(240)
def test_audit_clean_then_names_what_was_broken(stack):
    jobs = [
        {"job_id": f"audit_{i:03d}", "workflow": "order-workflow", "params": {"step_seconds": 0}}
        for i in range(30)
    ]
    with stack.client() as client:
        client.submit(jobs)
        client.submit(jobs[:10])
    stack.wait_for(
        lambda: (
            count_instances(stack.db, InstanceStatus.COMPLETE) == 30
            and duplicate_counts(stack.db).total == 10
        ),
        90,
        "all consumed",
    )

    def drained_and_clean():
        result = run_cli("audit", "--json", env=stack.env)
        report = orjson.loads(result.stdout)
        return result.returncode == 0 and report["lag"] == 0 and report["pending_job_ids"] == 0

    stack.wait_for(drained_and_clean, 30, "offsets committed and audit clean")
    clean = run_cli("audit", env=stack.env)
    assert "result: CLEAN" in clean.stdout
    assert "distinct job ids" in clean.stdout

    with stack.db.begin() as conn:
        conn.execute(sa.text("DELETE FROM onceflow_instances WHERE job_id = 'audit_007'"))
        conn.execute(
            sa.text(
                "INSERT INTO onceflow_task_runs (job_id, task, params)"
                " VALUES ('audit_012', 'send-welcome-email', '{}')"
            )
        )
    broken = run_cli("audit", "--json", env=stack.env)
    assert broken.returncode == 1
    report = orjson.loads(broken.stdout)
    assert report["missing"] == ["audit_007"]
    assert report["doubled"] == ["audit_012"]
    assert report["clean"] is False


@pytest.mark.timeout(240)
def test_a_dead_lettered_record_is_explained_and_the_audit_settles(stack):
    """Issue 17 defects 5 and 9: a record of an unknown type, produced straight to
    Kafka, is dead-lettered; the audit counts it as consumed (by reason) and settles,
    and HTTP, the CLI and SQL say why and where instead of "still in the queue"."""
    from tests.integration.kafka_helpers import produce_envelopes

    settings = stack.settings
    stray = JobEnvelope("dl_stray_01", "no-such-workflow", {"n": 1})
    produce_envelopes(settings.kafka_bootstrap_servers, settings.jobs_topic, [stray])
    with stack.client() as client:
        client.submit([{"job_id": "dl_fine_01", "workflow": "order-workflow", "params": {}}])

    def settled():
        result = run_cli("audit", "--json", env=stack.env)
        report = orjson.loads(result.stdout)
        return (
            result.returncode == 0
            and report["lag"] == 0
            and report["pending_job_ids"] == 0
            and report["dead_lettered_job_ids"] == 1
        )

    stack.wait_for(settled, 60, "the audit to settle with the dead letter counted")
    report = orjson.loads(run_cli("audit", "--json", env=stack.env).stdout)
    assert report["dead_lettered_by_reason"] == {"unknown_type": 1}
    assert "1 dead-lettered (by reason)" in run_cli("audit", env=stack.env).stdout

    got = httpx.get(f"{stack.ingest_url}/v1/jobs/dl_stray_01", headers=stack.auth_headers)
    assert got.status_code == 410, got.text
    body = got.json()
    assert (body.get("error") or body["detail"]["error"]) == "dead_lettered"
    (letter,) = error_details(got.json())["dead_letters"]
    assert letter["reason"] == "unknown_type"
    assert letter["source_topic"] == settings.jobs_topic
    assert letter["dlq_topic"] == settings.dlq_topic

    described = run_cli("instances", "describe", "order-workflow", "dl_stray_01", env=stack.env)
    assert described.returncode != 0
    assert "dead-lettered: unknown_type" in described.stderr
    trace = run_cli("trace", "dl_stray_01", env=stack.env)
    assert trace.returncode == 0, trace.stderr
    assert "dead-lettered" in trace.stdout
