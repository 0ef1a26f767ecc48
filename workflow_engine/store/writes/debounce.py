"""Debounce: the decision a new instance's creating transaction takes when its workflow
declares ``debounce=Debounce(key, period, max_wait, mode)``.

* ``trailing``: a new job of a key takes the place of the key's **pending** instance
  (queued, never claimed, ``run_after`` still ahead, created by the debounce): that one
  is recorded ``debounced`` (terminal, it never runs), ``debounced_into`` naming the new
  one, which starts at ``min(window start + max_wait, now + period)`` (never before its
  own start), the window's start carried forward. With none pending, the new one opens
  a window: it starts ``period`` from now.
* ``leading``: the first job of a key starts as usual and opens a window; a job within
  ``period`` of the window's start is recorded ``debounced`` into that leader (whatever
  the leader's status by then); after the period, a new job is a new leader.

Jobs of one key in one batch are decided in consumption order (the deliveries', not the
job ids'): trailing, the last of them stays and the others (and the pending one) are
debounced into it; leading, the first is the leader unless a window is open.

The decision is atomic across workers as the singleton's is
(:mod:`~workflow_engine.store.writes.singleton`): after the insert, a transaction-level
advisory lock per (workflow, key) in a key space of its own, in one order, then a read
in a statement that starts after the locks. The engines' claim does not take that
lock: it takes the row. So the trailing read locks the pending rows ``FOR UPDATE`` with
the pending condition in its WHERE: a claim (``FOR UPDATE SKIP LOCKED``) that comes
later skips a row being absorbed; one that holds it makes the read wait for its commit
and re-read the row as committed (READ COMMITTED), which is then running, not pending:
the new job opens a new window instead, and both run. An operator's pause or terminate
and the start-limit expiry take the row the same way. The failpoint
``debounce.after_lock`` stops a creator right there, the rows locked, nothing written.
"""

from __future__ import annotations

from collections.abc import Sequence
from dataclasses import dataclass, field
from typing import Any

import sqlalchemy as sa
from sqlalchemy.engine import Connection

from onceflow import failpoints
from onceflow.vocabulary import DebounceDecision, DebounceMode, InstanceStatus, LifecycleEvent
from workflow_engine.model import DebouncePolicy, Delivery
from workflow_engine.store import lifecycle

#: The advisory lock space of debounce keys (the two-key form): apart from the claim's
#: per-workflow locks, the singleton keys' (``singleton.LOCK_SPACE``) and the leases'.
LOCK_SPACE = 0x0CEF_25

Key = tuple[str, str]  # (workflow, debounce key as stored)

# The new rows' keys: the create statement stored them (bounded like a fairness lane,
# migration 0014), with the window start (now), from the delivery's key path.
_KEYS_OF = sa.text(
    "SELECT job_id, workflow, debounce_key FROM onceflow_instances"
    " WHERE job_id = ANY(CAST(:ids AS text[])) AND debounce_key IS NOT NULL"
)

# One lock per (workflow, key), in the order of their hashes (no deadlock between two
# creators with overlapping keys), held until the transaction ends.
_LOCK_KEYS = sa.text(
    """
SELECT count(pg_advisory_xact_lock(CAST(:space AS integer), h)) FROM (
    SELECT DISTINCT hashtext(w || chr(1) || k) AS h
    FROM unnest(CAST(:workflows AS text[]), CAST(:keys AS text[])) AS t(w, k)
    ORDER BY h
) AS s
"""
)

# Trailing: the keys' pending instances (normally one a key), locked in job-id order.
# The pending condition is in the WHERE, so a row whose lock this read waited for is
# re-checked as its locker committed it (a claim: running; a pause, a terminate, an
# expiry: not queued) and dropped. FOR UPDATE, as every other locker of a queued row.
# "Still ahead" on the clock of the read, not now() (this transaction's start, which
# may be long before: the create statement, the wait for the keys' locks): an operator's
# restart or retry queues an instance with run_after = its own now(), which a creator
# started before it would otherwise take for pending and debounce again.
_PENDING = sa.text(
    f"""
SELECT i.job_id, i.workflow, i.debounce_key, i.debounce_window_start
FROM onceflow_instances i
WHERE (i.workflow, i.debounce_key) IN (
        SELECT * FROM unnest(CAST(:workflows AS text[]), CAST(:keys AS text[])))
  AND i.debounce_key IS NOT NULL AND i.status = '{InstanceStatus.QUEUED}'
  AND i.started_at IS NULL AND i.run_after > clock_timestamp()
  AND i.job_id <> ALL(CAST(:new AS text[]))
ORDER BY i.job_id
FOR UPDATE OF i
"""
)

