"""The tools' commands, joined to the ``onceflow`` CLI through the
``onceflow.commands`` entry point group (see ``tools/pyproject.toml``): ``dev``,
``demo``, ``bench``, ``chaos``, ``dashboard``. The runtime never imports this package.
"""

from __future__ import annotations

import sys
from pathlib import Path

import click
import orjson

from onceflow.errors import OnceflowError
from onceflow.settings import Settings
from onceflow_cli.main import settings_from_env as _settings

# `onceflow bench` scenarios (onceflow_tools.bench.SCENARIOS; kept here so the CLI starts
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
    "console-list",
    "engine-flow-control",
    "engine-policies",
    "history",
    "claim",
    "soak",
)


def _dev_services(brokers: int = 1, postgres_ha: bool = False):
    from onceflow_tools.dev import DevServices

    return DevServices(_settings().state_dir, brokers=brokers, postgres_ha=postgres_ha)


# `--brokers N` (N > 1): Kafka is a KRaft cluster of N nodes on 29092, 29094, … instead of
# the single broker on 19092 (onceflow_tools.dev.cluster); both may run side by side.
_brokers_option = click.option(
    "--brokers",
    envvar="ONCEFLOW_DEV_BROKERS",
    type=click.IntRange(1, 9),
    default=1,
    show_default=True,
    help="Kafka brokers: 1 is the single dev broker, more a local KRaft cluster.",
)


# `--postgres-ha`: PostgreSQL is a pg_auto_failover formation (monitor 25440, primary and
# synchronous standby 25441/25442; onceflow_tools.dev.postgres_ha) instead of the single
# server on 15432; both may run side by side.
_postgres_ha_option = click.option(
    "--postgres-ha",
    envvar="ONCEFLOW_DEV_POSTGRES_HA",
    is_flag=True,
    help="PostgreSQL as a primary, a synchronous standby and a pg_auto_failover monitor.",
)


@click.group()
def dev() -> None:
    """Local Kafka and PostgreSQL on loopback (no Docker needed)."""


@dev.command("up")
@_brokers_option
@_postgres_ha_option
def dev_up(brokers: int, postgres_ha: bool) -> None:
    """Install what is missing, start Kafka and PostgreSQL, wait until both are ready."""
    services = _dev_services(brokers, postgres_ha)
    services.up()
    for name, state in services.status().items():
        click.echo(f"{name}: {state}")


@dev.command("down")
@_postgres_ha_option
def dev_down(postgres_ha: bool) -> None:
    """Stop Kafka (the broker and any cluster) and PostgreSQL (data is kept under the
    state directory); --postgres-ha stops the HA formation alone."""
    _dev_services(postgres_ha=postgres_ha).down()
    click.echo("stopped")


@dev.command("status")
@_brokers_option
@_postgres_ha_option
def dev_status(brokers: int, postgres_ha: bool) -> None:
    """Show whether each service answers (a cluster too, once one was started)."""
    for name, state in _dev_services(brokers, postgres_ha).status().items():
        click.echo(f"{name}: {state}")


@dev.command("env")
@_brokers_option
@_postgres_ha_option
def dev_env(brokers: int, postgres_ha: bool) -> None:
    """Print the service addresses as shell exports (--brokers N: the cluster's;
    --postgres-ha: the multi-host URL of the HA formation)."""
    for key, value in _dev_services(brokers, postgres_ha).env().items():
        click.echo(f"export {key}='{value}'")


@dev.command("schema-snapshot")
def dev_schema_snapshot() -> None:
    """Rewrite workflow_engine/store/schema.sql: the product migrations applied to a
    scratch database on DATABASE_URL's server, dumped by its own pg_dump."""
    from onceflow_tools.schema_snapshot import SNAPSHOT, write_snapshot

    changed = write_snapshot(_settings().database_url)
    click.echo(f"{'wrote' if changed else 'unchanged'} {SNAPSHOT}")


