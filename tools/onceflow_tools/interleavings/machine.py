"""The randomized interleaving search: a Hypothesis state machine on the real engine.

Each example gets a fresh migrated database and an in-process engine
(:class:`~onceflow_tools.interleavings.harness.EngineHarness`) on a flowing test clock.
Hypothesis draws a sequence of rules: submissions (new job ids and resubmissions of
old ones), events, operator actions (pause, resume, terminate, restart, through the
store functions the CLI, the admin API and the console call), a run held at a
failpoint and released later (so that the next rules happen inside its window), a
lease expired by hand and the rescuer run, an engine killed (no release, its leases
left to expire) or stopped, a second engine started or stopped, the clock moved on,
real time let pass. After every rule the history checker runs with bounds wide enough
for a step (what is broken at once: two instances of a job, overlapping executions, a
completed step run again, a request left on a finished instance); at teardown the
driver takes every instance to its end and the full check runs.

``tests/integration/test_interleaving_machine.py`` runs a short, derandomized search in
CI; ``onceflow chaos --interleavings`` a long one from a random seed it prints.
"""

from __future__ import annotations

import contextlib
import time
import traceback
import uuid
from collections.abc import Callable
from dataclasses import dataclass
from typing import Any, ClassVar

import hypothesis
import sqlalchemy as sa
from hypothesis import HealthCheck, Phase
from hypothesis import strategies as st
from hypothesis.stateful import (
    Bundle,
    RuleBasedStateMachine,
    initialize,
    invariant,
    multiple,
    precondition,
    rule,
    run_state_machine_as_test,
)

from onceflow import failpoints
from onceflow.envelope import JobEnvelope
from onceflow.settings import Settings
from onceflow_tools.interleavings.harness import Driver, EngineHarness, FlowingClock
from onceflow_tools.interleavings.history import check_history, scalar
from onceflow_tools.interleavings.workflows import COMPLETING, EVENT, EXECUTIONS
from onceflow_tools.stack import database_url_for
from workflow_engine.model import Delivery
from workflow_engine.store import make_engine, migrate, operations, writes
from workflow_engine.store.writes import create_instances

#: Short leases, so that an expiry, a rescue and a killed engine's leases come within a run.
LEASE = 3.0
#: How long an event, a request or a runnable instance may wait, checked after each rule
#: (a run may be held at a failpoint over several rules).
STEP_BOUND = 30.0
#: How long the teardown may take to bring every instance to its end.
DRAIN_SECONDS = 45.0
#: Failpoints a rule may hold a run at: (name, whether it is reached per job id).
HOLD_POINTS = [
    ("engine.after_claim", False),
    ("engine.before_step_start", True),
    ("engine.after_step_run", True),
    ("engine.after_consume_event", True),
    ("engine.before_suspend", True),
    ("engine.before_control_apply", True),
    ("engine.before_finish", True),
    ("engine.before_heartbeat", False),
]
CONTROL_ACTIONS = ["pause", "resume", "terminate", "restart"]


class Databases:
    """Fresh migrated databases, each cloned from one template (one per example)."""

    def __init__(self, base_url: str, template: str | None = None) -> None:
        self.base_url = base_url
        self._admin = make_engine(database_url_for(base_url, "postgres"), pool_size=1)
        self._own_template = template is None
        self.template = template or f"onceflow_iltpl_{uuid.uuid4().hex[:8]}"
        if self._own_template:
            self._run(f'CREATE DATABASE "{self.template}"')
            db = make_engine(database_url_for(base_url, self.template), pool_size=1)
            migrate(db)
            db.dispose()

    def _run(self, sql: str) -> None:
        with self._admin.connect().execution_options(isolation_level="AUTOCOMMIT") as conn:
            conn.execute(sa.text(sql))

    def create(self) -> str:
        name = f"onceflow_il_{uuid.uuid4().hex[:10]}"
        self._run(f'CREATE DATABASE "{name}" TEMPLATE "{self.template}"')
        return database_url_for(self.base_url, name)

    def drop(self, url: str) -> None:
        name = sa.engine.make_url(url).database
        self._run(f'DROP DATABASE IF EXISTS "{name}" WITH (FORCE)')

    def close(self) -> None:
        if self._own_template:
            self._run(f'DROP DATABASE IF EXISTS "{self.template}" WITH (FORCE)')
        self._admin.dispose()


