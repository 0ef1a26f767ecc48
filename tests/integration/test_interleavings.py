"""The interleaving matrix: each failpoint of the engine crossed with each concurrent
action (docs/architecture.md, "Interleavings").

A cell stops the in-process engine exactly at one failpoint for one instance, lets the
other actor in (an event, an operator's control action, a second engine, a rescue after
the lease expired), releases the engine, plays the outside world until the instance
has finished (:class:`~onceflow_tools.interleavings.Driver`: the clock past its sleep,
its awaited event if nobody sent one, a resume if it was paused), then checks the
invariants (``check_history``) and what that action must have done. The subprocess
cells SIGKILL an engine at a failpoint, or SIGSTOP it there past its lease (a zombie)
and SIGCONT it once another engine took the instance over.
"""

from __future__ import annotations

import contextlib
import json
import os
import signal
import subprocess
import threading
from collections.abc import Iterator
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

import pytest

from onceflow import failpoints
from onceflow.envelope import JobEnvelope
from onceflow.settings import settings_env
from onceflow_tools.interleavings import workflows as wf
from onceflow_tools.interleavings.workflows import CAUGHT, COMPLETING, EVENT, EXECUTIONS, FLOW
from onceflow_tools.processes import free_port, onceflow_command
from tests.integration.interleavings import (
    Driver,
    EngineHarness,
    Executions,
    FlowingClock,
    check_history,
    rows,
    status,
    wait_for,
)
from workflow_engine.clock import FakeClock
from workflow_engine.model import Delivery
from workflow_engine.store import operations, writes
from workflow_engine.store.views import describe_instance
from workflow_engine.store.writes import create_instances

ROOT = Path(__file__).resolve().parents[2]
JOB = "j1"
#: Short leases, so that a rescue, a heartbeat and a zombie's expiry come within a cell.
LEASE = 3.0
#: The point where the cell's action comes, and how the run gets there:
#: ``start``: armed before the engine starts; ``held``: the run is held inside its first
#: step (a heartbeat needs a run in flight); ``asked``: an operator's pause is asked of
#: the running instance first (so that the engine is about to apply it); ``@wait``: the
#: second occurrence, the wait's (the first suspend is the sleep's).
POINTS = {
    "after_claim": ("engine.after_claim", "start"),
    "before_step_start": ("engine.before_step_start", "start"),
    "after_step_run": ("engine.after_step_run", "start"),
    "before_suspend": ("engine.before_suspend", "start"),
    "after_consume_event": ("engine.after_consume_event", "start"),
    "before_suspend@wait": ("engine.before_suspend", "slept"),
    "before_control_apply": ("engine.before_control_apply", "asked"),
    "before_finish": ("engine.before_finish", "start"),
    "before_heartbeat": ("engine.before_heartbeat", "held"),
}
ACTIONS = ["event", "pause", "pause_resume", "terminate", "restart", "second_engine", "rescue"]
ACTION_EVENT = {"by": "action"}


@pytest.fixture(autouse=True)
def _clean() -> Iterator[None]:
    EXECUTIONS.clear()
    wf.HOLDS.clear()
    yield
    failpoints.disarm_all()
    for gate in wf.HOLDS.values():
        gate.set()
    wf.HOLDS.clear()


def create(db, job_id: str, workflow: str) -> None:
    create_instances(db, [Delivery(JobEnvelope(job_id, workflow, {}), "t", 0, 0)])


def instance(db, job_id: str) -> Any:
    (row,) = rows(
        db,
        "SELECT status, requested_action, claim_count, restart_count FROM onceflow_instances"
        " WHERE job_id = :j",
        j=job_id,
    )
    return row


def broken(db, clock: FakeClock, executions: Executions = EXECUTIONS) -> list[str]:
    return check_history(db, executions, now=clock.db_now(), completing=COMPLETING)


