"""History at scale: the same N rows of history before (schema at migration 0011,
unpartitioned, plus the later migrations that do not build on 0012's partitioned history,
0014 on, which today's store code reads) and after migration 0012 (time-partitioned), in
one scratch database.

The history is generated in SQL (``generate_series``, :mod:`onceflow_tools.benchsql`),
not through the pipeline:
30 days of finished three-step instances (one attempt per step, a duplicate delivery
for every third job id) ending now, plus 1,000 queued instances to claim. ``--rows``
is the number of step-attempt rows (default 100M); the database holds about as many
steps, a third as many jobs and instances, and a tenth as many duplicate rows.

One run:

1. fill at 0011, ANALYZE; measure (claim, describe, job_trace, console list, a
   10k-attempt insert, sizes);
2. retention the old way: DELETE the oldest day's instances (cascading to steps and
   attempts) and job ids; time it, read ``n_dead_tup`` / ``last_autovacuum``, then time
   the VACUUM that DELETE leaves owed;
3. apply migration 0012 (timed: it rewrites both tables), ANALYZE; measure again;
4. retention the new way (:func:`workflow_engine.store.writes.maintenance.prune`): the next
   day's partitions are dropped whole; time it and read the same statistics.

Never point it at a real database: it creates ``onceflow_hist_<id>`` on the server of
``DATABASE_URL`` and drops it at the end. Run: ``python -m onceflow_tools.history_bench
--rows 1000000`` (or ``onceflow bench history --jobs N``, N rows).
"""

from __future__ import annotations

import random
import statistics
import time
import uuid
from collections.abc import Callable
from datetime import UTC, datetime, timedelta
from typing import Any

import click
import orjson
from sqlalchemy.engine import Engine

from onceflow.settings import Settings
from onceflow_tools import benchsql
from onceflow_tools.stack import drop_database, recreate_database
from workflow_engine.store import available_migrations, make_engine, views, writes
from workflow_engine.store.views import describe_instance

DAYS = 30
SETTLE_SECONDS = 11.0
QUEUED = 1000


def _apply(db: Engine, versions: Callable[[int], bool]) -> float:
    """Apply the product migrations whose number passes ``versions``; seconds taken."""
    started = time.perf_counter()
    with db.begin() as conn:
        cursor = conn.connection.driver_connection.cursor()  # type: ignore[union-attr]
        for migration in available_migrations():
            if versions(migration.version):
                cursor.execute(migration.sql)
    return time.perf_counter() - started


def _timed(call: Callable[[], object], runs: int) -> dict[str, float]:
    samples = []
    for _ in range(runs):
        t0 = time.perf_counter()
        call()
        samples.append((time.perf_counter() - t0) * 1000)
    samples.sort()
    return {
        "median_ms": statistics.median(samples),
        "p95_ms": samples[min(len(samples) - 1, int(len(samples) * 0.95))],
        "max_ms": samples[-1],
    }


def _latencies(
    db: Engine, job_ids: list[str], attempt: int, middle: int
) -> dict[str, dict[str, float]]:
    ids = iter(job_ids * 4)
    everything = views.InstanceFilter()
    duplicated = views.InstanceFilter(has_duplicates=True)
    owner = f"bench-{attempt}"
    claimed: list[tuple[str, int]] = []

    def claim() -> None:
        batch = writes.claim(db, owner, 32, 30.0)
        claimed.extend((c.job_id, c.claim_count) for c in batch)

    out = {
        "claim 32": _timed(claim, 10),
        "describe": _timed(lambda: describe_instance(db, next(ids)), len(job_ids)),
        "job_trace": _timed(lambda: views.job_trace(db, next(ids)), len(job_ids)),
        "console list, first page": _timed(lambda: views.list_page(db, everything), 10),
        "console list, has duplicates": _timed(lambda: views.list_page(db, duplicated), 10),
        "console count, cap 10000": _timed(
            lambda: views.count_matching(db, everything, cap=10000), 10
        ),
    }
    writes.release(db, owner, claimed)

    def insert_attempts() -> None:
        benchsql.insert_attempts(db, attempt, middle + random.randrange(1000))

    out["insert 10k attempts"] = _timed(insert_attempts, 1)
    return out


def _retention_before(db: Engine, cutoff: datetime) -> dict[str, Any]:
    """One day of instance retention as onceflow ran it before 0012: DELETE the
    instances, cascading to their steps and step attempts row by row."""
    attempts = benchsql.count_attempts_before(db, cutoff)
    t0 = time.perf_counter()
    instances = benchsql.delete_finished_instances(db, cutoff)
    seconds = time.perf_counter() - t0
    stats = benchsql.vacuum_stats(db, SETTLE_SECONDS)
    t0 = time.perf_counter()
    benchsql.vacuum(db)
    return {
        "seconds": seconds,
        "removed": {"instances": instances, "step_attempts": attempts},
        "stats_after": stats,
        "vacuum_owed_seconds": time.perf_counter() - t0,
    }


def _retention_after(db: Engine, start: datetime, end: datetime) -> dict[str, Any]:
    """The same day of retention with 0012: a :func:`writes.prune` round drops the
    attempt partitions ending by ``end`` (job-id retention set far out, so only the
    attempts move), then the instances of that day are deleted as the next round
    would (one partition interval later), cascading to their steps only."""
    now = benchsql.server_now(db)
    attempts = benchsql.count_attempts_before(db, end)
    t0 = time.perf_counter()
    pruned = writes.prune(db, (now - end).total_seconds(), 3650 * 86400.0)
    drop_seconds = time.perf_counter() - t0
    t0 = time.perf_counter()
    instances = benchsql.delete_finished_instances(db, end)
    delete_seconds = time.perf_counter() - t0
    return {
        "seconds": drop_seconds + delete_seconds,
        "drop_seconds": drop_seconds,
        "delete_seconds": delete_seconds,
        "removed": {
            **pruned,
            "instances": pruned["instances"] + instances,
            "step_attempts": attempts,
        },
        "stats_after": benchsql.vacuum_stats(db, SETTLE_SECONDS),
    }


