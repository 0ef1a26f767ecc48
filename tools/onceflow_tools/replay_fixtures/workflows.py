"""The ``golden-*`` workflows the replay fixtures record (:mod:`.record`) and the unit
test replays: small, each crossing one part of replay that the samples do not (a caught
step failure, a sleep and an event, a gather, a patch marker).

They are frozen with their fixtures: changing one changes its version (its
fingerprint) and its history, so record its fixture again in the same change.
"""

from __future__ import annotations

from typing import Any

from workflow_engine import NonRetryableError, RetryPolicy, StepFailed, workflow
from workflow_engine.definitions import Context

#: Every execution of a ``golden-*`` step in this process: (job id, step name). The
#: replay test checks that replaying a history adds none.
CALLS: list[tuple[str, str]] = []


def _did(job_id: str, step: str, value: Any) -> Any:
    CALLS.append((job_id, step))
    return value


class CardDeclined(NonRetryableError):
    """The golden charge's own error: replay must raise this class again, or the
    workflow's ``except CardDeclined`` does not take the branch it took live."""


def _decline(job_id: str) -> None:
    CALLS.append((job_id, "charge"))
    raise CardDeclined("card declined")


def _mail_down(job_id: str) -> None:
    CALLS.append((job_id, "notify"))
    raise OSError("mail server down")


@workflow("golden-caught-failure")
async def golden_caught_failure(ctx: Context, params: dict[str, Any]) -> dict[str, Any]:
    """Two step failures the workflow catches (a ``NonRetryableError`` subclass and a
    ``StepFailed`` once retries are spent), a compensation, then a long sleep."""
    job = ctx.job_id
    try:
        charged = await ctx.step("charge", _decline, job)
    except CardDeclined as exc:
        charged = await ctx.step("refund", _did, job, "refund", f"refunded: {exc}")
    try:
        notified = await ctx.step("notify", _mail_down, job, retries=RetryPolicy(limit=0))
    except StepFailed as exc:
        notified = str(exc)
    await ctx.sleep("cool down", 3600)
    return {"charged": charged, "notified": notified}


@workflow("golden-waits")
async def golden_waits(ctx: Context, params: dict[str, Any]) -> dict[str, Any]:
    """A step, a durable sleep, an event wait with a time-out, a step using the event."""
    job = ctx.job_id
    prepared = await ctx.step("prepare", _did, job, "prepare", {"order": params["order"]})
    await ctx.sleep("cool off", 60)
    decision = await ctx.wait_for_event("approval", type="approved", timeout=3600)
    done = await ctx.step("fulfil", _did, job, "fulfil", {"by": decision["by"]})
    return {"prepared": prepared, "fulfilled": done}


@workflow("golden-gather")
async def golden_gather(ctx: Context, params: dict[str, Any]) -> dict[str, Any]:
    """A gather of two steps and a branch of two steps in a row, then a step after it."""
    job = ctx.job_id

    async def two_in_a_row() -> list[Any]:
        first = await ctx.step("c1", _did, job, "c1", "c1 done")
        return [first, await ctx.step("c2", _did, job, "c2", "c2 done")]

    got = await ctx.gather(
        ctx.step("a", _did, job, "a", "a done"),
        ctx.step("b", _did, job, "b", "b done"),
        two_in_a_row(),
    )
    after = await ctx.step("after", _did, job, "after", len(got))
    return {"branches": got, "after": after}


@workflow("golden-patched")
async def golden_patched(ctx: Context, params: dict[str, Any]) -> dict[str, Any]:
    """A step, a ``ctx.patched`` marker taken (recorded), the patched step."""
    job = ctx.job_id
    reserved = await ctx.step("reserve", _did, job, "reserve", "reserved")
    if await ctx.patched("tax-fix"):
        charged = await ctx.step("charge with tax", _did, job, "charge with tax", 121)
    else:
        charged = await ctx.step("charge", _did, job, "charge", 100)
    return {"reserved": reserved, "charged": charged}
