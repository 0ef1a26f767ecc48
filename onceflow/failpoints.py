"""Named failpoints at the transaction boundaries of the worker and the engine.

Every decision the engine takes in one transaction and acts on in a later one is a
window where another actor (an event, an operator, a second engine, a rescue, an
outage) can step in. A failpoint names such a boundary, so a test can stop the process
exactly there, let the other actor in, and check that the later transaction re-checks
what the first decided (docs/architecture.md, "Interleavings").

Nothing in the product arms a failpoint: there is no setting and no environment
variable for it. Only tests arm them, in-process with :func:`arm` or, for a subprocess,
through the test launcher (``onceflow_tools.failpoint_main``, which the chaos run's
worker goes through too), which calls
:func:`arm_from_spec` before it starts the process's own entry point. Unarmed, a
failpoint costs one truth test of an empty dict.

Actions: ``pause`` (block the caller until the test releases it; from async code the
event loop keeps running, only the caller waits), ``raise`` (raise
:class:`FailpointError` there), ``kill`` (SIGKILL the process) and ``stop`` (SIGSTOP the
process, for a zombie that wakes up after its lease expired).
"""

from __future__ import annotations

import asyncio
import os
import signal
import threading
from dataclasses import dataclass, field
from typing import Literal

Action = Literal["pause", "raise", "kill", "stop"]

#: Every failpoint the code reaches, by name: one source of truth for the tests' matrix
#: and the docs. A name not listed here cannot be armed.
POINTS: dict[str, str] = {
    "streams.after_db_commit": "worker: a batch's instances committed, offsets not yet",
    "engine.after_claim": "engine: instances claimed and leased, their runs not started",
    "claim.before_lease": "claim: plain candidates picked and locked, not leased yet",
    "claim.after_expiry": "claim: instances past their start limit errored, not committed",
    "engine.before_step_start": "engine: a step about to open its attempt",
    "engine.after_step_run": "engine: a step's code returned, its checkpoint not written",
    "engine.after_consume_event": "engine: the wait read its events (none yet), not suspended",
    "engine.before_suspend": "engine: a run decided to sleep/wait, the suspend not written",
    "engine.before_children_collect": "engine: a parent about to read its children",
    "engine.before_control_apply": "engine: a control request seen, not yet applied",
    "engine.before_finish": "engine: a run ended, its final status not written",
    "engine.before_release": "engine: unfinished runs about to be given back",
    "engine.before_heartbeat": "engine: the lease keeper about to extend the leases",
    "engine.before_rescue": "engine: the rescuer about to re-queue expired leases",
    "engine.before_tick_fire": "engine: a schedule's tick about to be created",
    "engine.before_partition_maintenance": "engine: a retention round about to run",
    "ingest.before_wait_register": "ingest: a waited-for job acknowledged, no waiter yet",
    "outcomes.between_reads": "a submission's status read: the id's run read, its record not yet",
    "ingest.events_before_reassign": "ingest: the events consumer, its partitions lost,"
    " about to read their watermarks and assign them again",
    "bulk.between_batches": "bulk runner: a batch committed, the next not started (lease held)",
    "relay.after_publish": "relay: a round's events acknowledged by Kafka, not yet deleted",
    "webhooks.before_commit": "webhook dispatcher: a batch's deliveries committed, offsets not yet",
    "webhooks.after_claim": "webhook dispatcher: a delivery claimed (attempt opened), not sent",
    "webhooks.before_record": "webhook dispatcher: an attempt sent, its outcome not recorded",
    "singleton.after_decide": "worker: a singleton key locked and its live instances read,"
    " the decision not committed",
    "reuse.after_read": "worker: finished runs of resubmitted job ids read, not yet locked",
    "batch.after_lock": "engine: a batch's members locked and re-checked, the batch run"
    " not created, the members not marked",
    "debounce.after_lock": "worker: a debounce key locked and its pending instance locked"
    " and read, the absorb not written",
    "operations.after_lock": "operator action: the instance locked, its status read, not changed",
}


class FailpointError(RuntimeError):
    """Raised where a failpoint armed with ``raise`` is reached."""


@dataclass(eq=False)
class Failpoint:
    """One armed failpoint: a test waits until it is reached, then releases it."""

    name: str
    action: Action
    job_id: str | None = None  # reach it only for this job id (any, when None)
    times: int = 1  # how many hits fire the action; later hits pass
    hits: int = 0
    reached: threading.Event = field(default_factory=threading.Event)
    _go: threading.Event = field(default_factory=threading.Event)

    def wait_reached(self, timeout: float = 30.0) -> None:
        if not self.reached.wait(timeout):
            raise AssertionError(f"failpoint {self.name} not reached within {timeout} s")

    def release(self) -> None:
        self._go.set()

    def _fire(self) -> None:
        if self.action == "kill":
            os.kill(os.getpid(), signal.SIGKILL)
        if self.action == "stop":
            self.reached.set()
            os.kill(os.getpid(), signal.SIGSTOP)
            return
        self.reached.set()
        if self.action == "raise":
            raise FailpointError(f"failpoint {self.name} reached")
        self._go.wait()


_armed: dict[str, list[Failpoint]] = {}
_lock = threading.Lock()


def arm(
    name: str, action: Action = "pause", *, job_id: str | None = None, times: int = 1
) -> Failpoint:
    """Arm ``name``; the returned handle says when it was reached and releases it."""
    if name not in POINTS:
        raise KeyError(f"no failpoint named {name!r} (known: {', '.join(sorted(POINTS))})")
    point = Failpoint(name, action, job_id, times)
    with _lock:
        _armed.setdefault(name, []).append(point)
    return point


def disarm_all() -> None:
    """Disarm everything and let every paused caller go on."""
    with _lock:
        points = [p for group in _armed.values() for p in group]
        _armed.clear()
    for point in points:
        point.release()


def arm_from_spec(spec: str) -> list[Failpoint]:
    """``name=action[@job_id][*times]`` items, comma-separated (the test launcher's form)."""
    points = []
    for item in filter(None, (part.strip() for part in spec.split(","))):
        name, _, rest = item.partition("=")
        rest, _, times = rest.partition("*")
        action, _, job_id = rest.partition("@")
        points.append(
            arm(name, action or "pause", job_id=job_id or None, times=int(times or 1))  # type: ignore[arg-type]
        )
    return points


def _take(name: str, job_id: str | None) -> Failpoint | None:
    with _lock:
        for point in _armed.get(name, ()):
            if point.job_id is not None and point.job_id != job_id:
                continue
            if point.hits >= point.times:
                continue
            point.hits += 1
            return point
    return None


def hit(name: str, job_id: str | None = None) -> None:
    """Reach failpoint ``name`` from blocking code (a store function in a thread)."""
    if not _armed:
        return
    point = _take(name, job_id)
    if point is not None:
        point._fire()


async def hit_async(name: str, job_id: str | None = None) -> None:
    """Reach failpoint ``name`` from a coroutine: a pause waits in a thread, so the
    event loop (the heartbeat, other instances, the claim loop) goes on meanwhile."""
    if not _armed:
        return
    point = _take(name, job_id)
    if point is None:
        return
    if point.action == "pause":
        await asyncio.to_thread(point._fire)
    else:
        point._fire()
