"""The scheduler: an engine service that fires due schedule ticks.

Every engine runs one; none is elected. Each pass hands the due schedules to
:func:`workflow_engine.store.writes.ticks.fire_due`, which takes them in batches with
``FOR UPDATE SKIP LOCKED`` and creates each tick's instance through the one create path,
whose unique constraint makes a tick's job id (``<schedule>@<UTC instant>``) start at
most one instance whichever engine gets there, after any crash or clock jump. Missed
ticks (no engine ran) are handled by the schedule's catch-up policy on the next pass.

Time comes from the engine's clock (:mod:`workflow_engine.clock`): the database's
``now()`` in production, a test clock in tests.
"""

from __future__ import annotations

import asyncio
import logging
from collections.abc import Sequence
from dataclasses import dataclass

from sqlalchemy.engine import Engine

from onceflow import failpoints
from onceflow.errors import ConfigurationError
from onceflow.service_config import require_positive
from onceflow.ticks import DEFAULT_GRACE_SECONDS
from onceflow.vocabulary import TickSkipReason, TickTrigger
from workflow_engine.clock import FakeClock, SystemClock
from workflow_engine.engine.metrics import (
    SCHEDULE_LATENESS,
    SCHEDULE_NEXT_FIRE,
    SCHEDULE_TICKS_FIRED,
    SCHEDULE_TICKS_SKIPPED,
)
from workflow_engine.engine.services import Service
from workflow_engine.model import Registry, ScheduleDef
from workflow_engine.store import views, writes
from workflow_engine.store.writes import TickReport

log = logging.getLogger(__name__)
#: The next-fire gauges are refreshed every this many passes (the first included).
GAUGE_EVERY_PASSES = 5
#: The shortest sleep between passes (a tick due now was just fired by another engine).
MIN_PAUSE_SECONDS = 0.01


@dataclass(frozen=True, slots=True)
class SchedulerConfig:
    """Due ticks are looked for at least every ``interval_seconds``; a tick up to
    ``grace_seconds`` late still fires as on time (:func:`onceflow.ticks.plan`)."""

    interval_seconds: float = 1.0
    grace_seconds: float = DEFAULT_GRACE_SECONDS

    def __post_init__(self) -> None:
        require_positive(self, "interval_seconds")
        if not self.grace_seconds >= 0:
            raise ConfigurationError(
                f"SchedulerConfig.grace_seconds must be zero or more, not {self.grace_seconds!r}"
            )


class Scheduler(Service):
    """Upserts the declared schedules, then fires due ticks as they fall due (checking
    at least every ``config.interval_seconds``)."""

    def __init__(
        self,
        db: Engine,
        clock: SystemClock | FakeClock,
        config: SchedulerConfig,
        declared: Sequence[ScheduleDef] = (),
        registry: Registry | None = None,
    ) -> None:
        super().__init__()
        self.db = db
        self.clock = clock
        self.config = config
        self.declared = tuple(declared)
        #: This engine's workflows: which schedules it fires, and a tick's definition.
        self.registry = registry if registry is not None else Registry()
        self._passes = 0

    async def run(self) -> None:
        upserted = not self.declared
        while True:
            try:
                if not upserted:
                    await self._upsert_declared()
                    upserted = True
                await self.tick()
                pause = await self._until_next()
            except Exception:
                log.exception("scheduler pass failed", extra={"event": "schedule.error"})
                pause = self.config.interval_seconds
            await asyncio.sleep(pause)

    async def _until_next(self) -> float:
        """Sleep until the next tick is due (a tick fires within milliseconds, not up to
        a whole interval late), at most the interval (schedules made meanwhile)."""
        due = await asyncio.to_thread(writes.seconds_until_next_fire, self.db, self.clock.db_now())
        interval = self.config.interval_seconds
        if due is None:
            return interval
        return min(interval, max(MIN_PAUSE_SECONDS, due))

    async def _upsert_declared(self) -> None:
        taken = await asyncio.to_thread(
            writes.upsert_declared, self.db, self.declared, self.clock.db_now()
        )
        for name in taken:
            log.warning(
                "declared schedule %r not applied: a schedule made by the CLI or API has that name",
                name,
                extra={"event": "schedule.name_taken", "schedule": name},
            )

    async def tick(self) -> list[TickReport]:
        """One pass: fire what is due, and now and then refresh the next-fire gauges."""
        # The time this pass fires by is read here; another engine may fire (or an
        # operator delete) the same schedule before fire_due locks it.
        await failpoints.hit_async("engine.before_tick_fire")
        reports = await asyncio.to_thread(
            writes.fire_due,
            self.db,
            self.clock.db_now(),
            self.config.grace_seconds,
            registry=self.registry,
        )
        for report in reports:
            self._observe(report)
        await self._gauges()
        return reports

    def _observe(self, report: TickReport) -> None:
        for tick in report.fired:
            if tick.created:
                SCHEDULE_TICKS_FIRED.labels(report.schedule, tick.trigger).inc()
                SCHEDULE_LATENESS.labels(report.schedule).observe(tick.lateness_seconds)
            log.info(
                "schedule tick fired" if tick.created else "schedule tick existed already",
                extra={
                    "event": "schedule.tick_fired" if tick.created else "schedule.tick_existed",
                    "job_id": tick.job_id,
                    "schedule": report.schedule,
                    "trigger": str(tick.trigger),
                    "lateness_seconds": round(tick.lateness_seconds, 3),
                },
            )
        for reason, n in report.skipped.items():
            if n:
                SCHEDULE_TICKS_SKIPPED.labels(report.schedule, reason).inc(n)
                log.info(
                    "schedule ticks skipped",
                    extra={
                        "event": "schedule.ticks_skipped",
                        "schedule": report.schedule,
                        "reason": str(reason),
                        "count": n,
                    },
                )

    async def _gauges(self) -> None:
        self._passes += 1
        if self._passes % GAUGE_EVERY_PASSES != 1:
            return
        times = await asyncio.to_thread(views.next_fire_times, self.db)
        SCHEDULE_NEXT_FIRE.clear()
        for name, next_fire in times.items():
            # Counters start at 0 for every schedule, so rate() and increase() see a
            # series before the first skip.
            for reason in TickSkipReason:
                SCHEDULE_TICKS_SKIPPED.labels(name, reason)
            SCHEDULE_TICKS_FIRED.labels(name, TickTrigger.ON_TIME)
            if next_fire is not None:
                SCHEDULE_NEXT_FIRE.labels(name).set(next_fire.timestamp())
