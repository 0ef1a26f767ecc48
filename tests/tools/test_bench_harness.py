"""The bench harness's tables of scenarios agree (the CLI keeps its own copy)."""

from onceflow_tools.bench import RENDERERS, SCENARIOS, render
from onceflow_tools.commands import BENCH_SCENARIOS


def test_every_scenario_is_offered_by_the_cli_and_rendered():
    assert set(BENCH_SCENARIOS) == set(SCENARIOS)
    assert set(SCENARIOS) <= set(RENDERERS)


def test_tables_align_their_columns():
    result = {
        "scenario": "queue",
        "runs": [
            {
                "records": 10000,
                "duplicate_fraction": 0.3,
                "instances": 7000,
                "seconds": 2.13,
                "records_per_second": 4686.2,
            }
        ],
    }
    header, row = render(result).splitlines()
    assert header == "queue: records  duplicates  instances  seconds  records/s"
    assert row == "         10000         30%       7000     2.13       4686"


def _dbos_side(mode: str, per_second: float) -> dict:
    light = {"first_step_p50_ms": 10.0, "first_step_p99_ms": 30.0}
    return {
        "mode": mode,
        "processing_workflows_per_second": per_second,
        "light": light | {"complete_p50_ms": 40.0, "complete_p99_ms": 90.0},
    }


def test_dbos_table_has_a_ratio_for_every_mode_and_reads_older_files():
    lat = {
        "jobs": 100.0,
        "first_step_p50_ms": 25.0,
        "first_step_p99_ms": 50.0,
        "complete_p50_ms": 36.0,
        "complete_p99_ms": 61.0,
    }
    run = {"concurrency": 64, "onceflow": {"workflows_per_second": 1000.0}}
    for label, mode, per_second in (
        ("dbos_default", "queue", 50.0),
        ("dbos_tuned", "queue", 80.0),
        ("dbos_start", "start", 100.0),
        ("dbos_direct", "direct", 125.0),
    ):
        run[label] = _dbos_side(mode, per_second)
        run[f"ratio_vs_{label}"] = 1000.0 / per_second
    result = {"scenario": "dbos", "jobs": 2000, "runs": [run], "onceflow_e2e": {"latency": lat}}
    lines = render(result).splitlines()
    rows = {line[15:39].strip(): line.split()[-1] for line in lines if line.startswith("  " * 5)}
    assert rows["DBOS start_workflow"] == "10.0x"
    assert rows["DBOS direct call"] == "8.0x"
    assert rows["DBOS queue, 0.05 s poll"] == "12.5x"
    # A result file written before the no-queue modes existed still renders.
    for label in ("dbos_start", "dbos_direct"):
        del run[label], run[f"ratio_vs_{label}"]
    assert "DBOS direct call" not in render(result)


def test_scale_table_shows_costs_and_dashes_where_not_measured():
    import os

    from onceflow_tools.scaling import cpu_seconds

    queue_row = {"partitions": 2, "workers": 2, "records": 5000, "records_per_second": 2642.4}
    engine_row = {
        "engines": 1,
        "concurrency": 64,
        "workflows": 5000,
        "workflows_per_second": 261.0,
        "onceflow_cpu_ms_per_job": 1.04,
        "postgres_cpu_ms_per_job": 1.44,
        "wal_bytes_per_job": 4573.2,
        "wal_commit_records_per_job": 0.5,
    }
    table = render({"scenario": "scale", "queue": [queue_row], "engine": [engine_row]})
    lines = table.splitlines()
    queue_cells, engine_cells = lines[1].split(), lines[3].split()
    assert queue_cells[:4] == ["2", "2", "5000", "2642"] and set(queue_cells[4:]) == {"-"}
    assert engine_cells[3:9] == ["261", "-", "1.04", "1.44", "4573", "-"]
    assert engine_cells[-1] == "0.500"
    assert cpu_seconds(os.getpid()) > 0  # this process has run


def test_scale_table_leads_with_the_ingest_series_or_says_why_not():
    queue = {"scenario": "scale", "queue": [], "engine": []}
    ingest_row = {
        "processes": 2,
        "connections": 64,
        "requests": 30120,
        "req_per_s": 3011.7,
        "p50_ms": 19.04,
        "p99_ms": 41.5,
        "errors": 0,
        "timeouts": 1,
        "cpu_ms_per_request": 0.4213,
    }
    lines = render({**queue, "ingest": [ingest_row]}).splitlines()
    assert lines[0].startswith("scale (ingest")
    assert lines[1].split() == ["2", "64", "30120", "3012", "19.0", "41.5", "1", "0.421"]
    skipped = render({**queue, "ingest": [], "ingest_skipped": "wrk is not installed"})
    assert skipped.splitlines()[0] == "scale (ingest): left out, wrk is not installed"
