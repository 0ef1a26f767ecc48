"""Replay of ``ctx.gather`` branches and child workflows, with a fake runtime."""

from __future__ import annotations

import asyncio
from datetime import timedelta
from typing import Any

import pytest

from onceflow.vocabulary import InstanceStatus, StepKind, StepStatus
from tests.unit.test_replay import LEASE, FakeRuntime, _runtime, context, never, step
from workflow_engine.definitions import ChildHandle
from workflow_engine.engine.branches import Cursor, merge_waits
from workflow_engine.engine.context import WorkflowContext
from workflow_engine.errors import ChildWorkflowFailed, NonDeterminismError, Suspend
from workflow_engine.model import RecordedStep
from workflow_engine.store import writes
from workflow_engine.store.writes import StartStep


async def _slow(value: str, delay: float) -> str:
    await asyncio.sleep(delay)
    return value


def _gather_steps(ctx):
    async def two_in_a_row() -> list[str]:
        first = await ctx.step("c1", _slow, "c1", 0.0)
        return [first, await ctx.step("c2", _slow, "c2", 0.0)]

    async def workflow() -> list[Any]:
        got = await ctx.gather(
            ctx.step("a", _slow, "a", 0.03),  # finishes last
            ctx.step("b", _slow, "b", 0.0),
            two_in_a_row(),
        )
        return [got, await ctx.step("after", _slow, "after", 0.0)]

    return workflow


def test_gather_gives_each_branch_its_own_positions_whatever_order_they_finish_in():
    rt = FakeRuntime()
    result = asyncio.run(_gather_steps(context(rt, []))())
    assert result == [["a", "b", ["c1", "c2"]], "after"]
    started = {w.name: w.position for w in rt.writes if isinstance(w, StartStep)}
    # gather at 0 with 3 branches: branch i takes 0+i, 3+i, ...; after it: 0 + 3*2 = 6.
    assert started == {"a": 0, "b": 1, "c1": 2, "c2": 5, "after": 6}


def test_a_replayed_gather_runs_nothing_again():
    rt = FakeRuntime()
    history = [
        step(0, "a", "a"),
        step(1, "b", "b"),
        step(2, "c1", "c1"),
        step(5, "c2", "c2"),
        step(6, "after", "after"),
    ]
    ctx = context(rt, history)

    async def workflow() -> list[Any]:
        async def two_in_a_row() -> list[str]:
            return [await ctx.step("c1", never), await ctx.step("c2", never)]

        got = await ctx.gather(ctx.step("a", never), ctx.step("b", never), two_in_a_row())
        return [got, await ctx.step("after", never)]

    assert asyncio.run(workflow()) == [["a", "b", ["c1", "c2"]], "after"]
    assert rt.writes == []


def test_a_branch_asking_for_another_step_than_recorded_is_non_determinism():
    rt = FakeRuntime()
    ctx = context(rt, [step(0, "a", "a"), step(1, "b", "b")])

    async def workflow() -> Any:
        return await ctx.gather(ctx.step("b", never), ctx.step("a", never))

    with pytest.raises(NonDeterminismError):
        asyncio.run(workflow())


def test_nested_gathers_compose_their_positions():
    outer = Cursor()
    branches = outer.split(2)  # positions 0, 2, 4... and 1, 3, 5...
    inner = branches[1].split(3)  # in branch 1 at its local 0: 1, 7, 13..; 3, 9..; 5, 11..
    assert [c.take() for c in inner] == [1, 3, 5]
    assert inner[0].take() == 7
    branches[1].join(inner)  # longest inner branch took 2: branch 1 resumes at local 6
    assert branches[1].take() == 13
    outer.join(branches)
    assert outer.take() == 2 * 7  # branch 1 took 7 local positions


def test_gather_waits_for_every_branch_then_suspends_until_the_earliest_wake():
    rt = FakeRuntime()
    ctx = context(rt, [])
    finished: list[str] = []

    async def sleeps_then_fails() -> None:
        raise Suspend(InstanceStatus.SLEEPING, None, delay=60)

    async def done_later() -> str:
        await asyncio.sleep(0.02)
        finished.append("later")
        return "x"

    async def waits() -> None:
        raise Suspend(InstanceStatus.WAITING, None)

    with pytest.raises(Suspend) as got:
        asyncio.run(ctx.gather(sleeps_then_fails(), done_later(), waits()))
    assert finished == ["later"]  # the other branches ran to the end first
    assert got.value.status == InstanceStatus.WAITING  # an event or child: wake on it
    assert got.value.wake_at == rt.clock.db_now() + timedelta(seconds=60)


def test_a_failed_branch_is_raised_after_the_others_settle():
    rt = FakeRuntime()
    ctx = context(rt, [])
    finished: list[str] = []

    async def fails() -> None:
        raise ValueError("boom")

    async def ok() -> str:
        await asyncio.sleep(0.01)
        finished.append("ok")
        return "ok"

    with pytest.raises(ValueError, match="boom"):
        asyncio.run(ctx.gather(fails(), ok()))
    assert finished == ["ok"]


