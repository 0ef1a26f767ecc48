import json
from pathlib import Path

from onceflow_tools.dashboard import UID, build, expressions

ROOT = Path(__file__).resolve().parents[2]


def test_committed_dashboard_is_the_generated_one():
    committed = json.loads((ROOT / "deploy/grafana/onceflow-dashboard.json").read_text())
    assert committed == json.loads(json.dumps(build()))


def test_dashboard_shape():
    doc = build()
    assert doc["uid"] == UID
    names = [v["name"] for v in doc["templating"]["list"]]
    assert names == ["datasource", "group", "topic"]
    rows = [p["title"] for p in doc["panels"] if p["type"] == "row"]
    assert rows == ["Ingest", "Kafka lag", "Streams worker", "Workflow engine", "PostgreSQL"]
    assert all(e.count("(") == e.count(")") for e in expressions())
    assert all("onceflow_" in e for e in expressions())
