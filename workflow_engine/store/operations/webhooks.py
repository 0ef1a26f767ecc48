"""Re-driving dead webhook deliveries: back to ``pending``, due now, with a new retry
window, their attempt history kept (the next attempt's number follows the last). One
row of the operators' audit trail per re-drive, in the transaction that re-queues."""

from __future__ import annotations

from dataclasses import dataclass

import sqlalchemy as sa
from sqlalchemy.engine import Engine

from onceflow.errors import OnceflowError
from onceflow.vocabulary import OperatorAction
from workflow_engine.store import operator_audit
from workflow_engine.store.operator_audit import Actor


class NothingToRedrive(OnceflowError):
    """A re-drive without a filter: it names an endpoint, a job, or says --all."""


@dataclass(frozen=True, slots=True)
class WebhookRedrive:
    requeued: int
    job_ids: list[str]


# Locked in id order, so two re-drives over the same rows cannot deadlock; a row that is
# no longer dead when its lock is granted (re-driven meanwhile) is skipped by the re-check.
_REDRIVE = sa.text(
    """
WITH chosen AS (
    SELECT id FROM onceflow_webhook_deliveries
    WHERE status = 'dead'
      AND (CAST(:endpoint AS text) IS NULL OR endpoint = :endpoint)
      AND (CAST(:job_id AS text) IS NULL OR job_id = :job_id)
    ORDER BY id
    FOR UPDATE
)
UPDATE onceflow_webhook_deliveries w
SET status = 'pending', dead_reason = NULL, finished_at = NULL, next_attempt_at = now(),
    give_up_at = now() + make_interval(secs => :retry_seconds), updated_at = now()
FROM chosen c WHERE w.id = c.id AND w.status = 'dead'
RETURNING w.job_id
"""
)


def redrive_webhooks(
    db: Engine,
    retry_seconds: float,
    *,
    endpoint: str | None = None,
    job_id: str | None = None,
    everything: bool = False,
    actor: Actor | None = None,
) -> WebhookRedrive:
    """Re-queue the dead deliveries of ``endpoint`` and/or ``job_id`` (``everything``:
    all of them), each retried for ``retry_seconds`` from now."""
    if endpoint is None and job_id is None and not everything:
        raise NothingToRedrive("name an endpoint or a job to re-drive (or all of them)")
    chosen = {"endpoint": endpoint, "job_id": job_id}
    with operator_audit.failures_recorded(
        db, actor, OperatorAction.REDRIVE, filter={"webhooks": chosen}, job_id=job_id
    ):
        with db.begin() as conn:
            params = {**chosen, "retry_seconds": retry_seconds}
            job_ids = [row.job_id for row in conn.execute(_REDRIVE, params)]
            audited = None
            if actor is not None:
                audited = operator_audit.record(
                    conn,
                    actor,
                    OperatorAction.REDRIVE,
                    filter={"webhooks": chosen},
                    job_id=job_id,
                    detail=f"{len(job_ids)} dead webhook deliveries re-queued",
                )
        operator_audit.announce(audited)
    return WebhookRedrive(len(job_ids), sorted(set(job_ids)))