@dataclass(frozen=True)
class Sandbox:
    """What a machine needs from outside: the engines' settings and its databases."""

    settings: Settings
    databases: Databases


class InterleavingMachine(RuleBasedStateMachine):
    """Rules are the actors; the invariant is the history checker (module docstring)."""

    SANDBOX: ClassVar[Sandbox]
    jobs = Bundle("jobs")

    def __init__(self) -> None:
        super().__init__()
        EXECUTIONS.clear()
        self.url = self.SANDBOX.databases.create()
        self.db = make_engine(self.url, pool_size=4)
        self.settings = self.SANDBOX.settings.model_copy(update={"database_url": self.url})
        self.clock = FlowingClock()
        self.driver = Driver(self.db, self.clock)
        self.engines: list[EngineHarness] = [self._engine()]
        self.second: EngineHarness | None = None
        self.held: list[failpoints.Failpoint] = []
        self.created = 0

    def _engine(self) -> EngineHarness:
        return EngineHarness(self.settings, self.db, self.clock, engine_lease_seconds=LEASE).start()

    def _workflow(self, job_id: str) -> str:
        return str(
            scalar(self.db, "SELECT workflow FROM onceflow_instances WHERE job_id = :j", j=job_id)
        )

    # --- the actors -------------------------------------------------------------------

    @initialize(
        target=jobs, workflows=st.lists(st.sampled_from(COMPLETING), min_size=1, max_size=3)
    )
    def first_jobs(self, workflows: list[str]) -> Any:
        """A few jobs before the first rule, so that every sequence has work to disturb."""
        return multiple(*(self._create(workflow) for workflow in workflows))

    @rule(target=jobs, workflow=st.sampled_from(COMPLETING))
    def submit(self, workflow: str) -> str:
        return self._create(workflow)

    def _create(self, workflow: str) -> str:
        job_id = f"m{self.created:03d}"
        self.created += 1
        create_instances(
            self.db, [Delivery(JobEnvelope(job_id, workflow, {}), "t", 0, self.created)]
        )
        return job_id

    @rule(job=jobs)
    def resubmit(self, job: str) -> None:
        """The same job id again, from a later Kafka position: it collapses."""
        self.created += 1
        delivery = Delivery(JobEnvelope(job, self._workflow(job), {}), "t", 0, self.created)
        create_instances(self.db, [delivery])

    @rule(job=jobs)
    def send_event(self, job: str) -> None:
        with contextlib.suppress(operations.ControlError):
            operations.send_event(self.db, self._workflow(job), job, EVENT, {"by": "machine"})

    @rule(job=jobs, action=st.sampled_from(CONTROL_ACTIONS))
    def operate(self, job: str, action: str) -> None:
        operation: Callable[..., Any] = getattr(operations, action)
        with contextlib.suppress(operations.ControlError):
            operation(self.db, self._workflow(job), job)

    @rule(job=jobs)
    def expire_lease(self, job: str) -> None:
        """Its lease made expired by hand (an engine cut off past its lease), then the
        rescuer's statement: the run that holds it, if any, goes on as a zombie."""
        with self.db.begin() as conn:
            conn.execute(
                sa.text(
                    "UPDATE onceflow_instances SET lease_expires_at = now() - interval '1 second'"
                    " WHERE job_id = :j AND status = 'running'"
                ),
                {"j": job},
            )
        writes.rescue_expired(self.db)

    @rule(point=st.sampled_from(HOLD_POINTS), job=jobs)
    def hold(self, point: tuple[str, bool], job: str) -> None:
        """The next run to reach ``point`` (for ``job``, where a point is per job) waits
        there until ``release``: the rules drawn meanwhile happen inside its window."""
        name, per_job = point
        if len(self.held) < 2:
            self.held.append(failpoints.arm(name, "pause", job_id=job if per_job else None))

    @precondition(lambda self: self.held)
    @rule()
    def release(self) -> None:
        for point in self.held:
            point.release()
        self.held.clear()

    @rule(kill=st.booleans())
    def restart_engine(self, kill: bool) -> None:
        """The first engine killed (nothing released) or stopped, and a new one started."""
        old = self.engines.pop(0)
        if kill:
            old.kill()
        else:
            old.stop()  # disarms every failpoint (a held run must not block the drain)
            self.held.clear()
        self.engines.insert(0, self._engine())

    @rule()
    def second_engine(self) -> None:
        """Start a second engine on the same database and clock, or stop it."""
        if self.second is None:
            self.second = self._engine()
            self.engines.append(self.second)
        else:
            self.engines.remove(self.second)
            self.second.stop()
            self.held.clear()
            self.second = None

    @rule(seconds=st.sampled_from([0.5, 2.0, 30.0]))
    def advance_clock(self, seconds: float) -> None:
        self.clock.advance(seconds)

    @rule(seconds=st.sampled_from([0.0, 0.05, 0.3, 1.0]))
    def let_run(self, seconds: float) -> None:
        time.sleep(seconds)

    # --- the invariants ---------------------------------------------------------------

    @invariant()
    def history_holds(self) -> None:
        # now=None: the bound on "runnable and not claimed" in real time, as the test
        # clock may just have jumped past many timers at once.
        broken = check_history(self.db, EXECUTIONS, settled_after=STEP_BOUND, completing=COMPLETING)
        assert broken == [], broken

    def teardown(self) -> None:
        try:
            failpoints.disarm_all()
            self.held.clear()
            self.driver.settle(None, timeout=DRAIN_SECONDS)
            broken = check_history(
                self.db, EXECUTIONS, now=self.clock.db_now(), completing=COMPLETING
            )
            assert broken == [], broken
        finally:
            for engine in reversed(self.engines):
                engine.stop()
            self.db.dispose()
            self.SANDBOX.databases.drop(self.url)


