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
from typing import TYPE_CHECKING, Any

import click
import orjson

from onceflow.errors import OnceflowError
from onceflow.settings import SCOPES, Settings, get_settings
from onceflow.vocabulary import DeadLetterReason, InstanceStatus
from onceflow_cli.database import connect
from onceflow_cli.events import events
from onceflow_cli.operator_log import audit_actions
from onceflow_cli.schedules import schedules

if TYPE_CHECKING:
    from collections.abc import Callable, Iterator

    from onceflow.redrive import DeadLetterRecord
    from workflow_engine.store.views import InstanceFilter, InstanceRow


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
    from workflow_engine.store import (
        PRODUCT,
        check_connection,
        grant_app_role,
        make_engine,
        migration_set_of,
    )
    from workflow_engine.store import migrate as run_migrations

    sets = (PRODUCT, *(migration_set_of(module) for module in with_modules))
    db = make_engine(_settings().database_url, pool_size=1)
    check_connection(db)
    for migration_set in sets:
        applied = run_migrations(db, migration_set)
        click.echo(
            f"{migration_set.name}: applied {len(applied)} migration(s)"
            if applied
            else f"{migration_set.name}: schema is up to date"
        )
    if grant_to:
        tables = grant_app_role(db, grant_to, sets)
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


@cli.command()
def relay() -> None:
    """Run the outbox relay alone: lifecycle events to the events topic (one active
    across processes; run it with ONCEFLOW_EVENTS_RELAY=false in the engines)."""
    from workflow_engine.engine.configs import relay_config
    from workflow_engine.engine.relay import run_relay

    settings = _settings()
    run_relay(settings, relay_config(settings))


@cli.command()
@click.option("--host", envvar="ONCEFLOW_CONSOLE_HOST", default=None, help="Listen address.")
@click.option("--port", envvar="ONCEFLOW_CONSOLE_PORT", type=int, default=None, help="HTTP port.")
def console(host: str | None, port: int | None) -> None:
    """Run the operator's web console (overview, instances, actions, dead letters)."""
    from console.server import serve

    serve(_with_overrides(console_host=host, console_port=port))


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
    from onceflow_cli.schedules import render_tick
    from workflow_engine.store.views import describe_instance

    db = _db()
    view = describe_instance(db, job_id)
    if view is None or view.workflow != workflow:
        # Say what the id *is* (another workflow's instance, a task run, a dead letter)
        # rather than "no instance": a wrong guess at the type is the usual mistake.
        raise OnceflowError(describe_elsewhere(db, workflow, job_id, view))
    tick_line, tick = render_tick(db, job_id)  # which schedule and tick, if one
    if as_json:
        doc = {**view.to_dict(), "schedule_tick": tick}
        click.echo(orjson.dumps(doc, option=orjson.OPT_INDENT_2, default=str))
    else:
        click.echo(render_instance(view) + (f"\n{tick_line}" if tick_line else ""))


def _db():
    return connect(_settings())


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
@click.option(
    "--version", "version", default=None, help="Only instances created with this version."
)
@click.option(
    "--attr",
    "attrs",
    multiple=True,
    metavar="KEY=VALUE",
    help="Only instances whose searchable attribute KEY is VALUE (repeatable: all must"
    " match; 2 or true also match the number or boolean). With --filter too.",
)
@click.option("--limit", default=100, show_default=True, type=click.IntRange(1, 10000))
@click.option("--json", "as_json", is_flag=True, help="Print JSON lines instead of a table.")
@click.option(
    "--filter",
    "filter_text",
    default=None,
    help="An instance filter instead of the options above, e.g."
    " 'workflow=order-workflow,status=errored,created_before=2026-11-30T10:00:00Z,prefix=ord_'"
    " (keys: workflow, status, created_from, created_to, job_id, prefix, has_duplicates,"
    " payload_mismatch, error_contains, version, scheduled, reused, attr.<key>).",
)
@click.option(
    "--sort", default="created", type=click.Choice(["created", "updated"]), help="Newest first by."
)
def instances_list(
    workflow, status, created_since, id_prefix, version, attrs, limit, as_json, filter_text, sort
) -> None:
    """List instances, newest first (with the version each was created with)."""
    from datetime import UTC

    from workflow_engine.store.views import InstanceFilter

    if filter_text is not None:
        if any(v is not None for v in (workflow, status, created_since, id_prefix, version)):
            raise OnceflowError("give either --filter or --workflow/--status/--since/--prefix")
        f = InstanceFilter.parse(filter_text)
        keys, line = _FILTERED
    else:
        f = InstanceFilter(
            workflow=workflow,
            status=InstanceStatus(status) if status else None,
            created_from=created_since.replace(tzinfo=UTC) if created_since else None,
            job_id_prefix=id_prefix,
            version=version,
        )
        keys, line = _BRIEF
    if attrs:
        f = f.with_attributes(list(attrs))
    for row in _listed(f, sort, limit):
        if as_json:
            click.echo(orjson.dumps({k: getattr(row, k) for k in keys}, default=str))
        else:
            click.echo(line(row))


