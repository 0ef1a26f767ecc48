"""Forming batches: the members of a batched workflow (``@workflow(batch=...)``,
migration 0026) waiting in their key's pool become one batch run.

The worker creates each member as its own instance, ``batching`` (no engine claims
it), with its key's value in ``batch_key``. :func:`form_due` (an engine's batch former,
:mod:`workflow_engine.engine.batch_former`) finds the pools that are due - ``max_size``
members waiting, or the oldest eligible ``max_wait`` ago (eligible: its ``run_after``,
so a delayed start delays a member) - and forms each batch in ONE transaction:

1. lock up to ``max_size`` of the pool's members ``FOR UPDATE SKIP LOCKED``, oldest
   first. The status test is re-evaluated on the row as it is when its lock is granted
   (READ COMMITTED), so a member another engine has just batched, or an operator has
   just terminated, is not taken; one that is being batched right now is skipped;
2. re-check the trigger on what was locked (the pool read in step 0 was an earlier
   statement: another engine may have taken some of those members since): a batch of
   fewer than ``max_size`` is formed only when its oldest is due;
3. insert the batch run: a job (origin ``batch``) and an instance whose id is
   ``<first member>~batch``, through the same unique constraints as every job (a member
   is in one batch only, so its id names one batch run); its params list the members;
4. mark every member ``batched`` with ``batch_id`` and ``batch_index``, and write their
   ``instance.batched`` events and the run's ``instance.created``.

A member can therefore never be in two batches (its row lock and status test), and a
crash anywhere before the commit leaves the pool as it was. The failpoint
``batch.after_lock`` stops a former after step 2, with the members locked.
What happens when the batch run ends is the trigger ``onceflow_batch_outcome``'s.
"""

from __future__ import annotations

import logging
from dataclasses import dataclass
from datetime import datetime
from typing import Any

import orjson
import sqlalchemy as sa
from sqlalchemy.engine import Connection, Engine

from onceflow import failpoints
from onceflow.envelope import DEFAULT_PRIORITY, params_digest
from onceflow.ids import BATCH_SUFFIX
from onceflow.vocabulary import InstanceStatus, JobKind, LifecycleEvent, Origin
from workflow_engine.model import BatchPolicy
from workflow_engine.store import lifecycle
from workflow_engine.store.db import is_transient
from workflow_engine.store.fragments import NOW, notify_runnable

log = logging.getLogger(__name__)

#: The most batches one pass forms for one workflow (then the next workflow's turn).
MAX_BATCHES_PER_PASS = 50

# Which of the batched workflows have a member waiting: one probe of
# onceflow_instances_batching_idx per workflow, so an idle pass costs one round trip.
_WAITING = sa.text(
    f"""
SELECT w FROM unnest(CAST(:workflows AS text[])) AS w
WHERE EXISTS (SELECT 1 FROM onceflow_instances
              WHERE workflow = w AND status = '{InstanceStatus.BATCHING}')
"""
)


def workflows_waiting(db: Engine, workflows: list[str]) -> list[str]:
    """The workflows of ``workflows`` that have members waiting to be batched."""
    with db.connect() as conn:
        return list(conn.execute(_WAITING, {"workflows": workflows}).scalars())


# The pools of one workflow that are due, oldest first. A loose index scan of
# onceflow_instances_batching_idx: the distinct keys one probe each (a recursive CTE:
# no skip scan before PostgreSQL 18), then per key its oldest member and a count of its
# eligible members that stops at max_size. A GROUP BY over the waiting members read
# all of them on every pass: 15 ms for 5,000 of 5 keys, against three probes per key.
# A pool is of one definition version, the oldest member's (a batch run is created with
# its members' version; another version's members of the key wait until the older
# ones are formed, or their own oldest is due).
_DUE_POOLS = sa.text(
    f"""
WITH RECURSIVE keys AS (
    (SELECT batch_key FROM onceflow_instances
     WHERE workflow = :workflow AND status = '{InstanceStatus.BATCHING}'
     ORDER BY batch_key LIMIT 1)
    UNION ALL
    SELECT n.batch_key FROM keys k CROSS JOIN LATERAL (
        SELECT i.batch_key FROM onceflow_instances i
        WHERE i.workflow = :workflow AND i.status = '{InstanceStatus.BATCHING}'
          AND i.batch_key > k.batch_key
        ORDER BY i.batch_key LIMIT 1
    ) AS n
),
pools AS (
    SELECT k.batch_key, o.version, o.run_after AS oldest, (
        SELECT count(*) FROM (
            SELECT 1 FROM onceflow_instances m
            WHERE m.workflow = :workflow AND m.batch_key = k.batch_key
              AND m.status = '{InstanceStatus.BATCHING}' AND m.run_after <= {NOW}
              AND m.version IS NOT DISTINCT FROM o.version
            LIMIT :size) AS c) AS eligible
    FROM keys k CROSS JOIN LATERAL (
        SELECT i.version, i.run_after FROM onceflow_instances i
        WHERE i.workflow = :workflow AND i.batch_key = k.batch_key
          AND i.status = '{InstanceStatus.BATCHING}'
        ORDER BY i.run_after, i.job_id LIMIT 1
    ) AS o
)
SELECT batch_key, version, eligible >= :size AS full FROM pools
WHERE oldest <= {NOW}
  AND (eligible >= :size OR oldest <= {NOW} - make_interval(secs => :wait))
ORDER BY oldest
LIMIT :pools
"""
)

