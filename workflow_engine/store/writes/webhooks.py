"""Webhook deliveries: what the dispatcher writes (migration 0019).

* :func:`add_webhook_deliveries` — one row per (event, endpoint), in one statement per batch of
  events; the named unique constraint ``onceflow_webhook_deliveries_event_endpoint_key``
  makes an event the at-least-once topic delivers again collapse into the row it has.
* :func:`claim_webhook_deliveries` — due deliveries, and those whose lease expired, taken with
  ``FOR UPDATE SKIP LOCKED``; the claim raises the claim number (the fence), opens the
  attempt's row, and marks the attempt an expired lease left open ``lost``.
* :func:`record_webhook_attempt` — the attempt's outcome and the delivery's next state, applied
  only while the claim is still the delivery's (same claim number, still ``sending``):
  a dispatcher whose lease ran out and was taken over writes nothing.

The window between the claim and the record is the one the fence and the lease guard:
a dispatcher sends only while its lease outlasts the attempt's whole timeout
(``workflow_engine.engine.webhook_dispatcher``), so no other dispatcher can claim the
delivery while its request may be in flight, and an attempt number is sent by one
dispatcher at most.
"""

from __future__ import annotations

from collections.abc import Sequence
from dataclasses import dataclass
from datetime import datetime

import orjson
import sqlalchemy as sa
from sqlalchemy.engine import Connection, Engine

from onceflow.vocabulary import WebhookDeadReason, WebhookOutcome, WebhookStatus

# The callback of the run an event names (id reuse, migration 0027): the current run's
# is the instance's, an earlier run's is archived with it (a new run may name another
# callback, or none, while the earlier run's final event is still on its way here).
# An event naming no run (written before migration 0027) takes the instance's.
_CALLBACKS = sa.text(
    """
SELECT k.job_id, k.run,
       CASE WHEN k.run IS NULL OR k.run = i.run THEN i.callback ELSE r.callback END
FROM unnest(CAST(:ids AS text[]), CAST(:runs AS int[])) AS k(job_id, run)
JOIN onceflow_instances i USING (job_id)
LEFT JOIN onceflow_runs r ON r.job_id = k.job_id AND r.run = k.run
"""
)


def webhook_callbacks(
    conn: Connection, keys: Sequence[tuple[str, int | None]]
) -> dict[tuple[str, int | None], str | None]:
    """The callback of each (job id, run) whose instance exists (one query); a key
    missing from the answer has no instance (any more). ``run`` None: the current run."""
    if not keys:
        return {}
    unique = sorted(set(keys), key=lambda k: (k[0], k[1] or 0))
    found = conn.execute(
        _CALLBACKS, {"ids": [j for j, _ in unique], "runs": [r for _, r in unique]}
    )
    return {(j, r): c for j, r, c in found}


@dataclass(frozen=True, slots=True)
class NewDelivery:
    """A delivery to create: the event (its id, kind, sequence, the exact body sent) and
    the endpoint; ``dead_reason`` set: created dead (an endpoint no longer configured)."""

    event_id: str
    endpoint: str
    job_id: str
    workflow: str
    kind: str
    sequence: int
    body: str
    dead_reason: WebhookDeadReason | None = None


# Joined to the instances: an event whose instance is gone (retention) delivers nothing,
# and the foreign key is never the one to refuse the batch.
_ADD = sa.text(
    """
WITH input AS (
    SELECT * FROM jsonb_to_recordset(CAST(:rows AS jsonb)) AS r(
        event_id text, endpoint text, job_id text, workflow text, kind text,
        sequence integer, body text, dead_reason text)
)
INSERT INTO onceflow_webhook_deliveries (
    event_id, endpoint, job_id, workflow, kind, sequence, body, status, dead_reason,
    give_up_at, finished_at)
SELECT r.event_id, r.endpoint, r.job_id, r.workflow, r.kind, r.sequence, r.body,
       CASE WHEN r.dead_reason IS NULL THEN 'pending' ELSE 'dead' END, r.dead_reason,
       now() + make_interval(secs => :retry_seconds),
       CASE WHEN r.dead_reason IS NULL THEN NULL ELSE now() END
FROM input r JOIN onceflow_instances i USING (job_id)
ORDER BY r.event_id, r.endpoint
ON CONFLICT ON CONSTRAINT onceflow_webhook_deliveries_event_endpoint_key DO NOTHING
RETURNING id
"""
)


