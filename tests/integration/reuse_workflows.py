"""Workflows with id reuse policies, for tests/integration/test_id_reuse*.py; subprocess
engines and workers load them with ``ONCEFLOW_WORKFLOW_MODULES``. Every execution of a
step is a row its code inserts in the test's database (``ONCEFLOW_DATABASE_URL``), with
the instance's run as the step's code saw it (its params carry it)."""

from __future__ import annotations

import os
import time
from typing import Any

import sqlalchemy as sa

from workflow_engine import NonRetryableError, workflow
from workflow_engine.definitions import Context
from workflow_engine.store import make_engine

AFTER_FAILURE = "test-reuse-after-failure"
AFTER_COMPLETION = "test-reuse-after-completion"
NEVER = "test-reuse-never"

CREATE_EXECUTIONS = sa.text(
    "CREATE TABLE IF NOT EXISTS test_reuse_executions (job_id text NOT NULL,"
    " step text NOT NULL, attempt text NOT NULL,"
    " at timestamptz NOT NULL DEFAULT clock_timestamp())"
)
_RECORD = sa.text("INSERT INTO test_reuse_executions (job_id, step, attempt) VALUES (:j, :s, :a)")
_DB: list[sa.Engine] = []


def _execute(job_id: str, step: str, attempt: str, seconds: float, fail: bool) -> str:
    if "ONCEFLOW_DATABASE_URL" in os.environ:
        if not _DB:
            _DB.append(make_engine(os.environ["ONCEFLOW_DATABASE_URL"]))
        with _DB[0].begin() as conn:
            conn.execute(_RECORD, {"j": job_id, "s": step, "a": attempt})
    time.sleep(seconds)
    if fail:
        raise NonRetryableError(f"{step} failed as asked ({attempt})")
    return f"{step}:{attempt}"


async def _two_steps(ctx: Context, params: dict[str, Any]) -> str:
    """``params``: ``attempt`` (a label the executions record), ``seconds`` per step,
    ``fail``: the second step fails (the run errors)."""
    attempt, seconds = str(params.get("attempt", "")), float(params.get("seconds", 0))
    await ctx.step("one", _execute, ctx.job_id, "one", attempt, seconds, False)
    fail = bool(params.get("fail"))
    return await ctx.step("two", _execute, ctx.job_id, "two", attempt, seconds, fail)


@workflow(AFTER_FAILURE, id_reuse="after_failure")
async def after_failure(ctx: Context, params: dict[str, Any]) -> str:
    return await _two_steps(ctx, params)


@workflow(AFTER_COMPLETION, id_reuse="after_completion")
async def after_completion(ctx: Context, params: dict[str, Any]) -> str:
    return await _two_steps(ctx, params)


@workflow(NEVER)
async def never(ctx: Context, params: dict[str, Any]) -> str:
    return await _two_steps(ctx, params)


PARENT = "test-reuse-parent"
CHILD = "test-reuse-child"


@workflow(CHILD)
async def child(ctx: Context, params: dict[str, Any]) -> str:
    """Fails when its params say so (``fail``): its parent's run then errors."""
    attempt = str(params.get("attempt", ""))
    fail = bool(params.get("fail"))
    return await ctx.step("work", _execute, ctx.job_id, "work", attempt, 0.0, fail)


@workflow(PARENT, id_reuse="after_failure")
async def parent(ctx: Context, params: dict[str, Any]) -> Any:
    """One child, ``charge``, with the parent's params: its result is the parent's."""
    handle = await ctx.start_child(CHILD, "charge", params)
    return await ctx.child_result(handle)
