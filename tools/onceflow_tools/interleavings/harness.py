"""An engine run in-process for the interleaving tests, and the driver that takes every
instance to an end.

:class:`EngineHarness` runs the real :class:`~workflow_engine.engine.runner.EngineRunner`
in a background thread's event loop, on a :class:`~workflow_engine.clock.FakeClock` by
default (a sleep of an hour is one ``advance``). Several harnesses may share one
database and one clock: a second engine. :meth:`EngineHarness.kill` leaves the engine
the way SIGKILL leaves a process: no release, no further write, its leases left to
expire.

:class:`Driver` plays the outside world until every instance has finished: it moves the
clock past due sleeps, sends the event a wait waits for (once per job, never beside an
event already there: that would hide a lost one) and resumes paused instances.
"""

from __future__ import annotations

import asyncio
import contextlib
import threading
import time
from collections.abc import Callable, Collection
from concurrent.futures import ThreadPoolExecutor
from dataclasses import dataclass, field
from datetime import UTC, datetime, timedelta
from typing import Any

from sqlalchemy.engine import Engine

from onceflow import failpoints
from onceflow.vocabulary import TERMINAL_STATUSES
from onceflow_tools.interleavings.history import rows
from workflow_engine.clock import FakeClock
from workflow_engine.definitions import REGISTRY
from workflow_engine.engine.runner import EngineRunner
from workflow_engine.store import operations


class FlowingClock(FakeClock):
    """A test clock that runs with the real one and jumps ahead on :meth:`advance`.

    A :class:`FakeClock` stands still, so an instance made runnable at the database's
    ``now()`` (created, resumed, woken by an event, rescued) becomes due for the engine
    only once a test has moved the clock past it; this one never falls behind."""

    def __init__(self, ahead: float = 1.0) -> None:
        super().__init__()
        self._ahead = timedelta(seconds=ahead)

    def db_now(self) -> datetime:
        return datetime.now(UTC) + self._ahead

    def advance(self, seconds: float) -> None:
        self._ahead += timedelta(seconds=seconds)


class EngineHarness:
    """An engine running in a background thread's event loop (a fake clock by default)."""

    def __init__(self, settings: Any, db: Engine, clock: FakeClock | None = None, **update: Any):
        self.clock = clock or FakeClock(datetime.now(UTC) + timedelta(seconds=1))
        self.runner = EngineRunner(
            settings.model_copy(update={"engine_poll_interval_seconds": 0.05, **update}),
            REGISTRY,
            db=db,
            clock=self.clock,
        )
        self.loop = asyncio.new_event_loop()
        # As the engine process has (runner._main): a thread per slot and a few more.
        self.loop.set_default_executor(
            ThreadPoolExecutor(self.runner.settings.engine_concurrency + 8, "harness")
        )
        self.thread = threading.Thread(target=self._run, daemon=True)
        self._main: asyncio.Task[None] | None = None

    def _run(self) -> None:
        self._main = self.loop.create_task(self.runner.run())
        with contextlib.suppress(asyncio.CancelledError):
            self.loop.run_until_complete(self._main)

    def start(self) -> EngineHarness:
        self.thread.start()
        return self

    def __enter__(self) -> EngineHarness:
        return self.start()

    def __exit__(self, *exc: object) -> None:
        self.stop()

    def stop(self) -> None:
        """A clean stop (SIGTERM): in-flight runs finish or are released."""
        if not self.thread.is_alive():
            return
        failpoints.disarm_all()  # a paused run must not hold the shutdown
        self.loop.call_soon_threadsafe(self.runner.stop)
        self.thread.join(30)

    def kill(self) -> None:
        """Stop as SIGKILL would: nothing released, no run resumes, leases expire.

        The main task is cancelled with the drain made a no-op, so the listener and the
        services stop (no heartbeat renews a lease) and the runs in flight are left
        suspended where they are, never to write again. A store call already in a
        thread finishes, as a transaction the server got before the kill commits."""

        async def no_drain() -> None:
            return None

        self.runner._drain = no_drain  # type: ignore[method-assign]
        if self._main is not None:
            self.loop.call_soon_threadsafe(self._main.cancel)
        self.thread.join(30)
        # The runs left suspended are collected with the loop: that is the point, not
        # an error to print ("Task was destroyed but it is pending!").
        self.loop.set_exception_handler(lambda loop, context: None)

    def inflight(self) -> int:
        return len(self.runner._inflight)


