"""The flow-controlled claim: per-key concurrency, rate limits, priority and fairness.

A workflow that declares flow control is claimed by :func:`claim_flow`, under the
per-workflow advisory lock :func:`~workflow_engine.store.writes.claim.claim` takes (tried,
in the plain claim's statements, before these), in two statements with
``FOR UPDATE SKIP LOCKED``: step 1 (the pool) is read by one, planned with sorts priced
out so that it can only probe ``onceflow_instances_lane_idx`` in order whatever the
statistics say (:func:`~workflow_engine.store.fragments.in_index_order`); steps 2-4 are
the other, which reads the pool's instances again by job id, in its own snapshot:

1. **lanes**: the distinct fairness lanes (``flow_lane``, the key value stored when the
   instance was created) of the workflow's runnable instances, by a loose index scan of
   ``onceflow_instances_lane_idx``; and the first few runnable instances of each lane,
   in claim order (``onceflow_claim_order``: priority, aged by time waited). So a lane's
   burst never hides another lane's head (no head-of-line blocking), whatever its size.
   When a lane mixes values of a limit's key (fairness on the tenant, one running per
   customer), it reads deeper (:data:`LOOKAHEAD`, shared among the lanes), so heads held
   back by one customer's full key do not hide the tenant's other customers.
2. **limits**, computed from the database: the slots held per concurrency key
   (``running``, plus ``sleeping``/``waiting`` when declared), the starts per rate key
   in the last period (``onceflow_rate_starts``). A candidate passes when its rank
   within its key, plus what the key already holds, stays within the limit.
3. **fairness**: the eligible candidates are taken round-robin across lanes (the first
   of each lane, then the second...), in claim order within a round.
4. the chosen rows are locked (``SKIP LOCKED``, re-checked runnable), marked running,
   and their starts are recorded for the rate limit, in the same statement.

The advisory lock serialises the claims of one workflow across engines and both
statements' snapshots are taken after it is granted, so every claim sees the slots and
starts of the claims before it: the limits hold across any number of engines. Every key
is computed from ``params`` in the statement; the stored lane only serves the lookahead.
"""

from __future__ import annotations

from typing import Any

import orjson
import sqlalchemy as sa

from onceflow.vocabulary import InstanceStatus
from workflow_engine.model import FlowControl
from workflow_engine.store.fragments import (
    CLAIMED_OUT,
    STARTED_EVENTS,
    in_index_order,
    mark_running,
)
from workflow_engine.store.fragments import NOW as _NOW
from workflow_engine.store.fragments import RUNNABLE as _RUNNABLE

_ORDER = "onceflow_claim_order(run_after, priority)"

#: Only the definition versions this engine has. An instance with no recorded version
#: (created before versioning) is claimed only by an engine that has its workflow: one
#: that lacks it would fail it as "unknown workflow" (``:any_workflow``: a caller that
#: named no versions, a tool, takes the unversioned ones of every workflow).
HAVE_VERSION = """
      AND ((version IS NULL AND (CAST(:any_workflow AS boolean)
                                 OR workflow = ANY(CAST(:have_workflows AS text[]))))
           OR (workflow, version) IN (SELECT * FROM unnest(
               CAST(:have_workflows AS text[]), CAST(:have_versions AS text[]))))
"""

#: A flow-controlled instance is claimed only up to ``:cutoff`` in the one claim order,
#: the place of the last plain candidate that would fill the batch (``claim._claim_flows``;
#: NULL: no plain candidate competes for the room).
_CANDIDATE = f"""
    SELECT job_id, params, status, started_at, flow_lane, {_ORDER} AS ord
    FROM onceflow_instances
    WHERE workflow = :workflow AND status IN ({_RUNNABLE}) AND run_after <= {_NOW}
      AND (CAST(:cutoff AS timestamptz) IS NULL OR {_ORDER} <= CAST(:cutoff AS timestamptz))
      {HAVE_VERSION}
"""