# Leading: each key's newest window still open (its start within the period). Not
# locked: what is read (the window start, not debounced) does not change once a leading
# instance is created, and the key's lock orders the creators.
_LEADERS = sa.text(
    """
SELECT l.job_id, k.w AS workflow, k.k AS debounce_key
FROM unnest(CAST(:workflows AS text[]), CAST(:keys AS text[]),
            CAST(:periods AS double precision[])) AS k(w, k, period)
CROSS JOIN LATERAL (
    SELECT i.job_id FROM onceflow_instances i
    WHERE i.workflow = k.w AND i.debounce_key = k.k AND i.status <> 'debounced'
      AND i.debounce_window_start > now() - make_interval(secs => k.period)
      AND i.job_id <> ALL(CAST(:new AS text[]))
    ORDER BY i.debounce_window_start DESC, i.job_id DESC
    LIMIT 1
) AS l
"""
)

# Trailing: the instance that stays pending, its window's start carried forward (NULL:
# it opened the window, its own start), and its start time; a start limit moves with it.
_EXTEND = sa.text(
    """
WITH s AS (
    SELECT i.job_id, coalesce(s.ws, i.debounce_window_start) AS ws,
           GREATEST(i.run_after, LEAST(
               coalesce(s.ws, i.debounce_window_start) + make_interval(secs => s.max_wait),
               now() + make_interval(secs => s.period))) AS at
    FROM unnest(CAST(:ids AS text[]), CAST(:starts AS timestamptz[]),
                CAST(:periods AS double precision[]),
                CAST(:waits AS double precision[])) AS s(job_id, ws, period, max_wait)
    JOIN onceflow_instances i USING (job_id)
)
UPDATE onceflow_instances i
SET debounce_window_start = s.ws, run_after = s.at, start_by = i.start_by + (s.at - i.run_after)
FROM s WHERE i.job_id = s.job_id
"""
)

# The debounced ones (this transaction's own rows and the locked pending ones): one
# statement for the batch.
_ABSORB = sa.text(
    "UPDATE onceflow_instances i SET status = :debounced, finished_at = now(),"
    " updated_at = now(), debounced_into = a.into_id, error = 'debounced into ' || a.into_id"
    " FROM unnest(CAST(:ids AS text[]), CAST(:intos AS text[])) AS a(job_id, into_id)"
    " WHERE i.job_id = a.job_id"
)


@dataclass(slots=True)
class _Plan:
    """What the batch decided: who is debounced into whom, who stays pending."""

    absorbed: dict[str, tuple[str, Key, DebounceMode]] = field(default_factory=dict)
    # trailing: job id -> (carried window start or None, policy)
    pending: dict[str, tuple[Any, DebouncePolicy]] = field(default_factory=dict)
    decisions: list[tuple[str, str]] = field(default_factory=list)


def decide(
    conn: Connection, deliveries: Sequence[Delivery], created: Sequence[str]
) -> list[tuple[str, str]]:
    """Take the debounce decision for the instances this transaction just created whose
    deliveries carry a debounce. Answers the (workflow, decision) pairs, for the
    worker's counter."""
    policies = _policies(deliveries, set(created))
    if not policies:
        return []
    keyed = conn.execute(_KEYS_OF, {"ids": list(policies)}).all()
    keys = {r.job_id: (r.workflow, r.debounce_key) for r in keyed}
    by_key: dict[Key, list[str]] = {}
    for job_id in policies:  # consumption order
        by_key.setdefault(keys[job_id], []).append(job_id)
    pairs = sorted(by_key)
    conn.execute(_LOCK_KEYS, {**_arrays(pairs), "space": LOCK_SPACE})
    new = list(policies)
    trailing = [k for k in pairs if policies[by_key[k][0]].mode == DebounceMode.TRAILING]
    leading = [k for k in pairs if policies[by_key[k][0]].mode == DebounceMode.LEADING]
    pending = _pending(conn, trailing, new)
    leaders = _leaders(conn, leading, [policies[by_key[k][0]] for k in leading], new)
    failpoints.hit("debounce.after_lock", new[0])
    plan = _Plan()
    for key in trailing:
        _plan_trailing(plan, key, by_key[key], pending.get(key, []), policies)
    for key in leading:
        _plan_leading(plan, key, by_key[key], leaders.get(key))
    _write(conn, plan)
    return plan.decisions


