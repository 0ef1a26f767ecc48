"""The workflow of test_retry_chaos.py, loaded by its engine processes
(``ONCEFLOW_WORKFLOW_MODULES``). Every execution of a step is a row its code inserts in
the test's database (``ONCEFLOW_DATABASE_URL``), committed before the step returns, so
executions are counted across processes and kills."""

from __future__ import annotations

import os
import time
from typing import Any

import sqlalchemy as sa

from workflow_engine import NonRetryableError, workflow
from workflow_engine.definitions import Context
from workflow_engine.store import make_engine

WORKFLOW = "test-retry-chaos"
CREATE_EXECUTIONS = sa.text(
    "CREATE TABLE IF NOT EXISTS test_chaos_executions"
    " (job_id text NOT NULL, step text NOT NULL, at timestamptz NOT NULL DEFAULT now())"
)
_COUNT = sa.text(
    "WITH run AS (INSERT INTO test_chaos_executions (job_id, step) VALUES (:j, :s))"
    " SELECT count(*) + 1 FROM test_chaos_executions WHERE job_id = :j AND step = :s"
)
_DB: list[sa.Engine] = []


def _execute(job_id: str, step: str, fail_first: int, seconds: float) -> int:
    if not _DB:
        _DB.append(make_engine(os.environ["ONCEFLOW_DATABASE_URL"]))
    time.sleep(seconds)
    with _DB[0].begin() as conn:
        n = int(conn.execute(_COUNT, {"j": job_id, "s": step}).scalar_one())
    if n <= fail_first:
        raise NonRetryableError(f"{step} refused (execution {n})")
    return n


@workflow(WORKFLOW)
async def retried(ctx: Context, params: dict[str, Any]) -> dict[str, Any]:
    """Step "two" errors the instance on its first execution; a retry runs it again."""
    seconds = float(params.get("step_seconds", 0))
    one = await ctx.step("one", _execute, ctx.job_id, "one", 0, seconds)
    two = await ctx.step("two", _execute, ctx.job_id, "two", 1, seconds)
    three = await ctx.step("three", _execute, ctx.job_id, "three", 0, seconds)
    return {"one": one, "two": two, "three": three}