def add_webhook_deliveries(
    conn: Connection, rows: Sequence[NewDelivery], retry_seconds: float
) -> int:
    """Create ``rows`` on the caller's transaction; how many are new (not seen before).
    Each is retried for ``retry_seconds`` from now."""
    if not rows:
        return 0
    doc = [
        {
            "event_id": r.event_id,
            "endpoint": r.endpoint,
            "job_id": r.job_id,
            "workflow": r.workflow,
            "kind": r.kind,
            "sequence": r.sequence,
            "body": r.body,
            "dead_reason": str(r.dead_reason) if r.dead_reason else None,
        }
        for r in rows
    ]
    params = {"rows": orjson.dumps(doc).decode(), "retry_seconds": retry_seconds}
    return len(conn.execute(_ADD, params).all())


@dataclass(frozen=True, slots=True)
class ClaimedDelivery:
    """A delivery claimed for one attempt: ``attempt`` is its number, ``claim`` the
    fence its record must name."""

    id: int
    event_id: str
    endpoint: str
    job_id: str
    kind: str
    body: str
    attempt: int
    claim: int
    give_up_at: datetime
    lost: int  # attempts an expired lease had left open, marked lost by this claim


_LOST_ERROR = "the lease ran out before the outcome was recorded (it may have been sent)"

# Two index scans (the due pending ones, the expired leases), then the rows locked and
# re-checked: under READ COMMITTED, FOR UPDATE re-evaluates this WHERE on the row as
# another dispatcher may just have committed it, so a row claimed meanwhile is skipped.
_CLAIM = sa.text(
    """
WITH due AS (
    SELECT w.id FROM onceflow_webhook_deliveries w
    WHERE w.id IN (
        (SELECT id FROM onceflow_webhook_deliveries
         WHERE status = 'pending' AND next_attempt_at <= now()
         ORDER BY next_attempt_at LIMIT :n)
        UNION ALL
        (SELECT id FROM onceflow_webhook_deliveries
         WHERE status = 'sending' AND lease_expires_at <= now()
         ORDER BY lease_expires_at LIMIT :n))
      AND ((w.status = 'pending' AND w.next_attempt_at <= now())
           OR (w.status = 'sending' AND w.lease_expires_at <= now()))
    ORDER BY w.next_attempt_at
    LIMIT :n
    FOR UPDATE SKIP LOCKED
),
lost AS (
    UPDATE onceflow_webhook_attempts a
    SET outcome = 'lost', finished_at = now(), error = :lost_error
    FROM due WHERE a.delivery_id = due.id AND a.outcome IS NULL
    RETURNING a.delivery_id
),
claimed AS (
    UPDATE onceflow_webhook_deliveries w
    SET status = 'sending', attempts = w.attempts + 1, claim_count = w.claim_count + 1,
        lease_owner = :owner, lease_expires_at = now() + make_interval(secs => :lease),
        updated_at = now()
    FROM due WHERE w.id = due.id
    RETURNING w.id, w.event_id, w.endpoint, w.job_id, w.kind, w.body, w.attempts,
              w.claim_count, w.give_up_at
),
opened AS (
    INSERT INTO onceflow_webhook_attempts (delivery_id, attempt, claim_count, owner)
    SELECT id, attempts, claim_count, :owner FROM claimed
)
SELECT c.id, c.event_id, c.endpoint, c.job_id, c.kind, c.body, c.attempts, c.claim_count,
       c.give_up_at, (SELECT count(*) FROM lost l WHERE l.delivery_id = c.id) AS lost
FROM claimed c
ORDER BY c.id
"""
)


def claim_webhook_deliveries(
    db: Engine, owner: str, limit: int, lease_seconds: float
) -> list[ClaimedDelivery]:
    """Claim up to ``limit`` due deliveries for ``owner`` for ``lease_seconds``."""
    params = {"n": limit, "owner": owner, "lease": lease_seconds, "lost_error": _LOST_ERROR}
    with db.begin() as conn:
        return [ClaimedDelivery(*row) for row in conn.execute(_CLAIM, params)]


