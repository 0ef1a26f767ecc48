"""Batched workflows, for tests/integration/test_batching.py and the chaos test; subprocess
engines and workers load them with ``ONCEFLOW_WORKFLOW_MODULES``. Every batch run's
step records which members it ran, in the test's database (``ONCEFLOW_DATABASE_URL``),
so a test can count how often each member was run."""

from __future__ import annotations

import os
import time
from typing import Any

import sqlalchemy as sa

from workflow_engine import Batch, NonRetryableError, workflow
from workflow_engine.definitions import Context
from workflow_engine.store import make_engine

SIZE = "test-batch-size"  # five per tenant; the wait long: only the size triggers
WAIT = "test-batch-wait"  # one pool; a short wait triggers
FAILING = "test-batch-failing"
WRONG = "test-batch-wrong"  # returns one result too few
CHAOS = "test-batch-chaos"

CREATE_RUNS = sa.text(
    "CREATE TABLE IF NOT EXISTS test_batch_runs (batch_id text NOT NULL,"
    " member text NOT NULL, at timestamptz NOT NULL DEFAULT clock_timestamp())"
)
_RECORD = sa.text(
    "INSERT INTO test_batch_runs (batch_id, member) SELECT :b, unnest(CAST(:m AS text[]))"
)
_DB: list[sa.Engine] = []


def _record(batch_id: str, members: list[str], seconds: float) -> int:
    if "ONCEFLOW_DATABASE_URL" in os.environ:
        if not _DB:
            _DB.append(make_engine(os.environ["ONCEFLOW_DATABASE_URL"]))
        with _DB[0].begin() as conn:
            conn.execute(_RECORD, {"b": batch_id, "m": members})
    time.sleep(seconds)
    return len(members)


@workflow(SIZE, batch=Batch(max_size=5, max_wait=600, key="params.tenant"))
async def by_size(ctx: Context, params: dict[str, Any]) -> list[Any]:
    members = params["members"]
    await ctx.step("run", _record, ctx.job_id, [m["job_id"] for m in members], 0)
    return [{"double": m["params"]["n"] * 2, "tenant": params["key"]} for m in members]


@workflow(WAIT, batch=Batch(max_size=100, max_wait=0.3))
async def by_wait(ctx: Context, params: dict[str, Any]) -> dict[str, Any]:
    return {m["job_id"]: m["params"]["n"] + 1 for m in params["members"]}


@workflow(FAILING, batch=Batch(max_size=3, max_wait=0.2))
async def failing(ctx: Context, params: dict[str, Any]) -> None:
    raise NonRetryableError("the whole batch failed")


@workflow(WRONG, batch=Batch(max_size=3, max_wait=0.2))
async def wrong(ctx: Context, params: dict[str, Any]) -> list[Any]:
    return [1] * (len(params["members"]) - 1)


@workflow(CHAOS, batch=Batch(max_size=50, max_wait=0.5, key="params.tenant"))
async def chaos(ctx: Context, params: dict[str, Any]) -> list[Any]:
    members = [m["job_id"] for m in params["members"]]
    await ctx.step("run", _record, ctx.job_id, members, float(os.environ.get("BATCH_SECONDS", "0")))
    return [{"n": m["params"]["n"]} for m in params["members"]]


PARENT = "test-batch-parent"  # starts a batched workflow as its child: refused


@workflow(PARENT)
async def parent(ctx: Context, params: dict[str, Any]) -> Any:
    handle = await ctx.start_child(SIZE, "member", {"tenant": "x", "n": 1})
    return await ctx.child_result(handle)
