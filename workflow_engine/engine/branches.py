"""Deterministic history positions for concurrent branches (``ctx.gather``).

Replay matches each durable call to its recorded entry by position, so positions must
not depend on which branch happened to run first. Each branch of a gather therefore
gets its own :class:`Cursor`: the gather at local index ``b`` of its cursor, with ``n``
branches, gives branch ``i`` the positions ``b + i + n*k`` (k = 0, 1, ...) of that
cursor, i.e. an affine map ``offset + stride*k`` onto the instance's positions. A
branch may itself gather (the maps compose), and may be any coroutine (several steps
in a row, a sleep, a child): the k-th durable call *within* a branch always lands on
the same position. After the gather, its cursor resumes past the longest branch.

Branches run until all have settled; their outcomes combine by :func:`settle`. What
they ask of the database in the same turn is coalesced (:class:`Coalescer`).
"""

from __future__ import annotations

import asyncio
import contextvars
from collections.abc import Awaitable, Callable, Sequence
from dataclasses import dataclass
from datetime import datetime, timedelta
from typing import Any, Generic, TypeVar

from onceflow.vocabulary import InstanceStatus
from workflow_engine.errors import ControlRequested, LeaseLost, Suspend, WorkflowError

ItemT = TypeVar("ItemT")
ResultT = TypeVar("ResultT")

#: ``onceflow_steps.position`` is an ``integer``.
MAX_POSITION = 2**31 - 1


class GatherTooDeep(WorkflowError):
    """Nested gathers multiplied the position stride past what a position can hold."""


class PatchedInBranch(WorkflowError):
    """``ctx.patched()`` asked inside a gather branch where the history cannot answer.

    A branch's positions are sparse (``offset + stride*k``), and a branch that ended
    early on the old code leaves its later positions empty for good, while the main
    line goes on at positions no branch lattice tells apart from a branch's. So an
    empty position inside a branch means "not reached yet" or "ended before it, the
    gather is long finished": answering True there would add a step to an instance
    that already ran past the patch point. The call is refused instead; ask on the
    main line before the gather (README, "Deploying new workflow code")."""

    def __init__(self, patch_id: str) -> None:
        super().__init__(
            f"ctx.patched({patch_id!r}) inside a gather branch: replay cannot tell whether"
            " this branch ran past that point on the old code; call ctx.patched() on the"
            " main line before ctx.gather and choose the branches there"
        )
        self.patch_id = patch_id


@dataclass(slots=True)
class Cursor:
    """The next position of one branch (or of the workflow's main line).

    ``path`` names the branch for the keys of the values it emits (``ctx.emit``):
    ``""`` on the main line, then ``/<gather>.<branch>`` per level, where ``<gather>``
    counts the gathers its parent cursor started. Positions alone cannot key an emit:
    a branch that ends with an emit would key it at a position the main line takes
    after the gather, and a gather whose branches take no position leaves its parent
    where it was (found in design review). A branch's path and its local index are
    unique however branches nest, and replay, running the same code, finds them again.
    """

    offset: int = 0
    stride: int = 1
    next: int = 0  # local index of the next durable call
    path: str = ""
    gathers: int = 0  # gathers this cursor has started
    emit_at: int = -1  # ``next`` at the last emit
    emits: int = 0  # emits since ``next`` was ``emit_at``

    def peek(self) -> int:
        position = self.offset + self.stride * self.next
        if position > MAX_POSITION:
            raise GatherTooDeep(f"history position {position} is past {MAX_POSITION}")
        return position

    def take(self) -> int:
        position = self.peek()
        self.next += 1
        return position

    def split(self, n: int) -> list[Cursor]:
        """The cursors of ``n`` branches starting at this cursor's next index."""
        base = self.offset + self.stride * self.next
        gather = f"{self.path}/{self.gathers}"
        self.gathers += 1
        return [
            Cursor(base + self.stride * i, self.stride * n, path=f"{gather}.{i}") for i in range(n)
        ]

    def emit_slot(self) -> str:
        """Where the next emit of this branch is in its code: its path, its local index
        and how many emits came before it at that index (a key replay finds again)."""
        if self.emit_at != self.next:
            self.emit_at, self.emits = self.next, 0
        slot = f"{self.path}@{self.next}#{self.emits}"
        self.emits += 1
        return slot

    def join(self, branches: Sequence[Cursor]) -> None:
        """Resume past the longest branch (``n * longest`` local indexes)."""
        self.next += len(branches) * max((b.next for b in branches), default=0)