@dataclass
class Cell:
    """One run of the matrix: the engine(s), the clock, the driver, what was done."""

    settings: Any
    db: Any
    workflow: str = FLOW
    clock: FlowingClock = field(default_factory=FlowingClock)
    engines: list[EngineHarness] = field(default_factory=list)
    second_rounds: list[list[str]] = field(default_factory=list)

    def __post_init__(self) -> None:
        self.driver = Driver(self.db, self.clock)

    def engine(self) -> EngineHarness:
        harness = EngineHarness(self.settings, self.db, self.clock, engine_lease_seconds=LEASE)
        self.engines.append(harness.start())
        return harness

    def stop(self) -> None:
        for harness in reversed(self.engines):
            harness.stop()

    def reach(self, point: str, phase: str) -> failpoints.Failpoint:
        """Start the engine and bring the run to ``point``; return it, paused there."""
        job = None if point in ("engine.after_claim", "engine.before_heartbeat") else JOB
        if phase == "start":
            paused = failpoints.arm(point, "pause", job_id=job)
            self.engine()
        elif phase == "held":
            wf.HOLDS[JOB] = threading.Event()
            self.engine()
            wait_for(lambda: EXECUTIONS.count(JOB, "a") == 1, "the run inside its first step")
            paused = failpoints.arm(point, "pause", job_id=job)
        elif phase == "slept":
            self.engine()
            self.driver.settle([JOB], until=lambda: status(self.db, JOB) == "sleeping")
            paused = failpoints.arm(point, "pause", job_id=job)
        else:  # asked: the run is held before its first step while a pause is asked
            before_a = failpoints.arm("engine.before_step_start", "pause", job_id=JOB)
            paused = failpoints.arm(point, "pause", job_id=job)
            self.engine()
            before_a.wait_reached()
            assert operations.pause(self.db, self.workflow, JOB).requested == "pause"
            before_a.release()
        self.driver.settle([JOB], until=paused.reached.is_set, events=True, resume=False)
        return paused

    def act(self, action: str) -> None:
        db, wfl = self.db, self.workflow
        if action == "event":
            operations.send_event(db, wfl, JOB, EVENT, ACTION_EVENT)
        elif action == "pause":
            operations.pause(db, wfl, JOB)
        elif action == "pause_resume":
            operations.pause(db, wfl, JOB)
            operations.resume(db, wfl, JOB)
        elif action in ("terminate", "restart"):
            getattr(operations, action)(db, wfl, JOB)
        elif action == "second_engine":
            self._second_engine()
        elif action == "rescue":
            expire_and_rescue(db, JOB)
        else:
            raise AssertionError(action)

    def _second_engine(self) -> None:
        """Start a second engine on the same database and clock; wait until it has
        claimed twice while the first one is held (it must not take the instance)."""
        harness = EngineHarness(self.settings, self.db, self.clock, engine_lease_seconds=LEASE)
        claim = harness.runner._claim

        async def counted(limit: int) -> tuple[list[writes.Claimed], bool] | None:
            got = await claim(limit)
            self.second_rounds.append([c.job_id for c in (got[0] if got else ())])
            return got

        harness.runner._claim = counted  # type: ignore[method-assign]
        self.engines.append(harness.start())
        wait_for(lambda: len(self.second_rounds) >= 2, "two claim rounds of the second engine")
        assert all(JOB not in r for r in self.second_rounds), "the second engine took it"


def expire_and_rescue(db, job_id: str) -> None:
    """What the rescuer does once a lease expired, run at once: the lease made expired
    by hand, then the rescuer's own statement (the engine's rescuer may get there
    first; either way the claim that was running is over)."""
    before = instance(db, job_id).claim_count
    with db.begin() as conn:
        conn.exec_driver_sql(
            "UPDATE onceflow_instances SET lease_expires_at = now() - interval '1 second'"
            f" WHERE job_id = '{job_id}' AND status = 'running'"
        )
    rescued = writes.rescue_expired(db)
    after = instance(db, job_id)
    assert job_id in rescued or after.status != "running" or after.claim_count > before