def machine_for(sandbox: Sandbox) -> type[InterleavingMachine]:
    """The state machine bound to ``sandbox`` (Hypothesis builds it with no arguments)."""
    return type("Interleavings", (InterleavingMachine,), {"SANDBOX": sandbox})


def search_settings(examples: int, steps: int, *, derandomize: bool = False) -> hypothesis.settings:
    """Settings for a search on real services: no deadline or speed health checks (each
    example starts an engine on a new database), no example database (a run is its seed),
    no shrinking (each shrink step reruns engines; the seed and the printed steps are
    the reproduction)."""
    return hypothesis.settings(
        max_examples=examples,
        stateful_step_count=steps,
        derandomize=derandomize,
        deadline=None,
        database=None,
        phases=[Phase.explicit, Phase.generate],
        suppress_health_check=list(HealthCheck),
        print_blob=True,
    )


def search(sandbox: Sandbox, examples: int, steps: int, seed: int | None = None) -> None:
    """Run the search: ``seed`` fixes the examples (None: derandomized, as in CI).
    Raises the first failure, after Hypothesis printed its steps."""
    machine: Any = machine_for(sandbox)
    if seed is not None:
        machine = hypothesis.seed(seed)(machine)
    run_state_machine_as_test(
        machine, settings=search_settings(examples, steps, derandomize=seed is None)
    )


def run_interleavings(
    settings: Settings, seed: int, examples: int, steps: int, log: Callable[[str], None]
) -> bool:
    """``onceflow chaos --interleavings``: one search from ``seed`` on the database server
    of ``settings`` (a database per example, dropped after it); True if it found nothing.
    A failure is logged with the steps Hypothesis printed and the seed to rerun it."""
    log(f"interleavings seed={seed}: {examples} sequences of up to {steps} steps")
    started = time.monotonic()
    databases = Databases(settings.database_url)
    try:
        search(Sandbox(settings, databases), examples, steps, seed=seed)
    except Exception as exc:
        log("".join(traceback.format_exception(exc)))
        log(f"interleavings seed={seed}: FAILED after {time.monotonic() - started:.1f}s")
        return False
    finally:
        failpoints.disarm_all()
        databases.close()
    log(f"interleavings seed={seed}: clean ({time.monotonic() - started:.1f}s)")
    return True
