"""Workflows with flow control, for tests/integration/test_flow_control.py; subprocess
engines load them with ``ONCEFLOW_WORKFLOW_MODULES``."""

from __future__ import annotations

import asyncio
from datetime import timedelta

from workflow_engine import RateLimit, workflow

PER_KEY = "test-flow-per-key"
RATE = "test-flow-rate"
FAIR = "test-flow-fair"
UNFAIR = "test-flow-unfair"
HOLDING = "test-flow-holding"
CAPPED = "test-flow-capped"
FAIR_PER_KEY = "test-flow-fair-per-key"
FAIR_RATED = "test-flow-fair-rated"


async def pause(seconds: float) -> float:
    await asyncio.sleep(seconds)
    return seconds


@workflow(PER_KEY, concurrency_key="params.customer", max_per_key=2)
async def per_key(ctx, params):
    await ctx.step("work", pause, params.get("seconds", 0.1))


@workflow(RATE, rate_limit=RateLimit(5, timedelta(seconds=1), key="params.tenant"))
async def rated(ctx, params):
    await ctx.step("work", pause, 0)


@workflow(FAIR, fairness_key="params.tenant")
async def fair(ctx, params):
    await ctx.step("work", pause, params.get("seconds", 0.005))


@workflow(UNFAIR)
async def unfair(ctx, params):
    await ctx.step("work", pause, params.get("seconds", 0.005))


@workflow(HOLDING, concurrency_key="params.customer", max_per_key=1, hold_while_waiting=True)
async def holding(ctx, params):
    await ctx.sleep("nap", params.get("nap", 0.5))
    await ctx.step("work", pause, 0)


@workflow(CAPPED, concurrency=1)
async def capped(ctx, params):
    await ctx.step("work", pause, 0)


@workflow(
    FAIR_PER_KEY, fairness_key="params.tenant", concurrency_key="params.customer", max_per_key=1
)
async def fair_per_key(ctx, params):
    await ctx.step("work", pause, 0)


@workflow(
    FAIR_RATED,
    fairness_key="params.tenant",
    rate_limit=RateLimit(1, timedelta(seconds=60), key="params.customer"),
)
async def fair_rated(ctx, params):
    await ctx.step("work", pause, 0)
