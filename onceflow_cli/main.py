"""The ``onceflow`` command line.

Every flag has an environment-variable twin (shown in ``--help``); settings that have
no flag come from ``ONCEFLOW_*`` variables (see the README's configuration table).
Any failure becomes one line on stderr and a non-zero exit status (``--debug``, or
``ONCEFLOW_DEBUG=1``, prints the traceback too).

Commands of other installed distributions join through the ``onceflow.commands``
entry point group: the tools (``onceflow-tools``) add ``dev``, ``demo``, ``bench``,
``chaos`` and ``dashboard`` that way, so the runtime never imports them.
"""

from __future__ import annotations

import sys
from typing import Any

import click
import orjson

from onceflow.errors import OnceflowError
from onceflow.settings import SCOPES, Settings, get_settings
from onceflow.vocabulary import InstanceStatus


def settings_from_env() -> Settings:
    """The settings as the environment (and the CLI's overrides) give them."""
    return get_settings()


_settings = settings_from_env


def _with_overrides(**overrides: Any) -> Settings:
    """The settings with the CLI's flags (those given) applied, the environment left
    alone: the process gets exactly the ``Settings`` it runs with."""
    given = {name: value for name, value in overrides.items() if value is not None}
    return _settings().model_copy(update=given)


@click.group(context_settings={"help_option_names": ["-h", "--help"], "show_default": True})
@click.version_option(package_name="onceflow")
@click.option(
    "--debug",
    envvar="ONCEFLOW_DEBUG",
    is_flag=True,
    help="On failure, print the traceback as well as the one-line reason.",
)
def cli(debug: bool) -> None:
    """onceflow: HTTP bursts into durable workflows, one per job id."""
    _state["debug"] = debug


_state: dict[str, bool] = {"debug": False}


def _add_plugin_commands(group: click.Group) -> None:
    """Add the commands other installed distributions register (the tools)."""
    from importlib.metadata import entry_points

    for entry in entry_points(group="onceflow.commands"):
        if entry.name not in group.commands:
            group.add_command(entry.load(), entry.name)


# --- schema and topics -------------------------------------------------------------------


@cli.command()
@click.option(
    "--grant-to",
    "grant_to",
    envvar="ONCEFLOW_APP_DB_ROLE",
    default=None,
    help="After migrating, let this database role read and write onceflow's rows"
    " (the role the services use; it gets no right to change the schema).",
)
@click.option(
    "--with",
    "with_modules",
    envvar="ONCEFLOW_MIGRATE_WITH",
    multiple=True,
    help="Also apply the migrations of this workflow module (its MIGRATIONS attribute),"
    " e.g. onceflow_examples; repeat for several.",
)
def migrate(grant_to: str | None, with_modules: tuple[str, ...]) -> None:
    """Apply pending database migrations (safe to run from several processes)."""
    from workflow_engine.store.db import check_connection, make_engine
    from workflow_engine.store.schema import PRODUCT, grant_app_role, migration_set_of
    from workflow_engine.store.schema import migrate as run_migrations

    sets = (PRODUCT, *(migration_set_of(module) for module in with_modules))
    engine = make_engine(_settings().database_url, pool_size=1)
    check_connection(engine)
    for migration_set in sets:
        applied = run_migrations(engine, migration_set)
        click.echo(
            f"{migration_set.name}: applied {len(applied)} migration(s)"
            if applied
            else f"{migration_set.name}: schema is up to date"
        )
    if grant_to:
        tables = grant_app_role(engine, grant_to, sets)
        click.echo(f"granted {grant_to} read/write on {len(tables)} tables")


@cli.group()
def topics() -> None:
    """Kafka topics."""


@topics.command("create")
def topics_create() -> None:
    """Create the jobs topic and its dead-letter topic if they do not exist."""
    from onceflow.topics import ensure_topics

    settings = _settings()
    created = ensure_topics(settings)
    click.echo(f"created: {', '.join(created)}" if created else "topics exist")


# --- the three processes -----------------------------------------------------------------


@cli.command()
@click.option("--host", envvar="ONCEFLOW_INGEST_HOST", default=None, help="Listen address.")
@click.option("--port", envvar="ONCEFLOW_INGEST_PORT", type=int, default=None, help="HTTP port.")
def ingest(host: str | None, port: int | None) -> None:
    """Run the HTTP ingest service (POST /v1/jobs)."""
    from producers.server import serve

    serve(_with_overrides(ingest_host=host, ingest_port=port))


