"""Engine subprocesses for the chaos tests that SIGKILL one of two engines."""

from __future__ import annotations

from onceflow_tools.processes import ProcessGroup, free_port


def start_engine(group: ProcessGroup, name: str, poll_seconds: float) -> None:
    """``onceflow engine`` as ``name``, with a 2 s lease (a killed engine's runs are
    rescued soon) and the given poll interval."""
    group.start(
        name,
        "engine",
        env={
            "ONCEFLOW_ENGINE_METRICS_PORT": str(free_port()),
            "ONCEFLOW_ENGINE_LEASE_SECONDS": "2",
            "ONCEFLOW_ENGINE_POLL_INTERVAL_SECONDS": str(poll_seconds),
        },
    )