def hold_until_claimed_again(db, seconds: float) -> None:
    """After a rescue, keep the old run where it is (held at its failpoint, or inside its
    step, whose thread cannot be cancelled) for as long as the engine could claim the
    instance anew (claim rounds come every 50 ms; ``seconds`` covers several, and two
    heartbeats where the run is held in its step). An engine that claims an id it still
    runs does it meanwhile, and its new run then goes on beside the old one (issue 23,
    case 2): the checker sees the overlap, or the old run's writes accepted."""
    with contextlib.suppress(AssertionError):
        wait_for(lambda: instance(db, JOB).claim_count >= 2, "claimed again", seconds)
    with contextlib.suppress(AssertionError):  # and its first step started, if it is to
        wait_for(lambda: EXECUTIONS.count(JOB, "a") >= 2, "step a again", 0.5)


def expected_paused(point: str, action: str) -> bool:
    """Whether the operator's last word leaves the instance paused (the driver then
    resumes it): their pause; or the prelude's, unless this action overrode it."""
    if point == "before_finish":
        return False  # asked after the run's last step: it finishes
    if action == "pause":
        return True
    return POINTS[point][1] == "asked" and action not in ("pause_resume", "terminate", "restart")


def check_cell(cell: Cell, point: str, action: str) -> None:
    db, job = cell.db, JOB
    row = instance(db, job)
    finished_first = point == "before_finish"  # a request then comes too late
    want = "terminated" if action == "terminate" and not finished_first else "complete"
    assert row.status == want, (row.status, cell.driver.describe())
    assert row.requested_action is None
    assert (job in cell.driver.resumed) == expected_paused(point, action), "paused or not"
    result = describe_instance(db, job).result
    if action == "event" and point not in ("before_finish",):
        assert job not in cell.driver.events_sent
        assert result["event"] == ACTION_EVENT
    if action == "restart" and not finished_first:
        assert row.restart_count == 1
    if action == "rescue":
        assert row.claim_count >= 2
    assert broken(db, cell.clock) == []


CELLS = [
    pytest.param(point, action, id=f"{point}-{action}") for point in POINTS for action in ACTIONS
]


@pytest.mark.parametrize(("point", "action"), CELLS)
def test_cell(settings, db, point, action):
    create(db, JOB, FLOW)
    cell = Cell(settings, db)
    name, phase = POINTS[point]
    try:
        paused = cell.reach(name, phase)
        assert status(db, JOB) == "running", "the window is inside a run"
        cell.act(action)
        if action == "rescue" and phase != "held":
            hold_until_claimed_again(db, 1.0)  # the old run held at its failpoint
        paused.release()
        if phase == "held":
            if action == "rescue":  # the heartbeat, let go, finds the lease taken
                hold_until_claimed_again(db, 2 * LEASE / 3)
            wf.HOLDS[JOB].set()
        cell.driver.settle([JOB])
        check_cell(cell, point, action)
    finally:
        cell.stop()


# --- a caught step failure, replayed across the interference -----------------------------

CAUGHT_CELLS = [
    ("before_suspend", "pause"),
    ("before_suspend", "rescue"),
    ("before_suspend", "second_engine"),
    ("before_finish", "rescue"),
]


@pytest.mark.parametrize(
    ("point", "action"), CAUGHT_CELLS, ids=[f"{p}-{a}" for p, a in CAUGHT_CELLS]
)
def test_caught_failure_cell(settings, db, point, action):
    """``charge`` fails for good and the workflow catches it: every replay (after the
    sleep, the pause, the rescue) raises the recorded failure again, never a second
    ``charge``."""
    create(db, JOB, CAUGHT)
    cell = Cell(settings, db, CAUGHT)
    try:
        paused = cell.reach(*POINTS[point])
        cell.act(action)
        paused.release()
        cell.driver.settle([JOB])
        assert instance(db, JOB).status == "complete", cell.driver.describe()
        assert describe_instance(db, JOB).result["charged"] is False
        assert EXECUTIONS.count(JOB, "charge") == 1, "a caught failure ran again on replay"
        assert broken(db, cell.clock) == []
    finally:
        cell.stop()


# --- an engine process killed, or stopped past its lease, at a failpoint ----------------


