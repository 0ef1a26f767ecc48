"""A tiny run of each benchmark scenario, only to keep the harness working.

(Performance is measured by `onceflow bench`, never asserted by timed tests.)
"""

from __future__ import annotations

import pytest

from onceflow.bench import burst, engine, render


@pytest.mark.timeout(300)
def test_burst_smoke(base_settings, tmp_path):
    result = burst(base_settings.model_copy(update={"state_dir": tmp_path}), 300, tmp_path)
    assert result["load"]["accepted"] == 300
    assert result["lost"] == 0
    assert "peak consumer lag" in render(result)


@pytest.mark.timeout(300)
def test_engine_smoke(base_settings, tmp_path):
    result = engine(base_settings.model_copy(update={"state_dir": tmp_path}), 100, tmp_path)
    assert [r["engines"] for r in result["runs"]] == [1, 2]
    assert all(r["workflows"] == 100 for r in result["runs"])
    assert "workflows/s" in render(result)


@pytest.mark.timeout(300)
def test_queue_smoke(base_settings, tmp_path):
    from onceflow.bench import queue

    result = queue(base_settings.model_copy(update={"state_dir": tmp_path}), 200, tmp_path)
    assert [(r["records"], r["instances"]) for r in result["runs"]] == [(200, 200), (200, 140)]
    assert "records/s" in render(result)