#: The first migration after 0012 that does not build on its partitioned history.
_INDEPENDENT_SINCE = 14


def history(database_url: str, rows: int) -> dict[str, Any]:
    name = f"onceflow_hist_{uuid.uuid4().hex[:6]}"
    db = make_engine(recreate_database(database_url, name), pool_size=2)
    result: dict[str, Any] = {"scenario": "history", "rows": rows, "database": name}
    try:
        _apply(db, lambda v: v < 12)
        # Today's store code reads columns that came later: "before" has them, dropped
        # before 0012 runs.
        benchsql.add_later_columns(db)
        # ... and the migrations after 0013 (they do not build on the partitioned
        # history, and today's claim and views read what they add): applied now, not
        # again after 0012
        _apply(db, lambda v: v >= _INDEPENDENT_SINCE)
        day = timedelta(days=1)
        start = writes.aligned(datetime.now(UTC) - DAYS * day, day)
        click.echo(f"  … filling {rows} attempt rows into {name}", err=True)
        t0 = time.perf_counter()
        result["counts"] = benchsql.fill_history(db, rows, start, QUEUED)
        result["fill_seconds"] = time.perf_counter() - t0
        m = result["counts"]["onceflow_jobs"]
        sample = [f"h{g:010d}" for g in random.Random(7).sample(range(m // 10, m - QUEUED), 50)]
        click.echo("  … measuring before (0011)", err=True)
        before: dict[str, Any] = {
            "sizes": benchsql.table_sizes(db),
            "stats": benchsql.vacuum_stats(db),
        }
        before["latency"] = _latencies(db, sample, 2, m // 2)
        click.echo("  … retention before (DELETE)", err=True)
        before["retention"] = _retention_before(db, start + day)
        before["sizes_after_retention"] = benchsql.table_sizes(db)
        result["before"] = before
        click.echo("  … migration 0012", err=True)
        benchsql.drop_later_columns(db)
        result["migration_seconds"] = _apply(db, lambda v: v == 12)
        # what today's store code reads; not timed
        _apply(db, lambda v: 12 < v < _INDEPENDENT_SINCE)  # 0013: retiring partitions
        benchsql.analyze(db)
        click.echo("  … measuring after (0012)", err=True)
        after: dict[str, Any] = {
            "sizes": benchsql.table_sizes(db),
            "stats": benchsql.vacuum_stats(db),
        }
        after["latency"] = _latencies(db, sample, 3, m // 2)
        click.echo("  … retention after (drop partitions)", err=True)
        after["retention"] = _retention_after(db, start + day, start + 2 * day)
        after["sizes_after_retention"] = benchsql.table_sizes(db)
        result["after"] = after
        return result
    finally:
        db.dispose()
        drop_database(database_url, name)


def _mb(n: int) -> str:
    return f"{n / 1e6:,.0f} MB"


def render(result: dict[str, Any]) -> list[str]:
    b, a = result["before"], result["after"]
    lines = [
        f"history: {result['rows']:,} step-attempt rows"
        f" ({', '.join(f'{t[9:]} {n:,}' for t, n in result['counts'].items())}),"
        f" filled in {result['fill_seconds']:.0f}s; migration 0012 took"
        f" {result['migration_seconds']:.1f}s",
        "",
        "| latency (median / p95 ms) | before (0011) | after (0012) |",
        "| --- | --- | --- |",
    ]
    for key, before in b["latency"].items():
        after = a["latency"][key]
        lines.append(
            f"| {key} | {before['median_ms']:.1f} / {before['p95_ms']:.1f}"
            f" | {after['median_ms']:.1f} / {after['p95_ms']:.1f} |"
        )
    lines += ["", "| table: heap + indexes | before | after (partitions) |", "| --- | --- | --- |"]
    for table, size in b["sizes"].items():
        other = a["sizes"][table]
        lines.append(
            f"| {table} | {_mb(size['table_bytes'])} + {_mb(size['index_bytes'])}"
            f" | {_mb(other['table_bytes'])} + {_mb(other['index_bytes'])} ({other['leaves']}) |"
        )
    rb, ra = b["retention"], a["retention"]
    dead_b = rb["stats_after"]["onceflow_step_attempts"]["n_dead_tup"]
    dead_a = ra["stats_after"]["onceflow_step_attempts"]["n_dead_tup"]
    lines += [
        "",
        f"retention of one day: before {rb['seconds']:.2f}s (DELETE, {rb['removed']}),"
        f" leaving {dead_b:,} dead attempt tuples and a VACUUM of"
        f" {rb['vacuum_owed_seconds']:.1f}s; after {ra['seconds']:.2f}s (prune: {ra['removed']}),"
        f" {dead_a:,} dead attempt tuples",
    ]
    return lines


@click.command()
@click.option(
    "--rows", type=int, default=100_000_000, show_default=True, envvar="ONCEFLOW_HISTORY_ROWS"
)
@click.option(
    "--out", type=click.Path(dir_okay=False), default="history-bench.json", show_default=True
)
def main(rows: int, out: str) -> None:
    """Fill N rows of history in a scratch database and measure it before and after
    partitioning (migration 0012)."""
    result = history(Settings().database_url, rows)
    with open(out, "wb") as fh:
        fh.write(orjson.dumps(result, option=orjson.OPT_INDENT_2))
    click.echo("\n".join(render(result)))


if __name__ == "__main__":
    main()
