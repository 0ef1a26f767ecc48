"""The flow-control benchmark's workflow (``onceflow bench engine-flow-control``):
the examples' three no-op steps, with every flow control on. The bench's engines load
this module (``ONCEFLOW_WORKFLOW_MODULES``); it is a tool, not part of the product."""

from __future__ import annotations

from datetime import timedelta
from typing import Any

from workflow_engine import RateLimit, workflow

NAME = "bench-flow-workflow"
#: Keys the bench spreads its jobs over: the per-key limit (customers x max_per_key =
#: 256 slots) and the rate limit (1,000,000 starts/s) are checked on every claim but do
#: not bind at concurrency 64, so the figure is the cost of the checks, not a throttle.
CUSTOMERS = 64
TENANTS = 8


def _noop(n: int) -> int:
    return n


@workflow(
    NAME,
    concurrency_key="params.customer",
    max_per_key=4,
    rate_limit=RateLimit(1_000_000, timedelta(seconds=1), key="params.tenant"),
    fairness_key="params.tenant",
)
async def bench_flow(ctx: Any, params: dict[str, Any]) -> dict[str, Any]:
    for n in range(3):
        await ctx.step(f"step {n + 1}", _noop, n)
    return {"steps": 3}
