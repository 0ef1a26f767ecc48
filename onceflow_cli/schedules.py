"""``onceflow schedules``: create, list, pause, resume, delete and backfill schedules.

The engines fire the ticks (``workflow_engine.engine.scheduler``); these commands only
change the ``onceflow_schedules`` rows, through the store.
"""

from __future__ import annotations

from datetime import UTC, datetime
from typing import Any

import click
import orjson

from onceflow.settings import get_settings
from onceflow.ticks import TickSpec
from onceflow.vocabulary import CatchupPolicy, OverlapPolicy
from onceflow_cli.database import connect

_CATCHUP = click.Choice([p.value for p in CatchupPolicy])
_OVERLAP = click.Choice([p.value for p in OverlapPolicy])


def _db() -> Any:
    return connect(get_settings())


def _moment(value: str, flag: str) -> datetime:
    try:
        moment = datetime.fromisoformat(value.replace("Z", "+00:00"))
    except ValueError:
        raise click.BadParameter(f"{value!r} is not an ISO 8601 time", param_hint=flag) from None
    return moment if moment.tzinfo else moment.replace(tzinfo=UTC)


def _iso(moment: datetime | None) -> str:
    return moment.astimezone(UTC).isoformat().replace("+00:00", "Z") if moment else "-"


@click.group("schedules")
def schedules() -> None:
    """Schedules: one workflow instance per tick (cron or interval)."""


@schedules.command("create")
@click.argument("name")
@click.option("--workflow", required=True, help="The workflow each tick starts.")
@click.option("--cron", default=None, help="A 5-field cron expression, e.g. '*/5 * * * *'.")
@click.option("--every", type=click.IntRange(1), default=None, help="Or an interval in seconds.")
@click.option("--timezone", default="UTC", help="The time zone the cron is read in.")
@click.option("--params", default="{}", help="The params of every tick's instance (JSON).")
@click.option("--catchup", type=_CATCHUP, default=CatchupPolicy.RUN_ONCE.value)
@click.option("--overlap", type=_OVERLAP, default=OverlapPolicy.SKIP.value)
@click.option("--max-catchup", type=click.IntRange(1, 1000), default=100)
def create(
    name: str,
    workflow: str,
    cron: str | None,
    every: int | None,
    timezone: str,
    params: str,
    catchup: str,
    overlap: str,
    max_catchup: int,
) -> None:
    """Create a schedule; it first fires at its first tick after now."""
    from onceflow_cli.inputs import exact_json
    from workflow_engine.model import ScheduleDef
    from workflow_engine.store.operations import create_schedule

    doc = exact_json(params.encode(), "--params")
    spec = TickSpec(cron, every, timezone)
    d = ScheduleDef(
        name, workflow, spec, doc, CatchupPolicy(catchup), OverlapPolicy(overlap), max_catchup
    )
    view = create_schedule(_db(), d)
    click.echo(f"created {view.name}: {spec.describe()}, next fire {_iso(view.next_fire_at)}")


@schedules.command("list")
@click.option("--json", "as_json", is_flag=True, help="Print JSON lines instead of a table.")
def list_(as_json: bool) -> None:
    """Every schedule: next fire, last tick, policies, ticks fired and skipped."""
    from workflow_engine.store.views import list_schedules

    views = list_schedules(_db())
    if as_json:
        for v in views:
            click.echo(orjson.dumps(v.to_dict(), default=str))
        return
    click.echo(
        "name\tworkflow\tspec\tstate\tnext fire\tlast tick (instance status)"
        "\tcatchup/overlap\tfired\tskipped"
    )
    for v in views:
        state = "paused" if v.paused else "active"
        last = f"{_iso(v.last_tick_at)} ({v.last_status or '-'})"
        click.echo(
            f"{v.name}\t{v.workflow}\t{v.spec.describe()}\t{state}\t{_iso(v.next_fire_at)}"
            f"\t{last}\t{v.catchup}/{v.overlap}\t{v.ticks_fired}\t{v.ticks_skipped}"
        )


@schedules.command("pause")
@click.argument("name")
def pause(name: str) -> None:
    """Stop firing (ticks that fall due while paused are not run later)."""
    from workflow_engine.store.operations import pause_schedule

    pause_schedule(_db(), name)
    click.echo(f"{name}: paused")


@schedules.command("resume")
@click.argument("name")
def resume(name: str) -> None:
    """Fire again, from the first tick after now."""
    from workflow_engine.store.operations import resume_schedule

    view = resume_schedule(_db(), name)
    click.echo(f"{name}: active, next fire {_iso(view.next_fire_at)}")


@schedules.command("delete")
@click.argument("name")
def delete(name: str) -> None:
    """Delete a schedule (the instances it started stay)."""
    from workflow_engine.store.operations import delete_schedule

    delete_schedule(_db(), name)
    click.echo(f"{name}: deleted")


@schedules.command("backfill")
@click.argument("name")
@click.option("--from", "start", required=True, help="First time of the range (ISO 8601).")
@click.option("--to", "end", required=True, help="Last time of the range (ISO 8601).")
@click.option("--dry-run", is_flag=True, help="Only count the ticks (and show first/last).")
def backfill(name: str, start: str, end: str, dry_run: bool) -> None:
    """Start one instance per tick in a past range (a tick that ran already is not
    run again: its job id exists)."""
    from workflow_engine.store.operations import backfill as run_backfill

    r = run_backfill(_db(), name, _moment(start, "--from"), _moment(end, "--to"), dry_run)
    click.echo(f"{name}: {r.count} ticks, first {_iso(r.first)}, last {_iso(r.last)}")
    if not dry_run:
        click.echo(f"created {r.created} instances ({r.existing} existed already)")


def render_tick(db: Any, job_id: str) -> tuple[str | None, dict[str, Any] | None]:
    """What ``instances describe`` adds for a schedule's tick: a line and a JSON field."""
    from workflow_engine.store.views import tick_of

    tick = tick_of(db, job_id)
    if tick is None:
        return None, None
    line = (
        f"schedule: {tick.schedule}, tick {_iso(tick.tick_at)} ({tick.trigger},"
        f" fired {tick.lateness_seconds:.3f} s late)"
    )
    return line, {**tick.__dict__, "trigger": str(tick.trigger)}
