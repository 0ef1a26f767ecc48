"""A tiny run of each benchmark scenario, only to keep the harness working.

(Performance is measured by `onceflow bench`, never asserted by timed tests.)
"""

from __future__ import annotations

import pytest

from onceflow_tools.bench import burst, engine, render


@pytest.mark.timeout(300)
def test_burst_smoke(base_settings, tmp_path):
    result = burst(base_settings.model_copy(update={"state_dir": tmp_path}), 300, tmp_path)
    assert result["load"]["accepted"] == 300
    assert result["lost"] == 0
    assert "peak consumer lag" in render(result)


@pytest.mark.timeout(300)
def test_engine_smoke(base_settings, tmp_path):
    settings = base_settings.model_copy(update={"state_dir": tmp_path})
    result = engine(settings, 100, tmp_path, concurrencies=(8,), inline_concurrencies=(8,))
    assert [(r["workflow"], r["engines"]) for r in result["runs"]] == [
        ("noop-workflow", 1),
        ("noop-workflow", 2),
        ("noop-inline-workflow", 1),
    ]
    assert all(r["workflows"] == 100 for r in result["runs"])
    assert "workflows/s" in render(result)


@pytest.mark.timeout(300)
def test_queue_smoke(base_settings, tmp_path):
    from onceflow_tools.bench import queue

    result = queue(base_settings.model_copy(update={"state_dir": tmp_path}), 200, tmp_path)
    assert [(r["records"], r["instances"]) for r in result["runs"]] == [(200, 200), (200, 140)]
    assert "records/s" in render(result)


@pytest.mark.timeout(300)
def test_e2e_smoke(base_settings, tmp_path):
    from onceflow_tools.bench import e2e

    result = e2e(base_settings.model_copy(update={"state_dir": tmp_path}), 30, tmp_path, rate=30)
    # Paced one job per request: exactly the jobs asked for, each timed end to end.
    assert result["load"]["accepted"] == 30 and result["load"]["requests"] == 30
    assert result["latency"]["jobs"] == 30
    assert 0 < result["latency"]["first_step_p50_ms"] <= result["latency"]["complete_p50_ms"]
    assert "submit-to-first-step" in render(result)


@pytest.mark.timeout(300)
def test_nobuffer_smoke(base_settings, tmp_path):
    from onceflow_tools.bench import nobuffer

    result = nobuffer(base_settings.model_copy(update={"state_dir": tmp_path}), 300, tmp_path)
    assert result["onceflow"]["lost"] == 0
    assert result["nobuffer"]["stored"] == result["nobuffer"]["load"]["accepted"] == 300
    assert "error rate" in render(result)


@pytest.mark.timeout(600)
def test_dbos_smoke(base_settings, tmp_path):
    """Installs DBOS into its own virtualenv (once per state dir) and runs both sides."""
    from onceflow_tools.bench import dbos

    settings = base_settings.model_copy(update={"state_dir": tmp_path})
    result = dbos(settings, 20, tmp_path, concurrencies=(4,), light=5, rate=5.0)
    run = result["runs"][0]
    assert run["onceflow"]["workflows"] == 20
    labels = ("dbos_default", "dbos_tuned", "dbos_start", "dbos_direct")
    assert [run[label]["completed"] for label in labels] == [20] * 4
    # Resubmitted ids collapsed, whether enqueued, started or called directly.
    assert [run[label]["distinct_workflows"] for label in labels] == [20] * 4
    assert [run[label]["mode"] for label in labels] == ["queue", "queue", "start", "direct"]
    assert run["dbos_direct"]["light"]["completed"] == 5
    table = render(result)
    assert "ratio" in table and "DBOS start_workflow" in table and "DBOS direct call" in table


@pytest.mark.timeout(600)
def test_scale_smoke(base_settings, tmp_path, monkeypatch):
    """Every pairing runs, creates every instance, and reports what a job cost. The
    extra points of a full run (8 x 8, 4 engines, 4 ingest processes) are left out;
    the ingest series runs for 2 s where `wrk` is installed."""
    import shutil

    from onceflow_tools.scaling import QUEUE_GRID, scale

    # The ingest series reads its Kafka from the environment (wrkbench.Ingest).
    monkeypatch.setenv("ONCEFLOW_KAFKA_BOOTSTRAP_SERVERS", base_settings.kafka_bootstrap_servers)
    with_wrk = shutil.which("wrk") is not None
    result = scale(
        base_settings.model_copy(update={"state_dir": tmp_path}),
        200,
        tmp_path,
        queue_grid=QUEUE_GRID,
        engine_counts=(1, 2),
        ingest_processes=(1, 2),
        ingest_seconds=2,
    )
    if with_wrk:
        assert [r["processes"] for r in result["ingest"]] == [1, 2]
        for row in result["ingest"]:
            assert row["requests"] > 0 and row["errors"] == 0 and row["cpu_ms_per_request"] > 0
            # Every request answered 202 is a record in the topic.
            assert row["records_added"] >= row["requests"]
        assert "req/s" in render(result)
    else:
        assert result["ingest"] == [] and "wrk" in result["ingest_skipped"]
    grid = [(r["partitions"], r["workers"]) for r in result["queue"]]
    assert grid == [(1, 1), (2, 1), (2, 2), (4, 1), (4, 2), (4, 4)]
    assert all(r["instances"] == 200 for r in result["queue"])
    assert [r["engines"] for r in result["engine"]] == [1, 2]
    runs = result["queue"] + result["engine"]
    # CPU is counted in clock ticks (10 ms): a 200-job run may show none on its own.
    assert sum(r["onceflow_cpu_seconds"] for r in runs) > 0
    assert sum(r["postgres_cpu_seconds"] for r in runs) > 0
    for run in runs:
        # Each job wrote WAL in the run's own database, and at least one commit.
        assert 0 < run["wal_bytes_per_job"] <= run["wal_bytes_cluster_per_job"]
        assert run["wal_commit_records_per_job"] > 0 and run["xact_commits_per_job"] > 0
    assert "WAL B/job" in render(result)


@pytest.mark.timeout(300)
def test_engine_policies_smoke(base_settings, tmp_path):
    from onceflow_tools.policy_bench import WORKFLOWS, engine_policies

    settings = base_settings.model_copy(update={"state_dir": tmp_path})
    result = engine_policies(settings, 40, tmp_path, rounds_wanted=1)
    (runs,) = result["rounds"]
    assert [r["workflow"] for r in runs] == list(WORKFLOWS)
    assert all(r["workflows"] == 40 and r["per_second"] > 0 for r in runs)
    assert "bench-singleton-skip" in render(result)


@pytest.mark.timeout(300)
def test_soak_smoke(base_settings, tmp_path):
    from onceflow_tools.soak import ROUNDS, soak

    result = soak(base_settings.model_copy(update={"state_dir": tmp_path}), 100, tmp_path)
    rounds = result["rounds"]
    assert [r["jobs_so_far"] for r in rounds] == [10 * (n + 1) for n in range(ROUNDS)]
    assert rounds[-1]["complete"] == 100
    # every process measured in every round, while it still ran
    assert all(set(r["rss_mb"]) == set(rounds[0]["rss_mb"]) for r in rounds)
    assert len(rounds[0]["rss_mb"]) == 3 and all(mb > 0 for mb in rounds[-1]["rss_mb"].values())
    assert "RSS from the end of round 1" in render(result)
