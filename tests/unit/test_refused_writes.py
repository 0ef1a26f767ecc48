"""A write the database refused for good (``DatabaseRefused``) ends its run errored with
the reason, and says whether the checkpoint it carried committed (issue 23, case 1):
without that, a refused checkpoint left the run "broken", its finish was refused too,
and the instance waited for a lease expiry, a rescue and the same refusal again."""

from __future__ import annotations

import asyncio
import contextlib
from concurrent.futures import ThreadPoolExecutor
from datetime import UTC, datetime
from typing import Any, TypeVar, cast

import pytest

from onceflow.vocabulary import InstanceStatus
from workflow_engine.clock import FakeClock
from workflow_engine.engine.context import WorkflowContext
from workflow_engine.engine.runtime import Runtime
from workflow_engine.errors import DatabaseRefused
from workflow_engine.store.writes import Chain, FinishInstance, Lease, Started, StartStep, Write

STEP_THREADS = ThreadPoolExecutor(4, thread_name_prefix="test-steps")
T = TypeVar("T")
AT = datetime(2025, 1, 1, tzinfo=UTC)


class RefusingRuntime:
    """Answers every write, except the chain carrying the start of step ``"two"``,
    which it refuses as ``write_each`` would: after its checkpoint committed, or not."""

    owner = "test-engine"
    max_result_bytes = 1000
    step_executor = STEP_THREADS  # sync steps' threads, shared by the test runs
    default_retry = None

    def __init__(self, checkpoint_committed: bool) -> None:
        self.clock = FakeClock(AT)
        self.checkpoint_committed = checkpoint_committed
        self.finished: list[FinishInstance] = []

    async def write(self, write: Write[T]) -> T:
        refused = isinstance(write, Chain) and isinstance(write.then, StartStep)
        if refused and cast(StartStep, cast(Chain[Any], write).then).name == "two":
            raise DatabaseRefused(
                "the database refused the start of step 'two': SQLSTATE 54000: too big",
                checkpoint_committed=self.checkpoint_committed,
            )
        if isinstance(write, FinishInstance):
            self.finished.append(write)
        if isinstance(write, StartStep | Chain):
            return cast(T, Started(1, AT, 1))
        return cast(T, None)

    async def call_db(self, fn: Any, *args: Any, **kwargs: Any) -> Any:
        raise AssertionError(f"not expected here: {fn.__name__}")


def _context(rt: RefusingRuntime) -> WorkflowContext:
    runtime: Runtime = rt  # the type checker verifies the fake against the protocol
    return WorkflowContext(runtime, Lease("test-engine", 1), "job-1", "orders", [])


@pytest.mark.parametrize("checkpoint_committed", [True, False])
def test_a_refused_write_fails_the_run_and_its_finish_still_goes(checkpoint_committed) -> None:
    rt = RefusingRuntime(checkpoint_committed)
    ctx = _context(rt)

    async def run() -> None:
        await ctx.step("one", lambda: 1)
        with pytest.raises(DatabaseRefused):
            await ctx.step("two", lambda: 2)
        # the runner's finish after a Failed outcome
        await ctx.commit(FinishInstance("job-1", 1, InstanceStatus.ERRORED, error="refused"))

    asyncio.run(run())
    assert [f.status for f in rt.finished] == [InstanceStatus.ERRORED]


def test_a_refused_checkpoint_errors_the_instance_even_if_the_workflow_goes_on() -> None:
    """The workflow caught the refusal and returned: its last step's checkpoint will
    never commit, so the instance ends errored with the refusal, not complete."""
    rt = RefusingRuntime(checkpoint_committed=False)
    ctx = _context(rt)

    async def run() -> None:
        await ctx.step("one", lambda: 1)
        with contextlib.suppress(DatabaseRefused):  # the workflow swallows it
            await ctx.step("two", lambda: 2)
        await ctx.commit(FinishInstance("job-1", 1, InstanceStatus.COMPLETE, result=b"3"))

    asyncio.run(run())
    (finish,) = rt.finished
    assert finish.status == InstanceStatus.ERRORED
    assert finish.result is None
    assert "SQLSTATE 54000" in (finish.error or "")
