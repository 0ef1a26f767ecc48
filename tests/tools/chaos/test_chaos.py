"""The chaos suite at CI size: faults while jobs flow, then every check of
``onceflow chaos`` (see tools/onceflow_tools/chaos.py). Larger runs:
``onceflow chaos --size large``.

The seed is fixed here so CI is reproducible; set ONCEFLOW_TEST_CHAOS_SEED to run
another (the printed figures name the seed of every run).
"""

from __future__ import annotations

import os

import pytest

from onceflow_tools.chaos import SIZES, run_chaos
from tests.services import REPO


@pytest.mark.timeout(600)
def test_nothing_lost_nothing_doubled_under_faults(base_settings, services, tmp_path, capsys):
    from onceflow_tools.dev import DevServices

    dev = DevServices(REPO / ".onceflow")
    local = (
        dev.kafka.bootstrap == services.kafka
        and f"127.0.0.1:{dev.postgres.port}/" in services.database_url
    )
    seed = int(os.environ.get("ONCEFLOW_TEST_CHAOS_SEED", "20261129"))
    lines: list[str] = []
    result = run_chaos(
        base_settings,
        seed,
        SIZES["ci"],
        tmp_path / "chaos",
        dev=dev if local else None,
        log=lines.append,
    )
    with capsys.disabled():
        print("\n" + "\n".join(lines) + "\n" + result.render())
    assert result.violations == []
    # the planned jobs, plus the fresh ones a fault posts while it kills a worker
    assert result.accepted == result.jobs >= SIZES["ci"]
    assert result.instances == result.complete == result.jobs
    assert not result.fault_errors
    expected = 6 if local else 4  # broker and PostgreSQL restarts need local services
    assert len(result.faults) == expected, result.faults