# A flow-controlled claim is two statements, as the plain claim is (store/writes/claim.py): the
# read of the lanes' heads (the pool), planned with sorts priced out, so that the walk
# over the lanes and every per-lane read are ordered probes of
# onceflow_instances_lane_idx whatever the statistics say (on statistics from before a
# burst they sorted the whole backlog, once per lane: 654 ms a claim at 20,000 queued
# over 50 keys, 25 ms analysed; tests/integration/test_engine_plans.py); then the limits,
# the choice, the lock and the lease, planned as usual, from the pool's job ids.
_FLOW_POOL = sa.text(
    f"""
WITH RECURSIVE lanes(lane) AS (
    (SELECT flow_lane FROM onceflow_instances
     WHERE workflow = :workflow AND status IN ({_RUNNABLE}) AND flow_lane IS NOT NULL
     ORDER BY flow_lane LIMIT 1)
    UNION ALL
    SELECT (SELECT i.flow_lane FROM onceflow_instances i
            WHERE i.workflow = :workflow AND i.status IN ({_RUNNABLE})
              AND i.flow_lane > l.lane
            ORDER BY i.flow_lane LIMIT 1)
    FROM lanes l WHERE l.lane IS NOT NULL
),
lane_count AS (SELECT count(*) AS n FROM lanes WHERE lane IS NOT NULL),
per_lane AS (
    -- how many instances of each lane to read: enough heads to fill a batch twice over
    -- (at least :min_per_lane), or, when a limit's key is not the lane, an equal share
    -- of :depth, so the heads held back by a full key do not hide the rest of the lane
    SELECT greatest(h, ceil(CAST(:depth AS float8) / greatest(n, 1))::int) AS n
    FROM lane_count, LATERAL (SELECT least(CAST(:limit AS int), greatest(
        CAST(:min_per_lane AS int), ceil(2.0 * :limit / greatest(n, 1))::int))) AS heads(h)
),
pool AS (
    SELECT p.* FROM lanes l CROSS JOIN LATERAL (
        {_CANDIDATE} AND flow_lane = l.lane
        ORDER BY {_ORDER} LIMIT (SELECT n FROM per_lane)
    ) p
    WHERE l.lane IS NOT NULL
    UNION ALL
    (
        -- instances created without a lane; "flow_lane," in the order makes the planner
        -- read onceflow_instances_lane_idx (this workflow's rows only)
        {_CANDIDATE} AND flow_lane IS NULL
        ORDER BY flow_lane, {_ORDER} LIMIT greatest(CAST(:limit AS int), :lone_depth)
    )
)
SELECT job_id FROM pool
"""
)

# The rest of the claim, planned as usual, from the pool's job ids. Each candidate's key,
# slot and start are read here, in the snapshot that counts the slots held and the starts
# made: between the statements an operator may restart a sleeping instance (it stops
# holding its slot and becomes a start again), and the limits must see both sides alike.
_CLAIM_FLOW = sa.text(
    f"""
WITH keyed AS (
    SELECT i.* FROM unnest(CAST(:pool AS text[])) AS p(job_id) CROSS JOIN LATERAL (
        -- by job id alone, fenced by OFFSET 0 (no condition pushed in): a primary-key
        -- probe each, never a read of the status indexes on stale statistics
        SELECT job_id, {_ORDER} AS ord, flow_lane, status, run_after,
               params #>> CAST(:ckey AS text[]) AS ck,
               params #>> CAST(:rkey AS text[]) AS rk,
               (status = '{InstanceStatus.QUEUED}' OR NOT :hold) AS needs_slot,
               (started_at IS NULL) AS is_start
        FROM onceflow_instances WHERE job_id = p.job_id OFFSET 0
    ) AS i
    WHERE i.status IN ({_RUNNABLE}) AND i.run_after <= {_NOW}
),
ranked AS (
    SELECT k.*,
           count(*) FILTER (WHERE needs_slot) OVER (
               PARTITION BY ck ORDER BY ord, job_id ROWS UNBOUNDED PRECEDING) AS c_rank,
           count(*) FILTER (WHERE is_start) OVER (
               PARTITION BY rk ORDER BY ord, job_id ROWS UNBOUNDED PRECEDING) AS r_rank
    FROM keyed k
),
held AS (
    SELECT params #>> CAST(:ckey AS text[]) AS ck, count(*) AS n FROM onceflow_instances
    WHERE CAST(:ckey AS text[]) IS NOT NULL
      AND workflow = :workflow AND status = ANY(CAST(:holding AS text[]))
    GROUP BY 1
),
recent AS (
    SELECT key AS rk, count(*) AS n FROM onceflow_rate_starts
    WHERE CAST(:rate_limit AS int) IS NOT NULL
      AND workflow = :workflow AND started_at > now() - make_interval(secs => :period)
    GROUP BY 1
),
eligible AS (
    SELECT r.job_id, r.ord, r.flow_lane, r.rk, r.is_start FROM ranked r
    LEFT JOIN held h ON h.ck IS NOT DISTINCT FROM r.ck
    LEFT JOIN recent s ON s.rk IS NOT DISTINCT FROM r.rk
    WHERE (CAST(:ckey AS text[]) IS NULL OR NOT r.needs_slot
           OR r.c_rank + coalesce(h.n, 0) <= :max_per_key)
      AND (CAST(:rate_limit AS int) IS NULL OR NOT r.is_start
           OR r.r_rank + coalesce(s.n, 0) <= :rate_limit)
),
picked AS (
    SELECT job_id FROM eligible
    ORDER BY CASE WHEN :fair THEN row_number() OVER (
                 PARTITION BY flow_lane ORDER BY ord, job_id) ELSE 1 END,
             ord, job_id
    LIMIT :limit
),
locked AS (
    SELECT i.job_id FROM onceflow_instances i JOIN picked USING (job_id)
    WHERE i.status IN ({_RUNNABLE}) AND i.run_after <= {_NOW}
    FOR UPDATE OF i SKIP LOCKED
),
claimed AS ({mark_running("locked")}
),
started AS ({STARTED_EVENTS}
),
starts AS (
    INSERT INTO onceflow_rate_starts (workflow, key, job_id)
    SELECT :workflow, e.rk, c.job_id FROM claimed c JOIN eligible e USING (job_id)
    WHERE CAST(:rate_limit AS int) IS NOT NULL AND e.is_start
),
pruned AS (
    DELETE FROM onceflow_rate_starts
    WHERE CAST(:rate_limit AS int) IS NOT NULL
      AND workflow = :workflow AND started_at <= now() - make_interval(secs => :period)
),
declared AS (
    INSERT INTO onceflow_flow_controls AS f (workflow, spec)
    VALUES (:workflow, CAST(:spec AS jsonb))
    ON CONFLICT ON CONSTRAINT onceflow_flow_controls_pkey DO UPDATE
        SET spec = EXCLUDED.spec, updated_at = now()
        WHERE f.spec IS DISTINCT FROM EXCLUDED.spec
)
SELECT {CLAIMED_OUT} FROM claimed
"""
)