# What each form of ``instances list`` prints of a row: its JSON keys and its table line.
_BRIEF: tuple[tuple[str, ...], Callable[[InstanceRow], str]] = (
    ("job_id", "workflow", "status", "created_at", "finished_at", "version", "attributes", "run"),
    lambda row: (
        f"{row.job_id}\t{row.workflow}\t{_status(row)}\t{row.created_at:%Y-%m-%d %H:%M:%S}"
        f"\t{row.version or '-'}"
    ),
)
_FILTERED: tuple[tuple[str, ...], Callable[[InstanceRow], str]] = (
    (
        "job_id",
        "workflow",
        "status",
        "created_at",
        "updated_at",
        "duplicates",
        "mismatches",
        "error",
        "attributes",
        "run",
    ),
    lambda row: (
        f"{row.job_id}\t{row.workflow}\t{_status(row)}"
        f"\t{row.created_at:%Y-%m-%d %H:%M:%S}\t{row.duplicates} dup"
        f"\t{row.mismatches} mismatch\t{row.error or '-'}"
    ),
)


def _status(row: InstanceRow) -> str:
    """A listed instance's status, with its run once an id reuse started a second."""
    return str(row.status) if row.run == 1 else f"{row.status} (run {row.run})"


def _control(op: str, workflow: str, job_id: str) -> None:
    from onceflow_cli.operator_log import cli_actor
    from workflow_engine.store import operations

    result = getattr(operations, op)(_db(), workflow, job_id, actor=cli_actor())
    click.echo(result.describe())


_CONTROL_OPERATIONS = {
    "pause": "Pause an instance (a running one pauses at its next step).",
    "resume": "Resume a paused instance.",
    "terminate": "Stop an instance for good (a running one stops at its next step).",
    "restart": "Run an instance again from its first step, forgetting its history.",
    "retry": (
        "Run an errored (or terminated) instance again from its failed step: completed"
        " steps keep their checkpoints, the failed step gets a fresh retry budget."
    ),
}


def _listed(f: InstanceFilter, sort: str, limit: int) -> Iterator[InstanceRow]:
    """Up to ``limit`` rows of the one list API (``views.list_page``), page after page."""
    from workflow_engine.store.views import list_page

    db, cursor, shown = _db(), None, 0
    while shown < limit:
        page = list_page(db, f, sort, cursor, min(500, limit - shown))  # type: ignore[arg-type]
        yield from page.rows
        shown += len(page.rows)
        cursor = page.next_cursor
        if cursor is None:
            break


def _bulk(op: str, filter_text: str, dry_run: bool, yes: bool, batch: int) -> None:
    """``instances <op> --filter …``: count, confirm, then apply in batches with a
    progress line per batch."""
    from onceflow.vocabulary import BulkAction
    from onceflow_cli.operator_log import cli_actor
    from workflow_engine.store import operations
    from workflow_engine.store.views import InstanceFilter, count_matching

    f = operations.refuse_empty(InstanceFilter.parse(filter_text))
    db = _db()
    n = count_matching(db, f)
    what = f"{op} {n} instance(s) matching {f.describe()!r}"
    if dry_run:
        click.echo(f"dry run: would {what}")
        return
    if n == 0:
        click.echo(f"nothing to {op}: no instance matches {f.describe()!r}")
        return
    if not yes:
        click.confirm(f"{what.capitalize()}?", abort=True, err=True)
    started = operations.start_bulk(db, BulkAction(op), f, actor=cli_actor())
    click.echo(f"bulk {op} #{started.id} started on {started.total} instance(s)")

    def progress(o: operations.BulkOperation) -> None:
        click.echo(f"  {o.done + o.skipped}/{o.total} ({o.done} done, {o.skipped} skipped)")

    try:
        finished = operations.run_bulk(db, started.id, batch=batch, on_progress=progress)
    except KeyboardInterrupt:
        raise OnceflowError(
            f"interrupted: bulk {op} #{started.id} stays running; a console or admin-API"
            " process resumes it after its last committed batch"
        ) from None
    click.echo(finished.describe())


