"""The console's metrics (served on ``ONCEFLOW_CONSOLE_METRICS_PORT``)."""

from __future__ import annotations

from prometheus_client import Counter

ACTIONS = Counter(
    "onceflow_console_actions_total",
    "Actions operators carried out from the console, by action.",
    ["action"],
)
REDRIVES = Counter(
    "onceflow_console_redriven_records_total",
    "Dead-letter records re-driven from the console.",
)