@click.command()
@click.option(
    "--write",
    "path",
    type=click.Path(path_type=Path),
    default=None,
    help="Write the dashboard JSON to this file instead of stdout.",
)
def dashboard(path: Path | None) -> None:
    """Print the Grafana dashboard JSON (deploy/grafana/onceflow-dashboard.json)."""
    from onceflow_tools.dashboard import build

    text = orjson.dumps(build(), option=orjson.OPT_INDENT_2).decode() + "\n"
    if path is None:
        click.echo(text, nl=False)
    else:
        path.write_text(text)


@click.command()
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
@click.option(
    "--postgres-ha",
    envvar="ONCEFLOW_CHAOS_POSTGRES_HA",
    is_flag=True,
    help="Fail over PostgreSQL (SIGKILL the primary of `dev up --postgres-ha`) instead of"
    " restarting it; DATABASE_URL from `onceflow dev env --postgres-ha`.",
)
@click.option(
    "--interleavings",
    envvar="ONCEFLOW_CHAOS_INTERLEAVINGS",
    is_flag=True,
    help="Instead: the randomized interleaving search (a Hypothesis state machine on an"
    " in-process engine and PostgreSQL; needs only DATABASE_URL).",
)
@click.option(
    "--examples",
    envvar="ONCEFLOW_CHAOS_EXAMPLES",
    type=int,
    default=100,
    help="With --interleavings: sequences per run.",
)
@click.option(
    "--steps",
    envvar="ONCEFLOW_CHAOS_STEPS",
    type=int,
    default=30,
    help="With --interleavings: steps per sequence, at most.",
)
def chaos(
    seed: int | None,
    size: str,
    n_jobs: int | None,
    runs: int,
    postgres_ha: bool,
    interleavings: bool,
    examples: int,
    steps: int,
) -> None:
    """Inject faults while jobs flow; check nothing is lost or doubled."""
    import random

    settings = _settings()
    first = seed if seed is not None else random.randrange(1 << 20)
    if interleavings:
        _chaos_interleavings(settings, first, runs, examples, steps)
        return

    from onceflow_tools.chaos import SIZES, run_chaos
    from onceflow_tools.dev import local_dev_services

    dev = local_dev_services(settings)
    if postgres_ha and (dev is None or not dev.postgres_ha):
        raise OnceflowError(
            "--postgres-ha needs the HA formation: onceflow dev up --postgres-ha, then"
            ' eval "$(onceflow dev env --postgres-ha)"'
        )
    failed = 0
    for s in range(first, first + runs):
        log_dir = (settings.state_dir / "runs" / f"chaos-{s}").resolve()
        result = run_chaos(
            settings, s, n_jobs or SIZES[size], log_dir, dev=dev, postgres_ha=postgres_ha
        )
        click.echo(result.render())
        failed += bool(result.violations)
    if failed:
        raise OnceflowError(f"{failed} of {runs} chaos run(s) found violations")


def _chaos_interleavings(
    settings: Settings, first: int, runs: int, examples: int, steps: int
) -> None:
    from onceflow_tools.interleavings.machine import run_interleavings

    failed = sum(
        not run_interleavings(settings, s, examples, steps, click.echo)
        for s in range(first, first + runs)
    )
    if failed:
        raise OnceflowError(
            f"{failed} of {runs} interleaving search(es) failed (seeds from {first})"
        )


@click.command()
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
    from onceflow_tools.bench import SCENARIOS, run_bench

    results = run_bench(_settings(), list(scenarios) or list(SCENARIOS), n_jobs, out)
    if plots is not None:
        from onceflow_tools.benchplots import plot

        for path in plot(results, plots):
            click.echo(f"wrote {path}")


@click.command()
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
    from onceflow_tools.demo import run_demo

    ok = run_demo(
        _settings(), n_jobs=n_jobs, clients=clients, seed=seed, timeout=timeout, json_out=json_out
    )
    sys.exit(0 if ok else 1)
