"""The engine's presence: it announces the workflow versions it has, and reports the
instances no live engine can run.

Every third of a lease it refreshes its row in ``onceflow_engines``; on stop it removes
it. Each round it also sets ``onceflow_engine_instances_without_engine{workflow,version}``
from the table (a database-wide figure, like ``onceflow_engine_instances``), so an
instance whose version no engine has is visible, never silently stuck.
"""

from __future__ import annotations

import asyncio
import contextlib
import logging
from dataclasses import dataclass

from sqlalchemy.engine import Engine

from onceflow.service_config import require_positive
from workflow_engine.engine.metrics import INSTANCES_WITHOUT_ENGINE, WORKFLOW_VERSION
from workflow_engine.engine.services import Service
from workflow_engine.store import views, writes
from workflow_engine.store.views import ENGINE_STALE_SECONDS

log = logging.getLogger(__name__)

UNVERSIONED = "unversioned"


@dataclass(frozen=True, slots=True)
class PresenceConfig:
    """The engine's row is refreshed, and the stranded instances counted, every
    ``interval_seconds``."""

    interval_seconds: float

    def __post_init__(self) -> None:
        require_positive(self, "interval_seconds")


class Presence(Service):
    def __init__(
        self, db: Engine, engine_id: str, versions: dict[str, str], config: PresenceConfig
    ) -> None:
        super().__init__()
        self.db = db
        self.engine_id = engine_id
        self.versions = dict(versions)
        self.config = config
        self._reported: dict[tuple[str, str | None], int] = {}

    async def run(self) -> None:
        WORKFLOW_VERSION.clear()
        for workflow, version in self.versions.items():
            WORKFLOW_VERSION.labels(workflow, version).set(1)
        while True:
            try:
                await asyncio.to_thread(writes.announce, self.db, self.engine_id, self.versions)
                await self._count()
            except Exception:
                log.exception("presence failed", extra={"event": "engine.presence_error"})
            await asyncio.sleep(self.config.interval_seconds)

    async def _count(self) -> None:
        stranded = await asyncio.to_thread(
            views.instances_without_engine, self.db, ENGINE_STALE_SECONDS
        )
        INSTANCES_WITHOUT_ENGINE.clear()
        reported, self._reported = self._reported, {}
        for s in stranded:
            if not s.count:  # none due: none stuck yet (the gauge counts runnable ones)
                continue
            INSTANCES_WITHOUT_ENGINE.labels(s.workflow, s.version or UNVERSIONED).set(s.count)
            self._reported[(s.workflow, s.version)] = s.count
            if reported.get((s.workflow, s.version)) == s.count:
                continue  # said already
            log.warning(
                "%d instances of %s version %s: no live engine has that version",
                s.count,
                s.workflow,
                s.version,
                extra={
                    "event": "engine.instances_without_engine",
                    "workflow": s.workflow,
                    "version": s.version,
                    "count": s.count,
                },
            )

    async def stop(self) -> None:
        await super().stop()
        with contextlib.suppress(Exception):
            await asyncio.to_thread(writes.retire, self.db, self.engine_id)
