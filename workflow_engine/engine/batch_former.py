"""The batch former: an engine service that turns the waiting members of batched
workflows (``@workflow(batch=...)``) into batch runs.

Every engine runs one when it has a batched workflow; none is elected. Each pass hands
each batched workflow to :func:`workflow_engine.store.writes.batches.form_due`, which
forms every due batch in its own transaction with the members locked ``FOR UPDATE SKIP
LOCKED`` and re-checked, so two engines forming at once split the pool between them and
no member is in two batches. Its own loop, beside the claim loop: the claim of other
work does not pay for it (an engine without a batched workflow does not run one).
"""

from __future__ import annotations

import asyncio
import logging
from collections.abc import Mapping

from sqlalchemy.engine import Engine

from workflow_engine.clock import FakeClock, SystemClock
from workflow_engine.engine.metrics import BATCH_SIZE, BATCHES, labelled
from workflow_engine.engine.services import Service
from workflow_engine.model import BatchPolicy
from workflow_engine.store.writes import form_due, workflows_waiting

log = logging.getLogger(__name__)

#: The longest pause between passes: a pool is formed at most this late after it is
#: due (and a quarter of the shortest max_wait, when that is shorter, down to
#: :data:`MIN_INTERVAL_SECONDS`).
INTERVAL_SECONDS = 0.25
#: The shortest pause: a max_wait of a millisecond (legal) would otherwise make an idle
#: engine probe the database thousands of times a second.
MIN_INTERVAL_SECONDS = 0.02


class BatchFormer(Service):
    """Forms the due batches of ``policies`` (``{workflow: policy}``) every pass."""

    def __init__(
        self,
        db: Engine,
        clock: SystemClock | FakeClock,
        policies: Mapping[str, BatchPolicy],
    ) -> None:
        super().__init__()
        self.db = db
        self.clock = clock
        self.policies = dict(policies)
        shortest = min((p.max_wait for p in self.policies.values()), default=INTERVAL_SECONDS)
        self.interval = max(MIN_INTERVAL_SECONDS, min(INTERVAL_SECONDS, shortest / 4))

    async def run(self) -> None:
        while True:
            formed = 0
            try:
                formed = await asyncio.to_thread(self.form_once)
            except Exception:
                log.exception("batch forming failed", extra={"event": "engine.batch_error"})
            if not formed:
                await asyncio.sleep(self.interval)

    def form_once(self) -> int:
        """One pass over every batched workflow; how many batches it formed."""
        count = 0
        for workflow in workflows_waiting(self.db, list(self.policies)):
            policy = self.policies[workflow]
            for batch in form_due(self.db, workflow, policy, self.clock.db_now()):
                count += 1
                labelled(BATCHES, workflow, batch.trigger).inc()
                labelled(BATCH_SIZE, workflow).observe(len(batch.members))
                log.info(
                    "batch formed",
                    extra={
                        "event": "batch.formed",
                        "job_id": batch.batch_id,
                        "workflow": workflow,
                        "members": len(batch.members),
                        "trigger": batch.trigger,
                    },
                )
        return count
