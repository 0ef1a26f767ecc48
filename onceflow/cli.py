"""The ``onceflow`` command line.

Every flag has an environment-variable twin (shown in ``--help``); settings that have
no flag come from ``ONCEFLOW_*`` variables (see the README's configuration table).
Any failure becomes one line on stderr and a non-zero exit status.
"""

from __future__ import annotations

import os
import sys
from pathlib import Path
from typing import Any

import click
import orjson

from onceflow.errors import OnceflowError
from onceflow.settings import SCOPES, Settings, get_settings

# `onceflow bench` scenarios (onceflow.bench.SCENARIOS; kept here so the CLI starts
# without importing the harness — a unit test keeps the two equal).
BENCH_SCENARIOS = (
    "burst",
    "burst-paced",
    "ingest",
    "queue",
    "engine",
    "e2e",
    "nobuffer",
    "nobuffer-outage",
    "dbos",
    "scale",
)


def _settings() -> Settings:
    return get_settings()


def _apply_overrides(**overrides: Any) -> None:
    """Turn CLI flags into the environment variables the settings read."""
    for name, value in overrides.items():
        if value is not None:
            os.environ[f"ONCEFLOW_{name.upper()}"] = str(value)
    get_settings.cache_clear()


def _dev_services():
    from onceflow.dev import DevServices

    return DevServices(_settings().state_dir)


@click.group(context_settings={"help_option_names": ["-h", "--help"], "show_default": True})
@click.version_option(package_name="onceflow")
def cli() -> None:
    """onceflow: HTTP bursts into durable workflows, one per job id."""


# --- dev services -------------------------------------------------------------------


@cli.group()
def dev() -> None:
    """Local Kafka and PostgreSQL on loopback (no Docker needed)."""


@dev.command("up")
def dev_up() -> None:
    """Install what is missing, start Kafka and PostgreSQL, wait until both are ready."""
    services = _dev_services()
    services.up()
    for name, state in services.status().items():
        click.echo(f"{name}: {state}")


@dev.command("down")
def dev_down() -> None:
    """Stop Kafka and PostgreSQL (data is kept under the state directory)."""
    _dev_services().down()
    click.echo("stopped")


@dev.command("status")
def dev_status() -> None:
    """Show whether each service answers."""
    for name, state in _dev_services().status().items():
        click.echo(f"{name}: {state}")


@dev.command("env")
def dev_env() -> None:
    """Print the service addresses as shell exports."""
    for key, value in _dev_services().env().items():
        click.echo(f"export {key}={value}")


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
def migrate(grant_to: str | None) -> None:
    """Apply pending database migrations (safe to run from several processes)."""
    from workflow_engine.db import check_connection, make_engine
    from workflow_engine.schema import grant_app_role
    from workflow_engine.schema import migrate as run_migrations

    engine = make_engine(_settings().database_url, pool_size=1)
    check_connection(engine)
    applied = run_migrations(engine)
    click.echo(f"applied {len(applied)} migration(s)" if applied else "schema is up to date")
    if grant_to:
        tables = grant_app_role(engine, grant_to)
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
    _apply_overrides(ingest_host=host, ingest_port=port)
    from producers.server import serve

    serve(_settings())


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
    _apply_overrides(streams_concurrency=concurrency)
    from streams.worker import run_worker

    run_worker(_settings())


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
    _apply_overrides(engine_concurrency=concurrency)
    from workflow_engine.runner import run_engine

    run_engine(_settings())


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
    from onceflow.describe import render_instance
    from workflow_engine.instances import describe_instance

    view = describe_instance(_db(), job_id)
    if view is None or view.workflow != workflow:
        raise OnceflowError(f"no instance of {workflow!r} with job id {job_id!r}")
    if as_json:
        click.echo(orjson.dumps(view.to_dict(), option=orjson.OPT_INDENT_2, default=str))
    else:
        click.echo(render_instance(view))


def _db():
    from workflow_engine.db import make_engine

    return make_engine(_settings().database_url, pool_size=1)


