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
