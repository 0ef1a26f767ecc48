"""What one claim costs on a mixed backlog: plain and flow-controlled workflows queued
together (issue 23, case 4: one claim order across both kinds).

A scratch database gets ``jobs`` plain instances at priority 5 and ``jobs`` x
``limited_share`` per-key-limited ones at priority 1 over 50 keys, analysed; then
claims of 32 are timed
(median and p90 of ``rounds``), each claimed batch put back in the queue before the next
so every claim meets the same backlog. Also printed: how many of the first batch are
flow-controlled (claim order says the priority-1 ones come first, up to their limits).

It uses only what every build's store offers (``writes.claim``, ``create_instances``),
so the same file times the build before a change too: run it with that build's
packages first on ``PYTHONPATH`` (BENCHMARKS.md, "One claim order").
"""

from __future__ import annotations

import statistics
import sys
import time
import uuid
from typing import Any

import click
import sqlalchemy as sa

from onceflow.envelope import JobEnvelope
from onceflow_tools.stack import database_url_for, recreate_database
from workflow_engine import workflow
from workflow_engine.definitions import REGISTRY, registered_versions
from workflow_engine.model import Delivery
from workflow_engine.store import make_engine, migrate, writes
from workflow_engine.store.writes import create_instances

PLAIN = "bench-claim-plain"
LIMITED = "bench-claim-limited"
KEYS = 50


@workflow(PLAIN)
async def _plain(ctx: Any, params: dict[str, Any]) -> None:
    return None


@workflow(LIMITED, concurrency_key="params.customer", max_per_key=2)
async def _limited(ctx: Any, params: dict[str, Any]) -> None:
    return None


def _fill(db: sa.Engine, jobs: int, limited: int) -> None:
    offset = 0
    for workflow_name, count, priority in ((PLAIN, jobs, 5), (LIMITED, limited, 1)):
        for start in range(0, count, 5000):
            batch = []
            for i in range(start, min(count, start + 5000)):
                params = {"customer": f"c{i % KEYS}"}
                envelope = JobEnvelope(
                    f"{workflow_name}-{i}", workflow_name, params, priority=priority
                )
                batch.append(
                    Delivery(
                        envelope, "bench", 0, offset, lane_path=REGISTRY.lane_path(workflow_name)
                    )
                )
                offset += 1
            create_instances(db, batch)
    with db.connect().execution_options(isolation_level="AUTOCOMMIT") as conn:
        conn.execute(sa.text("VACUUM ANALYZE onceflow_instances"))


_REQUEUE = sa.text(
    "UPDATE onceflow_instances SET status = 'queued', lease_owner = NULL,"
    " lease_expires_at = NULL WHERE job_id = ANY(:ids)"
)


def measure(base_url: str, jobs: int, rounds: int, limited_share: float = 0.25) -> dict[str, Any]:
    name = f"onceflow_claimbench_{uuid.uuid4().hex[:8]}"
    url = recreate_database(base_url, name)
    db = make_engine(url, pool_size=2)
    try:
        migrate(db)
        limited = int(jobs * limited_share)
        _fill(db, jobs, limited)
        versions = {w: v for w, v in registered_versions().items() if w in (PLAIN, LIMITED)}
        flows = {w: f for w, f in REGISTRY.flows().items() if w == LIMITED}
        times, first_limited = [], None
        for n in range(rounds):
            started = time.perf_counter()
            got = writes.claim(db, "bench", 32, 30, versions=versions, flows=flows)
            times.append((time.perf_counter() - started) * 1000)
            if first_limited is None:
                first_limited = sum(c.workflow == LIMITED for c in got)
            with db.begin() as conn:
                conn.execute(_REQUEUE, {"ids": [c.job_id for c in got]})
            if n % 20 == 19:
                with db.connect().execution_options(isolation_level="AUTOCOMMIT") as conn:
                    conn.execute(sa.text("VACUUM onceflow_instances"))
        times.sort()
        return {
            "scenario": "claim",
            "plain": jobs,
            "limited": limited,
            "claim_ms_median": round(statistics.median(times), 2),
            "claim_ms_p90": round(times[int(0.9 * (len(times) - 1))], 2),
            "limited_in_first_batch": first_limited,
        }
    finally:
        db.dispose()
        admin = make_engine(database_url_for(base_url, "postgres"), pool_size=1)
        with admin.connect().execution_options(isolation_level="AUTOCOMMIT") as conn:
            conn.execute(sa.text(f'DROP DATABASE IF EXISTS "{name}" WITH (FORCE)'))
        admin.dispose()


def render(result: dict[str, Any]) -> list[str]:
    return [
        f"claim of 32 on {result['plain']:,} plain (priority 5) + {result['limited']:,}"
        f" per-key-limited (priority 1) queued: median {result['claim_ms_median']} ms,"
        f" p90 {result['claim_ms_p90']} ms; first batch held"
        f" {result['limited_in_first_batch']} limited instances",
    ]


@click.command()
@click.option("--database-url", envvar="DATABASE_URL", required=True)
@click.option("--jobs", default=20000, show_default=True)
@click.option("--rounds", default=100, show_default=True)
@click.option(
    "--limited-share", default=0.25, show_default=True, help="Limited jobs per plain job."
)
def main(database_url: str, jobs: int, rounds: int, limited_share: float) -> None:
    """Time claims of 32 on a mixed backlog (see the module's docstring)."""
    click.echo("\n".join(render(measure(database_url, jobs, rounds, limited_share))))


if __name__ == "__main__":
    main(sys.argv[1:])
