"""The engine's single writes (``call_db``: sleeps, waits, children, attributes) stay
within its connection pool: past it, each took an overflow connection opened for one
transaction and closed after it (a new backend, its prepared statements planned again).
Seen at 64 in flight: 625 sessions for 3,000 workflows of one ``ctx.set_attributes``
each, and 0.24 of the plain workflow's throughput (BENCHMARKS.md, "What each run
control costs")."""

from __future__ import annotations

import time

import sqlalchemy as sa

from onceflow.envelope import JobEnvelope
from tests.integration.interleavings import EngineHarness, scalar, wait_for
from workflow_engine import workflow
from workflow_engine.model import Delivery
from workflow_engine.store import make_engine
from workflow_engine.store.writes import create_instances

WORKFLOW = "test-pool-attributes"
POOL = 8


def _noop(n: int) -> int:
    return n


@workflow(WORKFLOW)
async def attributes_between_steps(ctx, params):
    for n in range(3):
        await ctx.step(f"step {n}", _noop, n)
        await ctx.set_attributes({"stage": n})  # a single write (call_db) each
    return {}


def _sessions(db: sa.Engine) -> int:
    """Sessions established to this database and ended (PostgreSQL counts one at its
    end; the statistics reach the view within a second)."""
    time.sleep(1.2)
    with db.connect() as conn:
        conn.execute(sa.text("SELECT pg_stat_clear_snapshot()"))
        return int(
            conn.execute(
                sa.text("SELECT sessions FROM pg_stat_database WHERE datname = current_database()")
            ).scalar()
            or 0
        )


def test_single_writes_at_64_in_flight_open_no_connection_past_the_pool(settings, db):
    jobs = 300
    create_instances(
        db, [Delivery(JobEnvelope(f"pool_{i:04d}", WORKFLOW, {}), "t", 0, i) for i in range(jobs)]
    )
    engine_db = make_engine(settings.database_url, pool_size=POOL)
    before = _sessions(db)
    with EngineHarness(settings, engine_db, engine_concurrency=64):
        wait_for(
            lambda: (
                scalar(db, "SELECT count(*) FROM onceflow_instances WHERE status = 'complete'")
                == jobs
            ),
            "every run",
            120,
        )
    engine_db.dispose()  # the pool's own connections end here: counted once each
    opened = _sessions(db) - before
    print(f"sessions opened by the engine for {jobs} workflows: {opened}")
    # the pool and its overflow, each at most once (not one per transaction past it)
    assert opened <= 2 * POOL, opened
