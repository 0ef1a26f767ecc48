"""The engine's background services, one loop each (River's maintenance services are
the model: a rescuer, a cleaner, each its own small class).

* :class:`LeaseKeeper` — the heartbeat: extends the leases of everything in flight
  every third of a lease, and abandons a run whose lease another engine took.
* :class:`Rescuer` — re-queues ``running`` instances whose lease expired (their engine
  died), so another engine resumes them from their last checkpoint.
* :class:`Maintenance` — retention, and the gauges that need a query.

Each has ``start()`` (a task on the running loop) and ``stop()`` (cancel, and wait).
"""

from __future__ import annotations

import asyncio
import contextlib
import logging
from abc import ABC, abstractmethod
from collections.abc import Mapping
from typing import NamedTuple

from sqlalchemy.engine import Engine

from onceflow import failpoints
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


class LeaseKeeper(Service):
    def __init__(
        self,
        batcher: WriteBatcher,
        inflight: Mapping[str, Run],
        lease_seconds: float,
    ) -> None:
        super().__init__()
        self.batcher = batcher
        self.inflight = inflight
        self.lease_seconds = lease_seconds

    async def run(self) -> None:
        while True:
            await asyncio.sleep(self.lease_seconds / 3)
            held = tuple((job_id, run.claim) for job_id, run in self.inflight.items())
            await failpoints.hit_async("engine.before_heartbeat")
            try:
                kept = await self.batcher.write(Heartbeat(held, self.lease_seconds))
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


class Rescuer(Service):
    def __init__(self, engine: Engine, lease_seconds: float) -> None:
        super().__init__()
        self.engine = engine
        self.interval = max(1.0, lease_seconds / 2)

    async def run(self) -> None:
        while True:
            try:
                await failpoints.hit_async("engine.before_rescue")
                rescued = await asyncio.to_thread(writes.rescue_expired, self.engine)
            except Exception:
                log.exception("rescue failed", extra={"event": "engine.rescue_error"})
                rescued = []
            for job_id in rescued:
                RESCUED.inc()
                log.warning(
                    "expired lease re-queued",
                    extra={"event": "engine.lease_rescued", "job_id": job_id},
                )
            await asyncio.sleep(self.interval)


class Maintenance(Service):
    """Retention and the gauges that need a query; one engine at a time prunes."""

    def __init__(
        self,
        engine: Engine,
        interval: float,
        retention_instances_seconds: float,
        retention_job_ids_seconds: float,
        partition_seconds: float = writes.DAY,
        partitions_ahead: int = 3,
        retention_operator_actions_seconds: float = writes.OPERATOR_ACTIONS_RETENTION,
    ) -> None:
        super().__init__()
        self.engine = engine
        self.interval = interval
        self.retention = (retention_instances_seconds, retention_job_ids_seconds)
        self.partitions = (partition_seconds, partitions_ahead)
        self.operator_actions_retention = retention_operator_actions_seconds

    async def run(self) -> None:
        while True:
            try:
                await self._prune()
                await self._count()
            except Exception:
                log.exception("maintenance failed", extra={"event": "engine.maintenance_error"})
            await asyncio.sleep(self.interval)

    async def _prune(self) -> None:
        # Where a test holds a round while another engine's round, or a parent
        # collecting a child, goes on (docs/architecture.md, "Interleavings").
        await failpoints.hit_async("engine.before_partition_maintenance")
        pruned = await asyncio.to_thread(
            writes.prune,
            self.engine,
            *self.retention,
            *self.partitions,
            self.operator_actions_retention,
        )
        for kind, count in pruned.items():
            PRUNED.labels(kind).inc(count)

    async def _count(self) -> None:
        counts = await asyncio.to_thread(writes.status_counts, self.engine)
        INSTANCES_BY_STATUS.clear()
        for (workflow, status), n in counts.by_workflow_status.items():
            INSTANCES_BY_STATUS.labels(workflow, status).set(n)
        RUNNABLE_BACKLOG.set(counts.runnable_due)
