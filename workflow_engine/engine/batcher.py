"""Group commit for the engine's checkpoints.

Every in-flight instance of an engine sends its lease-guarded writes (step started,
step checkpoint, instance finished, and the engine's heartbeat) here instead of
committing each on its own. A single writer takes everything pending, applies it in
one transaction (one multi-row statement per kind of write, see
:func:`workflow_engine.store.execution.write_batch`) and only then wakes the instances whose
writes it carried. Durability is unchanged — nobody proceeds before its checkpoint is
committed — but a hundred instances pay for one commit and a handful of round trips
instead of a hundred of each, and no engine thread sits in ``COMMIT``.

While one batch commits the next one fills up, so batches grow with load by themselves
(no timer, no added latency at light load). ``writers`` batches may be in flight at once
(each on its own connection, so PostgreSQL works on them in parallel); they never touch
the same rows, because an instance has at most one write pending. The heartbeat is the
exception — it touches every leased row — so a batch carrying it runs alone.
"""

from __future__ import annotations

import asyncio
import logging
from typing import Any

from sqlalchemy.engine import Engine

from workflow_engine.engine.metrics import WRITE_BATCH_SIZE
from workflow_engine.store import execution as store

log = logging.getLogger(__name__)


class WriteBatcher:
    def __init__(self, engine: Engine, owner: str, writers: int = 3, max_batch: int = 1000) -> None:
        self.engine = engine
        self.owner = owner
        self.writers = writers
        self.max_batch = max_batch
        self._pending: list[tuple[str, tuple, asyncio.Future[Any]]] = []
        self._ready = asyncio.Event()
        self._running: set[asyncio.Task[None]] = set()

    async def write(self, kind: str, *args: Any) -> Any:
        """Queue one write; return its answer once committed (or raise its error)."""
        future: asyncio.Future[Any] = asyncio.get_running_loop().create_future()
        self._pending.append((kind, args, future))
        self._ready.set()
        return await future

    async def run(self) -> None:
        """The writer loop; runs until cancelled (after the runner has drained)."""
        slots = asyncio.Semaphore(self.writers)
        while True:
            await self._ready.wait()
            self._ready.clear()
            while self._pending:
                await slots.acquire()
                if any(kind == "heartbeat" for kind, _, _ in self._pending):
                    if self._running:  # let the batches in flight commit first
                        await asyncio.wait(set(self._running))
                    batch = self._take()
                    try:
                        await self._apply(batch)
                    finally:
                        slots.release()
                    continue
                task = asyncio.create_task(self._apply_then_release(self._take(), slots))
                self._running.add(task)
                task.add_done_callback(self._running.discard)

    def _take(self) -> list[tuple[str, tuple, asyncio.Future[Any]]]:
        batch = self._pending[: self.max_batch]
        del self._pending[: self.max_batch]
        if any(kind == "heartbeat" for kind, _, _ in self._pending):
            # A heartbeat left behind would wait for the next round; take it now.
            batch += [w for w in self._pending if w[0] == "heartbeat"]
            self._pending = [w for w in self._pending if w[0] != "heartbeat"]
        return batch

    async def _apply_then_release(
        self, batch: list[tuple[str, tuple, asyncio.Future[Any]]], slots: asyncio.Semaphore
    ) -> None:
        try:
            await self._apply(batch)
        finally:
            slots.release()

    async def _apply(self, batch: list[tuple[str, tuple, asyncio.Future[Any]]]) -> None:
        writes = [(kind, args) for kind, args, _ in batch]
        WRITE_BATCH_SIZE.observe(len(writes))
        try:
            answers = await asyncio.to_thread(store.write_batch, self.engine, self.owner, writes)
        except Exception as exc:
            if len(writes) == 1:
                answers = [exc]
            else:
                # Find the write that broke the batch; the others still go through.
                log.warning(
                    "batch of %d writes failed (%s); applying them one by one",
                    len(writes),
                    type(exc).__name__,
                    extra={"event": "engine.batch_split"},
                )
                answers = await asyncio.to_thread(store.write_each, self.engine, self.owner, writes)
        for (_, _, future), answer in zip(batch, answers, strict=True):
            if future.done():  # its instance was cancelled meanwhile
                continue
            if isinstance(answer, BaseException):
                future.set_exception(answer)
            else:
                future.set_result(answer)
