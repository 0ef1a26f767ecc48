"""Backpressure from the outbox: past a configured depth, the engine stops claiming.

Every engine reads the outbox's depth (bounded count) and the oldest event's age every
``interval_seconds``, publishes them as gauges, and closes its claims while the depth
is at or past ``max_depth``; they open again once it is under ``resume_ratio`` of it
(so claims do not flap at the bound). Runs in flight go on and finish, writing their
events: nothing is dropped, the outbox only stops growing from new work while the relay
(or Kafka) catches up. The alert ``OnceflowOutboxFilling`` fires before this starts
(deploy/prometheus/alerts.yml).
"""

from __future__ import annotations

import asyncio
import logging
from dataclasses import dataclass

from sqlalchemy.engine import Engine

from onceflow.errors import ConfigurationError
from onceflow.service_config import require_positive
from workflow_engine.engine.metrics import (
    BACKPRESSURE,
    OUTBOX_DEPTH,
    OUTBOX_MAX_DEPTH,
    OUTBOX_OLDEST_AGE,
)
from workflow_engine.engine.services import Service
from workflow_engine.store import writes

log = logging.getLogger(__name__)


@dataclass(frozen=True, slots=True)
class BackpressureConfig:
    """``max_depth``: the outbox depth that closes the claims (0: never closes them,
    the gauges are still kept); reopened under ``resume_ratio`` of it."""

    max_depth: int
    interval_seconds: float = 0.5
    resume_ratio: float = 0.9

    def __post_init__(self) -> None:
        require_positive(self, "interval_seconds", "resume_ratio")
        if self.max_depth < 0 or self.resume_ratio > 1:
            raise ConfigurationError(
                f"BackpressureConfig: max_depth {self.max_depth} must be >= 0 and"
                f" resume_ratio {self.resume_ratio} at most 1"
            )

    @property
    def count_cap(self) -> int:
        """How far the depth is counted: twice the bound (a million without one)."""
        return 2 * self.max_depth if self.max_depth else 1_000_000


class Backpressure(Service):
    """Watches the outbox; :meth:`wait_open` holds the claim loop while it is too deep."""

    def __init__(self, db: Engine, config: BackpressureConfig) -> None:
        super().__init__()
        self.db = db
        self.config = config
        self._open = asyncio.Event()
        self._open.set()
        OUTBOX_MAX_DEPTH.set(config.max_depth)

    @property
    def open(self) -> bool:
        return self._open.is_set()

    async def wait_open(self, timeout: float) -> bool:
        """Wait until claims are open again, at most ``timeout`` seconds; True if open."""
        try:
            await asyncio.wait_for(self._open.wait(), timeout)
        except TimeoutError:
            return False
        return True

    async def run(self) -> None:
        while True:
            try:
                depth = await asyncio.to_thread(writes.outbox_depth, self.db, self.config.count_cap)
            except Exception as exc:
                # The database's outage is the claim loop's problem too; keep the state.
                log.warning(
                    "outbox depth unreadable: %s", exc, extra={"event": "outbox.depth_error"}
                )
            else:
                self.observe(depth)
            await asyncio.sleep(self.config.interval_seconds)

    def observe(self, depth: writes.OutboxDepth) -> None:
        """Publish the gauges and open or close the claims for ``depth``."""
        OUTBOX_DEPTH.set(depth.events)
        OUTBOX_OLDEST_AGE.set(depth.oldest_age_seconds)
        bound = self.config.max_depth
        if not bound:
            return
        if self.open and depth.events >= bound:
            self._open.clear()
            BACKPRESSURE.set(1)
            log.warning(
                "outbox at %d events: claims held back until it drains",
                depth.events,
                extra={"event": "outbox.backpressure_on", "depth": depth.events},
            )
        elif not self.open and depth.events < bound * self.config.resume_ratio:
            self._open.set()
            BACKPRESSURE.set(0)
            log.info(
                "outbox at %d events: claims resumed",
                depth.events,
                extra={"event": "outbox.backpressure_off", "depth": depth.events},
            )
