"""Tools for the interleaving tests: an in-process engine, executions recorded by the
step code itself, and the history checker every case ends with.

The checker reads only what PostgreSQL recorded (instances, steps, attempts, events)
plus, when given, the :class:`Executions` the test's step functions logged: the
database alone cannot see a zombie's step still running after its lease was taken,
the step's own log can.
"""

from __future__ import annotations

import asyncio
import itertools
import threading
import time
from collections.abc import Callable
from dataclasses import dataclass, field
from datetime import UTC, datetime, timedelta
from typing import Any

import sqlalchemy as sa
from sqlalchemy.engine import Engine

from onceflow import failpoints
from workflow_engine.clock import FakeClock
from workflow_engine.engine.runner import EngineRunner


class EngineHarness:
    """An engine running in a background thread's event loop (a fake clock by default)."""

    def __init__(self, settings: Any, db: Engine, clock: FakeClock | None = None, **update: Any):
        self.clock = clock or FakeClock(datetime.now(UTC) + timedelta(seconds=1))
        self.runner = EngineRunner(
            settings.model_copy(update={"engine_poll_interval_seconds": 0.05, **update}),
            engine=db,
            clock=self.clock,
        )
        self.loop = asyncio.new_event_loop()
        self.thread = threading.Thread(target=self._run, daemon=True)

    def _run(self) -> None:
        self.loop.run_until_complete(self.runner.run())

    def __enter__(self) -> EngineHarness:
        self.thread.start()
        return self

    def __exit__(self, *exc: object) -> None:
        failpoints.disarm_all()  # a paused run must not hold the shutdown
        self.loop.call_soon_threadsafe(self.runner.stop)
        self.thread.join(30)

    def inflight(self) -> int:
        return len(self.runner._inflight)


def wait_for(predicate: Callable[[], Any], what: str, timeout: float = 20.0) -> None:
    deadline = time.monotonic() + timeout
    while time.monotonic() < deadline:
        if predicate():
            return
        time.sleep(0.02)
    raise AssertionError(f"timed out waiting for {what}")


def scalar(db: Engine, sql: str, **params: Any) -> Any:
    with db.connect() as conn:
        return conn.execute(sa.text(sql), params).scalar()


def rows(db: Engine, sql: str, **params: Any) -> list[Any]:
    with db.connect() as conn:
        return list(conn.execute(sa.text(sql), params))


def status(db: Engine, job_id: str) -> str | None:
    return scalar(db, "SELECT status FROM onceflow_instances WHERE job_id = :j", j=job_id)


@dataclass
class Executions:
    """What step code itself saw: one (job, step, start, end) per execution."""

    spans: list[tuple[str, str, float, float | None]] = field(default_factory=list)
    _lock: threading.Lock = field(default_factory=threading.Lock)

    def begin(self, job_id: str, step: str) -> int:
        with self._lock:
            self.spans.append((job_id, step, time.monotonic(), None))
            return len(self.spans) - 1

    def end(self, index: int) -> None:
        with self._lock:
            job, step, start, _ = self.spans[index]
            self.spans[index] = (job, step, start, time.monotonic())

    def count(self, job_id: str, step: str) -> int:
        return sum(1 for j, s, _, _ in self.spans if (j, s) == (job_id, step))

    def overlaps(self) -> list[str]:
        """Executions of one step of one job that ran at the same time."""
        found = []
        by_step: dict[tuple[str, str], list[tuple[float, float]]] = {}
        for job, step, start, end in self.spans:
            by_step.setdefault((job, step), []).append((start, end or float("inf")))
        for (job, step), spans in by_step.items():
            spans.sort()
            for (_, end_a), (start_b, _) in itertools.pairwise(spans):
                if start_b < end_a:
                    found.append(f"{job}/{step}: an execution started before the last ended")
        return found


def check_history(
    db: Engine,
    executions: Executions | None = None,
    *,
    settled_after: float = 5.0,
) -> list[str]:
    """The invariants every interleaving case must keep; returns what is broken.

    ``settled_after``: how long (seconds) an event, a control request or a runnable
    instance may wait at most before the checker calls it lost.
    """
    broken: list[str] = []
    # 1. One instance per accepted workflow job id (and no instance without its job).
    for (job_id,) in rows(
        db,
        "SELECT j.job_id FROM onceflow_jobs j LEFT JOIN onceflow_instances i USING (job_id)"
        " WHERE j.kind = 'workflow' AND i.job_id IS NULL",
    ):
        broken.append(f"{job_id}: accepted workflow job without an instance")
    # 2. Attempts of one step never overlap as recorded: each starts after the previous
    #    one closed (an attempt left open by a cut-off run is closed as abandoned when
    #    the next one starts, never later).
    for job_id, position, attempt in rows(
        db,
        "SELECT b.job_id, b.position, b.attempt FROM onceflow_step_attempts a"
        " JOIN onceflow_step_attempts b ON b.job_id = a.job_id AND b.position = a.position"
        "  AND b.attempt = a.attempt + 1"
        " WHERE a.finished_at IS NULL OR b.started_at < a.finished_at - interval '5 ms'",
    ):
        broken.append(f"{job_id}: attempt {attempt} of position {position} overlaps the one before")
    # 3. A completed step is never run again; 4. a recorded final failure is never re-run.
    for job_id, position, outcome in rows(
        db,
        "SELECT a.job_id, a.position, a.outcome FROM onceflow_step_attempts a"
        " WHERE a.outcome IN ('complete', 'failed') AND EXISTS ("
        "  SELECT 1 FROM onceflow_step_attempts b WHERE b.job_id = a.job_id"
        "   AND b.position = a.position AND b.attempt > a.attempt)",
    ):
        broken.append(f"{job_id}: position {position} ran again after it was {outcome}")
    # 5. No instance waits for an event that was delivered longer ago than the bound.
    for job_id, event_type in rows(
        db,
        "SELECT i.job_id, s.event_type FROM onceflow_instances i"
        " JOIN onceflow_steps s ON s.job_id = i.job_id AND s.status = 'waiting'"
        " JOIN onceflow_events e ON e.job_id = i.job_id AND e.type = s.event_type"
        "  AND e.consumed_at IS NULL"
        " WHERE i.status = 'waiting' AND e.sent_at < now() - make_interval(secs => :bound)",
        bound=settled_after,
    ):
        broken.append(f"{job_id}: waits for {event_type!r} beside an unconsumed one")
    # 6. Every control request is applied (or refused) within the bound.
    for job_id, action in rows(
        db,
        "SELECT job_id, requested_action FROM onceflow_instances"
        " WHERE requested_action IS NOT NULL"
        "  AND updated_at < now() - make_interval(secs => :bound)",
        bound=settled_after,
    ):
        broken.append(f"{job_id}: control request {action!r} not applied")
    # 7. Nothing a live engine could run is left unclaimed past the bound.
    for (job_id,) in rows(
        db,
        "SELECT job_id FROM onceflow_instances WHERE status IN ('queued', 'sleeping', 'waiting')"
        " AND run_after < now() - make_interval(secs => :bound)",
        bound=settled_after,
    ):
        broken.append(f"{job_id}: runnable and not claimed")
    if executions is not None:
        broken += executions.overlaps()
    return broken