@cli.command()
@click.option(
    "--concurrency",
    envvar="ONCEFLOW_STREAMS_CONCURRENCY",
    type=int,
    default=None,
    help="Database transactions in flight per batch.",
)
def worker(concurrency: int | None) -> None:
    """Run the streams worker (Faust agent: Kafka records into workflow instances)."""
    from streams.worker import run_worker

    run_worker(_with_overrides(streams_concurrency=concurrency))


@cli.command()
@click.option(
    "--concurrency",
    envvar="ONCEFLOW_ENGINE_CONCURRENCY",
    type=int,
    default=None,
    help="Instances run at once by this engine process.",
)
def engine(concurrency: int | None) -> None:
    """Run a workflow engine process (claims and runs instances durably)."""
    from workflow_engine.engine.runner import run_engine

    run_engine(_with_overrides(engine_concurrency=concurrency))


# --- instances -----------------------------------------------------------------------------


@cli.group()
def instances() -> None:
    """Inspect workflow instances."""


@instances.command("describe")
@click.argument("workflow")
@click.argument("job_id")
@click.option("--json", "as_json", is_flag=True, help="Print JSON instead of text.")
def instances_describe(workflow: str, job_id: str, as_json: bool) -> None:
    """Show one instance's status and each step's state."""
    from onceflow_cli.render import describe_elsewhere, render_instance
    from workflow_engine.store.instances import describe_instance

    engine = _db()
    view = describe_instance(engine, job_id)
    if view is None or view.workflow != workflow:
        # Say what the id *is* (another workflow's instance, a task run, a dead letter)
        # rather than "no instance": a wrong guess at the type is the usual mistake.
        raise OnceflowError(describe_elsewhere(engine, workflow, job_id, view))
    if as_json:
        click.echo(orjson.dumps(view.to_dict(), option=orjson.OPT_INDENT_2, default=str))
    else:
        click.echo(render_instance(view))


def _db():
    from workflow_engine.store.db import make_engine

    return make_engine(_settings().database_url, pool_size=1)


@instances.command("list")
@click.option("--workflow", default=None, help="Only this workflow.")
@click.option(
    "--status",
    default=None,
    type=click.Choice([s.value for s in InstanceStatus]),
    help="Only instances in this status.",
)
@click.option(
    "--since",
    "created_since",
    default=None,
    type=click.DateTime(formats=["%Y-%m-%d", "%Y-%m-%dT%H:%M:%S"]),
    help="Created at or after (UTC).",
)
@click.option("--prefix", "id_prefix", default=None, help="Job ids starting with this.")
@click.option("--limit", default=100, show_default=True, type=click.IntRange(1, 10000))
@click.option("--json", "as_json", is_flag=True, help="Print JSON lines instead of a table.")
def instances_list(workflow, status, created_since, id_prefix, limit, as_json) -> None:
    """List instances, newest first."""
    from datetime import UTC

    from workflow_engine.store.control import list_instances

    since = created_since.replace(tzinfo=UTC) if created_since else None
    wanted = InstanceStatus(status) if status else None
    rows = list_instances(_db(), workflow, wanted, since, id_prefix, limit)
    for row in rows:
        if as_json:
            click.echo(orjson.dumps(row.__dict__, default=str))
        else:
            click.echo(
                f"{row.job_id}\t{row.workflow}\t{row.status}\t{row.created_at:%Y-%m-%d %H:%M:%S}"
            )


def _control(op: str, workflow: str, job_id: str) -> None:
    from workflow_engine.store import control

    result = getattr(control, op)(_db(), workflow, job_id)
    click.echo(result.describe())


_CONTROL_OPERATIONS = {
    "pause": "Pause an instance (a running one pauses at its next step).",
    "resume": "Resume a paused instance.",
    "terminate": "Stop an instance for good (a running one stops at its next step).",
    "restart": "Run an instance again from its first step, forgetting its history.",
}


def _control_command(op: str, help_text: str) -> None:
    @instances.command(op, help=help_text)
    @click.argument("workflow")
    @click.argument("job_id")
    def command(workflow: str, job_id: str) -> None:
        _control(op, workflow, job_id)


