"""``onceflow audit actions``: the operators' audit trail, and who the CLI acts as.

The CLI's control commands (``instances pause|resume|terminate|restart|send-event``,
bulk operations by ``--filter``, ``dead-letters redrive``) act as ``cli:<OS user>``
(:func:`cli_actor`); the store records each in ``onceflow_operator_actions``
(:mod:`workflow_engine.store.operator_audit`), as it does for the console and the admin
API, and this command reads them back, newest first.
"""

from __future__ import annotations

import getpass
import os
from typing import TYPE_CHECKING

import click
import orjson

from onceflow.settings import get_settings
from onceflow.vocabulary import ActionResult, FrontEnd, OperatorAction
from onceflow_cli.database import connect

if TYPE_CHECKING:  # the store is imported when a command runs, not when the CLI starts
    from workflow_engine.store.operations import ActionEntry, Actor


def os_user() -> str:
    """The OS user running the CLI (``getpass.getuser``: ``$LOGNAME``, ``$USER``, … or
    the password database), or the uid when none names it (a container's bare uid)."""
    try:
        return getpass.getuser()
    except (KeyError, OSError):
        return f"uid{os.getuid()}"


def cli_actor() -> Actor:
    from workflow_engine.store.operations import Actor

    return Actor.cli(os_user())


def render_action(e: ActionEntry) -> str:
    at = f"{e.at:%Y-%m-%d %H:%M:%S}" if e.at else "-"
    target = e.target() if (e.job_id or e.filter is not None) else "-"
    bulk = f" bulk #{e.bulk_id}" if e.bulk_id is not None else ""
    return (
        f"{at}\t{e.actor}\t{e.front_end}\t{e.action}\t{e.result}\t{target}{bulk}\t{e.detail or '-'}"
    )


def _choice(vocabulary: type) -> click.Choice:
    return click.Choice([v.value for v in vocabulary])  # type: ignore[attr-defined]


@click.command("actions")
@click.option("--job-id", default=None, help="Only actions on this instance.")
@click.option(
    "--actor", default=None, help="Only this actor (a key's name, console:<key>, cli:<user>)."
)
@click.option("--action", default=None, type=_choice(OperatorAction), help="Only this action.")
@click.option("--front-end", default=None, type=_choice(FrontEnd), help="Only from here.")
@click.option("--result", default=None, type=_choice(ActionResult), help="Only this result.")
@click.option("--limit", default=50, type=click.IntRange(1, 100_000), help="At most this many.")
@click.option("--json", "as_json", is_flag=True, help="Print JSON lines instead of a table.")
def audit_actions(
    job_id: str | None,
    actor: str | None,
    action: str | None,
    front_end: str | None,
    result: str | None,
    limit: int,
    as_json: bool,
) -> None:
    """The operators' audit trail, newest first: who paused, resumed, terminated,
    restarted, sent an event, started a bulk operation or re-drove dead letters (from
    the console, the admin API or the CLI), console logins, and refused requests."""
    from workflow_engine.store.views import ActionFilter, list_actions

    given = {
        "job_id": job_id,
        "actor": actor,
        "action": action,
        "front_end": front_end,
        "result": result,
    }
    f = ActionFilter.from_params({k: v for k, v in given.items() if v is not None})
    db, cursor, shown = connect(get_settings()), None, 0
    while shown < limit:
        page = list_actions(db, f, cursor, min(500, limit - shown))
        for e in page.rows:
            click.echo(orjson.dumps(e.to_dict()) if as_json else render_action(e))
        shown += len(page.rows)
        cursor = page.next_cursor
        if cursor is None:
            break