def wait_for(predicate: Callable[[], Any], what: str, timeout: float = 20.0) -> None:
    deadline = time.monotonic() + timeout
    while time.monotonic() < deadline:
        if predicate():
            return
        time.sleep(0.02)
    raise AssertionError(f"timed out waiting for {what}")


@dataclass
class Driver:
    """The outside world of a run: time, the awaited events, an operator's resume."""

    db: Engine
    clock: FakeClock  # a FlowingClock, when instances are resumed or woken
    #: The payload of the event the driver sends where a wait waits for one.
    payload: Any = field(default_factory=lambda: {"by": "driver"})
    events_sent: set[str] = field(default_factory=set)
    resumed: set[str] = field(default_factory=set)
    advanced: float = 0.0

    def settle(
        self,
        job_ids: Collection[str] | None = None,
        timeout: float = 15.0,
        *,
        until: Callable[[], bool] | None = None,
        events: bool = True,
        resume: bool = True,
    ) -> None:
        """Act until every instance (of ``job_ids``, else all) is terminal, or until
        ``until()`` holds; raise with where each one stands if that takes longer than
        ``timeout``. ``events``/``resume``: send awaited events, resume paused ones."""
        deadline = time.monotonic() + timeout
        while True:
            live = self._live(job_ids)
            if until() if until is not None else not live:
                return
            if time.monotonic() > deadline:
                raise AssertionError(f"not settled within {timeout} s: {self.describe(live)}")
            self._act(live, events, resume)
            time.sleep(0.03)

    def _live(self, job_ids: Collection[str] | None) -> list[Any]:
        return [
            row
            for row in rows(
                self.db,
                "SELECT i.job_id, i.workflow, i.status, i.run_after, i.requested_action,"
                " (SELECT s.event_type FROM onceflow_steps s WHERE s.job_id = i.job_id"
                "   AND s.status = 'waiting' AND s.event_type IS NOT NULL LIMIT 1) AS awaits,"
                " (SELECT count(*) FROM onceflow_events e WHERE e.job_id = i.job_id)"
                "   AS events,"
                " (SELECT count(*) FROM onceflow_events e WHERE e.job_id = i.job_id"
                "   AND e.consumed_at IS NULL) AS unconsumed"
                " FROM onceflow_instances i WHERE i.status <> ALL(:final)"
                "  AND (CAST(:ids AS text[]) IS NULL OR i.job_id = ANY(CAST(:ids AS text[])))",
                final=sorted(TERMINAL_STATUSES),
                ids=None if job_ids is None else list(job_ids),
            )
        ]

    def _act(self, live: list[Any], events: bool = True, resume: bool = True) -> None:
        now = self.clock.db_now()
        assert now is not None
        due = [r.run_after for r in live if r.status == "sleeping" and r.run_after > now]
        if due and all(r.status != "running" for r in live):
            step = (min(due) - now).total_seconds() + 0.01
            self.clock.advance(step)  # every timer of a quiet system: on to the next
            self.advanced += step
        for r in live:
            if r.status == "paused" and resume:
                with contextlib.suppress(operations.ControlError):
                    operations.resume(self.db, r.workflow, r.job_id)
                self.resumed.add(r.job_id)
            elif r.status == "waiting" and r.awaits and r.events == 0 and events:
                with contextlib.suppress(operations.ControlError):
                    operations.send_event(self.db, r.workflow, r.job_id, r.awaits, self.payload)
                self.events_sent.add(r.job_id)

    def describe(self, live: list[Any] | None = None) -> str:
        live = self._live(None) if live is None else live
        return "; ".join(
            f"{r.job_id} {r.status} (run_after {r.run_after:%H:%M:%S.%f}, requested"
            f" {r.requested_action}, awaits {r.awaits}, {r.unconsumed} unconsumed event(s))"
            for r in live
        )
