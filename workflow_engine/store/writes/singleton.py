"""Singleton policies: the decision a new instance's creating transaction takes when
its workflow declares ``singleton=Singleton(key, mode="skip"|"cancel_in_progress")``.

Running is bounded elsewhere: the policy is also a per-key limit of one in the claim
(held while sleeping or waiting, :func:`~workflow_engine.model.flow_control`), so no two
engines run two instances of one key. What is decided here is which instance is *the*
live one of its key when a new one arrives:

* ``skip`` (and ``cancel_newest``, the same under Hatchet's name): while another
  instance of the key is live (queued, running, sleeping, waiting, paused), the new one
  is recorded ``skipped`` - terminal, it never runs - with ``skipped_for`` naming it;
* ``cancel_in_progress``: every older live instance of the key is terminated by the
  operator's rule (:func:`~workflow_engine.store.writes.requests.transition`: at once
  when no engine runs it, else requested of its engine, which stops it at its next step
  boundary and writes its events; those no engine runs that have no parent and no live
  child, the common case, get the same outcome in one statement for the batch), with
  ``cancelled_by`` naming its successor; the new one waits in the claim until the old
  one has stopped, then runs.

The decision is atomic across workers: after the instances are inserted (in the same
transaction, so nobody else sees them yet), the transaction takes a transaction-level
advisory lock per (workflow, key), in one order, and reads the key's live instances in a
statement that starts after the locks are granted, locking them ``FOR UPDATE`` (their
finishers do not take the key's lock, but they do take the row's). A second worker
creating a job of the same key waits for the lock, i.e. for this transaction's commit,
and then sees its instance: two jobs of one key created at once cannot both be the live one. (A hash
collision between two keys only makes them wait for each other.) The failpoint
``singleton.after_decide`` stops a creator right there, with the lock held.
"""

from __future__ import annotations

import itertools
from collections.abc import Sequence
from dataclasses import dataclass
from typing import Any

import orjson
import sqlalchemy as sa
from sqlalchemy.engine import Connection

from onceflow import failpoints
from onceflow.vocabulary import (
    TERMINAL_STATUSES,
    BulkAction,
    ControlAction,
    InstanceStatus,
    LifecycleEvent,
    ParentClosePolicy,
    SingletonDecision,
    SingletonMode,
)
from workflow_engine.model import Delivery, SingletonPolicy
from workflow_engine.store import lifecycle
from workflow_engine.store.writes.requests import transition

#: The live statuses: an instance in one of these is its key's live one
#: (``onceflow_instances_singleton_idx`` covers exactly these).
LIVE = (
    InstanceStatus.QUEUED,
    InstanceStatus.RUNNING,
    InstanceStatus.SLEEPING,
    InstanceStatus.WAITING,
    InstanceStatus.PAUSED,
)

# The key's value, bounded like a fairness lane (migration 0014), on the new rows.
_SET_KEYS = sa.text(
    """
UPDATE onceflow_instances i
SET singleton_key = onceflow_lane_key(coalesce(i.params #>> r.path, ''))
FROM jsonb_to_recordset(CAST(:rows AS jsonb)) AS r(job_id text, path text[])
WHERE i.job_id = r.job_id
RETURNING i.job_id, i.workflow, i.singleton_key
"""
)

# One lock per (workflow, key), taken in the order of their hashes, so two creators
# with overlapping keys cannot deadlock on them; held until the transaction ends.
#: The advisory lock space of singleton keys: the two-key form, a key space apart from
#: the one-key locks (the claim's per-workflow lock, retention's, migrations') and from
#: the bulk leases' (``LEASE_LOCK_SPACE``), so a key's hash never makes a creator wait
#: for an engine's claim.
LOCK_SPACE = 0x0CEF_24
_LOCK_KEYS = sa.text(
    """
SELECT count(pg_advisory_xact_lock(CAST(:space AS integer), h)) FROM (
    SELECT DISTINCT hashtext(w || chr(1) || k) AS h
    FROM unnest(CAST(:workflows AS text[]), CAST(:keys AS text[])) AS t(w, k)
    ORDER BY h
) AS s
"""
)

# Read in a statement of its own, after the locks: its snapshot has every instance of
# these keys that an earlier holder of the lock committed. The key's lock is not one an
# instance's finisher takes (an engine completing or failing it, an operator's
# terminate), so the live rows are locked too, in job-id order: a finisher that comes
# later waits for this decision's commit, one that holds the row makes this read wait
# for its commit and re-read the row as committed (READ COMMITTED), dropping it when it
# is no longer live. A skipped one never names an instance that finished before the
# skip committed. FOR UPDATE, not FOR SHARE: an engine's checkpoint write takes FOR
# SHARE and upgrades it in the same statement (execution.py), which only works while
# every other locker takes FOR UPDATE - a share held here would let the engine in, and
# the cancel's FOR UPDATE below and the engine's upgrade would wait for each other.
_LIVE_OF_KEYS = sa.text(
    """
SELECT i.job_id, i.workflow, i.singleton_key, i.cancelled_by IS NOT NULL AS superseded,
       i.created_at
FROM onceflow_instances i
WHERE (i.workflow, i.singleton_key) IN (
        SELECT * FROM unnest(CAST(:workflows AS text[]), CAST(:keys AS text[])))
  AND i.singleton_key IS NOT NULL AND i.status = ANY(CAST(:live AS text[]))
ORDER BY i.job_id
FOR UPDATE OF i
"""
)

