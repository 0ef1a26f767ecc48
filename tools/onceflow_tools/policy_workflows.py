"""The run-controls benchmark's workflows (``onceflow bench engine-policies``): the
examples' three no-op steps, each with one of issue 26's policies on, set so that it
never binds (a key per job, limits hours away): the figure is the policy's own cost in
the worker's create and the engine's claim, not a throttle. The bench's engines load
this module (``ONCEFLOW_WORKFLOW_MODULES``); it is a tool, not part of the product."""

from __future__ import annotations

from datetime import timedelta
from typing import Any

from workflow_engine import Batch, Debounce, Singleton, workflow

SINGLETON_QUEUE = "bench-singleton-queue"
SINGLETON_SKIP = "bench-singleton-skip"
TIME_LIMITS = "bench-time-limits"
ATTRIBUTES = "bench-attributes"
DEBOUNCE = "bench-debounce-leading"
ID_REUSE = "bench-id-reuse"
BATCH = "bench-batch"
#: Members per batch run of ``BATCH`` (one pool: the workflow has no key).
BATCH_SIZE = 50


def _noop(n: int) -> int:
    return n


async def _three_steps(ctx: Any) -> dict[str, Any]:
    for n in range(3):
        await ctx.step(f"step {n + 1}", _noop, n)
    return {"steps": 3}


@workflow(SINGLETON_QUEUE, singleton=Singleton(key="params.customer", mode="queue"))
async def singleton_queue(ctx: Any, params: dict[str, Any]) -> dict[str, Any]:
    return await _three_steps(ctx)


@workflow(SINGLETON_SKIP, singleton=Singleton(key="params.customer", mode="skip"))
async def singleton_skip(ctx: Any, params: dict[str, Any]) -> dict[str, Any]:
    return await _three_steps(ctx)


@workflow(TIME_LIMITS, start_within=timedelta(hours=1), execution_timeout=timedelta(hours=1))
async def time_limits(ctx: Any, params: dict[str, Any]) -> dict[str, Any]:
    return await _three_steps(ctx)


@workflow(ATTRIBUTES)
async def attributes(ctx: Any, params: dict[str, Any]) -> dict[str, Any]:
    """Submitted with attributes, and sets one from its code (one more write a run)."""
    result = await _three_steps(ctx)
    await ctx.set_attributes({"stage": "done"})
    return result


@workflow(DEBOUNCE, debounce=Debounce(key="params.customer", period=60.0, mode="leading"))
async def debounce_leading(ctx: Any, params: dict[str, Any]) -> dict[str, Any]:
    """Each job the first of its key: it starts at once (the decision is the cost)."""
    return await _three_steps(ctx)


@workflow(ID_REUSE, id_reuse="after_failure")
async def reused(ctx: Any, params: dict[str, Any]) -> dict[str, Any]:
    """Fresh ids under a reuse policy: the worker looks for finished runs, finds none."""
    return await _three_steps(ctx)


@workflow(BATCH, batch=Batch(max_size=BATCH_SIZE, max_wait=0.2))
async def batched(ctx: Any, params: dict[str, Any]) -> list[dict[str, Any]]:
    """Three no-op steps a batch run, one result per member."""
    await _three_steps(ctx)
    return [{"member": m["job_id"]} for m in params["members"]]
