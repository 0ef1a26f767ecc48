"""The Helm chart: lint, render with defaults and with every option on, validate the
manifests offline against Kubernetes schemas, and check commands and settings."""

from __future__ import annotations

import json
import os
import shutil
import subprocess
from pathlib import Path

import kubernetes_validate
import pytest
import yaml

from tests.deploy.test_checks import is_onceflow_command, is_setting

ROOT = Path(__file__).resolve().parents[2]
CHART = ROOT / "helm" / "onceflow"
K8S_VERSION = "1.30"
ALL_ON = [
    "serviceMonitor.enabled=true",
    "prometheusRule.enabled=true",
    "ingest.autoscaling.enabled=true",
    "engine.autoscaling.enabled=true",
    "streams.autoscaling.mode=keda",
    "dashboard.enabled=true",
    "database.migrationSecret=onceflow-migrator",
    "settings.ONCEFLOW_LOG_LEVEL=DEBUG",
    "console.enabled=true",
    "webhooks.existingSecret=onceflow-webhooks",
    "webhooks.inEngine=false",
]
CRDS = {"ServiceMonitor", "PrometheusRule", "ScaledObject"}


def helm() -> str:
    found = shutil.which("helm") or str(
        Path(os.environ.get("GOPATH", Path.home() / "go")) / "bin" / "helm"
    )
    assert Path(found).exists(), "helm is missing: run `make tools` (go install helm)"
    return found


def run_helm(*args: str) -> subprocess.CompletedProcess:
    return subprocess.run([helm(), *args], capture_output=True, text=True, check=False)


def render(*sets: str) -> list[dict]:
    args = ["template", "t", str(CHART)]
    for s in sets:
        args += ["--set", s]
    result = run_helm(*args)
    assert result.returncode == 0, result.stderr
    return [doc for doc in yaml.safe_load_all(result.stdout) if doc]


@pytest.mark.parametrize("sets", [[], ALL_ON], ids=["defaults", "all-options"])
def test_lint_strict(sets):
    args = ["lint", "--strict", str(CHART)]
    for s in sets:
        args += ["--set", s]
    result = run_helm(*args)
    assert result.returncode == 0, result.stdout + result.stderr


@pytest.mark.parametrize(
    "sets",
    [[], ALL_ON, ["streams.autoscaling.mode=hpa"]],
    ids=["defaults", "all-options", "streams-hpa"],
)
def test_rendered_manifests_are_valid_kubernetes(sets):
    docs = render(*sets)
    for doc in docs:
        if doc["kind"] in CRDS:
            assert doc["apiVersion"] and doc["metadata"]["name"] and doc["spec"]
            continue
        kubernetes_validate.validate(doc, K8S_VERSION, strict=True)


def test_objects_per_configuration():
    kinds = sorted(d["kind"] for d in render())
    assert kinds == sorted(
        [
            "ConfigMap",
            "ConfigMap",
            "Deployment",
            "Deployment",
            "Deployment",
            "Job",
            "PodDisruptionBudget",
            "PodDisruptionBudget",
            "PodDisruptionBudget",
            "Service",
            "Service",
            "Service",
        ]
    )
    all_on = sorted(d["kind"] for d in render(*ALL_ON))
    for kind in ("HorizontalPodAutoscaler", "ScaledObject", "ServiceMonitor", "PrometheusRule"):
        assert kind in all_on
    assert all_on.count("HorizontalPodAutoscaler") == 2  # ingest and engine; streams: KEDA
    hpa_docs = render("streams.autoscaling.mode=hpa")
    assert sum(d["kind"] == "HorizontalPodAutoscaler" for d in hpa_docs) == 1
    assert not any(d["kind"] == "ScaledObject" for d in hpa_docs)


def test_console_is_off_by_default_and_its_own_deployment_when_on():
    def named(docs: list[dict]) -> set[tuple[str, str]]:
        return {(d["kind"], d["metadata"]["name"]) for d in docs}

    assert not {n for n in named(render()) if "console" in n[1]}
    docs = render("console.enabled=true")
    assert {n for n in named(docs) if "console" in n[1]} == {
        ("Deployment", "t-onceflow-console"),
        ("Service", "t-onceflow-console"),
    }
    (deployment,) = [
        d
        for d in docs
        if d["metadata"]["name"] == "t-onceflow-console" and d["kind"] == "Deployment"
    ]
    (container,) = deployment["spec"]["template"]["spec"]["containers"]
    assert container["args"] == ["console"]
    env = {e["name"]: e.get("value") for e in container["env"]}
    assert env["ONCEFLOW_CONSOLE_PORT"] == "8090"
    assert env["ONCEFLOW_CONSOLE_METRICS_PORT"] == "9104"
    ports = {p["name"]: p["containerPort"] for p in container["ports"]}
    assert ports == {"http": 8090, "metrics": 9104}


def test_every_command_and_setting_is_real():
    for doc in render(*ALL_ON):
        if doc["kind"] == "ConfigMap" and doc["metadata"]["name"].endswith("-settings"):
            assert all(is_setting(k) for k in doc["data"]), doc["data"]
        if doc["kind"] not in ("Deployment", "Job"):
            continue
        pod = doc["spec"]["template"]["spec"]
        for container in pod.get("initContainers", []) + pod["containers"]:
            assert is_onceflow_command(container["args"]), container["args"]
            for env in container.get("env", []):
                assert is_setting(env["name"]), env["name"]


def test_streams_cannot_outnumber_partitions():
    result = run_helm(
        "template",
        "t",
        str(CHART),
        "--set",
        "kafka.partitions=4",
        "--set",
        "streams.autoscaling.maxReplicas=8",
    )
    assert result.returncode != 0
    assert "cannot exceed kafka.partitions" in result.stderr


def test_schema_rejects_bad_values():
    result = run_helm("template", "t", str(CHART), "--set", "streams.autoscaling.mode=sideways")
    assert result.returncode != 0 and "must be one of" in result.stderr


def test_chart_ships_the_same_dashboard_and_alerts():
    assert (CHART / "files/alerts.yml").read_text() == (
        ROOT / "deploy/prometheus/alerts.yml"
    ).read_text()
    assert (CHART / "files/onceflow-dashboard.json").read_text() == (
        ROOT / "deploy/grafana/onceflow-dashboard.json"
    ).read_text()
    dashboard = next(d for d in render() if d["metadata"]["name"].endswith("-dashboard"))
    assert dashboard["metadata"]["labels"]["grafana_dashboard"] == "1"
    assert json.loads(dashboard["data"]["onceflow-dashboard.json"])["uid"] == "onceflow-overview"
    rule = next(d for d in render(*ALL_ON) if d["kind"] == "PrometheusRule")
    assert len(rule["spec"]["groups"][0]["rules"]) == 13