def _control_command(op: str, help_text: str) -> None:
    @instances.command(
        op,
        help=help_text + " With --filter instead of WORKFLOW JOB_ID: every instance it matches.",
    )
    @click.argument("workflow", required=False)
    @click.argument("job_id", required=False)
    @click.option(
        "--filter",
        "filter_text",
        default=None,
        help="Act on every instance this filter matches (see `instances list --filter`).",
    )
    @click.option("--dry-run", is_flag=True, help="With --filter: only count the instances.")
    @click.option("--yes", is_flag=True, help="With --filter: do not ask for confirmation.")
    @click.option(
        "--batch",
        default=500,
        envvar="ONCEFLOW_BULK_BATCH",
        type=click.IntRange(1, 10000),
        help="With --filter: instances per transaction.",
    )
    def command(
        workflow: str | None,
        job_id: str | None,
        filter_text: str | None,
        dry_run: bool,
        yes: bool,
        batch: int,
    ) -> None:
        if filter_text is not None:
            if workflow or job_id:
                raise OnceflowError("give either WORKFLOW JOB_ID or --filter, not both")
            _bulk(op, filter_text, dry_run, yes, batch)
            return
        if not (workflow and job_id):
            raise OnceflowError(f"{op} needs WORKFLOW JOB_ID, or --filter")
        if dry_run:
            raise OnceflowError("--dry-run goes with --filter")
        _control(op, workflow, job_id)


for _op, _help in _CONTROL_OPERATIONS.items():
    _control_command(_op, _help)


@instances.command("fork")
@click.argument("workflow")
@click.argument("job_id")
@click.option("--from-step", default=None, help="Fork from this step (it runs in the fork).")
@click.option(
    "--from-position", default=None, type=click.IntRange(0), help="Or from this history position."
)
@click.option(
    "--number",
    default=1,
    type=click.IntRange(1),
    help="The fork's id is JOB_ID~fork<NUMBER> (the same fork twice collides).",
)
@click.option("--new-job-id", default=None, help="Name the fork's job id instead.")
@click.option(
    "--params", "params_text", default=None, help="New params (a JSON object) from that step on."
)
def instances_fork(
    workflow: str,
    job_id: str,
    from_step: str | None,
    from_position: int | None,
    number: int,
    new_job_id: str | None,
    params_text: str | None,
) -> None:
    """Fork an instance into a new job id: its history before the step is copied (those
    steps do not run again), the step and everything after it run in the fork."""
    from onceflow_cli.inputs import exact_json
    from onceflow_cli.operator_log import cli_actor
    from workflow_engine.store.operations import fork

    params = None
    if params_text is not None:
        params = exact_json(params_text.encode(), "--params")
    made = fork(
        _db(),
        workflow,
        job_id,
        from_step=from_step,
        from_position=from_position,
        number=number,
        new_job_id=new_job_id,
        params=params,
        actor=cli_actor(),
    )
    click.echo(made.describe())


@instances.command("send-event")
@click.argument("workflow")
@click.argument("job_id")
@click.argument("event_type")
@click.argument("payload", required=False, default=None)
def instances_send_event(workflow: str, job_id: str, event_type: str, payload: str | None) -> None:
    """Send an event (PAYLOAD is JSON) to an instance; it wakes if it waits for one."""
    from onceflow_cli.inputs import exact_json
    from onceflow_cli.operator_log import cli_actor
    from workflow_engine.store.operations import send_event

    value = None
    if payload is not None:
        try:
            orjson.loads(payload)
        except orjson.JSONDecodeError as exc:
            raise OnceflowError(f"payload is not valid JSON: {exc}") from None
        # valid JSON: now under the exact rule (numbers as written, each key once)
        value = exact_json(b'{"payload": ' + payload.encode() + b"}", "payload")["payload"]
    event_id = send_event(_db(), workflow, job_id, event_type, value, actor=cli_actor())
    click.echo(f"{job_id}: event {event_type!r} stored (id {event_id})")


# --- dead letters ---------------------------------------------------------------------------


@cli.group("dead-letters")
def dead_letters() -> None:
    """Read the dead-letter topic and send letters back to the jobs topic."""


_REASONS = click.Choice([r.value for r in DeadLetterReason])


