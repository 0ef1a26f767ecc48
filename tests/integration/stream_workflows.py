"""Workflows of test_output_streams.py that emit to output streams, loaded in-process and
by its engine processes (``ONCEFLOW_WORKFLOW_MODULES``)."""

from __future__ import annotations

import time

from workflow_engine import StreamLimitReached, current_step, emit, workflow


def _emitting_step(index: int, count: int, seconds: float) -> int:
    """Sync step code (a thread): ``count`` values, each naming its step and attempt."""
    attempt = current_step().attempt
    for k in range(count):
        emit("steps", {"step": index, "attempt": attempt, "k": k})
        if seconds:
            time.sleep(seconds / count)
    return index


@workflow("stream-values")
async def stream_values(ctx, params):
    """``rounds`` rounds of: ``body`` values from the body, then a step that emits
    ``per_step`` values from its thread (``step_seconds`` spread over them)."""
    rounds, body, per_step = params["rounds"], params["body"], params["per_step"]
    seconds = params.get("step_seconds", 0.0)
    for r in range(rounds):
        for b in range(body):
            await ctx.emit("body", {"round": r, "b": b})
        await ctx.step(f"round {r}", _emitting_step, r, per_step, seconds)
    return {"rounds": rounds}


@workflow("stream-gather")
async def stream_gather(ctx, params):
    """Branches that emit and take no history position, twice, then one that does: every
    emit is its own value (their keys differ although the positions do not)."""

    async def branch(name):
        await ctx.emit("g", {"branch": name})

    async def with_step(name):
        await ctx.emit("g", {"branch": name, "at": "before"})
        await ctx.step(f"step {name}", lambda: name)
        await ctx.emit("g", {"branch": name, "at": "after"})

    await ctx.emit("g", {"main": 0})
    await ctx.gather(branch("a"), branch("b"))
    await ctx.gather(branch("c"), branch("d"))
    await ctx.gather(with_step("e"), with_step("f"))
    await ctx.emit("g", {"main": 1})
    return "ok"


@workflow("stream-bounded")
async def stream_bounded(ctx, params):
    """Emits until the instance's bound refuses one; reports how far it got (the
    refusal is caught) and then fails a step that emits past the bound."""
    sent = 0
    try:
        for i in range(params["try"]):
            await ctx.emit("fill", {"i": i, "pad": "x" * params.get("pad", 0)})
            sent += 1
    except StreamLimitReached as exc:
        refused = str(exc)
    else:
        refused = None
    await ctx.step("summary", lambda: {"sent": sent, "refused": refused})

    def over():
        emit("fill", {"from": "step"})

    await ctx.step("over the bound", over)
