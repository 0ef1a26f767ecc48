"""docker-compose.yml: valid for Debian's docker-compose, and every app command and
setting it uses is real (no Docker engine is needed for these checks)."""

from __future__ import annotations

import shutil
import subprocess
from pathlib import Path

import yaml

from tests.deploy.test_checks import is_onceflow_command, is_setting

ROOT = Path(__file__).resolve().parents[2]


def _config() -> dict:
    tool = shutil.which("docker-compose")
    assert tool, "docker-compose is missing: run `make tools` (Debian package docker-compose)"
    result = subprocess.run(
        [tool, "-f", str(ROOT / "docker-compose.yml"), "config"],
        capture_output=True,
        text=True,
        check=False,
        cwd=ROOT,
    )
    assert result.returncode == 0, result.stderr
    return yaml.safe_load(result.stdout)


def test_compose_is_valid_and_complete():
    services = _config()["services"]
    assert set(services) == {
        "kafka",
        "postgres",
        "migrate",
        "topics",
        "ingest",
        "streams",
        "engine",
        "console",
        "prometheus",
        "grafana",
        "jaeger",  # traces (README, "Tracing")
    }
    assert services["kafka"]["image"].startswith("apache/kafka:4.")
    for name in ("ingest", "streams", "engine", "console"):
        assert "healthcheck" in services[name]
        assert (
            services[name]["depends_on"]["migrate"]["condition"] == "service_completed_successfully"
        )


def test_every_app_command_and_setting_is_real():
    services = _config()["services"]
    app = {n: s for n, s in services.items() if s.get("image") == "onceflow:local"}
    assert set(app) == {"migrate", "topics", "ingest", "streams", "engine", "console"}
    for name, service in app.items():
        assert is_onceflow_command(service["command"]), (name, service["command"])
        for key in service["environment"]:
            assert is_setting(key), (name, key)


def test_prometheus_config_and_grafana_provisioning(tmp_path):
    promtool = shutil.which("promtool")
    assert promtool, "promtool is missing: run `make tools`"
    config = yaml.safe_load((ROOT / "deploy/prometheus/prometheus.yml").read_text())
    config["rule_files"] = [str(ROOT / "deploy/prometheus/alerts.yml")]
    (tmp_path / "prometheus.yml").write_text(yaml.safe_dump(config))
    result = subprocess.run(
        [promtool, "check", "config", str(tmp_path / "prometheus.yml")],
        capture_output=True,
        text=True,
        check=False,
    )
    assert result.returncode == 0, result.stdout + result.stderr
    jobs = {c["job_name"] for c in config["scrape_configs"]}
    assert jobs == {"onceflow-ingest", "onceflow-streams", "onceflow-engine"}
    dashboards = yaml.safe_load(
        (ROOT / "deploy/grafana/provisioning/dashboards/onceflow.yml").read_text()
    )
    assert dashboards["providers"][0]["options"]["path"] == "/var/lib/grafana/dashboards"
