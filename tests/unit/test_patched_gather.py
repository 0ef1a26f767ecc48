"""``ctx.patched()`` and ``ctx.gather``: the answer is what the history proves, and a
gather branch, whose empty positions prove nothing, refuses to guess (fake runtime)."""

from __future__ import annotations

import asyncio
from collections.abc import Awaitable, Callable
from typing import Any

from onceflow.vocabulary import StepKind, StepStatus
from tests.unit.test_versions import MarkerRuntime, _ctx, done
from workflow_engine.engine.context import WorkflowContext
from workflow_engine.errors import WorkflowError
from workflow_engine.model import RecordedStep


def running(position: int, name: str) -> RecordedStep:
    return RecordedStep(position, name, StepStatus.RUNNING, 1, None)


def outcome(run: Awaitable[Any]) -> Any:
    """The run's result, or the exception it ended with."""
    try:
        return asyncio.run(run)  # type: ignore[arg-type]
    except Exception as exc:
        return exc


# A gather at position 0 with two branches: branch 0 takes positions 0, 2, 4, ...,
# branch 1 takes 1, 3, 5, ...; the main line resumes at 0 + 2 * (longest branch).
# On the old code branch 0 made one step, branch 1 three: the gather ended at 6, and
# the instance was then in its step "after" (running) when the new code was deployed.
OLD_HISTORY = [
    done(0, "x"),
    done(1, "y1"),
    done(3, "y2"),
    done(5, "y3"),
    running(6, "after"),
]


def patched_branch_flow(ctx: WorkflowContext) -> Callable[[], Awaitable[Any]]:
    """The new code: branch 0 (the shorter one) gained a patched extra step."""

    async def short() -> list[Any]:
        out = [await ctx.step("x", lambda: "x")]
        if await ctx.patched("extra"):
            out.append(await ctx.step("x-extra", lambda: "side effect"))
        return out

    async def long() -> list[Any]:
        return [await ctx.step(f"y{n}", lambda: "y") for n in (1, 2, 3)]

    async def flow() -> Any:
        got = await ctx.gather(short(), long())
        return [got, await ctx.step("after", lambda: "after")]

    return flow


def test_patched_in_a_shorter_branch_of_a_finished_gather_adds_no_step():
    """ccfa842: position 2 (branch 0's next) was empty, so patched() answered True,
    recorded its marker and ran "x-extra" at 4 on an instance whose gather had
    finished on the old code. Now the call is refused: nothing is written or run."""
    rt = MarkerRuntime()
    ended = outcome(patched_branch_flow(_ctx(rt, OLD_HISTORY))())
    assert rt.started == []  # neither the patched step nor anything after the gather
    assert rt.markers == []
    assert isinstance(ended, WorkflowError), ended
    assert "inside a gather branch" in str(ended) and "'extra'" in str(ended)


def test_patched_in_a_branch_of_a_fresh_instance_is_refused_too():
    """Same code, no history: the branch cannot know either (a fresh instance and one
    whose branch ended look alike), so the refusal shows on the first test run."""
    rt = MarkerRuntime()
    ended = outcome(patched_branch_flow(_ctx(rt, []))())
    assert isinstance(ended, WorkflowError) and "inside a gather branch" in str(ended)
    assert rt.markers == []
    assert (2, "x-extra") not in rt.started and (4, "x-extra") not in rt.started


def test_a_branch_answers_what_its_position_holds():
    """Where the branch's position holds an entry, the history does answer: the marker
    (recorded there by an engine from before the refusal) replays True, another entry
    means the branch ran past this point on the old code: False."""
    took = [done(0, "x"), done(1, "y1"), done(2, "extra", StepKind.PATCH), done(3, "y2")]
    took += [done(4, "x-extra"), done(5, "y3"), done(6, "after")]
    rt = MarkerRuntime()
    assert asyncio.run(patched_branch_flow(_ctx(rt, took))()) == [
        [["r-x", "r-x-extra"], ["r-y1", "r-y2", "r-y3"]],
        "r-after",
    ]
    assert rt.markers == [] and rt.started == []

    async def flow(ctx: WorkflowContext) -> Any:
        async def branch() -> list[Any]:
            if await ctx.patched("extra"):
                return [await ctx.step("new", lambda: "new")]
            return [await ctx.step("x", lambda: "old")]

        return await ctx.gather(branch(), ctx.step("y1", lambda: "y"))

    rt = MarkerRuntime()
    assert asyncio.run(flow(_ctx(rt, [done(0, "x"), done(1, "y1")]))) == [["r-x"], "r-y1"]
    assert rt.markers == [] and rt.started == []


def test_asked_on_the_main_line_first_a_branch_gets_the_remembered_answer():
    async def flow(ctx: WorkflowContext) -> Any:
        fixed = await ctx.patched("extra")

        async def branch() -> bool:
            return await ctx.patched("extra")  # remembered: no position, no refusal

        return [fixed, await ctx.gather(branch(), ctx.step("y", lambda: "y"))]

    rt = MarkerRuntime()
    assert asyncio.run(flow(_ctx(rt, []))) == [True, [True, "y"]]
    assert rt.markers == [(0, "extra")]
    assert rt.started == [(2, "y")]  # gather at 1: branch 1 takes 1 + 1


def test_patched_on_the_main_line_before_a_gather_whose_first_branch_recorded_nothing():
    """The documented alternative, ``patched()`` before the gather, is right even when
    the old gather's first branch made no durable call: its base position is empty
    while the rest of the gather and what followed are recorded. ccfa842 took the empty
    position as fresh: True, a marker at 0, and the patched code's step at 1 met the
    old branch 1's entry there (NonDeterminismError)."""

    async def nothing() -> str:
        return "nothing durable"

    async def flow(ctx: WorkflowContext) -> Any:
        extra = []
        if await ctx.patched("before-gather"):
            extra.append(await ctx.step("new", lambda: "new"))
        got = await ctx.gather(nothing(), ctx.step("b", lambda: "b"))
        return [extra, got, await ctx.step("after", lambda: "after")]

    rt = MarkerRuntime()
    old = [done(1, "b"), running(2, "after")]  # gather at 0: branch 0 empty, join 0+2*1
    assert asyncio.run(flow(_ctx(rt, old))) == [[], ["nothing durable", "r-b"], "after"]
    assert rt.markers == []
    assert rt.started == [(2, "after")]
