import json
from pathlib import Path
from typing import Any

from onceflow_tools.dashboard import UID, build, expressions

ROOT = Path(__file__).resolve().parents[2]
# The output of the hand-written generator the SDK builder replaced (commit 6543763,
# `git show 6543763:deploy/grafana/onceflow-dashboard.json`), kept to prove the move
# changed no panel, query, unit, position or variable.
HAND_WRITTEN = Path(__file__).with_name("dashboard_hand_written.json")


def test_committed_dashboard_is_the_generated_one():
    committed = json.loads((ROOT / "deploy/grafana/onceflow-dashboard.json").read_text())
    assert committed == json.loads(json.dumps(build()))


def test_dashboard_shape():
    doc = build()
    assert doc["uid"] == UID
    names = [v["name"] for v in doc["templating"]["list"]]
    assert names == ["datasource", "group", "topic"]
    rows = [p["title"] for p in doc["panels"] if p["type"] == "row"]
    assert rows == [
        "Ingest",
        "Kafka lag",
        "Streams worker",
        "Workflow engine",
        "PostgreSQL",
        "Lifecycle events",
        "Webhooks",
        "Run controls",
    ]
    assert all(e.count("(") == e.count(")") for e in expressions())
    assert all("onceflow_" in e for e in expressions())


def _essentials(doc: dict[str, Any]) -> list[dict[str, Any]]:
    return [
        {
            "id": p["id"],
            "type": p["type"],
            "title": p["title"],
            "gridPos": p["gridPos"],
            "datasource": p.get("datasource"),
            "unit": p.get("fieldConfig", {}).get("defaults", {}).get("unit"),
            "targets": [
                (t["refId"], t["expr"], t["legendFormat"], t["datasource"])
                for t in p.get("targets", [])
            ],
        }
        for p in doc["panels"]
    ]


#: Rows added after the move to the SDK (the hand-written dashboard stops before them;
#: they are built by the same helpers, so they take the same shape).
ADDED_ROWS = ("Lifecycle events", "Webhooks", "Run controls")


def _as_hand_written() -> dict[str, Any]:
    """The built dashboard without :data:`ADDED_ROWS` (and their panels)."""
    doc = build()
    first = next(i for i, p in enumerate(doc["panels"]) if p["title"] == ADDED_ROWS[0])
    doc["panels"] = doc["panels"][:first]
    return doc


def test_same_panels_as_the_hand_written_dashboard():
    old = json.loads(HAND_WRITTEN.read_text())
    new = _as_hand_written()
    assert _essentials(new) == _essentials(old)
    assert [p["title"] for p in build()["panels"] if p["type"] == "row"][-len(ADDED_ROWS) :] == (
        list(ADDED_ROWS)
    )
    # what tests/integration/test_prometheus.py evaluates (the hand-written ones first)
    hand_written = [t["expr"] for p in old["panels"] for t in p.get("targets", [])]
    assert expressions()[: len(hand_written)] == hand_written


def _diff(old: Any, new: Any, path: str, out: dict[str, set[str]]) -> None:
    """Paths of the old document that the new one lacks or changes (``out["lost"]``) and
    paths the new one adds (``out["added"]``), lists compared position by position."""
    if isinstance(old, dict) and isinstance(new, dict):
        for key in old.keys() | new.keys():
            if key not in new:
                out["lost"].add(f"{path}.{key}")
            elif key not in old:
                out["added"].add(f"{path}.{key}={json.dumps(new[key], sort_keys=True)}")
            else:
                _diff(old[key], new[key], f"{path}.{key}", out)
    elif isinstance(old, list) and isinstance(new, list) and len(old) == len(new):
        for i, (o, n) in enumerate(zip(old, new, strict=True)):
            _diff(o, n, f"{path}[{i}]" if path.endswith("list") else f"{path}[]", out)
    elif old != new:
        out["lost"].add(path)


def test_the_sdk_only_adds_grafana_defaults():
    out: dict[str, set[str]] = {"lost": set(), "added": set()}
    _diff(json.loads(HAND_WRITTEN.read_text()), _as_hand_written(), "", out)
    # `definition` is the query's display copy, which Grafana writes back on save (the
    # SDK's variable model has no such field); an empty `current` is no selection.
    assert out["lost"] == {
        ".templating.list[0].current",
        ".templating.list[1].definition",
        ".templating.list[2].definition",
    }
    variable_defaults = {
        "skipUrlSync=false",
        "allowCustomValue=true",
        "auto=false",
        'auto_min="10s"',
        "auto_count=30",
    }
    assert out["added"] == {
        ".annotations={}",
        ".editable=true",
        ".graphTooltip=0",
        ".fiscalYearStartMonth=0",
        ".panels[].transparent=false",
        '.panels[].repeatDirection="h"',
        ".panels[].options.legend.showLegend=true",
        ".panels[].options.legend.calcs=[]",
        '.panels[].options.tooltip={"mode": "single", "sort": "none"}',
        *(f".templating.list[{i}].{d}" for i in range(3) for d in variable_defaults),
        ".templating.list[0].multi=false",
        ".templating.list[0].includeAll=false",
    }