#: (the context the branch belongs to, its cursor), set inside each branch's task.
BRANCH: contextvars.ContextVar[tuple[object, Cursor] | None] = contextvars.ContextVar(
    "onceflow_branch", default=None
)


@dataclass(frozen=True, slots=True)
class Raised:
    """A branch that ended by raising (kept until every branch has settled)."""

    error: BaseException


async def run_branch(owner: object, cursor: Cursor, awaitable: Awaitable[Any]) -> Any:
    """Run one branch in its own task with its own cursor; capture how it ended."""
    BRANCH.set((owner, cursor))
    try:
        return await awaitable
    except Exception as exc:
        return Raised(exc)
    except (Suspend, ControlRequested) as exc:
        return Raised(exc)


def settle(outcomes: Sequence[Any], now: datetime) -> list[Any]:
    """Combine settled branches: an operator's request or a lost lease stops the run;
    else the first error (in branch order) is raised; else, if any branch must wait,
    the instance suspends until the earliest of their wake-ups (a branch woken too
    early re-suspends on replay, so the earliest is always safe); else the results."""
    raised = [o.error for o in outcomes if isinstance(o, Raised)]
    for error in raised:
        if isinstance(error, (ControlRequested, LeaseLost)):
            raise error
    for error in raised:
        if not isinstance(error, Suspend):
            raise error
    waits = [e for e in raised if isinstance(e, Suspend)]
    if waits:
        raise merge_waits(waits, now)
    return list(outcomes)


def merge_waits(waits: Sequence[Suspend], now: datetime) -> Suspend:
    """One suspension for several waiting branches: waiting (events, children) if any
    branch waits, else sleeping; until the earliest wake-up (none: until woken)."""
    status = (
        InstanceStatus.WAITING
        if any(w.status == InstanceStatus.WAITING for w in waits)
        else InstanceStatus.SLEEPING
    )
    times: list[datetime] = []
    for w in waits:
        if w.delay is not None:
            times.append(now + timedelta(seconds=w.delay))
        elif isinstance(w.wake_at, datetime):
            times.append(w.wake_at)
    return Suspend(status, min(times) if times else None)


class Coalescer(Generic[ItemT, ResultT]):
    """Calls that concurrent branches make in the same event-loop turn (the N
    ``start_child`` or ``child_result`` of one gather) go to the database as one call:
    one transaction and one commit instead of N, one after another.

    The flush is given with each call, not kept: a Coalescer that held its owner's bound
    method would make every workflow context a reference cycle, which only the cyclic
    garbage collector frees, together with everything the context reaches (found in
    issue 23's engine profile: a third of the engine's loop time per workflow went to
    collecting them).
    """

    def __init__(self) -> None:
        self._items: list[ItemT] = []
        self._futures: list[asyncio.Future[ResultT]] = []
        self._running: set[asyncio.Task[None]] = set()

    async def submit(
        self, item: ItemT, flush: Callable[[list[ItemT]], Awaitable[list[ResultT]]]
    ) -> ResultT:
        """``item``'s result from ``flush``, called once with every item of this turn
        (the first call's ``flush``: the calls of one Coalescer all give the same)."""
        loop = asyncio.get_running_loop()
        future: asyncio.Future[ResultT] = loop.create_future()
        if not self._items:  # the first of this turn: flush after the others join
            loop.call_soon(self._start, flush)
        self._items.append(item)
        self._futures.append(future)
        return await future

    def _start(self, flush: Callable[[list[ItemT]], Awaitable[list[ResultT]]]) -> None:
        items, futures = self._items, self._futures
        self._items, self._futures = [], []
        task = asyncio.ensure_future(self._apply(flush, items, futures))
        self._running.add(task)
        task.add_done_callback(self._running.discard)

    @staticmethod
    async def _apply(
        flush: Callable[[list[ItemT]], Awaitable[list[ResultT]]],
        items: list[ItemT],
        futures: list[asyncio.Future[ResultT]],
    ) -> None:
        try:
            results = await flush(items)
        except BaseException as exc:  # LeaseLost, ControlRequested...: every caller's
            for future in futures:
                if not future.done():
                    future.set_exception(exc)
            return
        for future, result in zip(futures, results, strict=True):
            if not future.done():
                future.set_result(result)