@dead_letters.command("list")
@click.option("--reason", type=_REASONS, default=None, help="Only letters of this reason.")
@click.option("--limit", default=100, type=click.IntRange(1, 100000), help="At most this many.")
@click.option("--after", default=None, help="Start after this position (PARTITION@OFFSET).")
@click.option("--json", "as_json", is_flag=True, help="Print JSON lines instead of a table.")
def dead_letters_list(reason: str | None, limit: int, after: str | None, as_json: bool) -> None:
    """List dead letters, oldest first (partition by partition)."""
    from onceflow.redrive import parse_position, read_dead_letters

    start = parse_position(after) if after else None
    for letter in read_dead_letters(_settings(), limit, reason, start):
        if as_json:
            click.echo(
                orjson.dumps(
                    {
                        "position": letter.position,
                        "key": _text(letter.key),
                        "reason": letter.reason,
                        "detail": letter.detail,
                        "source": letter.source,
                        "truncated": letter.truncated,
                        "timestamp_ms": letter.timestamp_ms,
                        "size": len(letter.value or b""),
                    }
                )
            )
        else:
            cut = " (truncated)" if letter.truncated else ""
            click.echo(
                f"{letter.position}\t{_text(letter.key) or '-'}\t{letter.reason}"
                f"\t{letter.source}\t{letter.detail[:120]}{cut}"
            )


def _text(raw: bytes | None) -> str:
    return raw.decode(errors="replace") if raw is not None else ""


@dead_letters.command("redrive")
@click.option("--all", "everything", is_flag=True, help="Every letter in the topic.")
@click.option("--reason", type=_REASONS, default=None, help="Every letter of this reason.")
@click.option(
    "--offset",
    "positions",
    multiple=True,
    help="The letter at PARTITION@OFFSET of the dead-letter topic (repeatable).",
)
@click.option("--dry-run", is_flag=True, help="Only say what would be done with each letter.")
def dead_letters_redrive(
    everything: bool, reason: str | None, positions: tuple[str, ...], dry_run: bool
) -> None:
    """Send dead letters back, saying what each one does: a dead-lettered task runs
    again (its next attempt), a job id the database does not know is delivered again,
    one that already has an instance or a succeeded task is skipped (it would only
    collapse as a duplicate), a truncated letter is refused."""
    from onceflow.redrive import parse_position, read_dead_letters
    from onceflow_cli.operator_log import cli_actor
    from workflow_engine.store.operations import Verdict, redrive_letters

    if sum((everything, reason is not None, bool(positions))) != 1:
        raise OnceflowError("give exactly one of --all, --reason R or --offset P@O")
    settings = _settings()
    if positions:
        letters = []
        for text in positions:
            p, o = parse_position(text)
            found = read_dead_letters(settings, 1, None, (p, o - 1))
            if not found or (found[0].dlq_partition, found[0].dlq_offset) != (p, o):
                raise OnceflowError(f"no dead letter at {text}")
            letters.append(found[0])
    else:
        letters = _all_letters(settings, reason)
    report = redrive_letters(settings, _db(), letters, dry_run=dry_run, actor=cli_actor())
    for outcome in report.outcomes:
        click.echo(outcome.line(), err=outcome.verdict == Verdict.FAILED)
    click.echo(report.summary())
    failed = report.count(Verdict.FAILED)
    if failed:
        raise OnceflowError(f"{failed} letter(s) not acknowledged by Kafka; run it again")


def _all_letters(settings: Settings, reason: str | None) -> list[DeadLetterRecord]:
    from onceflow.redrive import read_dead_letters

    letters: list[DeadLetterRecord] = []
    after = None
    while True:
        page = read_dead_letters(settings, 1000, reason, after)
        letters += page
        if len(page) < 1000:
            return letters
        after = (page[-1].dlq_partition, page[-1].dlq_offset)


@cli.command("workflows")
def workflows_command() -> None:
    """Which workflow versions the live engines run, and the instances whose version
    none of them has: runnable ones (due: they wait for an engine with it) and those
    that sleep or wait (they will need one)."""
    from workflow_engine.store.views import (
        ENGINE_STALE_SECONDS,
        instances_without_engine,
        live_engines,
    )

    db = _db()
    engines = live_engines(db, ENGINE_STALE_SECONDS)
    click.echo(f"live engines: {len(engines)}")
    for e in engines:
        versions = ", ".join(f"{w}@{v}" for w, v in sorted(e.workflows.items()))
        click.echo(f"  {e.engine_id}\t{versions}")
    for s in instances_without_engine(db, ENGINE_STALE_SECONDS):
        version = s.version or "(none)"
        if s.count:
            click.echo(
                f"{s.count} runnable instances of {s.workflow} version {version}:"
                " waiting for an engine with that version"
            )
        if s.later:
            click.echo(
                f"{s.later} instances of {s.workflow} version {version} sleeping or waiting"
                " (not due yet) will need an engine with that version"
            )


