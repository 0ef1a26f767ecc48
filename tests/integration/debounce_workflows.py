"""Workflows with a debounce, for tests/integration/test_debounce*.py; subprocess
engines and workers load them with ``ONCEFLOW_WORKFLOW_MODULES``. Every execution of a
step is a row its code inserts in the test's database (``ONCEFLOW_DATABASE_URL``), so
the proof counts runs, not only statuses."""

from __future__ import annotations

import os
import time
from typing import Any

import sqlalchemy as sa

from workflow_engine import Debounce, workflow
from workflow_engine.definitions import Context
from workflow_engine.store import make_engine

TRAILING = "test-debounce-trailing"
LEADING = "test-debounce-leading"
BOUNDED = "test-debounce-bounded"
SLOW = "test-debounce-slow"
BURST = "test-debounce-burst"
BURST_LEADING = "test-debounce-burst-leading"

CREATE_EXECUTIONS = sa.text(
    "CREATE TABLE IF NOT EXISTS test_debounce_executions (job_id text NOT NULL,"
    " step text NOT NULL, at timestamptz NOT NULL DEFAULT clock_timestamp())"
)
_RECORD = sa.text("INSERT INTO test_debounce_executions (job_id, step) VALUES (:j, :s)")
_DB: list[sa.Engine] = []


def _execute(job_id: str, step: str, seconds: float) -> str:
    if "ONCEFLOW_DATABASE_URL" in os.environ:
        if not _DB:
            _DB.append(make_engine(os.environ["ONCEFLOW_DATABASE_URL"]))
        with _DB[0].begin() as conn:
            conn.execute(_RECORD, {"j": job_id, "s": step})
    time.sleep(seconds)
    return step


async def _two_steps(ctx: Context, params: dict[str, Any]) -> str:
    seconds = float(params.get("seconds", 0))
    for step in ("one", "two"):
        await ctx.step(step, _execute, ctx.job_id, step, seconds)
    return "done"


@workflow(TRAILING, debounce=Debounce(key="params.tenant", period=0.5, max_wait=30.0))
async def trailing(ctx: Context, params: dict[str, Any]) -> str:
    return await _two_steps(ctx, params)


@workflow(LEADING, debounce=Debounce(key="params.tenant", period=0.5, mode="leading"))
async def leading(ctx: Context, params: dict[str, Any]) -> str:
    return await _two_steps(ctx, params)


# A period longer than a test holds a creator paused: its pending instance is still
# pending (its start ahead on the database's clock) when the next creator reads it.
@workflow(SLOW, debounce=Debounce(key="params.tenant", period=10.0))
async def slow(ctx: Context, params: dict[str, Any]) -> str:
    return await _two_steps(ctx, params)


@workflow(BOUNDED, debounce=Debounce(key="params.tenant", period=0.4, max_wait=1.0))
async def bounded(ctx: Context, params: dict[str, Any]) -> str:
    return await _two_steps(ctx, params)


# The burst: a window far longer than a 1,000-job burst takes to be consumed by two
# workers (about 5 s on a 2-core box, a consumer-group rebalance included), so each key has
# exactly one window (max_wait well above it).
@workflow(BURST, debounce=Debounce(key="params.tenant", period=8.0, max_wait=60.0))
async def burst(ctx: Context, params: dict[str, Any]) -> str:
    return await _two_steps(ctx, params)


@workflow(BURST_LEADING, debounce=Debounce(key="params.tenant", period=8.0, mode="leading"))
async def burst_leading(ctx: Context, params: dict[str, Any]) -> str:
    return await _two_steps(ctx, params)