@dataclass(frozen=True, slots=True)
class AttemptResult:
    """What one attempt came to. ``retry_in``: the backoff before the next attempt (a
    failure); ``dead_reason``: give up now, whatever the time left (a refused address)."""

    outcome: WebhookOutcome
    latency_ms: float | None = None
    response_code: int | None = None
    error: str | None = None
    retry_in: float = 0.0
    dead_reason: WebhookDeadReason | None = None


# The delivery's next state is decided here, on the database's clock: delivered; dead
# (the attempt says so, or the backoff would pass give_up_at); else pending again.
_RECORD = sa.text(
    """
WITH decided AS (
    SELECT w.id, CASE
        WHEN :outcome = 'delivered' THEN 'delivered'
        WHEN CAST(:dead_reason AS text) IS NOT NULL THEN 'dead'
        WHEN now() + make_interval(secs => :retry_in) > w.give_up_at THEN 'dead'
        ELSE 'pending' END AS status
    FROM onceflow_webhook_deliveries w
    WHERE w.id = :id AND w.claim_count = :claim AND w.status = 'sending'
    FOR UPDATE
),
d AS (
    UPDATE onceflow_webhook_deliveries w
    SET status = x.status,
        dead_reason = CASE WHEN x.status = 'dead'
                           THEN coalesce(CAST(:dead_reason AS text), 'retries_exhausted') END,
        next_attempt_at = CASE WHEN x.status = 'pending'
                               THEN now() + make_interval(secs => :retry_in)
                               ELSE w.next_attempt_at END,
        finished_at = CASE WHEN x.status IN ('delivered', 'dead') THEN now() END,
        lease_owner = NULL, lease_expires_at = NULL,
        last_code = CAST(:code AS integer), last_error = CAST(:error AS text), updated_at = now()
    FROM decided x WHERE w.id = x.id
    RETURNING w.id, w.status, w.dead_reason
),
a AS (
    UPDATE onceflow_webhook_attempts a
    SET outcome = :outcome, finished_at = now(), latency_ms = :latency,
        response_code = CAST(:code AS integer), error = CAST(:error AS text)
    FROM d WHERE a.delivery_id = d.id AND a.attempt = :attempt
)
SELECT status, dead_reason FROM d
"""
)


def record_webhook_attempt(
    db: Engine, claimed: ClaimedDelivery, result: AttemptResult
) -> tuple[WebhookStatus, WebhookDeadReason | None] | None:
    """Record ``result`` for ``claimed``'s attempt; the delivery's new status (and why
    dead), or None when the claim is no longer the delivery's (nothing written)."""
    params = {
        "id": claimed.id,
        "claim": claimed.claim,
        "attempt": claimed.attempt,
        "outcome": str(result.outcome),
        "dead_reason": str(result.dead_reason) if result.dead_reason else None,
        "retry_in": max(0.0, result.retry_in),
        "latency": result.latency_ms,
        "code": result.response_code,
        "error": result.error[:1000] if result.error else None,
    }
    with db.begin() as conn:
        row = conn.execute(_RECORD, params).one_or_none()
    if row is None:
        return None
    return WebhookStatus(row.status), WebhookDeadReason(
        row.dead_reason
    ) if row.dead_reason else None


@dataclass(frozen=True, slots=True)
class WebhookCounts:
    pending: int  # pending or sending
    dead: int


_COUNTS = sa.text(
    "SELECT count(*) FILTER (WHERE status IN ('pending', 'sending')),"
    " count(*) FILTER (WHERE status = 'dead')"
    " FROM onceflow_webhook_deliveries WHERE status IN ('pending', 'sending', 'dead')"
)


def webhook_counts(db: Engine) -> WebhookCounts:
    """The deliveries not yet done, and the dead ones (the dispatcher's gauges)."""
    with db.connect() as conn:
        pending, dead = conn.execute(_COUNTS).one()
    return WebhookCounts(int(pending or 0), int(dead or 0))
