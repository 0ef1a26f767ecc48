"""The interleaving harness: engines in-process, the history checker, the workflows it
runs, and the randomized state machine (:mod:`onceflow_tools.interleavings.machine`,
run by ``onceflow chaos --interleavings`` and, briefly, by the test suite).

The tests import from here (``tests/integration/interleavings.py`` re-exports it); the
tools never import the tests. docs/architecture.md, "Interleavings", lists the
failpoints, the matrix and the invariants.
"""

from onceflow_tools.interleavings.harness import Driver, EngineHarness, FlowingClock, wait_for
from onceflow_tools.interleavings.history import (
    Executions,
    check_history,
    rows,
    scalar,
    status,
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
