"""A real Prometheus scrapes the three real processes under a workload; every PromQL
expression of the Grafana dashboard must return data, and the alert rules must load."""

from __future__ import annotations

import shutil
import subprocess
import time
import uuid
from pathlib import Path

import httpx
import orjson
import pytest

from onceflow_tools.dashboard import expressions
from onceflow_tools.processes import free_port
from onceflow_tools.stack import Stack
from tests.integration.kafka_helpers import produce

ROOT = Path(__file__).resolve().parents[2]
RULES = ROOT / "deploy/prometheus/alerts.yml"


def test_alert_rules_pass_promtool():
    promtool = shutil.which("promtool")
    assert promtool, "promtool is missing: run `make tools` (Debian package prometheus)"
    result = subprocess.run(
        [promtool, "check", "rules", str(RULES)], capture_output=True, text=True, check=False
    )
    assert result.returncode == 0, result.stdout + result.stderr
    assert "SUCCESS: 13 rules found" in result.stdout


@pytest.mark.timeout(240)
def test_every_dashboard_expression_returns_data(base_settings, tmp_path, capsys):
    prometheus = shutil.which("prometheus")
    assert prometheus, "prometheus is missing: run `make tools` (Debian package prometheus)"
    stack = Stack(base_settings, f"prom-{uuid.uuid4().hex[:8]}", tmp_path / "run").prepare()
    try:
        stack.start_ingest()
        streams_port = stack.start_worker()
        engine_port = stack.start_engine()
        targets = {
            "onceflow-ingest": stack.env["ONCEFLOW_INGEST_METRICS_PORT"],
            "onceflow-streams": str(streams_port),
            "onceflow-engine": str(engine_port),
        }
        prom_port = free_port()
        config = {
            "global": {"scrape_interval": "1s", "evaluation_interval": "1s"},
            "rule_files": [str(RULES)],
            "scrape_configs": [
                {"job_name": job, "static_configs": [{"targets": [f"127.0.0.1:{port}"]}]}
                for job, port in targets.items()
            ],
        }
        (tmp_path / "prometheus.yml").write_bytes(orjson.dumps(config))  # JSON is YAML
        prom = subprocess.Popen(
            [
                prometheus,
                f"--config.file={tmp_path / 'prometheus.yml'}",
                f"--storage.tsdb.path={tmp_path / 'tsdb'}",
                f"--web.listen-address=127.0.0.1:{prom_port}",
            ],
            stdout=open(tmp_path / "prometheus.log", "wb"),  # noqa: SIM115 (child keeps it)
            stderr=subprocess.STDOUT,
        )
        api = f"http://127.0.0.1:{prom_port}/api/v1"
        try:
            stack.wait_for(lambda: _up(api) == 3, 60, "Prometheus scraping all three targets")
            _workload(stack)
            time.sleep(8)  # several scrapes after the workload, for rate() windows

            results = {}
            for expr in expressions():
                query = (
                    expr.replace("$__rate_interval", "30s")
                    .replace("$group", stack.settings.consumer_group)
                    .replace("$topic", stack.settings.jobs_topic)
                )
                body = httpx.get(f"{api}/query", params={"query": query}, timeout=10).json()
                assert body["status"] == "success", (query, body)
                results[expr] = len(body["data"]["result"])
            rules = httpx.get(f"{api}/rules", timeout=10).json()["data"]["groups"]
        finally:
            prom.terminate()
            prom.wait(10)
    finally:
        stack.close()
    with capsys.disabled():
        print(
            f"\n{sum(1 for n in results.values() if n)} of {len(results)} dashboard"
            " expressions returned data"
        )
    empty = [expr for expr, n in results.items() if n == 0]
    assert empty == [], "expressions without data:\n" + "\n".join(empty)
    assert rules[0]["rules"][0]["name"] == "OnceflowConsumerLagGrowing"
    assert len(rules[0]["rules"]) == 13


def _up(api: str) -> int:
    try:
        body = httpx.get(f"{api}/query", params={"query": "sum(up)"}, timeout=2).json()
        return int(float(body["data"]["result"][0]["value"][1]))
    except Exception:
        return 0


