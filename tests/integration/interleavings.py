"""Tools for the interleaving tests: they live in the tools package
(:mod:`onceflow_tools.interleavings`), which ``onceflow chaos --interleavings`` runs
too; re-exported here for the tests that import them from this module."""

from onceflow_tools.interleavings import (
    Driver,
    EngineHarness,
    Executions,
    FlowingClock,
    check_history,
    rows,
    scalar,
    status,
    wait_for,
)

__all__ = [
    "Driver",
    "EngineHarness",
    "Executions",
    "FlowingClock",
    "check_history",
    "rows",
    "scalar",
    "status",
    "wait_for",
]
