"""The history checker every interleaving case and every chaos run ends with.

It reads what PostgreSQL recorded (instances, steps, attempts, events) plus, when
given, the :class:`Executions` the step code logged itself: the database alone cannot
see a zombie's step still running after its lease was taken, the step's own log can.
Each invariant is one query; a broken one is a line of text naming the job.

The queries are its own, not the store's nor ``onceflow_tools.figures`` (the other
tools' figures): an oracle that shared the code it checks would share its mistakes.
"""

from __future__ import annotations

import itertools
import os
import threading
import time
from collections.abc import Collection
from dataclasses import dataclass, field
from datetime import datetime
from pathlib import Path
from typing import Any

import sqlalchemy as sa
from sqlalchemy.engine import Engine

from onceflow.vocabulary import TERMINAL_STATUSES

Span = tuple[str, str, float, float | None]


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
    """What step code itself saw: one (job, step, start, end) per execution.

    With ``log_path`` each begin and end is also appended to that file as one line, so
    the executions of a subprocess (which a test may SIGKILL or SIGSTOP) can be read
    back with :meth:`read`. Times are ``time.monotonic()``: one clock for every process
    of the machine (Linux's CLOCK_MONOTONIC), so spans of two processes compare.
    """

    spans: list[Span] = field(default_factory=list)
    log_path: Path | None = None
    _lock: threading.Lock = field(default_factory=threading.Lock)

    def begin(self, job_id: str, step: str) -> int:
        with self._lock:
            now = time.monotonic()
            self.spans.append((job_id, step, now, None))
            index = len(self.spans) - 1
            self._log(f"B\t{os.getpid()}:{index}\t{job_id}\t{step}\t{now!r}")
            return index

    def end(self, index: int) -> None:
        with self._lock:
            job, step, start, _ = self.spans[index]
            now = time.monotonic()
            self.spans[index] = (job, step, start, now)
            self._log(f"E\t{os.getpid()}:{index}\t{now!r}")

    def _log(self, line: str) -> None:
        if self.log_path is not None:
            with open(self.log_path, "a") as out:  # one write per line: O_APPEND keeps it whole
                out.write(line + "\n")

    def clear(self) -> None:
        with self._lock:
            self.spans.clear()

    @classmethod
    def read(cls, path: Path) -> Executions:
        """The executions another process appended to ``path`` (none if it is absent);
        one that began and never ended (its process was killed) stays open."""
        begun: dict[str, list[Any]] = {}
        if path.exists():
            for line in path.read_text().splitlines():
                kind, key, *rest = line.split("\t")
                if kind == "B":
                    job, step, start = rest
                    begun[key] = [job, step, float(start), None]
                elif kind == "E" and key in begun:
                    begun[key][3] = float(rest[0])
        return cls(spans=[(j, s, a, b) for j, s, a, b in begun.values()])

    def __add__(self, other: Executions) -> Executions:
        return Executions(spans=[*self.spans, *other.spans])

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
    now: datetime | None = None,
    completing: Collection[str] = (),
) -> list[str]:
    """The invariants every interleaving case must keep; returns what is broken.

    ``settled_after``: how long (seconds) an event, a control request or a runnable
    instance may wait at most before the checker calls it lost. ``now``: the time the
    engines' timers run by (a test's fake clock; the database's ``now()`` if None).
    ``completing``: workflows that complete whatever happens to them, so an errored
    instance of one is interference gone wrong, not the workflow's own failure.
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
    # 3. A completed step is never run again; 4. a recorded final failure is never re-run
    #    (unless an operator retried the step: its attempts up to retry_base, 0020).
    for job_id, position, outcome in rows(
        db,
        "SELECT a.job_id, a.position, a.outcome FROM onceflow_step_attempts a"
        " JOIN onceflow_steps s ON s.job_id = a.job_id AND s.position = a.position"
        " WHERE a.outcome IN ('complete', 'failed')"
        "  AND NOT (a.outcome = 'failed' AND a.attempt <= s.retry_base) AND EXISTS ("
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
    # 6. Every control request is applied (or refused) within the bound; and one left on
    #    a finished instance was neither (nothing will ever apply it).
    for job_id, action, state in rows(
        db,
        "SELECT job_id, requested_action, status FROM onceflow_instances"
        " WHERE requested_action IS NOT NULL AND (status = ANY(:final)"
        "  OR updated_at < now() - make_interval(secs => :bound))",
        bound=settled_after,
        final=sorted(TERMINAL_STATUSES),
    ):
        broken.append(f"{job_id}: control request {action!r} not applied (it is {state})")
    # 7. Nothing a live engine could run is left unclaimed past the bound.
    for (job_id,) in rows(
        db,
        "SELECT job_id FROM onceflow_instances WHERE status IN ('queued', 'sleeping', 'waiting')"
        " AND run_after < coalesce(CAST(:now AS timestamptz), now())"
        "  - make_interval(secs => :bound)",
        bound=settled_after,
        now=now,
    ):
        broken.append(f"{job_id}: runnable and not claimed")
    # 8. No instance of a workflow that always completes errored.
    for job_id, error in rows(
        db,
        "SELECT job_id, error FROM onceflow_instances"
        " WHERE status = 'errored' AND workflow = ANY(:completing)",
        completing=sorted(completing),
    ):
        broken.append(f"{job_id}: errored ({error}) although it completes undisturbed")
    if executions is not None:
        broken += executions.overlaps()
    return broken