def _workload(stack: Stack) -> None:
    # A schedule ticking every second, for the dashboard's schedule panel.
    created = httpx.post(
        f"{stack.ingest_url}/v1/schedules",
        json={"name": "prom", "workflow": "noop-workflow", "every_seconds": 1, "overlap": "allow"},
        headers=stack.auth_headers,
    )
    assert created.status_code == 201, created.text
    jobs = [
        {
            "job_id": f"prom_{i:04d}",
            "workflow": "order-workflow",
            "params": {"step_seconds": 0.01, "flaky": i % 7 == 0},
        }
        for i in range(300)
    ]
    with stack.client() as client:
        for start in range(0, 300, 50):
            client.submit(jobs[start : start + 50])
            time.sleep(0.5)
        client.submit(jobs[:40])  # duplicates
        # errored timed_out before its third step (1 s execution_timeout, 0.6 s steps)
        client.submit(
            [
                {
                    "job_id": "prom_timed",
                    "workflow": "deadline-demo-workflow",
                    "params": {"step_seconds": 0.6},
                }
            ]
        )
        client.submit([{**jobs[1], "params": {"other": True}}])  # a payload mismatch
        # Each run control decides (the "Run controls" row): a singleton skip (a report
        # of the account still live), a debounce (a burst for one index), batches (12
        # digests of one tenant: a full batch of 10, then the rest by max_wait), and an
        # id reuse (a declined payment submitted again: run 2).
        client.submit(
            [
                {
                    "job_id": f"prom_report_{i}",
                    "workflow": "report-workflow",
                    "params": {"account": "a1", "step_seconds": 1.0},
                }
                for i in range(3)
            ]
        )
        client.submit(
            [
                {
                    "job_id": f"prom_reindex_{i}",
                    "workflow": "reindex-workflow",
                    "params": {"index": "products"},
                }
                for i in range(5)
            ]
        )
        client.submit(
            [
                {
                    "job_id": f"prom_digest_{i:02d}",
                    "workflow": "digest-workflow",
                    "params": {"tenant": "t1"},
                }
                for i in range(12)
            ]
        )
        declined = {
            "job_id": "prom_pay",
            "workflow": "payment-workflow",
            "params": {"decline": True},
        }
        client.submit([declined])
    httpx.post(
        f"{stack.ingest_url}/v1/jobs", json={"workflow": "bad name!"}, headers=stack.auth_headers
    )  # a 422
    produce(
        stack.settings.kafka_bootstrap_servers,
        stack.settings.jobs_topic,
        [(b"junk", b"not json", [])],
    )  # a dead letter
    stack.wait_for(
        lambda: (
            stack.scalar(
                "SELECT count(*) FROM onceflow_instances"
                " WHERE status = 'complete' AND workflow = 'order-workflow'"
            )
            == 300
            and stack.scalar(
                "SELECT count(*) FROM onceflow_instances"
                " WHERE job_id = 'prom_timed' AND timeout_kind = 'timed_out'"
            )
            == 1
        ),
        120,
        "the workload to finish",
    )
    # Once the declined payment's run 1 has errored, the same id again starts run 2.
    stack.wait_for(
        lambda: (
            stack.scalar(
                "SELECT count(*) FROM onceflow_instances WHERE job_id = 'prom_pay'"
                " AND status = 'errored'"
            )
            == 1
        ),
        60,
        "the declined payment's end",
    )
    with stack.client() as client:
        client.submit([{"job_id": "prom_pay", "workflow": "payment-workflow", "params": {}}])
    stack.wait_for(
        lambda: (
            stack.scalar(
                "SELECT count(*) FROM onceflow_instances WHERE job_id = 'prom_pay' AND run = 2"
            )
            == 1
            and stack.scalar(
                "SELECT count(*) FROM onceflow_instances"
                " WHERE workflow = 'digest-workflow' AND status = 'complete'"
            )
            == 12 + 2  # the members and their two batch runs
        ),
        60,
        "the run controls' decisions",
    )