# This transaction's new rows that give way, each naming its key's live one: one
# statement for the batch.
_SKIP = sa.text(
    "UPDATE onceflow_instances i SET status = :skipped, finished_at = now(),"
    " updated_at = now(), skipped_for = s.active"
    " FROM unnest(CAST(:ids AS text[]), CAST(:actives AS text[])) AS s(job_id, active)"
    " WHERE i.job_id = s.job_id"
)
_LOCK_LIVE = sa.text(
    "SELECT job_id, status, requested_action FROM onceflow_instances"
    " WHERE job_id = ANY(CAST(:ids AS text[])) ORDER BY job_id FOR UPDATE"
)
_CANCELLED_BY = sa.text(
    "UPDATE onceflow_instances i SET cancelled_by = coalesce(i.cancelled_by, c.by)"
    " FROM unnest(CAST(:ids AS text[]), CAST(:bys AS text[])) AS c(job_id, by)"
    " WHERE i.job_id = c.job_id"
)


# The terminate rule's outcome for the superseded ones no engine runs, that have no
# parent to wake and no live child to close (always this batch's own rows; an older one
# unless it started children): terminated at once, in one statement for the batch, as
# requests.apply_terminate would one by one. The others go through that rule itself.
_TERMINATE_QUIET = sa.text(
    f"""
UPDATE onceflow_instances i
SET status = :terminated, finished_at = now(), updated_at = now(), lease_owner = NULL,
    lease_expires_at = NULL, requested_action = NULL,
    error = 'cancelled by ' || i.cancelled_by || ' (singleton)'
WHERE i.job_id = ANY(CAST(:ids AS text[])) AND i.status <> '{InstanceStatus.RUNNING}'
  AND i.parent_job_id IS NULL
  AND NOT EXISTS (
      SELECT 1 FROM onceflow_instances c
      WHERE c.parent_job_id = i.job_id AND c.parent_close_policy = :closing
        AND c.status <> ALL(CAST(:final AS text[])))
RETURNING i.job_id
"""
)


@dataclass(frozen=True, slots=True)
class _Live:
    job_id: str
    key: tuple[str, str]  # (workflow, singleton key)
    new: bool  # created by this transaction
    superseded: bool  # already cancelled by a newer one, still stopping


def decide(
    conn: Connection, deliveries: Sequence[Delivery], created: Sequence[str]
) -> list[tuple[str, str]]:
    """Take the singleton decision for the instances this transaction just created
    (``created``, in consumption order) whose deliveries carry a deciding policy.
    Answers the (workflow, decision) pairs taken, for the worker's counter."""
    policies = _policies(deliveries, set(created))
    if not policies:
        return []
    rows = [{"job_id": j, "path": list(p.key)} for j, p in policies.items()]
    keyed = conn.execute(_SET_KEYS, {"rows": orjson.dumps(rows).decode()}).all()
    keys = {r.job_id: (r.workflow, r.singleton_key) for r in keyed}
    pairs = sorted(set(keys.values()))
    args = {"workflows": [w for w, _ in pairs], "keys": [k for _, k in pairs]}
    conn.execute(_LOCK_KEYS, {**args, "space": LOCK_SPACE})
    locked = conn.execute(_LIVE_OF_KEYS, {**args, "live": [str(s) for s in LIVE]}).all()
    live_rows = sorted(locked, key=lambda r: (r.created_at, r.job_id))  # locked by job id
    failpoints.hit("singleton.after_decide", next(iter(policies)))
    # consumption order (the deliveries'), not ``created``'s (the statement's, job ids)
    order = {job_id: n for n, job_id in enumerate(policies)}
    by_key: dict[tuple[str, str], list[_Live]] = {}
    for r in live_rows:
        by_key.setdefault((r.workflow, r.singleton_key), []).append(
            _Live(r.job_id, (r.workflow, r.singleton_key), r.job_id in keys, r.superseded)
        )
    decisions: list[tuple[str, str]] = []
    skips: dict[str, tuple[str, tuple[str, str]]] = {}  # job id -> (live one, key)
    cancels: dict[str, tuple[str, tuple[str, str]]] = {}  # job id -> (successor, key)
    for key, live in by_key.items():
        # The older ones first, those already superseded before the one still in charge
        # (created_at is when a creating transaction began, not when it took the lock);
        # then this transaction's own, in consumption order.
        live.sort(key=lambda x: (x.new, not x.superseded, order.get(x.job_id, 0)))
        mode = next(policies[x.job_id].mode for x in live if x.new)
        plan = _plan_cancel if mode == SingletonMode.CANCEL_IN_PROGRESS else _plan_skip
        decisions += plan(key, live, cancels if plan is _plan_cancel else skips)
    _skip(conn, skips)
    return decisions + _cancel(conn, cancels)


