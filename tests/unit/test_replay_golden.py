"""Golden replay: histories the real engine recorded (``tests/fixtures/replay/*.json``,
written by ``python -m onceflow_tools.replay_fixtures record``) replayed against
today's workflow code and today's engine, without services.

Each history runs through the engine runner's own run of one claimed instance
(``EngineRunner._run_instance``: the context, the run, the settling of its outcome),
with the runner's two ways out to PostgreSQL, ``write`` and ``db``, replaced by
:class:`ReplayRunner`: a store that serves only the recorded history and refuses any
write a correct replay does not make. A completed history must finish with its
recorded result, running no step again; a suspended one must reach the same
suspension; an errored one must end with the same error. A change that breaks the
replay of instances already in a database (a step renamed or moved, a recorded failure
raised as another class, a new write on replay) fails here.

When a workflow of the fixtures changes on purpose, record them again
(docs/architecture.md, "Golden replay fixtures").
"""

from __future__ import annotations

import asyncio
from collections.abc import Callable
from dataclasses import dataclass, field
from datetime import UTC, datetime
from pathlib import Path
from typing import Any, TypeVar, cast

import orjson
import pytest
from sqlalchemy.engine import Engine

import onceflow_examples  # noqa: F401  (registers the sample workflows the fixtures ran)
from onceflow.settings import Settings
from onceflow.vocabulary import TERMINAL_STATUSES, InstanceStatus, StepKind, StepStatus
from onceflow_tools.replay_fixtures import workflows as golden
from onceflow_tools.replay_fixtures.record import FORMAT
from workflow_engine import workflow
from workflow_engine.definitions import REGISTRY, Context
from workflow_engine.engine import replay
from workflow_engine.engine.runner import EngineRunner
from workflow_engine.errors import NonRetryableError
from workflow_engine.model import RecordedStep
from workflow_engine.store import writes
from workflow_engine.store.writes import Claimed, FinishInstance, Write

T = TypeVar("T")
FIXTURES = Path(__file__).resolve().parents[1] / "fixtures" / "replay"
PATHS = sorted(FIXTURES.glob("*.json"))


def load(path: Path) -> dict[str, Any]:
    fixture = orjson.loads(path.read_bytes())
    assert fixture["format"] == FORMAT, f"{path.name}: format {fixture['format']}, not {FORMAT}"
    return cast(dict[str, Any], fixture)


def _when(text: str | None) -> datetime | None:
    return None if text is None else datetime.fromisoformat(text)


def history(fixture: dict[str, Any]) -> list[RecordedStep]:
    """The fixture's steps as the claim hands them to a run (``claim.load_steps``)."""
    return [
        RecordedStep(
            s["position"],
            s["name"],
            StepStatus(s["status"]),
            s["attempts"],
            s["result"],
            StepKind(s["kind"]),
            _when(s["wake_at"]),
            s["error"],
        )
        for s in fixture["steps"]
    ]


class Refused(AssertionError):
    """A write or a read that a correct replay of the recorded history does not make."""


