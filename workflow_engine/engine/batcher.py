"""Group commit for the engine's checkpoints.

Every in-flight instance of an engine sends its lease-guarded writes (``StartStep``,
``FinishStep``, ``FinishInstance``, and the engine's ``Heartbeat``; see
:mod:`workflow_engine.store.writes`) here instead of committing each on its own. A
single writer takes everything pending, applies it in one transaction (one multi-row
statement per class of write, see :func:`workflow_engine.store.writes.execution.write_batch`)
and only then wakes the instances whose writes it carried. Durability is unchanged —
nobody proceeds before its checkpoint is committed — but a hundred instances pay for
one commit and a handful of round trips instead of a hundred of each, and no engine
thread sits in ``COMMIT``.

While one batch commits the next one fills up, so batches grow with load by themselves
(no timer, no added latency at light load). ``writers`` batches may be in flight at once
(each on its own connection, so PostgreSQL works on them in parallel); they never touch
the same rows, because an instance has at most one write pending. The heartbeat is the
exception — it touches every leased row (``Write.runs_alone``) — so a batch carrying it
runs alone.

If a batch fails (a step name used twice in one run violates a unique constraint, a
value too large for its index, say), its writes are applied again one at a time, so
only the culprit's instance gets the error. Only a database that cannot answer (by
SQLSTATE: :func:`workflow_engine.store.db.is_transient`) fails every write of the batch.
"""

from __future__ import annotations

import asyncio
import logging
from collections.abc import Sequence
from dataclasses import dataclass
from typing import Any, Protocol, TypeVar, cast

from sqlalchemy.engine import Engine

from onceflow.service_config import require_positive
from workflow_engine.engine.metrics import WRITE_BATCH_SIZE
from workflow_engine.store import is_transient, refusal, sqlstate
from workflow_engine.store.writes import (
    Answer,
    Chain,
    Write,
    error_answer,
    write_batch,
    write_each,
)

log = logging.getLogger(__name__)
T = TypeVar("T")


class WriteStore(Protocol):
    """Where batches go: one transaction for all, or one transaction per write."""

    async def apply_batch(self, writes: Sequence[Write[Any]]) -> list[Answer]: ...

    async def apply_each(self, writes: Sequence[Write[Any]]) -> list[Answer]: ...


@dataclass(frozen=True)
class PostgresWrites:
    """The engine's :class:`WriteStore`: the store's SQL, run off the event loop."""

    db: Engine
    owner: str

    async def apply_batch(self, writes: Sequence[Write[Any]]) -> list[Answer]:
        return await asyncio.to_thread(write_batch, self.db, self.owner, writes)

    async def apply_each(self, writes: Sequence[Write[Any]]) -> list[Answer]:
        return await asyncio.to_thread(write_each, self.db, self.owner, writes)


@dataclass(frozen=True, slots=True)
class _Pending:
    write: Write[Any]
    future: asyncio.Future[Any]


@dataclass(frozen=True, slots=True)
class BatcherConfig:
    """At most ``writers`` batches in flight at once, each of at most ``max_batch``
    writes (a heartbeat left behind joins the batch whatever its size)."""

    writers: int = 3
    max_batch: int = 1000

    def __post_init__(self) -> None:
        require_positive(self, "writers", "max_batch")


class WriteBatcher:
    def __init__(self, store: WriteStore, config: BatcherConfig | None = None) -> None:
        self.store = store
        self.config = config or BatcherConfig()
        self._pending: list[_Pending] = []
        self._ready = asyncio.Event()
        self._running: set[asyncio.Task[None]] = set()

    async def write(self, write: Write[T]) -> T:
        """Queue one write; return its answer once committed (or raise its error)."""
        future: asyncio.Future[Any] = asyncio.get_running_loop().create_future()
        self._pending.append(_Pending(write, future))
        self._ready.set()
        return cast(T, await future)

    async def run(self) -> None:
        """The writer loop; runs until cancelled (after the runner has drained)."""
        slots = asyncio.Semaphore(self.config.writers)
        while True:
            await self._ready.wait()
            self._ready.clear()
            while self._pending:
                await slots.acquire()
                if self._has_exclusive(self._pending):
                    await self._apply_alone(slots)
                    continue
                task = asyncio.create_task(self._apply_then_release(self._take(), slots))
                self._running.add(task)
                task.add_done_callback(self._running.discard)

    @staticmethod
    def _has_exclusive(pending: list[_Pending]) -> bool:
        return any(p.write.runs_alone for p in pending)

    async def _apply_alone(self, slots: asyncio.Semaphore) -> None:
        """Apply a batch carrying a heartbeat with no other batch in flight."""
        if self._running:  # let the batches in flight commit first
            await asyncio.wait(set(self._running))
        try:
            await self._apply(self._take())
        finally:
            slots.release()

    def _take(self) -> list[_Pending]:
        batch = self._pending[: self.config.max_batch]
        del self._pending[: self.config.max_batch]
        if self._has_exclusive(self._pending):
            # A heartbeat left behind would wait for the next round; take it now.
            batch += [p for p in self._pending if p.write.runs_alone]
            self._pending = [p for p in self._pending if not p.write.runs_alone]
        return batch

    async def _apply_then_release(self, batch: list[_Pending], slots: asyncio.Semaphore) -> None:
        try:
            await self._apply(batch)
        finally:
            slots.release()

    async def _apply(self, batch: list[_Pending]) -> None:
        writes = [p.write for p in batch]
        WRITE_BATCH_SIZE.observe(len(writes))
        try:
            answers = await self.store.apply_batch(writes)
        except Exception as exc:
            answers = await self._isolate(writes, exc)
        for pending, answer in zip(batch, answers, strict=True):
            if pending.future.done():  # its instance was cancelled meanwhile
                continue
            if isinstance(answer, BaseException):
                pending.future.set_exception(answer)
            else:
                pending.future.set_result(answer)

    async def _isolate(self, writes: list[Write[Any]], exc: Exception) -> list[Answer]:
        """Find the write that broke the batch; the others still go through. A chain
        alone in its batch is split too, so its checkpoint commits even when what follows
        it is refused; a single write gets the answer its error means for its instance
        (a refused row fails that instance: ``store.writes.error_answer``). If the database
        itself failed (an outage, a failover), every write gets the error: none is
        retried here, since the batch may have committed (see
        ``EngineRunner._give_back``)."""
        if is_transient(exc):
            return [exc] * len(writes)
        if len(writes) == 1 and not isinstance(writes[0], Chain):
            return [error_answer(writes[0], exc)]
        log.warning(
            "batch of %d writes failed (%s); applying them one by one",
            len(writes),
            refusal(exc),
            extra={"event": "engine.batch_split", "sqlstate": sqlstate(exc)},
        )
        return await self.store.apply_each(writes)