def _policies(deliveries: Sequence[Delivery], created: set[str]) -> dict[str, SingletonPolicy]:
    """The deciding policy of each created instance: its first delivery's (the one that
    created it, in consumption order), none if that one had none. A later delivery of
    the id is a duplicate, whatever workflow it names (found in review: an id created
    as a plain workflow took the policy of a later record naming a singleton one)."""
    found: dict[str, SingletonPolicy] = {}
    seen: set[str] = set()
    for d in deliveries:
        job_id = d.envelope.job_id
        if job_id in seen:
            continue
        seen.add(job_id)
        if d.singleton is not None and job_id in created:
            found[job_id] = d.singleton
    return found


def _plan_skip(
    key: tuple[str, str], live: list[_Live], skips: dict[str, tuple[str, tuple[str, str]]]
) -> list[tuple[str, str]]:
    """skip: the oldest live instance stays the one; every new one after it is skipped
    (two older live ones, a restart or a child's, are not this batch's to undo). One
    already superseded (the workflow was cancel_in_progress before a deploy) is being
    stopped: never the one to give way to (this batch's own rows never are)."""
    staying = [x for x in live if not x.superseded]
    active = staying[0].job_id
    skipped = [x.job_id for x in staying[1:] if x.new]
    skips.update((job_id, (active, key)) for job_id in skipped)
    decisions = [(key[0], str(SingletonDecision.ACTIVE))] if staying[0].new else []
    return decisions + [(key[0], str(SingletonDecision.SKIPPED))] * len(skipped)


def _plan_cancel(
    key: tuple[str, str], live: list[_Live], cancels: dict[str, tuple[str, tuple[str, str]]]
) -> list[tuple[str, str]]:
    """cancel_in_progress: the newest stays; each older live one is superseded by the
    next one, once (one already superseded is being stopped by its engine)."""
    cancels.update(
        (a.job_id, (b.job_id, key)) for a, b in itertools.pairwise(live) if not a.superseded
    )
    return [(key[0], str(SingletonDecision.ACTIVE))] if live[-1].new else []


def _skip(conn: Connection, skips: dict[str, tuple[str, tuple[str, str]]]) -> None:
    if not skips:
        return
    ids = sorted(skips)
    params = {"ids": ids, "actives": [skips[j][0] for j in ids]}
    conn.execute(_SKIP, {**params, "skipped": str(InstanceStatus.SKIPPED)})
    lifecycle.emit(conn, [_skipped(j, *skips[j]) for j in ids])


def _skipped(
    job_id: str, active: str, key: tuple[str, str]
) -> tuple[str, LifecycleEvent, dict[str, Any]]:
    data = {"singleton": {"key": key[1], "mode": "skip", "active_job_id": active}}
    return (job_id, LifecycleEvent.SKIPPED, data)


def _cancel(
    conn: Connection, cancels: dict[str, tuple[str, tuple[str, str]]]
) -> list[tuple[str, str]]:
    """Terminate the superseded ones by the operator's rule, locked in job-id order and
    re-checked live under the lock (an engine may have finished one since the read)."""
    if not cancels:
        return []
    rows = conn.execute(_LOCK_LIVE, {"ids": sorted(cancels)}).all()
    locked = [r for r in rows if InstanceStatus(r.status) in LIVE]
    ids = [r.job_id for r in locked]
    conn.execute(_CANCELLED_BY, {"ids": ids, "bys": [cancels[j][0] for j in ids]})
    lifecycle.emit(conn, [_superseded(cancels[j][1], j, cancels[j][0]) for j in ids])
    params = {
        "ids": ids,
        "terminated": str(InstanceStatus.TERMINATED),
        "closing": str(ParentClosePolicy.TERMINATE),
        "final": sorted(TERMINAL_STATUSES),
    }
    quiet = set(conn.execute(_TERMINATE_QUIET, params).scalars())
    lifecycle.emit(conn, [(j, LifecycleEvent.TERMINATED, None) for j in ids if j in quiet])
    for r in locked:
        if r.job_id not in quiet:
            asked = ControlAction(r.requested_action) if r.requested_action else None
            transition(conn, r.job_id, BulkAction.TERMINATE, InstanceStatus(r.status), asked)
    return [(cancels[j][1][0], str(SingletonDecision.CANCELLED)) for j in ids]


def _superseded(
    key: tuple[str, str], job_id: str, by: str
) -> tuple[str, LifecycleEvent, dict[str, Any]]:
    data = {"singleton": {"key": key[1], "mode": "cancel_in_progress", "by_job_id": by}}
    return (job_id, LifecycleEvent.SUPERSEDED, data)
