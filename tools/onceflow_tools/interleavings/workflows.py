"""The workflows the interleaving matrix and the state machine run.

Small on purpose, and each crossing the boundaries the failpoints name: a step, a
durable sleep, a wait for an event, a second step; one whose caught step failure must
replay as the same failure. Every step logs its executions in :data:`EXECUTIONS` (a
file too, when ``ONCEFLOW_TEST_EXECUTIONS`` names one: an engine subprocess started by
``onceflow_tools.failpoint_main``). :data:`HOLDS` keeps a job's first step running until a
test lets it go (in-process only), for a window that needs a run in flight.

An engine loads them as ``onceflow_tools.interleavings.workflows``.
"""

from __future__ import annotations

import os
import threading
from pathlib import Path
from typing import Any

from onceflow_tools.interleavings.history import Executions
from workflow_engine import RetryPolicy, StepFailed, workflow

EXECUTIONS = Executions(
    log_path=Path(p) if (p := os.environ.get("ONCEFLOW_TEST_EXECUTIONS")) else None
)
#: job id -> the gate its step "a" waits at (30 s at most) before it returns.
HOLDS: dict[str, threading.Event] = {}

FLOW = "interleave-flow"
CAUGHT = "interleave-caught"
#: The workflows here complete whatever the interference (the checker's ``completing``).
COMPLETING = (FLOW, CAUGHT)
EVENT = "go"


def record(job_id: str, step: str) -> str:
    run = EXECUTIONS.begin(job_id, step)
    try:
        gate = HOLDS.get(job_id) if step == "a" else None
        if gate is not None:
            gate.wait(30)
        return f"{step} done"
    finally:
        EXECUTIONS.end(run)


def refuse(job_id: str, step: str) -> str:
    run = EXECUTIONS.begin(job_id, step)
    try:
        raise RuntimeError("card declined")
    finally:
        EXECUTIONS.end(run)


@workflow(FLOW)
async def flow(ctx: Any, params: dict[str, Any]) -> dict[str, Any]:
    """Step, sleep, wait for an event, step."""
    a = await ctx.step("a", record, ctx.job_id, "a")
    await ctx.sleep("nap", float(params.get("nap", 1.0)))
    got = await ctx.wait_for_event("approval", type=EVENT)
    b = await ctx.step("b", record, ctx.job_id, "b")
    return {"a": a, "event": got, "b": b}


@workflow(CAUGHT)
async def caught(ctx: Any, params: dict[str, Any]) -> dict[str, Any]:
    """A step that fails once and for all, caught; a sleep; a step. Replay after the
    sleep must raise the recorded failure again, not run ``charge`` a second time."""
    try:
        await ctx.step("charge", refuse, ctx.job_id, "charge", retries=RetryPolicy(limit=0))
        charged = True
    except StepFailed:
        charged = False
    await ctx.sleep("nap", float(params.get("nap", 1.0)))
    b = await ctx.step("b", record, ctx.job_id, "b")
    return {"charged": charged, "b": b}
