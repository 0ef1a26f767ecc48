"""Replay returns what history recorded, failures too (issue 23, case 5): a step whose
final failure the workflow caught raises the same error again on replay, from the
history, without running again; the workflow takes the same branch as the first time.
Fake runtime, as in ``test_replay``."""

from __future__ import annotations

import asyncio
from typing import Any

import orjson
import pytest

from onceflow.vocabulary import AttemptOutcome, StepKind, StepStatus
from tests.unit.test_replay import FakeRuntime, context, step
from workflow_engine.definitions import RetryPolicy
from workflow_engine.errors import NonRetryableError, StepFailed
from workflow_engine.model import RecordedStep
from workflow_engine.store.writes import FinishStep


class CardDeclined(NonRetryableError):
    """A step's own non-retryable error, caught by the workflow below."""


def failed(position: int, name: str, result: Any, error: str, attempts: int = 1) -> RecordedStep:
    return RecordedStep(position, name, StepStatus.FAILED, attempts, result, error=error)


def charge_then_compensate(ctx: Any, charge: Any, caught: type[Exception]) -> Any:
    """The issue's workflow: a caught charge failure, a compensation, a sleep, a step."""

    async def workflow() -> tuple[str, str]:
        try:
            outcome = await ctx.step("charge", charge)
        except caught as exc:
            outcome = f"caught {type(exc).__name__}: {exc}"
            await ctx.step("refund", lambda: "refunded")
        await ctx.sleep("cool down", 60)
        return outcome, await ctx.step("notify", lambda: "notified")

    return workflow


def recorded_run(charge: Any, caught: type[Exception]) -> list[RecordedStep]:
    """Run the workflow's first claim live (up to its sleep); the history it recorded."""
    rt = FakeRuntime(RetryPolicy(limit=0))
    asyncio.run(_until_sleep(context(rt, []), charge, caught))
    finishes = [w for w in rt.writes if isinstance(w, FinishStep)]
    history = []
    for w in finishes:
        status = StepStatus.FAILED if w.outcome == AttemptOutcome.FAILED else StepStatus.COMPLETE
        result = orjson.loads(w.result) if w.result is not None else None
        name = "charge" if w.position == 0 else "refund"
        history.append(RecordedStep(w.position, name, status, 1, result, error=w.error))
    return history


async def _until_sleep(ctx: Any, charge: Any, caught: type[Exception]) -> None:
    try:
        await ctx.step("charge", charge)
    except caught:
        await ctx.step("refund", lambda: "refunded")
    await ctx.flush()  # what the runner does before it suspends at the sleep


def test_a_caught_step_failure_is_raised_again_on_replay_without_running_the_step():
    ran: list[str] = []

    def charge() -> str:  # the second run would succeed: the double charge
        ran.append("charge")
        return "charged"

    history = [
        failed(
            0,
            "charge",
            {
                "raised": "StepFailed",
                "type": "builtins:ValueError",
                "message": "step 'charge' failed after 1 attempts: ValueError: network down",
            },
            "ValueError: network down",
        ),
        step(1, "refund", "refunded"),
        RecordedStep(2, "cool down", StepStatus.COMPLETE, 1, None, StepKind.SLEEP),
    ]
    rt = FakeRuntime()
    ctx = context(rt, history)
    outcome, notified = asyncio.run(charge_then_compensate(ctx, charge, StepFailed)())
    assert ran == []  # not run again
    assert outcome == (
        "caught StepFailed: step 'charge' failed after 1 attempts: ValueError: network down"
    )
    assert notified == "notified"
    assert [w.position for w in rt.writes] == [3]  # only the new step was started


def test_a_replayed_step_failure_carries_its_cause_type():
    history = [
        failed(
            0,
            "charge",
            {"raised": "StepFailed", "type": "builtins:TimeoutError", "message": "m"},
            "TimeoutError: slow",
        )
    ]
    ctx = context(FakeRuntime(), history)
    with pytest.raises(StepFailed, match=r"^m$") as raised:
        asyncio.run(ctx.step("charge", lambda: "charged"))
    assert raised.value.cause_type == "builtins:TimeoutError"


def test_a_caught_non_retryable_error_is_raised_again_as_its_own_class():
    history = [
        failed(
            0,
            "charge",
            {"raised": "NonRetryableError", "type": f"{__name__}:CardDeclined", "message": "no"},
            "CardDeclined: no",
        )
    ]
    ctx = context(FakeRuntime(), history)
    with pytest.raises(CardDeclined, match=r"^no$"):
        asyncio.run(ctx.step("charge", lambda: "charged"))


def test_a_non_retryable_error_of_a_class_not_loaded_is_raised_as_non_retryable():
    record = {"raised": "NonRetryableError", "type": "gone.module:Declined", "message": "no"}
    ctx = context(FakeRuntime(), [failed(0, "charge", record, "Declined: no")])
    with pytest.raises(NonRetryableError, match=r"^no$") as raised:
        asyncio.run(ctx.step("charge", lambda: "charged"))
    assert type(raised.value) is NonRetryableError


def test_a_failed_step_recorded_without_a_failure_record_replays_as_step_failed():
    """Entries written before failure records existed: the StepFailed of that time."""
    ctx = context(FakeRuntime(), [failed(0, "charge", None, "ValueError: down", attempts=3)])
    with pytest.raises(StepFailed) as raised:
        asyncio.run(ctx.step("charge", lambda: "charged"))
    assert str(raised.value) == "step 'charge' failed after 3 attempts: ValueError: down"


@pytest.mark.parametrize("error", [ValueError("network down"), CardDeclined("card declined")])
def test_what_a_live_failure_records_replays_as_the_same_error(error: Exception):
    """The round trip: the record the live run writes makes replay raise what the
    workflow saw live, and take the same branch."""
    caught: type[Exception] = StepFailed if isinstance(error, ValueError) else CardDeclined

    def charge() -> str:
        raise error

    history = recorded_run(charge, caught)
    assert [(e.name, e.status) for e in history] == [
        ("charge", StepStatus.FAILED),
        ("refund", StepStatus.COMPLETE),
    ]
    history.append(RecordedStep(2, "cool down", StepStatus.COMPLETE, 1, None, StepKind.SLEEP))
    ran: list[str] = []

    def charge_again() -> str:
        ran.append("charge")
        return "charged"

    ctx = context(FakeRuntime(), history)
    outcome, _ = asyncio.run(charge_then_compensate(ctx, charge_again, caught)())
    assert ran == []
    live = "step 'charge' failed after 1 attempts: ValueError: network down"
    assert outcome == f"caught {caught.__name__}: {live if caught is StepFailed else error}"