#: How many instances one claim may read past the heads of the lanes (shared among the
#: lanes, at least the heads of each) when a lane mixes values of a limit's key (the
#: concurrency or rate key is not the lane's key, e.g. fairness on the tenant and one
#: running per customer); and of the instances without a lane, which always mix them.
#: The heads of a lane can then all belong to a key that is full (or to one key beyond
#: its free slots): the claim looks behind them, so one customer's backlog does not stall
#: its tenant's other customers. Bounded, so a claim's cost does not grow with a backlog:
#: behind more than its share of one held key, a lane still waits for that key.
LOOKAHEAD = 1024

#: What holds a per-key slot, without and with ``hold_while_waiting``.
_HOLDING = [str(InstanceStatus.RUNNING)]
_HOLDING_WAITING = [
    str(InstanceStatus.RUNNING),
    str(InstanceStatus.SLEEPING),
    str(InstanceStatus.WAITING),
]


def claim_flow(
    conn: sa.Connection,
    workflow: str,
    flow: FlowControl,
    limit: int,
    params: dict[str, Any],
) -> list[sa.Row[Any]]:
    """Claim up to ``limit`` instances of ``workflow`` within its flow control, in the
    caller's transaction (which holds the workflow's advisory lock). ``params``: owner,
    lease, now, inflight, have_workflows, have_versions, as the plain claim takes them,
    and the claim-order ``cutoff``."""
    values = flow_params(workflow, flow, limit, params)
    values["pool"] = [job_id for (job_id,) in in_index_order(conn, _FLOW_POOL, values)]
    if not values["pool"]:
        return []  # nothing runnable up to the cutoff: the second statement is spared
    return list(conn.execute(_CLAIM_FLOW, values))


def flow_params(
    workflow: str, flow: FlowControl, limit: int, params: dict[str, Any]
) -> dict[str, Any]:
    """The values both statements of a flow-controlled claim read."""
    rate = flow.rate_limit is not None
    keys = flow.limit_keys
    return {
        **params,
        "workflow": workflow,
        "limit": limit,
        "min_per_lane": 2,
        "depth": LOOKAHEAD if any(key != flow.lane for key in keys) else 0,
        "lone_depth": LOOKAHEAD if keys else 0,
        "ckey": list(flow.concurrency_key) if flow.concurrency_key else None,
        "max_per_key": flow.max_per_key,
        "hold": flow.hold_while_waiting,
        "holding": _HOLDING_WAITING if flow.hold_while_waiting else _HOLDING,
        "rkey": list(flow.rate_key) if rate and flow.rate_key else None,
        "rate_limit": flow.rate_limit,
        "period": flow.rate_period,
        "fair": flow.fairness_key is not None,
        "spec": orjson.dumps(flow.spec()).decode(),
    }