def test_merge_of_waits_without_a_time_waits_until_woken():
    merged = merge_waits([Suspend(InstanceStatus.WAITING, None)], rt_now())
    assert merged.status == InstanceStatus.WAITING and merged.wake_at is None


def rt_now():
    return FakeRuntime().clock.db_now()


def child_entry(position: int, name: str, status: StepStatus, result: Any, error=None):
    return RecordedStep(position, name, status, 0, result, StepKind.CHILD, None, error)


def test_a_recorded_child_is_not_started_again_and_its_result_is_replayed():
    rt = FakeRuntime()
    ctx = context(rt, [child_entry(0, "charge", StepStatus.COMPLETE, {"ok": 1})])

    async def workflow() -> Any:
        handle = await ctx.start_child("charge-workflow", "charge", {"amount": 5})
        assert handle == ChildHandle("job-1__charge", "charge", "charge-workflow", 0)
        return await ctx.child_result(handle)

    assert asyncio.run(workflow()) == {"ok": 1}
    assert rt.db_calls == [] and rt.writes == []


def test_a_recorded_child_failure_raises_in_the_parent_with_the_childs_error():
    rt = FakeRuntime()
    history = [
        child_entry(0, "charge", StepStatus.FAILED, {"child_status": "errored"}, "card declined")
    ]
    ctx = context(rt, history)

    async def workflow() -> Any:
        return await ctx.child_result(await ctx.start_child("charge-workflow", "charge"))

    with pytest.raises(ChildWorkflowFailed) as got:
        asyncio.run(workflow())
    assert (got.value.child_job_id, got.value.status, got.value.error) == (
        "job-1__charge",
        "errored",
        "card declined",
    )


def test_a_recorded_child_is_the_one_the_history_names_whatever_the_derivation():
    """The history decides which child an entry started: a run-2 parent whose entry was
    recorded as ``job-1__charge`` (started before children were scoped to the run) keeps
    taking that child, on the handle and in a replayed failure; the derived id (here
    ``job-1__charge~run2``) is for children not yet started."""
    rt = FakeRuntime()
    recorded = RecordedStep(
        0,
        "charge",
        StepStatus.FAILED,
        0,
        {"child_status": "errored"},
        StepKind.CHILD,
        None,
        "declined",
        "job-1__charge",
    )
    ctx = WorkflowContext(_runtime(rt), LEASE, "job-1", "orders", [recorded], run=2)

    async def workflow() -> Any:
        handle = await ctx.start_child("charge-workflow", "charge")
        assert handle.job_id == "job-1__charge"
        return await ctx.child_result(handle)

    with pytest.raises(ChildWorkflowFailed) as got:
        asyncio.run(workflow())
    assert got.value.child_job_id == "job-1__charge"
    assert rt.writes == []  # nothing started


def test_a_step_recorded_where_a_child_is_asked_for_is_non_determinism():
    rt = FakeRuntime()
    ctx = context(rt, [step(0, "charge", 1)])
    with pytest.raises(NonDeterminismError):
        asyncio.run(ctx.start_child("charge-workflow", "charge"))


@pytest.mark.parametrize("name", ["a__b", "_a", "a_", "a/b", "", "a b"])
def test_child_names_that_could_make_two_children_share_an_id_are_refused(name):
    with pytest.raises(ValueError):
        writes.child_job_id("job_1", name)


def test_child_ids_are_valid_job_ids_and_split_back_uniquely():
    assert writes.child_job_id("job_1", "charge-2") == "job_1__charge-2"
    assert writes.child_job_id("job_", "b") == "job___b"  # parent ending in '_'
    assert writes.child_job_id("job", "_b".lstrip("_")) != writes.child_job_id("job_", "b")
    with pytest.raises(ValueError, match="100 characters"):
        writes.child_job_id("p" * 95, "toolong")


def test_a_later_run_of_a_reused_id_has_children_of_its_own():
    """Run 2's child is not run 1's (``~`` is in neither a client id nor a child name,
    so no other pair gives it), and a long id is measured as a derived one."""
    assert writes.child_job_id("job_1", "charge", 1) == "job_1__charge"
    assert writes.child_job_id("job_1", "charge", 2) == "job_1__charge~run2"
    assert writes.child_job_id("p" * 95, "toolong", 3) == "p" * 95 + "__toolong~run3"


def test_a_schedule_tick_may_start_children():
    """A tick's job id (``<schedule>@<instant>``) has ``@`` and ``:``, which client ids
    may not: its children's ids keep them (no client id can collide with one)."""
    tick = "nightly@2026-11-30T06:00:00Z"
    assert writes.child_job_id(tick, "c1") == f"{tick}__c1"
    grandchild = writes.child_job_id(f"{tick}__c1", "c2")
    assert grandchild == f"{tick}__c1__c2"
    with pytest.raises(ValueError, match="200 characters"):
        writes.child_job_id("n" * 80 + "@2026-11-30T06:00:00Z", "x" * 100)
