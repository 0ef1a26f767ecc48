"""Smoke size of the history bench: it runs end to end on real PostgreSQL, and the
partitioned retention leaves no dead attempt tuples where the DELETE left some."""

from onceflow_tools import history_bench


def test_history_bench_smoke(base_settings):
    result = history_bench.history(base_settings.database_url, 6000)
    before, after = result["before"], result["after"]
    assert result["counts"]["onceflow_step_attempts"] > 0
    assert after["sizes"]["onceflow_step_attempts"]["leaves"] > 30  # daily, 30 days
    assert before["sizes"]["onceflow_step_attempts"]["leaves"] == 1
    assert before["retention"]["removed"]["step_attempts"] > 0
    assert after["retention"]["removed"]["partitions_dropped"] >= 1
    assert after["retention"]["stats_after"]["onceflow_step_attempts"]["n_dead_tup"] == 0
    assert set(before["latency"]) == set(after["latency"])
    assert history_bench.render(result)[0].startswith("history: ")