# Step 1: the pool's oldest members, locked; ``due``: the oldest was eligible max_wait ago.
# Their params as the stored JSON text, copied into the run's as it is (orjson.Fragment):
# the driver's Python value of a jsonb number can be one orjson cannot write (1e30 is
# printed as 31 digits, read as an int over 64 bits), which failed every formation.
_LOCK_MEMBERS = sa.text(
    f"""
SELECT job_id, CAST(params AS text) AS params,
       run_after <= {NOW} - make_interval(secs => :wait) AS due
FROM onceflow_instances
WHERE workflow = :workflow AND batch_key = :key AND version IS NOT DISTINCT FROM :version
  AND status = '{InstanceStatus.BATCHING}' AND run_after <= {NOW}
ORDER BY run_after, job_id
LIMIT :size
FOR UPDATE SKIP LOCKED
"""
)

# Steps 3 and 4 in one statement. The job row of the run has no Kafka position.
_FORM = sa.text(
    f"""
WITH job AS (
    INSERT INTO onceflow_jobs (job_id, kind, type_name, params_digest, submitted_at, origin)
    VALUES (:batch, '{JobKind.WORKFLOW}', :workflow, :digest, now(), '{Origin.BATCH}')
    ON CONFLICT ON CONSTRAINT onceflow_jobs_job_id_key DO NOTHING
    RETURNING job_id
),
run AS (
    INSERT INTO onceflow_instances (job_id, workflow, params, version, batch_size)
    SELECT job_id, :workflow, CAST(:params AS jsonb), :version, :size FROM job
    RETURNING job_id
),
members AS (
    SELECT * FROM unnest(CAST(:members AS text[])) WITH ORDINALITY AS t(job_id, ord)
)
UPDATE onceflow_instances i
SET status = '{InstanceStatus.BATCHED}', batch_id = run.job_id,
    batch_index = members.ord - 1, updated_at = now()
FROM members, run
WHERE i.job_id = members.job_id AND i.status = '{InstanceStatus.BATCHING}'
RETURNING i.job_id
"""
)


class BatchIdTaken(RuntimeError):
    """A batch run's id already exists: a member was batched twice (never expected)."""


@dataclass(frozen=True, slots=True)
class FormedBatch:
    """One batch formed: its run's job id, its workflow, key, members (in order) and
    what triggered it (``size``: max_size members waited; ``wait``: the oldest was due)."""

    batch_id: str
    workflow: str
    key: str
    members: tuple[str, ...]
    trigger: str


def batch_params(key: str, members: list[tuple[str, Any]]) -> dict[str, Any]:
    """A batch run's params: its key, and every member's job id and params in order
    (a member's params: a value orjson writes, here the stored JSON as a Fragment)."""
    return {"key": key, "members": [{"job_id": j, "params": p} for j, p in members]}