@cli.command()
@click.argument("job_id")
@click.option("--json", "as_json", is_flag=True, help="Print JSON lines instead of a table.")
def trace(job_id: str, as_json: bool) -> None:
    """Print one job's whole timeline, from HTTP to its last step."""
    from onceflow_cli.render import render_trace
    from workflow_engine.store.views import job_trace

    events = job_trace(_db(), job_id)
    if not events:
        raise OnceflowError(f"no job with id {job_id!r} has reached the database")
    if as_json:
        for e in events:
            click.echo(orjson.dumps(e.__dict__, default=str))
    else:
        click.echo(render_trace(job_id, events))


@cli.group(invoke_without_command=True)
@click.option("--json", "as_json", is_flag=True, help="Print the report as JSON.")
@click.pass_context
def audit(ctx: click.Context, as_json: bool) -> None:
    """Check that every accepted job id has exactly one instance or task run
    (`onceflow audit`); `onceflow audit actions` lists the operators' audit trail."""
    if ctx.invoked_subcommand is not None:
        return
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


@cli.group()
def webhooks() -> None:
    """Signed webhooks on lifecycle events (README, "Webhooks")."""


@webhooks.command("run")
def webhooks_run() -> None:
    """Run the webhook dispatcher as its own process (engines then with
    ONCEFLOW_ENGINE_WEBHOOKS=false)."""
    from workflow_engine.engine.webhook_process import run_webhooks

    run_webhooks(_settings())


@webhooks.command("redrive")
@click.option(
    "--endpoint",
    envvar="ONCEFLOW_REDRIVE_ENDPOINT",
    default=None,
    help="Only this endpoint's dead deliveries.",
)
@click.option(
    "--job",
    "job_id",
    envvar="ONCEFLOW_REDRIVE_JOB",
    default=None,
    help="Only this job id's dead deliveries.",
)
@click.option("--all", "everything", is_flag=True, help="Every dead delivery.")
def webhooks_redrive(endpoint: str | None, job_id: str | None, everything: bool) -> None:
    """Re-queue dead deliveries: due now, with a new retry window; their attempts kept."""
    from onceflow_cli.operator_log import cli_actor
    from workflow_engine.store.operations import redrive_webhooks

    settings = _settings()
    if endpoint is not None and endpoint not in settings.webhook_endpoints:
        raise OnceflowError(
            f"no webhook endpoint named {endpoint!r} is configured (ONCEFLOW_WEBHOOK_ENDPOINTS)"
        )
    done = redrive_webhooks(
        _db(),
        settings.webhook_retry_seconds,
        endpoint=endpoint,
        job_id=job_id,
        everything=everything,
        actor=cli_actor(),
    )
    click.echo(f"re-queued {done.requeued} dead deliveries ({len(done.job_ids)} jobs)")


@webhooks.command("secret")
def webhooks_secret() -> None:
    """Print a new endpoint secret (whsec_ and 32 random bytes, base64)."""
    import base64
    import secrets

    click.echo("whsec_" + base64.b64encode(secrets.token_bytes(32)).decode())


cli.add_command(schedules)  # onceflow_cli/schedules.py
cli.add_command(events)  # onceflow_cli/events.py
audit.add_command(audit_actions)  # onceflow_cli/operator_log.py


def _fail(message: str) -> None:
    # One line, whatever the driver's message looked like (the traceback with --debug).
    if _state["debug"]:
        import traceback

        traceback.print_exc()
    click.echo(f"onceflow: {' '.join(message.split())}", err=True)
    sys.exit(1)


def _explain(exc: Exception) -> str:
    """A short, actionable sentence for errors that escape the commands; a database
    error by its SQLSTATE (``store.db.classify``), never by its exception class: a
    value too large for an index is an ``OperationalError`` too, and is no outage."""
    from workflow_engine.store import ErrorClass, classify, refusal, sqlstate

    if sqlstate(exc) == "42P01":  # undefined_table
        return "the database has no onceflow schema: run `onceflow migrate` first"
    kind = classify(exc)
    if kind == ErrorClass.TRANSIENT:
        first = str(getattr(exc, "orig", exc)).strip().splitlines()[:1]
        return f"PostgreSQL unreachable or not accepting writes: {' '.join(first)}"
    if kind is not None:
        return f"the database refused it: {refusal(exc)}"
    return f"unexpected {type(exc).__name__}: {exc}"


def _quiet_operator_log() -> None:
    """The CLI prints what it did (or one line of why not); the store's log line of an
    operator action would be printed beside it on stderr by Python's last-resort
    handler. Its row in the audit trail is the CLI's record (`onceflow audit actions`)."""
    import logging

    logging.getLogger("workflow_engine.store.operator_audit").addHandler(logging.NullHandler())


def main() -> None:
    _quiet_operator_log()
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