for _op, _help in _CONTROL_OPERATIONS.items():
    _control_command(_op, _help)


@instances.command("send-event")
@click.argument("workflow")
@click.argument("job_id")
@click.argument("event_type")
@click.argument("payload", required=False, default=None)
def instances_send_event(workflow: str, job_id: str, event_type: str, payload: str | None) -> None:
    """Send an event (PAYLOAD is JSON) to an instance; it wakes if it waits for one."""
    from workflow_engine.store.control import send_event

    try:
        value = orjson.loads(payload) if payload is not None else None
    except orjson.JSONDecodeError as exc:
        raise OnceflowError(f"payload is not valid JSON: {exc}") from None
    event_id = send_event(_db(), workflow, job_id, event_type, value)
    click.echo(f"{job_id}: event {event_type!r} stored (id {event_id})")


@cli.command()
@click.argument("job_id")
@click.option("--json", "as_json", is_flag=True, help="Print JSON lines instead of a table.")
def trace(job_id: str, as_json: bool) -> None:
    """Print one job's whole timeline, from HTTP to its last step."""
    from onceflow_cli.render import render_trace
    from workflow_engine.store.trace import job_trace

    events = job_trace(_db(), job_id)
    if not events:
        raise OnceflowError(f"no job with id {job_id!r} has reached the database")
    if as_json:
        for e in events:
            click.echo(orjson.dumps(e.__dict__, default=str))
    else:
        click.echo(render_trace(job_id, events))


@cli.command()
@click.option("--json", "as_json", is_flag=True, help="Print the report as JSON.")
def audit(as_json: bool) -> None:
    """Check that every accepted job id has exactly one instance or task run."""
    from onceflow_cli.audit import run_audit

    report = run_audit(_settings(), _db())
    if as_json:
        doc = {**report.__dict__, "clean": report.clean}
        click.echo(orjson.dumps(doc, option=orjson.OPT_INDENT_2))
    else:
        click.echo(report.render())
    if not report.clean:
        sys.exit(1)


@cli.group()
def keys() -> None:
    """API keys for the HTTP endpoints."""


@keys.command("new")
@click.option("--name", required=True, help="Who holds the key (shown in logs, never the key).")
@click.option(
    "--scope",
    "scopes",
    multiple=True,
    required=True,
    type=click.Choice(SCOPES),
    help="A scope the key grants (repeat for several).",
)
def keys_new(name: str, scopes: tuple[str, ...]) -> None:
    """Make a key: prints it once, and the entry to add to ONCEFLOW_API_KEYS."""
    from producers.auth import hash_key, new_key

    key = new_key()
    entry = {"name": name, "sha256": hash_key(key), "scopes": list(scopes)}
    click.echo(f"key (give it to the client; it is not stored anywhere): {key}")
    click.echo(f"ONCEFLOW_API_KEYS entry: {orjson.dumps(entry).decode()}")


def _fail(message: str) -> None:
    # One line, whatever the driver's message looked like (the traceback with --debug).
    if _state["debug"]:
        import traceback

        traceback.print_exc()
    click.echo(f"onceflow: {' '.join(message.split())}", err=True)
    sys.exit(1)


def _explain(exc: Exception) -> str:
    """A short, actionable sentence for errors that escape the commands."""
    import sqlalchemy.exc as sa_exc

    if isinstance(exc, sa_exc.ProgrammingError) and "UndefinedTable" in type(exc.orig).__name__:
        return "the database has no onceflow schema: run `onceflow migrate` first"
    if isinstance(exc, sa_exc.OperationalError):
        return f"PostgreSQL unreachable: {exc.orig}"
    if isinstance(exc, sa_exc.SQLAlchemyError):
        return f"database error: {getattr(exc, 'orig', exc)}"
    return f"unexpected {type(exc).__name__}: {exc}"


def main() -> None:
    try:
        _add_plugin_commands(cli)
        cli.main(standalone_mode=False)
    except click.exceptions.Abort:
        click.echo("onceflow: aborted", err=True)
        sys.exit(130)
    except click.ClickException as exc:
        exc.show()
        sys.exit(exc.exit_code)
    except OnceflowError as exc:
        _fail(str(exc))
    except Exception as exc:
        _fail(_explain(exc))
    except KeyboardInterrupt:
        sys.exit(130)


if __name__ == "__main__":
    main()
