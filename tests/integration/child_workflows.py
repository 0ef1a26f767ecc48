"""Workflows of test_children.py: parents, children, gathers. Imported by the test and
loaded by its engine processes (``ONCEFLOW_WORKFLOW_MODULES``)."""

from __future__ import annotations

import time
from datetime import timedelta
from typing import Any

from workflow_engine import NonRetryableError, current_step, workflow
from workflow_engine.definitions import Context
from workflow_engine.errors import ChildWorkflowFailed

#: Every execution of a step of these workflows in this process: (job id, step name).
EFFECTS: list[tuple[str, str]] = []


def _effect(params: dict[str, Any]) -> dict[str, Any]:
    step = current_step()
    time.sleep(float(params.get("step_seconds", 0)))
    EFFECTS.append((step.job_id, step.name))
    return {"step": step.name, "key": step.idempotency_key}


@workflow("test-child")
async def child(ctx: Context, params: dict[str, Any]) -> dict[str, Any]:
    """Charges ``amount``; ``fail`` makes it error; ``hold`` makes it wait for an event
    ``release`` first; ``step_seconds`` makes its step slow."""
    if params.get("hold"):
        await ctx.wait_for_event("held", type="release")
    if params.get("fail"):
        await ctx.step("decline", _decline)
    effect = await ctx.step("charge", _effect, params)
    if params.get("then_more"):  # one more step boundary after the charge
        await ctx.step("more", _effect, {})
    return {"amount": params.get("amount", 0), "key": effect["key"]}


def _decline() -> None:
    raise NonRetryableError("card declined")


@workflow("test-parent")
async def parent(ctx: Context, params: dict[str, Any]) -> Any:
    handle = await ctx.start_child("test-child", "charge", params.get("child", {}))
    # A slow step between start and result: the window test_children SIGKILLs in.
    await ctx.step("meanwhile", time.sleep, float(params.get("meanwhile_seconds", 0)))
    return {"child": await ctx.child_result(handle)}


@workflow("test-parent-catch")
async def parent_catch(ctx: Context, params: dict[str, Any]) -> Any:
    handle = await ctx.start_child("test-child", "charge", {"fail": True})
    try:
        await ctx.child_result(handle)
    except ChildWorkflowFailed as failed:
        return {"caught": failed.error, "status": failed.status, "child": failed.child_job_id}
    return {"caught": None}


@workflow("test-fanout")
async def fanout(ctx: Context, params: dict[str, Any]) -> Any:
    n = int(params["n"])
    seconds = params.get("step_seconds", 0)
    handles = await ctx.gather(
        *(
            ctx.start_child("test-child", f"c{i}", {"amount": i, "step_seconds": seconds})
            for i in range(n)
        )
    )
    results = await ctx.gather(*(ctx.child_result(h) for h in handles))
    return {"total": sum(r["amount"] for r in results), "n": len(results)}


@workflow("test-gather-steps")
async def gather_steps(ctx: Context, params: dict[str, Any]) -> Any:
    async def two_in_a_row() -> list[Any]:
        first = await ctx.step("c1", _effect, {"step_seconds": 0.05})
        second = await ctx.step("c2", _effect, {"step_seconds": 0})
        return [first["step"], second["step"]]

    got = await ctx.gather(
        ctx.step("a", _effect, {"step_seconds": 0.2}),
        ctx.step("b", _effect, {"step_seconds": 0}),
        two_in_a_row(),
    )
    # A durable pause after the gather: the next run replays the whole gather.
    await ctx.sleep("pause", timedelta(seconds=float(params.get("pause_seconds", 0.3))))
    after = await ctx.step("after", _effect, {"step_seconds": 0})
    return {"branches": [got[0]["step"], got[1]["step"], got[2]], "after": after["step"]}


@workflow("test-parent-close")
async def parent_close(ctx: Context, params: dict[str, Any]) -> Any:
    await ctx.start_child("test-child", "doomed", {"hold": True}, on_parent_close="terminate")
    await ctx.start_child("test-child", "spared", {"hold": True}, on_parent_close="abandon")
    await ctx.wait_for_event("forever", type="never")


@workflow("test-fair-child", fairness_key="params.tenant")
async def fair_child(ctx: Context, params: dict[str, Any]) -> Any:
    return await ctx.step("work", _effect, {})


@workflow("test-fair-parent")
async def fair_parent(ctx: Context, params: dict[str, Any]) -> Any:
    handles = await ctx.gather(
        *(ctx.start_child("test-fair-child", t, {"tenant": t}) for t in params["tenants"])
    )
    return await ctx.gather(*(ctx.child_result(h) for h in handles))
