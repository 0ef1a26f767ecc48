"""Consumer-lag metrics: broker end offsets minus the group's committed offsets.

A background thread reads them every few seconds from the broker, so the figures are
right across rebalances and restarts (they are not this worker's own positions). Every
worker of a group reports the whole topic: aggregate with ``max by (partition)``.
"""

from __future__ import annotations

import logging
import threading
import time
from dataclasses import dataclass

from onceflow.errors import ConfigurationError
from onceflow.lag import consumer_lag
from onceflow.service_config import require_positive
from streams.metrics import COMMITTED_OFFSET, END_OFFSET, LAG, LAG_TOTAL

log = logging.getLogger(__name__)


@dataclass(frozen=True, slots=True)
class LagMonitorConfig:
    """The lag of ``consumer_group`` on ``topic`` at ``bootstrap_servers``, read every
    ``interval_seconds`` (built by :func:`streams.worker.lag_monitor_config`)."""

    bootstrap_servers: str
    consumer_group: str
    topic: str
    interval_seconds: float = 5.0

    def __post_init__(self) -> None:
        require_positive(self, "interval_seconds")
        for name in ("bootstrap_servers", "consumer_group", "topic"):
            if not getattr(self, name):
                raise ConfigurationError(f"LagMonitorConfig.{name} must not be empty")


class LagMonitor:
    def __init__(self, config: LagMonitorConfig) -> None:
        self.config = config
        self._stop = threading.Event()
        self._thread = threading.Thread(target=self._run, name="lag-monitor", daemon=True)
        self._last_ok: float | None = None

    def start(self) -> LagMonitor:
        self._thread.start()
        return self

    def stop(self) -> None:
        self._stop.set()

    def broker_answering(self) -> bool:
        """Readiness: the broker answered one of the last few lag reads."""
        last = self._last_ok
        return last is not None and time.monotonic() - last < 3 * self.config.interval_seconds

    def refresh(self) -> int:
        c = self.config
        lags = consumer_lag(c.bootstrap_servers, c.consumer_group, c.topic)
        for p in lags:
            labels = (c.consumer_group, c.topic, str(p.partition))
            LAG.labels(*labels).set(p.lag)
            END_OFFSET.labels(*labels).set(p.end)
            COMMITTED_OFFSET.labels(*labels).set(p.committed if p.committed is not None else p.low)
        total = sum(p.lag for p in lags)
        LAG_TOTAL.labels(c.consumer_group, c.topic).set(total)
        self._last_ok = time.monotonic()
        return total

    def _run(self) -> None:
        while not self._stop.is_set():
            try:
                self.refresh()
            except Exception as exc:
                log.warning(
                    "could not read consumer lag: %s", exc, extra={"event": "streams.lag_error"}
                )
            self._stop.wait(self.config.interval_seconds)