@dataclass
class HistoryStore:
    """Serves one recorded history; keeps how the run ended and what it was refused."""

    recorded: dict[int, RecordedStep]
    refused: list[str] = field(default_factory=list)
    finished: list[FinishInstance] = field(default_factory=list)
    suspended: list[tuple[InstanceStatus, datetime | None, float | None]] = field(
        default_factory=list
    )

    def refuse(self, what: str) -> Refused:
        self.refused.append(what)
        return Refused(what)

    def waiting_entry(self, position: int, kind: StepKind, what: str) -> RecordedStep:
        """The recorded sleep/wait/child at ``position`` that is still open, or refused:
        a replay asks the store about a wait only where the history left one open."""
        entry = self.recorded.get(position)
        open_statuses = (StepStatus.SLEEPING, StepStatus.WAITING)
        if entry is None or entry.kind != kind or entry.status not in open_statuses:
            raise self.refuse(f"{what} at position {position}, not open in the history")
        return entry

    def begin_wait(
        self, _lease: Any, _job: str, position: int, name: str, kind: StepKind, *_: Any
    ) -> tuple[datetime | None, bool]:
        # The recorded wake time, not due: the instance was suspended on it, so a replay
        # suspends on it again (the fixture's state, whatever the clock says today).
        return self.waiting_entry(position, kind, f"{kind} {name!r}").wake_at, False

    def consume_event(self, _lease: Any, _job: str, position: int) -> tuple[bool, Any]:
        self.waiting_entry(position, StepKind.EVENT, "consume an event")
        return False, None  # a fixture holds no event sent after its snapshot

    def collect(
        self, _lease: Any, _job: str, awaited: list[writes.Awaited]
    ) -> list[writes.ChildOutcome | None]:
        for a in awaited:
            self.waiting_entry(a.position, StepKind.CHILD, f"collect child {a.job_id!r}")
        return [None for _ in awaited]  # still running when the history was recorded

    def suspend(
        self,
        _lease: Any,
        _job: str,
        status: InstanceStatus,
        _now: datetime | None,
        wake_at: datetime | None = None,
        delay: float | None = None,
    ) -> bool:
        self.suspended.append((status, wake_at, delay))
        return False


class ReplayRunner(EngineRunner):
    """The real runner with its writes and store calls served by a :class:`HistoryStore`
    (no database: its engine is never used)."""

    def __init__(self, store: HistoryStore) -> None:
        super().__init__(Settings(), REGISTRY, db=cast(Engine, object()))
        self.store = store
        self._reads: dict[Callable[..., Any], Callable[..., Any]] = {
            writes.begin_wait: store.begin_wait,
            writes.consume_event: store.consume_event,
            writes.collect: store.collect,
            writes.suspend: store.suspend,
        }

    async def write(self, write: Write[T]) -> T:
        if isinstance(write, FinishInstance):
            self.store.finished.append(write)
            return cast(T, None)
        # A StartStep (a step about to run again), a FinishStep or a Chain of them.
        raise self.store.refuse(f"write {write!r}")

    async def call_db(self, fn: Callable[..., T], *args: Any, **kwargs: Any) -> T:
        served = self._reads.get(fn)
        if served is None:  # a marker, a closed wait, a child started, a control...
            raise self.store.refuse(f"store call {fn.__name__}{args[1:]!r}")
        return cast(T, served(*args, **kwargs))


def replay_fixture(fixture: dict[str, Any], workflow_name: str | None = None) -> HistoryStore:
    """Run the fixture's instance once, as a claim of today's engine would, from its
    recorded history; ``workflow_name``: replay it with another registered workflow."""
    steps = history(fixture)
    store = HistoryStore({s.position: s for s in steps})
    claimed = Claimed(
        fixture["job_id"],
        workflow_name or fixture["workflow"],
        fixture["params"],
        datetime(2026, 1, 1, tzinfo=UTC),
        None,
        fixture["claim_count"] + 1,  # the next claim of the instance
        steps,
        None,
        fixture["version"],
    )
    asyncio.run(ReplayRunner(store)._run_instance(claimed))
    return store


def mismatches(fixture: dict[str, Any], store: HistoryStore) -> list[str]:
    """How the replay differs from what the history says happened (empty: none)."""
    found = [f"refused: {what}" for what in store.refused]
    outcome = fixture["outcome"]
    if outcome["status"] in TERMINAL_STATUSES:
        ended = [
            (f.status, None if f.result is None else orjson.loads(f.result), f.error)
            for f in store.finished
        ]
        expected = [(outcome["status"], outcome["result"], outcome["error"])]
        if ended != expected or store.suspended:
            found.append(f"ended {ended}, suspended {store.suspended}; recorded {expected}")
    else:
        expected_wait = [(outcome["status"], _when(outcome["run_after"]))]
        waited = [(status, wake_at) for status, wake_at, _ in store.suspended]
        if waited != expected_wait or store.finished:
            found.append(f"suspended {waited}, finished {store.finished}; recorded {expected_wait}")
    return found


