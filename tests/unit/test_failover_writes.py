"""A batch of engine writes cut by a database failover: nothing is replayed write by
write (the batch may have committed), every writer gets the error."""

from __future__ import annotations

import asyncio
from collections.abc import Sequence
from typing import Any

import psycopg2
import sqlalchemy as sa

from workflow_engine.engine.batcher import WriteBatcher
from workflow_engine.store.writes import Answer, StartStep, Write


class FailingOver:
    def __init__(self) -> None:
        self.batches = 0
        self.each = 0

    async def apply_batch(self, writes: Sequence[Write[Any]]) -> list[Answer]:
        self.batches += 1
        raise sa.exc.OperationalError("COMMIT", {}, psycopg2.OperationalError("server closed"))

    async def apply_each(self, writes: Sequence[Write[Any]]) -> list[Answer]:
        self.each += 1
        return [None] * len(writes)


def test_a_transient_failure_reaches_every_writer_and_is_not_retried_one_by_one() -> None:
    store = FailingOver()

    async def run() -> list[Any]:
        batcher = WriteBatcher(store)
        writer = asyncio.create_task(batcher.run())
        results = await asyncio.gather(
            *(batcher.write(StartStep(f"job-{n}", 1, 0, "s")) for n in range(5)),
            return_exceptions=True,
        )
        writer.cancel()
        return results

    results = asyncio.run(run())
    assert all(isinstance(r, sa.exc.OperationalError) for r in results), results
    assert store.each == 0 and store.batches >= 1
