"""onceflow_tools.benchplots on synthetic results shaped like onceflow_tools.bench's scenarios."""

from __future__ import annotations

import sys
from pathlib import Path
from typing import Any

import click
import orjson
import pytest
from click.testing import CliRunner

from onceflow_tools import benchplots

PNG_MAGIC = b"\x89PNG\r\n\x1a\n"
ALL = [
    "ingest-throughput.png",
    "ingest-latency.png",
    "burst-lag.png",
    "engine-throughput.png",
    "latency-percentiles.png",
    "scaling.png",
]


def load(batch: int, concurrency: int, per_second: float, p50: float, rate: float = 0.0) -> dict:
    jobs = 2000
    return {
        "jobs": jobs,
        "batch": batch,
        "concurrency": concurrency,
        "wall_seconds": jobs / per_second,
        "accepted": jobs,
        "accepted_per_second": per_second,
        "requests": jobs // batch,
        "statuses": {"202": jobs // batch},
        "latency_p50": p50,
        "latency_p99": p50 * 3,
        "latency_max": p50 * 4,
        **({"rate": rate} if rate else {}),
    }


def latency(scale: float) -> dict[str, float]:
    return {
        "jobs": 300.0,
        "first_step_p50_ms": 30 * scale,
        "first_step_p99_ms": 80 * scale,
        "complete_p50_ms": 60 * scale,
        "complete_p99_ms": 130 * scale,
        "complete_max_ms": 140 * scale,
    }


def engine_run(engines: int, concurrency: int, per_second: float) -> dict[str, Any]:
    return {
        "workflow": "noop-workflow",
        "concurrency": concurrency,
        "engines": engines,
        "workflows": 2000,
        "wall_seconds": 2000 / per_second + 1,
        "seconds": 2000 / per_second,
        "workflows_per_second": per_second,
        "checkpoints_per_second": 3 * per_second,
    }


def dbos_run(concurrency: int, per_second: float) -> dict[str, Any]:
    return {
        "system": "dbos",
        "jobs": 2000,
        "concurrency": concurrency,
        "seconds": 2000 / per_second,
        "processing_workflows_per_second": per_second,
        "workflows_per_second": per_second * 0.9,
        "completed": 2000,
        "timed_out": False,
        "light": {"jobs": 100, "rate": 10.0, **latency(30), "timed_out": False},
    }


def scale_result() -> dict[str, Any]:
    """Shaped like onceflow_tools.scaling.scale's result, figures made up."""
    costs = {"onceflow_cpu_ms_per_job": 0.3, "postgres_cpu_ms_per_job": 0.1}
    return {
        "scenario": "scale",
        "ingest": [
            {
                "processes": n,
                "connections": 64,
                "req_per_s": 1000.0 * n**0.5,
                "onceflow_cpu_ms_per_job": 1.0,
            }
            for n in (1, 2, 4)
        ],
        "queue": [
            {"partitions": p, "workers": w, "records_per_second": 4000.0 * w**0.5, **costs}
            for p, w in ((1, 1), (2, 1), (2, 2), (4, 1), (4, 2), (4, 4), (8, 8))
        ],
        "engine": [{**engine_run(n, 64, 1000.0 * n**0.3), **costs} for n in (1, 2, 4)],
    }


def e2e_result() -> dict[str, Any]:
    return {"scenario": "e2e", "rate": 50.0, "load": load(1, 4, 50, 0.011), "latency": latency(1)}


def results(paced: bool = False) -> list[dict[str, Any]]:
    ingest = [
        load(b, c, (6000 if b == 100 else 150) * c**0.3, 0.01 * c)
        for b in (100, 1)
        for c in (1, 4, 16)
    ]
    if paced:
        ingest = [
            load(b, 8, min(r, 7000 if b == 100 else 160), 0.01 + r / 1e5, rate=r)
            for b in (100, 1)
            for r in (100, 1000, 5000, 10000)
        ] + [load(100, 16, 7000, 0.3)]  # a flat-out run (no rate) among them
    return [
        {
            "scenario": "burst",
            "jobs": 20000,
            "load": load(100, 8, 1800, 0.4),
            "peak_lag": 12472,
            "drain_seconds_after_burst": 11.4,
            "instances_created": 20000,
            "lost": 0,
            "complete_at_drain": 2087,
            "all_complete_seconds_after_burst": 90.0,
            "latency": latency(200),
            "peak_rss_mb": {"ingest": 78.0, "streams": 119.0, "engine": 65.0},
            "lag_series": [[0.1 + 0.5 * i, min(i, 45 - i) * 550] for i in range(46)],
        },
        {"scenario": "ingest", "runs": ingest},
        {
            "scenario": "queue",
            "runs": [
                {
                    "records": 20000,
                    "duplicate_fraction": 0.0,
                    "instances": 20000,
                    "seconds": 4.0,
                    "records_per_second": 5000.0,
                }
            ],
        },
        {"scenario": "engine", "runs": [engine_run(1, 16, 117), engine_run(2, 16, 120)]},
        e2e_result(),
        {
            "scenario": "nobuffer",
            "jobs": 20000,
            "onceflow": {"load": load(100, 8, 1800, 0.4), "error_rate": 0.0, "lost": 0},
            "nobuffer": {
                "load": load(100, 8, 14000, 0.04),
                "stored": 20000,
                "error_rate": 0.0,
                "peak_rss_mb": {"direct-http": 60.0},
            },
        },
        {
            "scenario": "dbos",
            "jobs": 2000,
            "runs": [
                {
                    "concurrency": c,
                    "onceflow": engine_run(1, c, 100 + c),
                    "dbos_default": dbos_run(c, c * 0.95),
                    "dbos_tuned": dbos_run(c, c * 5.0),
                    "dbos_start": dbos_run(c, 60.0),
                    "dbos_direct": dbos_run(c, 75.0),
                    "ratio_vs_dbos_default": (100 + c) / (c * 0.95),
                    "ratio_vs_dbos_tuned": (100 + c) / (c * 5.0),
                    "ratio_vs_dbos_start": (100 + c) / 60.0,
                    "ratio_vs_dbos_direct": (100 + c) / 75.0,
                }
                for c in (16, 64)
            ],
            "onceflow_e2e": e2e_result(),
        },
        scale_result(),
    ]


def assert_pngs(paths: list[Path], out: Path, names: list[str]) -> None:
    assert paths == [out / n for n in names]
    assert sorted(p.name for p in out.iterdir()) == sorted(names)
    for path in paths:
        data = path.read_bytes()
        assert len(data) > 1000 and data.startswith(PNG_MAGIC)


@pytest.mark.parametrize("paced", [False, True])
def test_every_plot_from_every_scenario(tmp_path: Path, paced: bool) -> None:
    pytest.importorskip("matplotlib")
    assert_pngs(benchplots.plot(results(paced), tmp_path), tmp_path, ALL)


def test_absent_scenarios_are_skipped(tmp_path: Path) -> None:
    pytest.importorskip("matplotlib")
    assert benchplots.plot([], tmp_path / "none") == []
    out = tmp_path / "e2e"
    assert_pngs(benchplots.plot([e2e_result()], out), out, ["latency-percentiles.png"])
    only_dbos = [r for r in results() if r["scenario"] == "dbos"]
    out = tmp_path / "dbos"
    names = ["engine-throughput.png", "latency-percentiles.png"]
    assert_pngs(benchplots.plot(only_dbos, out), out, names)


def test_older_result_files(tmp_path: Path) -> None:
    """Older files: burst without latency, engine runs without concurrency, no rates."""
    pytest.importorskip("matplotlib")
    old = [r for r in results() if r["scenario"] in ("burst", "engine", "ingest")]
    del old[0]["latency"]
    for run in old[2]["runs"]:
        del run["concurrency"]
    names = ["ingest-throughput.png", "ingest-latency.png", "burst-lag.png"]
    assert_pngs(benchplots.plot(old, tmp_path), tmp_path, names)


def test_scaling_has_a_panel_per_series_each_with_a_cpu_axis(tmp_path: Path) -> None:
    pytest.importorskip("matplotlib")
    from matplotlib.figure import Figure

    def panels(result: dict[str, Any]) -> list[str]:
        fig = Figure()
        assert benchplots.scaling(fig.subplots(), {"scale": result})
        titles = [ax.get_title() for ax in fig.axes]
        assert titles.count("") == len(fig.axes) // 2  # a CPU axis (untitled) per panel
        return [t for t in titles if t]

    full = scale_result()
    assert panels(full) == [
        "ingest: single-job requests (wrk, 64 connections)",
        "queue → instance",
        "engine: three-step no-op workflows",
    ]
    fig = Figure()
    benchplots.scaling(fig.subplots(), {"scale": full})
    (queue_ax,) = [ax for ax in fig.axes if ax.get_title() == "queue → instance"]
    queue_lines = [line.get_label() for line in queue_ax.get_lines()]
    assert queue_lines[:4] == ["1 partition", "2 partitions", "4 partitions", "8 partitions"]
    # A result written before the ingest series (or without wrk): two panels.
    older = {**full, "ingest": [], "ingest_skipped": "wrk is not installed"}
    assert panels(older) == ["queue → instance", "engine: three-step no-op workflows"]
    assert not benchplots.scaling(Figure().subplots(), {})
    out = tmp_path / "scale"
    assert_pngs(benchplots.plot([older], out), out, ["scaling.png"])


def test_not_a_result_file(tmp_path: Path) -> None:
    path = tmp_path / "raw.json"
    path.write_bytes(orjson.dumps({"system": "dbos", "jobs": 10}))
    with pytest.raises(click.ClickException, match="not an `onceflow bench` result"):
        benchplots.load([path])


def test_cli_merges_files_later_replacing_earlier(tmp_path: Path) -> None:
    pytest.importorskip("matplotlib")
    first, second = tmp_path / "a.json", tmp_path / "b.json"
    old = {"scenario": "e2e", "rate": 1.0, "load": {}, "latency": latency(1)}
    first.write_bytes(orjson.dumps([old, {"scenario": "queue", "runs": []}]))
    second.write_bytes(orjson.dumps([e2e_result()]))
    merged = benchplots.load([first, second])
    assert [r["scenario"] for r in merged] == ["e2e", "queue"]
    assert merged[0]["rate"] == 50.0
    out = tmp_path / "out"
    run = CliRunner().invoke(benchplots.main, [str(first), str(second), "--out", str(out)])
    assert run.exit_code == 0, run.output
    assert run.output.split() == [str(out / "latency-percentiles.png")]


def test_missing_matplotlib_is_a_click_error(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    for name in ("matplotlib", "matplotlib.figure", "matplotlib.backends.backend_agg"):
        monkeypatch.setitem(sys.modules, name, None)
    with pytest.raises(click.ClickException, match=r"pip install 'onceflow\[bench\]'"):
        benchplots.plot([e2e_result()], tmp_path)
