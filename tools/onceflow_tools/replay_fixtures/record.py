"""The recorder of the golden replay fixtures: run each :class:`Scenario` on the real
engine and write its instance's history as JSON.

Each scenario runs on the real :class:`~workflow_engine.engine.runner.EngineRunner`
(in-process, :class:`~onceflow_tools.interleavings.EngineHarness`) against a fresh
database until its instance reaches the state it is recorded in (finished, or
suspended on a sleep or an event), and is written as JSON: the instance (workflow,
version, params), its history as the claim loads it (``store.claim.load_steps``) and
where it stands (status, result or error, ``run_after``).
"""

from __future__ import annotations

import contextlib
import functools
import os
import uuid
from collections.abc import Iterator, Sequence
from dataclasses import dataclass
from datetime import datetime
from pathlib import Path
from typing import Any

import click
import orjson
import sqlalchemy as sa
from sqlalchemy.engine import Engine

import onceflow_examples
from onceflow.envelope import JobEnvelope
from onceflow.settings import Settings, get_settings
from onceflow.vocabulary import TERMINAL_STATUSES
from onceflow_tools.interleavings import Driver, EngineHarness, FlowingClock, wait_for
from onceflow_tools.replay_fixtures import workflows
from onceflow_tools.stack import database_url_for, recreate_database
from workflow_engine.definitions import REGISTRY
from workflow_engine.model import Delivery, RecordedStep
from workflow_engine.store import make_engine, migrate
from workflow_engine.store.writes import create_instances, load_steps

#: The layout of the fixture files (the unit test refuses any other).
FORMAT = 1
FIXTURES = Path("tests/fixtures/replay")
#: The modules whose workflows the scenarios run (both imported here).
MODULES = [onceflow_examples.__name__, workflows.__name__]


@dataclass(frozen=True, slots=True)
class Scenario:
    """One fixture: an instance run until it reaches ``until`` (a status)."""

    name: str  # the fixture's file name, without .json
    covers: str  # what part of replay it checks, for a reader of the file
    workflow: str
    job_id: str
    params: dict[str, Any]
    until: str  # "complete", "errored" (finished) or "sleeping", "waiting" (suspended)


SCENARIOS = (
    Scenario(
        "order_complete",
        "three steps in a row, completed (the sample order-workflow)",
        "order-workflow",
        "golden_order",
        {"step_seconds": 0},
        "complete",
    ),
    Scenario(
        "caught_failure_sleeping",
        "a CardDeclined and a StepFailed caught by the workflow, then suspended on a sleep:"
        " replay raises both again, never runs them, and reaches the same sleep",
        "golden-caught-failure",
        "golden_caught",
        {},
        "sleeping",
    ),
    Scenario(
        "waits_complete",
        "a sleep and an event wait already satisfied, completed",
        "golden-waits",
        "golden_waits",
        {"order": 7},
        "complete",
    ),
    Scenario(
        "approval_waiting",
        "suspended on an event wait with a time-out, no event yet (the sample approval-workflow)",
        "approval-workflow",
        "golden_approval",
        {"step_seconds": 0, "timeout_seconds": 86400},
        "waiting",
    ),
    Scenario(
        "gather_complete",
        "a gather of steps and a two-step branch (sparse positions), completed",
        "golden-gather",
        "golden_gather",
        {},
        "complete",
    ),
    Scenario(
        "patched_complete",
        "a ctx.patched() marker recorded and taken, completed",
        "golden-patched",
        "golden_patched",
        {},
        "complete",
    ),
    Scenario(
        "checkout_declined_complete",
        "children started in a gather, one completed and one failed (ChildWorkflowFailed"
        " caught), refunds in a gather, completed (the sample checkout-workflow)",
        "checkout-workflow",
        "golden_checkout",
        {"items": [{"amount": 1200}, {"amount": 300, "declined": True}]},
        "complete",
    ),
    Scenario(
        "card_charge_declined_errored",
        "the declined child: a NonRetryableError not caught, the instance errored",
        "card-charge-workflow",
        "golden_checkout__charge-1",  # started by golden_checkout, not created here
        {"amount": 300, "declined": True},
        "errored",
    ),
)


def record(database_url: str, out: Path, scenarios: Sequence[Scenario] = SCENARIOS) -> list[Path]:
    """Run ``scenarios`` on a fresh database of the server of ``database_url`` and write
    one fixture each into ``out``; the database is dropped after."""
    name = f"onceflow_golden_{uuid.uuid4().hex[:8]}"
    url = recreate_database(database_url, name)
    db = make_engine(url, pool_size=4)
    try:
        migrate(db)
        migrate(db, onceflow_examples.MIGRATIONS)
        with _step_database(url):
            _run(Settings(database_url=url, workflow_modules=MODULES), db, scenarios)
        out.mkdir(parents=True, exist_ok=True)
        return [_write(out, s, snapshot(db, s)) for s in scenarios]
    finally:
        db.dispose()
        admin = make_engine(database_url_for(database_url, "postgres"), pool_size=1)
        with admin.connect().execution_options(isolation_level="AUTOCOMMIT") as conn:
            conn.execute(sa.text(f'DROP DATABASE IF EXISTS "{name}" WITH (FORCE)'))
        admin.dispose()


