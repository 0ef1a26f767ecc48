"""The engine's background services, one loop each (River's maintenance services are
the model: a rescuer, a cleaner, each its own small class).

* :class:`LeaseKeeper` — the heartbeat: extends the leases of everything in flight
  every third of a lease, and abandons a run whose lease another engine took.
* :class:`Rescuer` — re-queues ``running`` instances whose lease expired (their engine
  died), so another engine resumes them from their last checkpoint.
* :class:`Maintenance` — retention, and the gauges that need a query.

Each has ``start()`` (a task on the running loop) and ``stop()`` (cancel, and wait),
and takes a frozen config defined next to it (:class:`LeaseKeeperConfig`,
:class:`RescuerConfig`, :class:`MaintenanceConfig`) that refuses bad values when built
(:mod:`onceflow.service_config`); :func:`workflow_engine.engine.configs.engine_configs`
builds them from the settings.
"""

from __future__ import annotations

import asyncio
import contextlib
import logging
from abc import ABC, abstractmethod
from collections.abc import Mapping
from dataclasses import dataclass, fields
from typing import NamedTuple

from sqlalchemy.engine import Engine

from onceflow import failpoints
from onceflow.errors import ConfigurationError
from onceflow.service_config import require_positive
from workflow_engine.engine.batcher import WriteBatcher
from workflow_engine.engine.metrics import (
    INSTANCES_BY_STATUS,
    PRUNED,
    RESCUED,
    RUNNABLE_BACKLOG,
)
from workflow_engine.store import writes
from workflow_engine.store.writes import Heartbeat

log = logging.getLogger(__name__)


class Service(ABC):
    """A loop that runs beside the claim loop until stopped."""

    def __init__(self) -> None:
        self._task: asyncio.Task[None] | None = None

    def start(self) -> None:
        self._task = asyncio.create_task(self.run(), name=type(self).__name__)

    async def stop(self) -> None:
        task, self._task = self._task, None
        if task is None:
            return
        task.cancel()
        with contextlib.suppress(asyncio.CancelledError):
            await task

    @abstractmethod
    async def run(self) -> None:
        """The loop; runs until cancelled."""


class Run(NamedTuple):
    """One run in flight: the claim it runs under, and its task."""

    claim: int
    task: asyncio.Task[None]


@dataclass(frozen=True, slots=True)
class LeaseKeeperConfig:
    """Each heartbeat extends the leases to ``lease_seconds`` from now; one is sent
    every ``heartbeat_seconds``, which must be shorter than the lease, or leases would
    expire between heartbeats and the rescuer take every run from a live engine."""

    lease_seconds: float
    heartbeat_seconds: float

    def __post_init__(self) -> None:
        require_positive(self, "lease_seconds", "heartbeat_seconds")
        if self.heartbeat_seconds >= self.lease_seconds:
            raise ConfigurationError(
                f"LeaseKeeperConfig.heartbeat_seconds ({self.heartbeat_seconds!r}) must be"
                f" shorter than lease_seconds ({self.lease_seconds!r}): the leases would"
                " expire between two heartbeats"
            )


class LeaseKeeper(Service):
    def __init__(
        self,
        batcher: WriteBatcher,
        inflight: Mapping[str, Run],
        config: LeaseKeeperConfig,
    ) -> None:
        super().__init__()
        self.batcher = batcher
        self.inflight = inflight
        self.config = config

    async def run(self) -> None:
        while True:
            await asyncio.sleep(self.config.heartbeat_seconds)
            held = tuple((job_id, run.claim) for job_id, run in self.inflight.items())
            await failpoints.hit_async("engine.before_heartbeat")
            try:
                kept = await self.batcher.write(Heartbeat(held, self.config.lease_seconds))
            except Exception:
                log.exception("heartbeat failed", extra={"event": "engine.heartbeat_error"})
                continue
            for lost in set(held) - kept:
                self._abandon(*lost)

    def _abandon(self, job_id: str, claim: int) -> None:
        """Cancel the run of ``claim``, if it is still the one in flight for the id."""
        run = self.inflight.get(job_id)
        task = run.task if run is not None and run.claim == claim else None
        if task is not None and not task.done():
            log.warning(
                "lease lost; abandoning run",
                extra={"event": "engine.lease_lost", "job_id": job_id},
            )
            task.cancel()


@dataclass(frozen=True, slots=True)
class RescuerConfig:
    """A rescue pass runs every ``interval_seconds``."""

    interval_seconds: float

    def __post_init__(self) -> None:
        require_positive(self, "interval_seconds")


class Rescuer(Service):
    def __init__(self, db: Engine, config: RescuerConfig) -> None:
        super().__init__()
        self.db = db
        self.config = config

    async def run(self) -> None:
        while True:
            try:
                await failpoints.hit_async("engine.before_rescue")
                rescued = await asyncio.to_thread(writes.rescue_expired, self.db)
            except Exception:
                log.exception("rescue failed", extra={"event": "engine.rescue_error"})
                rescued = []
            for job_id in rescued:
                RESCUED.inc()
                log.warning(
                    "expired lease re-queued",
                    extra={"event": "engine.lease_rescued", "job_id": job_id},
                )
            await asyncio.sleep(self.config.interval_seconds)


@dataclass(frozen=True, slots=True)
class MaintenanceConfig:
    """A round every ``interval_seconds``; the retentions and partitioning that
    :func:`workflow_engine.store.writes.prune` applies (its arguments' meaning).
    Every field must be above zero."""

    interval_seconds: float
    retention_instances_seconds: float
    retention_job_ids_seconds: float
    partition_seconds: float = writes.DAY
    partitions_ahead: int = 3
    retention_operator_actions_seconds: float = writes.OPERATOR_ACTIONS_RETENTION

    def __post_init__(self) -> None:
        require_positive(self, *(field.name for field in fields(self)))


class Maintenance(Service):
    """Retention and the gauges that need a query; one engine at a time prunes."""

    def __init__(self, db: Engine, config: MaintenanceConfig) -> None:
        super().__init__()
        self.db = db
        self.config = config

    async def run(self) -> None:
        while True:
            try:
                await self._prune()
                await self._count()
            except Exception:
                log.exception("maintenance failed", extra={"event": "engine.maintenance_error"})
            await asyncio.sleep(self.config.interval_seconds)

    async def _prune(self) -> None:
        # Where a test holds a round while another engine's round, or a parent
        # collecting a child, goes on (docs/architecture.md, "Interleavings").
        await failpoints.hit_async("engine.before_partition_maintenance")
        c = self.config
        pruned = await asyncio.to_thread(
            writes.prune,
            self.db,
            instance_seconds=c.retention_instances_seconds,
            job_id_seconds=c.retention_job_ids_seconds,
            partition_seconds=c.partition_seconds,
            partitions_ahead=c.partitions_ahead,
            operator_action_seconds=c.retention_operator_actions_seconds,
        )
        for kind, count in pruned.items():
            PRUNED.labels(kind).inc(count)

    async def _count(self) -> None:
        counts = await asyncio.to_thread(writes.status_counts, self.db)
        INSTANCES_BY_STATUS.clear()
        for (workflow, status), n in counts.by_workflow_status.items():
            INSTANCES_BY_STATUS.labels(workflow, status).set(n)
        RUNNABLE_BACKLOG.set(counts.runnable_due)