@instances.command("list")
@click.option("--workflow", default=None, help="Only this workflow.")
@click.option(
    "--status",
    default=None,
    type=click.Choice(
        ["queued", "running", "sleeping", "waiting", "paused", "complete", "errored", "terminated"]
    ),
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

    from workflow_engine.control import list_instances

    since = created_since.replace(tzinfo=UTC) if created_since else None
    rows = list_instances(_db(), workflow, status, since, id_prefix, limit)
    for row in rows:
        if as_json:
            click.echo(orjson.dumps(row.__dict__, default=str))
        else:
            click.echo(
                f"{row.job_id}\t{row.workflow}\t{row.status}\t{row.created_at:%Y-%m-%d %H:%M:%S}"
            )


def _control(op: str, workflow: str, job_id: str) -> None:
    from workflow_engine import control

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
    from workflow_engine.control import send_event

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
    from onceflow.trace import job_trace, render_trace

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
    from onceflow.audit import run_audit

    report = run_audit(_settings(), _db())
    if as_json:
        doc = {**report.__dict__, "clean": report.clean}
        click.echo(orjson.dumps(doc, option=orjson.OPT_INDENT_2))
    else:
        click.echo(report.render())
    if not report.clean:
        sys.exit(1)


@cli.command()
@click.option(
    "--write",
    "path",
    type=click.Path(path_type=Path),
    default=None,
    help="Write the dashboard JSON to this file instead of stdout.",
)
def dashboard(path: Path | None) -> None:
    """Print the Grafana dashboard JSON (deploy/grafana/onceflow-dashboard.json)."""
    from onceflow.dashboard import build

    text = orjson.dumps(build(), option=orjson.OPT_INDENT_2).decode() + "\n"
    if path is None:
        click.echo(text, nl=False)
    else:
        path.write_text(text)


@cli.command()
@click.option(
    "--seed",
    envvar="ONCEFLOW_CHAOS_SEED",
    type=int,
    default=None,
    help="Seed of the workload and fault schedule (printed; rerun a failing one).",
)
@click.option(
    "--size",
    envvar="ONCEFLOW_CHAOS_SIZE",
    type=click.Choice(["ci", "large"]),
    default="ci",
    help="ci: 600 jobs; large: 5000 jobs.",
)
@click.option(
    "--jobs",
    "n_jobs",
    envvar="ONCEFLOW_CHAOS_JOBS",
    type=int,
    default=None,
    help="Number of jobs (overrides --size).",
)
@click.option(
    "--runs",
    envvar="ONCEFLOW_CHAOS_RUNS",
    type=int,
    default=1,
    help="Consecutive runs with seeds seed, seed+1, ...",
)
def chaos(seed: int | None, size: str, n_jobs: int | None, runs: int) -> None:
    """Inject faults while jobs flow; check nothing is lost or doubled."""
    import random

    from onceflow.chaos import SIZES, run_chaos
    from onceflow.dev import local_dev_services

    settings = _settings()
    first = seed if seed is not None else random.randrange(1 << 20)
    failed = 0
    for s in range(first, first + runs):
        log_dir = (settings.state_dir / "runs" / f"chaos-{s}").resolve()
        result = run_chaos(
            settings, s, n_jobs or SIZES[size], log_dir, dev=local_dev_services(settings)
        )
        click.echo(result.render())
        failed += bool(result.violations)
    if failed:
        raise OnceflowError(f"{failed} of {runs} chaos run(s) found violations")


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


@cli.command()
@click.argument(
    "scenarios",
    nargs=-1,
    type=click.Choice(BENCH_SCENARIOS),
)
@click.option(
    "--jobs",
    "n_jobs",
    envvar="ONCEFLOW_BENCH_JOBS",
    type=int,
    default=20000,
    help="Jobs per scenario (BENCHMARKS.md says which sizes its figures used).",
)
@click.option(
    "--out",
    envvar="ONCEFLOW_BENCH_OUT",
    type=click.Path(path_type=Path),
    default=Path("bench-results.json"),
    help="Where to write the JSON results.",
)
@click.option(
    "--plots",
    type=click.Path(path_type=Path, file_okay=False),
    default=None,
    help="Also draw PNG plots of the results into this directory (needs matplotlib).",
)
def bench(scenarios: tuple[str, ...], n_jobs: int, out: Path, plots: Path | None) -> None:
    """Measure the real processes (burst, ingest, queue-to-instance, engine, end-to-end
    latency) and the baselines side by side (nobuffer, dbos); all of them by default."""
    from onceflow.bench import SCENARIOS, run_bench

    results = run_bench(_settings(), list(scenarios) or list(SCENARIOS), n_jobs, out)
    if plots is not None:
        from onceflow.benchplots import plot

        for path in plot(results, plots):
            click.echo(f"wrote {path}")


# --- demo ---------------------------------------------------------------------------------


@cli.command()
@click.option(
    "--jobs",
    "n_jobs",
    envvar="ONCEFLOW_DEMO_JOBS",
    type=int,
    default=100,
    help="Distinct jobs to submit.",
)
@click.option(
    "--clients",
    envvar="ONCEFLOW_DEMO_CLIENTS",
    type=int,
    default=4,
    help="Concurrent clients resubmitting a random subset.",
)
@click.option(
    "--seed",
    envvar="ONCEFLOW_DEMO_SEED",
    type=int,
    default=None,
    help="Random seed (printed, so a run can be replayed).",
)
@click.option(
    "--timeout",
    envvar="ONCEFLOW_DEMO_TIMEOUT",
    type=float,
    default=180.0,
    help="Seconds to wait for all work to finish.",
)
@click.option(
    "--json-out",
    envvar="ONCEFLOW_DEMO_JSON_OUT",
    type=click.Path(path_type=Path),
    default=None,
    help="Also write the proof as JSON to this file.",
)
def demo(
    n_jobs: int, clients: int, seed: int | None, timeout: float, json_out: Path | None
) -> None:
    """Run the whole pipeline on real services and print a re-checkable proof."""
    from onceflow.demo import run_demo

    ok = run_demo(
        _settings(), n_jobs=n_jobs, clients=clients, seed=seed, timeout=timeout, json_out=json_out
    )
    sys.exit(0 if ok else 1)


def _fail(message: str) -> None:
    # One line, whatever the driver's message looked like.
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