def _policies(deliveries: Sequence[Delivery], created: set[str]) -> dict[str, DebouncePolicy]:
    """The debounce of each created instance, in consumption order: its first
    delivery's, the one the create statement made it from (a later one of the same id,
    another workflow's, is a duplicate)."""
    found: dict[str, DebouncePolicy] = {}
    seen: set[str] = set()
    for d in deliveries:
        job_id = d.envelope.job_id
        if job_id in seen:
            continue
        seen.add(job_id)
        if d.debounce is not None and job_id in created:
            found[job_id] = d.debounce
    return found


def _arrays(pairs: Sequence[Key]) -> dict[str, list[str]]:
    return {"workflows": [w for w, _ in pairs], "keys": [k for _, k in pairs]}


def _pending(conn: Connection, keys: Sequence[Key], new: list[str]) -> dict[Key, list[Any]]:
    if not keys:
        return {}
    found: dict[Key, list[Any]] = {}
    for r in conn.execute(_PENDING, {**_arrays(keys), "new": new}):
        found.setdefault((r.workflow, r.debounce_key), []).append(r)
    return found


def _leaders(
    conn: Connection, keys: Sequence[Key], policies: Sequence[DebouncePolicy], new: list[str]
) -> dict[Key, str]:
    if not keys:
        return {}
    params = {**_arrays(keys), "periods": [p.period for p in policies], "new": new}
    return {(r.workflow, r.debounce_key): r.job_id for r in conn.execute(_LEADERS, params)}


def _plan_trailing(
    plan: _Plan,
    key: Key,
    jobs: list[str],
    pending: list[Any],
    policies: dict[str, DebouncePolicy],
) -> None:
    """The last new job of the key stays pending; the others and the pending ones are
    debounced into it; the window starts at the earliest pending one's start."""
    stays = jobs[-1]
    for job_id in [p.job_id for p in pending] + jobs[:-1]:
        plan.absorbed[job_id] = (stays, key, DebounceMode.TRAILING)
    start = min((p.debounce_window_start for p in pending), default=None)
    plan.pending[stays] = (start, policies[stays])
    decision = DebounceDecision.EXTENDED if pending else DebounceDecision.OPENED
    plan.decisions.append((key[0], str(decision)))
    debounced = len(pending) + len(jobs) - 1
    plan.decisions += [(key[0], str(DebounceDecision.DEBOUNCED))] * debounced


def _plan_leading(plan: _Plan, key: Key, jobs: list[str], leader: str | None) -> None:
    """Into the open window's leader; with none, the first new job leads."""
    if leader is None:
        leader, jobs = jobs[0], jobs[1:]
        plan.decisions.append((key[0], str(DebounceDecision.OPENED)))
    for job_id in jobs:
        plan.absorbed[job_id] = (leader, key, DebounceMode.LEADING)
    plan.decisions += [(key[0], str(DebounceDecision.DEBOUNCED))] * len(jobs)


def _write(conn: Connection, plan: _Plan) -> None:
    if plan.pending:
        ids = sorted(plan.pending)
        conn.execute(
            _EXTEND,
            {
                "ids": ids,
                "starts": [plan.pending[j][0] for j in ids],
                "periods": [plan.pending[j][1].period for j in ids],
                "waits": [plan.pending[j][1].max_wait for j in ids],
            },
        )
    if plan.absorbed:
        ids = sorted(plan.absorbed)
        params = {"ids": ids, "intos": [plan.absorbed[j][0] for j in ids]}
        conn.execute(_ABSORB, {**params, "debounced": str(InstanceStatus.DEBOUNCED)})
        lifecycle.emit(conn, [_debounced(j, *plan.absorbed[j]) for j in ids])


def _debounced(
    job_id: str, into: str, key: Key, mode: DebounceMode
) -> tuple[str, LifecycleEvent, dict[str, Any]]:
    data = {
        "debounce": {"key": key[1], "mode": str(mode), "into_job_id": into},
        "error": f"debounced into {into}",
    }
    return (job_id, LifecycleEvent.DEBOUNCED, data)