def engine_process(settings, tmp_path: Path, spec: str) -> tuple[subprocess.Popen, Path]:
    log = tmp_path / "executions.log"
    env = {
        **os.environ,
        **settings_env(settings),
        "ONCEFLOW_WORKFLOW_MODULES": json.dumps(["onceflow_tools.interleavings.workflows"]),
        "ONCEFLOW_ENGINE_LEASE_SECONDS": "2",
        "ONCEFLOW_ENGINE_POLL_INTERVAL_SECONDS": "0.1",
        "ONCEFLOW_ENGINE_METRICS_PORT": str(free_port()),
        "ONCEFLOW_TEST_EXECUTIONS": str(log),
    }
    proc = subprocess.Popen(
        [*onceflow_command(spec), "engine"],
        cwd=ROOT,
        env=env,
        stdout=open(tmp_path / "engine.log", "wb"),  # noqa: SIM115 (the child's)
        stderr=subprocess.STDOUT,
    )
    return proc, log


def stopped(pid: int) -> bool:
    state = Path(f"/proc/{pid}/stat").read_text().rsplit(")", 1)[1].split()[0]
    return state == "T"


def drive_to_end(cell: Cell, proc: subprocess.Popen, log: Path) -> None:
    cell.driver.settle([JOB], timeout=20)
    row = instance(cell.db, JOB)
    assert row.status == "complete", cell.driver.describe()
    assert row.claim_count >= 2
    assert broken(cell.db, cell.clock, EXECUTIONS + Executions.read(log)) == []


def engine_log(tmp_path: Path) -> str:
    return (tmp_path / "engine.log").read_text(errors="replace")[-3000:]


KILLED = [
    "engine.after_step_run",
    "engine.before_suspend",
    "engine.after_consume_event",
    "engine.before_finish",
]
STOPPED = [
    "engine.after_claim",
    "engine.after_step_run",
    "engine.before_suspend",
    "engine.before_finish",
]


@pytest.mark.parametrize("point", KILLED, ids=[p.removeprefix("engine.") for p in KILLED])
def test_sigkill_cell(settings, db, tmp_path, point):
    """SIGKILL there; another engine rescues the instance once the lease expires and
    finishes it from its last checkpoint."""
    create(db, JOB, FLOW)
    proc, log = engine_process(settings, tmp_path, f"{point}=kill@{JOB}")
    cell = Cell(settings, db)
    try:
        # The sleep and the event are the subprocess's real clock's and the driver's.
        cell.driver.settle([JOB], timeout=30, until=lambda: proc.poll() is not None)
        assert proc.returncode == -signal.SIGKILL, engine_log(tmp_path)
        cell.engine()
        drive_to_end(cell, proc, log)
    finally:
        cell.stop()
        if proc.poll() is None:
            proc.kill()
        proc.wait()


@pytest.mark.parametrize("point", STOPPED, ids=[p.removeprefix("engine.") for p in STOPPED])
def test_sigstop_cell(settings, db, tmp_path, point):
    """SIGSTOP there (a zombie engine); once its lease expired another engine rescues
    and claims the instance; SIGCONT: the zombie's writes must all be refused."""
    create(db, JOB, FLOW)
    job = "" if point == "engine.after_claim" else f"@{JOB}"  # reached for no job
    proc, log = engine_process(settings, tmp_path, f"{point}=stop{job}")
    cell = Cell(settings, db)
    try:
        cell.driver.settle([JOB], timeout=30, until=lambda: stopped(proc.pid))
        claimed = instance(db, JOB).claim_count
        cell.engine()
        wait_for(lambda: instance(db, JOB).claim_count > claimed, "the instance taken over", 15)
        os.kill(proc.pid, signal.SIGCONT)
        drive_to_end(cell, proc, log)
        assert proc.poll() is None, engine_log(tmp_path)
    finally:
        cell.stop()
        if proc.poll() is None:
            os.kill(proc.pid, signal.SIGCONT)
            proc.terminate()
            try:
                proc.wait(15)
            except subprocess.TimeoutExpired:
                proc.kill()
                proc.wait()
