"""Which step a retry runs again (``onceflow_instances.failed_position``): the step
whose failure ended the run, unless the workflow went on after it on its path (a
compensation, an alert step), where running the step again would repeat its side
effect under a history that says its failure was handled (found in review). A
sibling branch of a gather going on is not handling. Fake runtime, as in
``test_replay``."""

from __future__ import annotations

import asyncio
from typing import Any

import pytest

from tests.unit.test_replay import FakeRuntime, context
from workflow_engine.definitions import RetryPolicy
from workflow_engine.errors import NonRetryableError, StepFailed, failed_step_position


class Declined(NonRetryableError):
    pass


def _declined() -> None:
    raise Declined("card declined")


def _ok() -> str:
    return "ok"


def _run(workflow: Any) -> int | None:
    """Run ``workflow(ctx)`` on a fresh history; the failed position its error records."""
    ctx = context(FakeRuntime(RetryPolicy(limit=0)), [])
    with pytest.raises(Exception) as raised:
        asyncio.run(workflow(ctx))
    return failed_step_position(raised.value)


def test_an_uncaught_step_failure_records_its_position():
    async def workflow(ctx: Any) -> None:
        await ctx.step("fetch", _ok)
        await ctx.step("charge", _declined)

    assert _run(workflow) == 1


def test_a_failure_raised_again_without_a_durable_call_in_between_keeps_it():
    async def workflow(ctx: Any) -> None:
        try:
            await ctx.step("charge", _declined)
        except StepFailed:
            raise
        except Declined as exc:
            raise RuntimeError("gave up") from exc

    assert _run(workflow) == 0


def test_a_failure_handled_by_a_durable_call_records_none():
    async def workflow(ctx: Any) -> None:
        try:
            await ctx.step("charge", _declined)
        except Declined:
            await ctx.step("alert", _ok)
            raise

    assert _run(workflow) is None


def test_a_failed_branch_of_a_gather_keeps_its_position_while_its_sibling_went_on():
    async def other(ctx: Any) -> None:
        await ctx.step("a", _ok)
        await ctx.step("b", _ok)  # after the sibling's failure: not its handling

    async def workflow(ctx: Any) -> None:
        await ctx.step("fetch", _ok)
        await ctx.gather(ctx.step("charge", _declined), other(ctx))

    # the gather at position 1 with 2 branches: "charge" at 1, "a" at 2, "b" at 4
    assert _run(workflow) == 1


def test_a_gather_failure_handled_on_the_main_line_records_none():
    async def workflow(ctx: Any) -> None:
        try:
            await ctx.gather(ctx.step("charge", _declined), ctx.step("a", _ok))
        except Declined:
            await ctx.step("refund", _ok)
            raise

    assert _run(workflow) is None