def test_the_fixtures_are_there():
    assert len(PATHS) >= 6, f"golden histories missing from {FIXTURES}"


@pytest.mark.parametrize("path", PATHS, ids=[p.stem for p in PATHS])
def test_a_recorded_history_replays_to_the_same_outcome_without_running_a_step(path):
    fixture = load(path)
    calls = len(golden.CALLS)

    store = replay_fixture(fixture)

    assert mismatches(fixture, store) == []
    assert golden.CALLS[calls:] == []  # no step function ran again


@pytest.mark.parametrize("path", PATHS, ids=[p.stem for p in PATHS])
def test_todays_engine_would_claim_the_recorded_instance(path):
    """Engines claim only the versions they have: a workflow whose version changed
    would leave the recorded instances unclaimed (README, "Deploying new workflow
    code"). Changed on purpose: record the fixtures again."""
    fixture = load(path)
    assert REGISTRY.version(fixture["workflow"]) == fixture["version"]


# --- the checks can fail: today's workflows changed, or a replay that lost something ---


@workflow("golden-waits-renamed")
async def waits_renamed(ctx: Context, params: dict[str, Any]) -> Any:
    """``golden-waits`` with its first step renamed."""
    await ctx.step("prepare order", golden._did, ctx.job_id, "prepare", params["order"])
    await ctx.sleep("cool off", 60)
    return None


@workflow("golden-gather-swapped")
async def gather_swapped(ctx: Context, params: dict[str, Any]) -> Any:
    """``golden-gather`` with its first two branches swapped."""
    job = ctx.job_id
    return await ctx.gather(
        ctx.step("b", golden._did, job, "b", "b done"),
        ctx.step("a", golden._did, job, "a", "a done"),
    )


@pytest.mark.parametrize(
    ("fixture_name", "changed", "message"),
    [
        ("waits_complete", "golden-waits-renamed", "asked for step 'prepare order' at position 0"),
        ("gather_complete", "golden-gather-swapped", "asked for step 'b' at position 0"),
    ],
)
def test_a_workflow_changed_under_its_history_fails_the_replay(fixture_name, changed, message):
    fixture = load(FIXTURES / f"{fixture_name}.json")
    calls = len(golden.CALLS)

    store = replay_fixture(fixture, workflow_name=changed)

    found = mismatches(fixture, store)
    assert len(found) == 1 and message in found[0], found  # NonDeterminismError: errored
    assert [f.status for f in store.finished] == [InstanceStatus.ERRORED]
    assert store.refused == [] and golden.CALLS[calls:] == []  # stopped before any write


def test_a_replay_that_loses_a_failures_class_fails(monkeypatch):
    """A recorded ``CardDeclined`` replayed as a plain ``NonRetryableError``: the
    workflow's ``except CardDeclined`` no longer matches, and the instance that slept
    after compensating errors instead."""

    def lost_class(job_id: str, recorded: RecordedStep) -> Exception:
        return NonRetryableError(recorded.error or "")

    monkeypatch.setattr(replay, "replayed_failure", lost_class)
    fixture = load(FIXTURES / "caught_failure_sleeping.json")

    found = mismatches(fixture, replay_fixture(fixture))

    assert len(found) == 1 and "errored" in found[0], found


def test_a_replay_that_runs_a_recorded_step_again_is_refused():
    """A run that no longer sees a completed entry (as if the claim had loaded the
    history without it) would run that step again: its start is refused before its
    code runs."""
    fixture = load(FIXTURES / "order_complete.json")
    forgetful = {**fixture, "steps": fixture["steps"][1:]}  # "charge payment" forgotten

    store = replay_fixture(forgetful)

    assert (
        store.refused and "StartStep" in store.refused[0] and "charge payment" in store.refused[0]
    )
