"""SQL text shared by the claims (:mod:`~workflow_engine.store.writes.claim`, the
flow-controlled :mod:`~workflow_engine.store.writes.flow`) and the lease-guarded writes."""

from __future__ import annotations

from typing import Any

import sqlalchemy as sa
from sqlalchemy.engine import Connection

from onceflow.vocabulary import (
    RUNNABLE_STATUSES,
    TERMINAL_STATUSES,
    InstanceStatus,
    LifecycleEvent,
)
from workflow_engine.store.lifecycle import ONE_EVENT, outbox_insert, position_of, record_position
from workflow_engine.store.prepared import execute_prepared

#: ``'queued', 'sleeping', 'waiting'`` spelled out in the SQL text, not passed as a
#: parameter: the planner matches the literal list against the partial index
#: ``onceflow_instances_runnable_idx``, which a parameter array would defeat.
RUNNABLE = ", ".join(f"'{status}'" for status in sorted(RUNNABLE_STATUSES))

#: ``'complete', 'errored', 'skipped', 'terminated'`` spelled out in the SQL text, for
#: ``status IN (...)`` in statements that take no parameter array for it.
TERMINAL = ", ".join(f"'{status}'" for status in sorted(TERMINAL_STATUSES))

#: The statement's notion of now: the test clock's ``:now`` when given, else the server's.
NOW = "coalesce(CAST(:now AS timestamptz), now())"


#: The claimed instance's workflow's execution timeout in seconds, from the claim's
#: ``:timeout_workflows`` / ``:timeout_seconds`` (the engine's registry); NULL: none.
_TIMEOUT_OF = """(SELECT t.secs FROM unnest(CAST(:timeout_workflows AS text[]),
                                  CAST(:timeout_seconds AS double precision[])) AS t(w, secs)
         WHERE t.w = i.workflow)"""


def mark_running(source: str) -> str:
    """The CTE body that leases the instances whose ``job_id`` the CTE ``source`` holds,
    but those in ``:inflight``, and returns what the runner needs of each (one shape for
    every claim)."""
    return f"""
    UPDATE onceflow_instances i
    SET status = '{InstanceStatus.RUNNING}', lease_owner = :owner,
        lease_expires_at = now() + make_interval(secs => :lease),
        started_at = coalesce(i.started_at, now()), updated_at = now(),
        claim_count = i.claim_count + 1,
        -- instance.started is the first claim of a run (started_at was NULL: created,
        -- or restarted), not each claim after a sleep, a wait or a rescue
        event_seq = i.event_seq + CASE WHEN i.started_at IS NULL THEN {ONE_EVENT} ELSE 0 END,
        -- the execution deadline (execution_timeout, migration 0023): set by the first
        -- start of a run (started_at was NULL: created, or restarted; a retry clears
        -- it) and kept by every later claim, so a rescue or a restarted engine keeps it
        deadline = CASE WHEN i.started_at IS NULL OR i.deadline IS NULL
                        THEN now() + make_interval(secs => {_TIMEOUT_OF}) ELSE i.deadline END
    FROM {source} src, onceflow_jobs j
    WHERE i.job_id = src.job_id AND j.job_id = src.job_id
      -- never a first start past its start limit (start_within): the expiry
      -- (time_limits.expire_unstarted) errors it instead; both test the row they lock
      AND NOT coalesce(i.started_at IS NULL AND i.start_by <= now(), false)
      -- never an id this engine still runs: a rescue may have re-queued it while its
      -- run, cut off from the database, goes on (that run is fenced by its claim)
      AND i.job_id <> ALL(CAST(:inflight AS text[]))
    RETURNING {CLAIMED_COLUMNS},
              -- for the started event: set by this statement (now(): this transaction),
              -- and the position of the job's record from this statement's own join
              i.started_at = now() AS first_start, i.event_seq AS seq, i.status,
              {record_position("j")}"""


#: The columns of a claimed instance the runner takes (``claim.Claimed``), from the CTE
#: of :func:`mark_running`, in order. ``overdue`` reads the clock the claim's pick read
#: (``run_after <= NOW``; a test clock's ``:now``): a sleep capped at its deadline is due
#: exactly when it is overdue, never due and not overdue (replayed into the same capped
#: sleep, runnable at once, claimed again until the server's clock caught up).
#: A run after the first (id reuse) is the submission that started it: its own
#: submitted_at and traceparent (``onceflow_runs``), one key probe per such claim.
_RUN_SUBMISSION = (
    "CASE WHEN i.run > 1 THEN (SELECT r.{c} FROM onceflow_runs r"
    " WHERE r.job_id = i.job_id AND r.run = i.run) ELSE j.{c} END AS {c}"
)
CLAIMED_COLUMNS = (
    "i.job_id, i.workflow, i.params, i.created_at,"
    f" {_RUN_SUBMISSION.format(c='submitted_at')}, i.claim_count,"
    f" {_RUN_SUBMISSION.format(c='traceparent')}, i.version, i.deadline,"
    f" coalesce(i.deadline <= {NOW}, false) AS overdue,"
    " i.run"
)
CLAIMED_OUT = (
    "job_id, workflow, params, created_at, submitted_at, claim_count, traceparent, version,"
    " deadline, overdue, run"
)

