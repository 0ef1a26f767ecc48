"""The sample ``checkout-workflow``: fan-out to one child workflow per item, fan-in.

Each item is charged by its own ``card-charge-workflow`` instance (its job id is
``<checkout job id>__charge-<n>``), so a charge has its own retries, history, describe
and trace; the checkout waits for all of them without holding a worker, and one
declined card raises :class:`~workflow_engine.errors.ChildWorkflowFailed` in the
checkout, which refunds what was charged (a gather of steps).

    POST /v1/jobs {"workflow": "checkout-workflow", "job_id": "cart_42",
                   "params": {"items": [{"amount": 1200}, {"amount": 300}]}}
"""

from __future__ import annotations

from typing import Any

from workflow_engine.definitions import Context, RetryPolicy, workflow
from workflow_engine.errors import ChildWorkflowFailed, NonRetryableError
from workflow_engine.steps import current_step

_RETRY = RetryPolicy(limit=3, delay=0.2)


def _charge_card(amount: int, declined: bool) -> dict[str, Any]:
    """The pretend payment provider, called with the step's idempotency key."""
    if declined:
        raise NonRetryableError(f"card declined for {amount}")
    return {"amount": amount, "charge_id": current_step().idempotency_key}


def _refund(charge: dict[str, Any]) -> dict[str, Any]:
    return {"refunded": charge["charge_id"]}


@workflow("card-charge-workflow")
async def card_charge(ctx: Context, params: dict[str, Any]) -> dict[str, Any]:
    amount = int(params["amount"])
    return await ctx.step(
        "charge card", _charge_card, amount, bool(params.get("declined")), retries=_RETRY
    )


@workflow("checkout-workflow")
async def checkout(ctx: Context, params: dict[str, Any]) -> dict[str, Any]:
    items = params.get("items", [])
    handles = await ctx.gather(
        *(
            ctx.start_child("card-charge-workflow", f"charge-{n}", item)
            for n, item in enumerate(items)
        )
    )
    outcomes = await ctx.gather(*(_settled(ctx, handle) for handle in handles))
    charges = [o for o in outcomes if "charge_id" in o]
    if len(charges) < len(items):
        # Compensate: refund the charges that went through, concurrently, once each.
        await ctx.gather(*(ctx.step(f"refund {c['charge_id']}", _refund, c) for c in charges))
        return {"status": "declined", "refunded": len(charges)}
    return {"status": "paid", "total": sum(c["amount"] for c in charges)}


async def _settled(ctx: Context, handle: Any) -> dict[str, Any]:
    """A child's result, or its failure as a value (so the gather sees every charge)."""
    try:
        return await ctx.child_result(handle)
    except ChildWorkflowFailed as failed:
        return {"failed": failed.child_job_id, "error": failed.error}