def form_due(
    db: Engine, workflow: str, policy: BatchPolicy, now: datetime | None = None
) -> list[FormedBatch]:
    """Form the due batches of one workflow (each in its own transaction), at most
    :data:`MAX_BATCHES_PER_PASS`; answers what was formed."""
    formed: list[FormedBatch] = []
    failed: set[tuple[str, str | None]] = set()  # tried once this pass, not again
    while len(formed) < MAX_BATCHES_PER_PASS:
        with db.connect() as conn:
            pools = conn.execute(
                _DUE_POOLS, _pool_params(workflow, policy, now, MAX_BATCHES_PER_PASS)
            ).all()
        if not pools:
            break
        made = [
            b
            for key, version, _ in pools
            if (key, version) not in failed
            and (b := _form_isolated(db, workflow, policy, key, version, now, failed))
        ]
        if not made:
            break  # every due pool is being formed by another engine (locked) or not due
        formed += made
    return formed


def _pool_params(
    workflow: str, policy: BatchPolicy, now: datetime | None, pools: int
) -> dict[str, Any]:
    return {
        "workflow": workflow,
        "size": policy.max_size,
        "wait": policy.max_wait,
        "now": now,
        "pools": pools,
    }


def _form_isolated(
    db: Engine,
    workflow: str,
    policy: BatchPolicy,
    key: str,
    version: str | None,
    now: datetime | None,
    failed: set[tuple[str, str | None]],
) -> FormedBatch | None:
    """:func:`_form_one`, a failure logged with its pool (added to ``failed``) and taken
    as nothing formed: its transaction rolled back (the pool whole), it holds up no
    other pool or workflow of the pass; a database that cannot answer still ends the
    pass (the next one tries)."""
    try:
        return _form_one(db, workflow, policy, key, version, now)
    except Exception as exc:
        if is_transient(exc):
            raise
        failed.add((key, version))
        log.exception(
            "batch of %s key %r could not be formed",
            workflow,
            key,
            extra={"event": "engine.batch_error", "workflow": workflow, "batch_key": key},
        )
        return None


def _form_one(
    db: Engine,
    workflow: str,
    policy: BatchPolicy,
    key: str,
    version: str | None,
    now: datetime | None,
) -> FormedBatch | None:
    """Form one batch of the pool ``(workflow, key, version)`` in one transaction, or
    None when what could be locked is not due (fewer than max_size, the oldest not
    max_wait old) or nothing could."""
    params = {**_pool_params(workflow, policy, now, 0), "key": key, "version": version}
    with db.begin() as conn:
        rows = conn.execute(_LOCK_MEMBERS, params).all()
        full = len(rows) >= policy.max_size
        if not rows or not (full or rows[0].due):
            return None  # the rollback releases the locks
        failpoints.hit("batch.after_lock", rows[0].job_id)
        members = [(row.job_id, orjson.Fragment(row.params)) for row in rows]
        batch_id = members[0][0] + BATCH_SUFFIX
        _insert_run(conn, workflow, key, version, batch_id, members)
        _emit_formed(conn, batch_id, [job_id for job_id, _ in members])
        notify_runnable(conn)
    return FormedBatch(
        batch_id, workflow, key, tuple(j for j, _ in members), "size" if full else "wait"
    )


def _insert_run(
    conn: Connection,
    workflow: str,
    key: str,
    version: str | None,
    batch_id: str,
    members: list[tuple[str, orjson.Fragment]],
) -> None:
    run_params = batch_params(key, members)
    marked = conn.execute(
        _FORM,
        {
            "batch": batch_id,
            "workflow": workflow,
            "digest": params_digest(run_params),
            "params": orjson.dumps(run_params).decode(),
            "version": version,
            "size": len(members),
            "members": [job_id for job_id, _ in members],
        },
    ).all()
    if len(marked) != len(members):
        # the run's id existed (no member marked) or a locked member was not 'batching':
        # neither can happen while members are locked and tested; refuse, roll back
        raise BatchIdTaken(f"batch {batch_id}: {len(marked)} of {len(members)} members marked")


def _emit_formed(conn: Connection, batch_id: str, members: list[str]) -> None:
    """The run's instance.created (naming its members' count) and each member's
    instance.batched (the run and the member's place in it)."""
    size = len(members)
    events: list[tuple[str, LifecycleEvent, dict[str, Any] | None]] = [
        (batch_id, LifecycleEvent.CREATED, {"priority": DEFAULT_PRIORITY, "batch_size": size})
    ]
    events += [
        (
            job_id,
            LifecycleEvent.BATCHED,
            {"batch": {"batch_id": batch_id, "index": k, "size": size}},
        )
        for k, job_id in enumerate(members)
    ]
    lifecycle.emit(conn, events)