#: The CTE body writing ``instance.started`` for the first claims among ``claimed``,
#: with the provenance :func:`mark_running` returned (no second probe of the job record).
STARTED_EVENTS = outbox_insert(
    "claimed",
    f"'{LifecycleEvent.STARTED}'",
    where="e.first_start",
    provenance=position_of("e"),
)


def held(table: str = "", claim: str = ":claim") -> str:
    """The condition "``:owner`` holds this instance's lease under claim ``claim``", the
    whole test of it (``table``: the alias of ``onceflow_instances`` in the statement, if
    any; ``claim``: the SQL expression of the claim number, a column of the batch's input
    in the batched writes).

    The claim number makes the lease a fencing token (``writes.Lease``): a run from an
    older claim of the same instance, even in this same engine, matches no row.

    ``onceflow_instances_lease_check`` makes an owner and an expiry, both set, mean
    ``status = 'running'``, so no status is named, on purpose: a status condition lets
    the planner cost the indexes on status from statistics that may predate a burst
    ("almost nothing runs") and read every running instance for each batch of
    checkpoints instead of probing its job ids (tests/integration/test_engine_plans.py)."""
    t = f"{table}." if table else ""
    return (
        f"{t}lease_owner = :owner AND {t}claim_count = {claim} AND {t}lease_expires_at IS NOT NULL"
    )


#: Locks the running instance ``:job_id`` if ``:owner`` holds its lease under claim
#: ``:claim`` (one row or none).
LEASE_CTE = f"""
lease AS (
    SELECT job_id, requested_action FROM onceflow_instances
    WHERE job_id = :job_id AND {held()}
    FOR SHARE
)"""


def json_text(data: bytes | None) -> str | None:
    """JSON already encoded by the engine (orjson bytes), as the text a jsonb cast takes."""
    return data.decode() if data is not None else None


# Plain strings for exec_driver_sql (SET takes no bind parameter: nothing to bind).
_SORT_OFF = "SET LOCAL enable_sort = off"
_SORT_DEFAULT = "SET LOCAL enable_sort TO DEFAULT"
_SORTING = (_SORT_OFF, _SORT_DEFAULT)
# For a prepared read: its one generic plan, made (once per connection) with sorting
# priced out like every plan of it. Left to choose, PostgreSQL keeps planning it on every
# execution, since a generic plan's ``LIMIT $n`` is costed at a tenth of the table and
# looks dearer than each custom plan that knows its limit of a few dozen rows.
_GENERIC_SORT_OFF = "SET LOCAL enable_sort = off; SET LOCAL plan_cache_mode = force_generic_plan"
_GENERIC_SORT_DEFAULT = "SET LOCAL enable_sort TO DEFAULT; SET LOCAL plan_cache_mode TO DEFAULT"


def in_index_order(
    conn: sa.Connection,
    statement: sa.TextClause,
    params: dict[str, Any],
    *,
    prepared: bool = False,
) -> list[Any]:
    """Run a claim's read with sorting priced out of its plan (this statement only), so
    that its only plan reads the claim indexes in order and stops at its limits. Left to
    the statistics, the planner sorts the whole runnable set when it believes that set
    small, and statistics taken before a burst (analysed with a few hundred runnable, a
    million queued since) say just that. Only for a statement whose every ORDER BY an
    index can serve: a sort it cannot avoid would be priced out too and distort the rest
    of its plan.

    ``prepared``: run it as the connection's prepared statement with its generic plan
    (``prepared.execute_prepared``; every parameter inside a ``CAST``), planned once per
    connection instead of on each claim: planning the claim's pick took ~1.1 ms of the
    server's CPU, running it ~0.1 ms, on the path of every light-load job."""
    off, default = (_GENERIC_SORT_OFF, _GENERIC_SORT_DEFAULT) if prepared else _SORTING
    conn.exec_driver_sql(off)
    run = execute_prepared if prepared else Connection.execute
    rows = list(run(conn, statement, params))
    conn.exec_driver_sql(default)
    return rows


RUNNABLE_CHANNEL = "onceflow_runnable"


_NOTIFY = sa.text("SELECT pg_notify(:c, '')")


def notify_runnable(conn: Connection) -> None:
    """Wake the engines (delivered when the caller's transaction commits)."""
    conn.execute(_NOTIFY, {"c": RUNNABLE_CHANNEL})
