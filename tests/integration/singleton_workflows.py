"""Workflows with singleton policies, for tests/integration/test_singleton.py; subprocess
engines and workers load them with ``ONCEFLOW_WORKFLOW_MODULES``. Every execution of a
step is a row its code inserts in the test's database (``ONCEFLOW_DATABASE_URL``),
with whether its instance's cancellation (``cancelled_by``) was already committed when
the step's code began."""

from __future__ import annotations

import os
import time
from typing import Any

import sqlalchemy as sa

from workflow_engine import Singleton, workflow
from workflow_engine.definitions import Context
from workflow_engine.store import make_engine

SKIP = "test-singleton-skip"
NEWEST = "test-singleton-newest"
CANCEL = "test-singleton-cancel"
QUEUE = "test-singleton-queue"

CREATE_EXECUTIONS = sa.text(
    "CREATE TABLE IF NOT EXISTS test_singleton_executions (job_id text NOT NULL,"
    " step text NOT NULL, at timestamptz NOT NULL DEFAULT clock_timestamp(),"
    " cancelled_seen boolean NOT NULL)"
)
_RECORD = sa.text(
    "INSERT INTO test_singleton_executions (job_id, step, cancelled_seen)"
    " SELECT :j, :s, cancelled_by IS NOT NULL FROM onceflow_instances WHERE job_id = :j"
)
_DB: list[sa.Engine] = []


def _execute(job_id: str, step: str, seconds: float) -> str:
    if "ONCEFLOW_DATABASE_URL" in os.environ:
        if not _DB:
            _DB.append(make_engine(os.environ["ONCEFLOW_DATABASE_URL"]))
        with _DB[0].begin() as conn:
            conn.execute(_RECORD, {"j": job_id, "s": step})
    time.sleep(seconds)
    return step


async def _three_steps(ctx: Context, params: dict[str, Any]) -> str:
    seconds = float(params.get("seconds", 0))
    for step in ("one", "two", "three"):
        await ctx.step(step, _execute, ctx.job_id, step, seconds)
    return "done"


@workflow(SKIP, singleton=Singleton(key="params.customer", mode="skip"))
async def skipping(ctx: Context, params: dict[str, Any]) -> str:
    return await _three_steps(ctx, params)


@workflow(NEWEST, singleton=Singleton(key="params.customer", mode="cancel_newest"))
async def newest(ctx: Context, params: dict[str, Any]) -> str:
    return await _three_steps(ctx, params)


@workflow(CANCEL, singleton=Singleton(key="params.customer", mode="cancel_in_progress"))
async def cancelling(ctx: Context, params: dict[str, Any]) -> str:
    return await _three_steps(ctx, params)


@workflow(QUEUE, singleton=Singleton(key="params.customer", mode="queue"))
async def queueing(ctx: Context, params: dict[str, Any]) -> str:
    return await _three_steps(ctx, params)


PARENT = "test-singleton-parent"
CHILD = "test-singleton-child"


@workflow(CHILD)
async def child(ctx: Context, params: dict[str, Any]) -> str:
    await ctx.sleep("long", 3600)
    return "slept"


@workflow(PARENT, singleton=Singleton(key="params.customer", mode="cancel_in_progress"))
async def parent(ctx: Context, params: dict[str, Any]) -> str:
    """Starts a child that outlives it unless closed, then waits (not running)."""
    await ctx.start_child(CHILD, "kid")
    await ctx.wait_for_event("go", "never-sent")
    return "done"