@contextlib.contextmanager
def _step_database(url: str) -> Iterator[None]:
    """The samples' steps write their side effects through ``get_settings()``: point it
    at the scratch database for the run."""
    before = os.environ.get("ONCEFLOW_DATABASE_URL")
    os.environ["ONCEFLOW_DATABASE_URL"] = url
    get_settings.cache_clear()
    try:
        yield
    finally:
        if before is None:
            del os.environ["ONCEFLOW_DATABASE_URL"]
        else:
            os.environ["ONCEFLOW_DATABASE_URL"] = before
        get_settings.cache_clear()


def _run(settings: Settings, db: Engine, scenarios: Sequence[Scenario]) -> None:
    """Create the instances and run one engine until each is where it is recorded: the
    driver moves the clock past sleeps and sends awaited events, but only to those
    recorded finished; the others are left where they suspend."""
    created = [s for s in scenarios if "__" not in s.job_id]  # children start themselves
    create_instances(db, [_delivery(offset, s) for offset, s in enumerate(created)])
    clock = FlowingClock()
    finishing = [s.job_id for s in created if s.until in TERMINAL_STATUSES]
    with EngineHarness(settings, db, clock=clock):
        Driver(db, clock).settle(finishing, timeout=30)
        for s in scenarios:
            wait_for(functools.partial(_reached, db, s), f"{s.job_id} {s.until}", 30)


def _delivery(offset: int, s: Scenario) -> Delivery:
    """The instance as the streams worker creates it, with today's version."""
    version = REGISTRY.version(s.workflow)
    if version is None:
        raise click.ClickException(f"{s.name}: workflow {s.workflow!r} is not registered")
    return Delivery(
        JobEnvelope(s.job_id, s.workflow, s.params), "golden", 0, offset, version=version
    )


def _reached(db: Engine, s: Scenario) -> bool:
    return _status(db, s.job_id) == s.until


def _status(db: Engine, job_id: str) -> str | None:
    with db.connect() as conn:
        return conn.execute(
            sa.text("SELECT status FROM onceflow_instances WHERE job_id = :j"), {"j": job_id}
        ).scalar()


def snapshot(db: Engine, scenario: Scenario) -> dict[str, Any]:
    """The fixture of ``scenario``'s instance as the database holds it now."""
    with db.connect() as conn:
        row = (
            conn.execute(
                sa.text(
                    "SELECT workflow, version, params, status, result, error, run_after,"
                    " claim_count FROM onceflow_instances WHERE job_id = :j"
                ),
                {"j": scenario.job_id},
            )
            .mappings()
            .one()
        )
        steps = load_steps(conn, [scenario.job_id])[scenario.job_id]
    return {
        "format": FORMAT,
        "recorded_by": "python -m onceflow_tools.replay_fixtures record",
        "covers": scenario.covers,
        "job_id": scenario.job_id,
        "workflow": row["workflow"],
        "version": row["version"],
        "params": row["params"],
        "claim_count": row["claim_count"],
        "steps": [_step(s) for s in steps],
        "outcome": {
            "status": row["status"],
            "result": row["result"],
            "error": row["error"],
            "run_after": _when(row["run_after"]),
        },
    }


def _step(s: RecordedStep) -> dict[str, Any]:
    return {
        "position": s.position,
        "name": s.name,
        "kind": str(s.kind),
        "status": str(s.status),
        "attempts": s.attempts,
        "result": s.result,
        "error": s.error,
        "wake_at": _when(s.wake_at),
    }


def _when(value: datetime | None) -> str | None:
    """ISO 8601; ``None`` for none or ``infinity`` (suspended until woken)."""
    if value is None or value == datetime.max.replace(tzinfo=value.tzinfo):
        return None
    return value.isoformat()


def _write(out: Path, scenario: Scenario, fixture: dict[str, Any]) -> Path:
    if fixture["outcome"]["status"] != scenario.until:
        raise click.ClickException(f"{scenario.name}: {fixture['outcome']}, not {scenario.until}")
    path = out / f"{scenario.name}.json"
    path.write_bytes(orjson.dumps(fixture, option=orjson.OPT_INDENT_2) + b"\n")
    return path


@click.group()
def main() -> None:
    """Golden replay fixtures (tests/unit/test_replay_golden.py replays them)."""


@main.command("record")
@click.option("--out", type=click.Path(path_type=Path), default=FIXTURES, show_default=True)
@click.option(
    "--database-url",
    envvar="DATABASE_URL",
    required=True,
    help="A server to make a scratch database on (onceflow dev env sets it).",
)
def record_command(out: Path, database_url: str) -> None:
    """Run every scenario on the real engine and write its fixture into OUT."""
    for path in record(database_url, out):
        click.echo(path)
