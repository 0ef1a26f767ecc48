"""A write the database refuses fails only its own instance (issue 23, case 1, engine side).

Real PostgreSQL, an in-process engine. Eleven instances reach their second step at the
same moment (a barrier), so their writes (the first step's checkpoint chained with the
second step's start) share one group-commit batch; one instance's second step has a
~20 kB name, which its index cannot hold (SQLSTATE 54000, raised as an
OperationalError). Before, the whole batch was taken for a database outage: every run
of it was given back and re-claimed, and their first steps ran again. Now the batch is
split, the healthy writes commit once, and the poison instance errors with the
database's reason.
"""

from __future__ import annotations

import asyncio
import contextlib
import logging
import secrets
import time

import pytest
import sqlalchemy as sa

import workflow_engine.definitions
from tests.integration.test_engine import create
from workflow_engine import workflow
from workflow_engine.definitions import REGISTRY
from workflow_engine.engine.runner import EngineRunner

HEALTHY = [f"healthy_{i}" for i in range(10)]
POISON = "poison"
#: Random text does not compress: an index entry of ~10-20 kB, over a page's third.
HUGE_NAME = secrets.token_hex(10_000)

CALLS: dict[tuple[str, str], int] = {}
_together: dict[str, asyncio.Barrier] = {}
_arrived: set[str] = set()


def _count(job_id: str, step: str) -> str:
    CALLS[(job_id, step)] = CALLS.get((job_id, step), 0) + 1
    return step


async def _all_at_once(job_id: str) -> None:
    """The first time each instance gets here, wait for the other ten (at most 10 s)."""
    if job_id in _arrived:
        return
    _arrived.add(job_id)
    with contextlib.suppress(TimeoutError, asyncio.BrokenBarrierError):
        await asyncio.wait_for(_together["second step"].wait(), 10)


@workflow("test-poison-write")
async def poison_write(ctx, params):
    await ctx.step("one", _count, ctx.job_id, "one")
    await _all_at_once(ctx.job_id)
    second = HUGE_NAME if params.get("poison") else "two"
    await ctx.step(second, _count, ctx.job_id, "two")
    return await ctx.step("three", _count, ctx.job_id, "three")


def _rows(db, sql):
    with db.connect() as conn:
        return conn.execute(sa.text(sql)).all()


def _run_engine_until(settings, db, done, timeout: float) -> None:
    """An in-process engine until ``done()`` holds or ``timeout`` passes (the assertions
    after it say what went wrong)."""

    async def main() -> None:
        runner = EngineRunner(
            settings.model_copy(update={"engine_poll_interval_seconds": 0.05}), REGISTRY, db=db
        )
        task = asyncio.create_task(runner.run())
        deadline = time.monotonic() + timeout
        while time.monotonic() < deadline and not await asyncio.to_thread(done):
            await asyncio.sleep(0.05)
        runner.stop()
        await task

    asyncio.run(main())


def test_a_refused_write_fails_its_instance_and_leaves_the_batch_alone(
    settings, db, monkeypatch, caplog
):
    # The name bound (workflow_engine.definitions) would refuse the name before the
    # database sees it; lifted here so the database's own refusal is what is tested.
    monkeypatch.setattr(workflow_engine.definitions, "MAX_STEP_NAME_CHARS", 10**6, raising=False)
    CALLS.clear()
    _arrived.clear()
    _together["second step"] = asyncio.Barrier(len(HEALTHY) + 1)
    for job_id in HEALTHY:
        create(db, job_id, "test-poison-write")
    create(db, POISON, "test-poison-write", {"poison": True})

    # this test's instances only: the sample schedules' ticks run in the same engine
    ours = ", ".join(f"'{job_id}'" for job_id in [*HEALTHY, POISON])

    def settled() -> bool:
        (n,) = _rows(
            db,
            "SELECT count(*) FROM onceflow_instances"
            f" WHERE status IN ('complete', 'errored') AND job_id IN ({ours})",
        )[0]
        return n == len(HEALTHY) + 1

    with caplog.at_level(logging.WARNING, logger="workflow_engine.engine.batcher"):
        _run_engine_until(settings, db, settled, timeout=30)

    instances = {
        r.job_id: r
        for r in _rows(db, "SELECT job_id, status, error, claim_count FROM onceflow_instances")
    }
    for job_id in HEALTHY:
        assert instances[job_id].status == "complete", instances[job_id].error
        assert instances[job_id].claim_count == 1  # never given back nor re-claimed
        for step in ("one", "two", "three"):
            assert CALLS[(job_id, step)] == 1, f"{job_id} ran {step} {CALLS[(job_id, step)]}x"
    healthy = ", ".join(f"'{job_id}'" for job_id in HEALTHY)
    attempts = _rows(
        db, f"SELECT job_id, name, attempts FROM onceflow_steps WHERE job_id IN ({healthy})"
    )
    assert len(attempts) == 3 * len(HEALTHY)
    assert {a.attempts for a in attempts} == {1}

    poison = instances[POISON]
    assert poison.status == "errored"
    assert poison.claim_count == 1  # errored at once, not re-claimed over and over
    assert "SQLSTATE 54000" in poison.error, poison.error
    assert "refused" in poison.error
    assert len(poison.error) < 1000  # the reason, not the statement and its 20 kB value
    assert CALLS[(POISON, "one")] == 1
    assert (POISON, "two") not in CALLS  # the refused step never started
    assert _rows(
        db, "SELECT name, status, attempts FROM onceflow_steps WHERE job_id = 'poison'"
    ) == [("one", "complete", 1)]
    # The poison write shared a batch with healthy ones (else nothing was isolated).
    splits = [r for r in caplog.records if getattr(r, "event", None) == "engine.batch_split"]
    assert [r.args[0] for r in splits if r.args[0] > 1], "no batch held the poison write"


LONG = "n" * 501  # one over the bound: fits an index, but is refused where it enters


@workflow("test-long-names")
async def long_names(ctx, params):
    kind = params["kind"]
    if kind == "step":
        await ctx.step(LONG, _count, ctx.job_id, "long")
    elif kind == "sleep":
        await ctx.sleep(LONG, 0)
    elif kind == "event wait":
        await ctx.wait_for_event(LONG, "approval", timeout=0)
    elif kind == "event type":
        await ctx.wait_for_event("approval", "t" * 201, timeout=0)
    elif kind == "patch":
        await ctx.patched(LONG)
    await ctx.step("after", _count, ctx.job_id, "after")


@pytest.mark.parametrize(
    ("kind", "message"),
    [
        ("step", "step name 'nnn"),
        ("sleep", "sleep name 'nnn"),
        ("event wait", "event name 'nnn"),
        ("event type", "event type 'ttt"),
        ("patch", "patch name 'nnn"),
    ],
)
def test_a_name_over_its_bound_fails_the_instance_where_it_enters(settings, db, kind, message):
    CALLS.clear()
    job_id = f"long_{kind.replace(' ', '_')}"
    create(db, job_id, "test-long-names", {"kind": kind})

    def finished() -> bool:
        rows = _rows(db, f"SELECT status FROM onceflow_instances WHERE job_id = '{job_id}'")
        return rows[0].status in ("complete", "errored")

    _run_engine_until(settings, db, finished, timeout=30)
    (row,) = _rows(db, f"SELECT status, error FROM onceflow_instances WHERE job_id = '{job_id}'")
    assert row.status == "errored", row
    assert message in row.error and "over the limit of" in row.error, row.error
    assert (job_id, "after") not in CALLS
    assert _rows(db, f"SELECT name FROM onceflow_steps WHERE job_id = '{job_id}'") == []
