"""Child workflows: starting one from a parent, taking its result, waking the parent.

A child is an ordinary job whose id is derived from its parent's and a name the
workflow code chooses (:func:`child_job_id`), created through the same unique
constraint as every job (``onceflow_jobs_job_id_key``) and recorded in the parent's
history (an entry of kind ``child``) in the same transaction. So a replaying parent, a
second engine or a crash at any point never makes a second child, and never loses one.

Waking a parent that awaits a child (``ctx.child_result``) cannot be lost, by lock
order, with no timer: every transaction that finishes a child locks its parent's row
and then, in a later statement (a fresh snapshot), wakes the parent if it is waiting
for that child (:func:`wake_parents`); a parent that suspends re-checks its awaited
children after it has locked its row (:func:`awaited_child_finished`, in
:func:`workflow_engine.store.writes.waits.suspend`). Whichever of the two takes the parent's
row first, the second sees the first's commit.
"""

from __future__ import annotations

import re
from dataclasses import dataclass
from datetime import datetime
from typing import Any

import orjson
import sqlalchemy as sa
from sqlalchemy.engine import Connection, Engine
from sqlalchemy.exc import IntegrityError

from onceflow.envelope import params_digest
from onceflow.ids import is_derived_job_id, is_valid_job_id
from onceflow.vocabulary import (
    TERMINAL_STATUSES,
    InstanceStatus,
    JobKind,
    LifecycleEvent,
    Origin,
    ParentClosePolicy,
    StepKind,
    StepStatus,
)
from workflow_engine.errors import (
    ControlRequested,
    LeaseLost,
    NonDeterminismError,
    NonRetryableError,
)
from workflow_engine.store.commands import Lease
from workflow_engine.store.db import constraint_of
from workflow_engine.store.fragments import TERMINAL, held, notify_runnable
from workflow_engine.store.lifecycle import ONE_EVENT, outbox_insert

#: ``<parent job id>__<name>``. A name has no ``__`` and does not start or end with
#: ``_``, so the last ``__`` followed by a non-underscore splits any child id back into
#: (parent, name): two different (parent, name) pairs never give one id.
SEPARATOR = "__"
_NAME = re.compile(r"[A-Za-z0-9-]+(?:_[A-Za-z0-9-]+)*")
#: The longest child id of a schedule's tick (``<schedule>@<instant>``, up to 101
#: characters) or of its descendants: their ids carry the tick's ``@`` and ``:``, which
#: no client-supplied id has, so they can never collide with one.
MAX_TICK_CHILD_ID = 200


class ChildIdTaken(NonRetryableError):
    """The derived child id already belongs to a job that is not this parent's child
    (a client submitted that id): the parent fails rather than adopt a stranger."""


#: Between a child's id and the parent's run that started it, from run 2 on (id reuse).
RUN_SUFFIX = "~run"


def child_job_id(parent_job_id: str, name: str, run: int = 1) -> str:
    """The child's job id: deterministic, and a valid job id (``onceflow.ids``).

    ``run``: the parent's run (id reuse, migration 0027). Run 1's children are
    ``<parent>__<name>``; a later run's are ``<parent>__<name>~run<N>``: its own, never
    run 1's, which a reused id's new run would otherwise adopt, finished or failed (an
    ``after_failure`` run 2 of a parent whose child failed failed again at once, the
    child never run; found in review). ``~`` is outside both the client's alphabet and a
    child name's, so no other id is one of these. An operator's restart keeps the run,
    and so its children, as documented."""
    if not _NAME.fullmatch(name):
        raise ValueError(
            f"child name {name!r}: use letters, digits, '-' and single '_' inside"
            " (no '__', no leading or trailing '_')"
        )
    job_id = f"{parent_job_id}{SEPARATOR}{name}"
    if run > 1:
        job_id = f"{job_id}{RUN_SUFFIX}{run}"
    if is_derived_job_id(job_id):  # below a schedule's tick, a fork, or a later run
        if len(job_id) > MAX_TICK_CHILD_ID:
            raise ValueError(
                f"child id {job_id!r} is over {MAX_TICK_CHILD_ID} characters:"
                " choose a shorter child name"
            )
    elif not is_valid_job_id(job_id):
        raise ValueError(
            f"child id {job_id!r} is not a valid job id (at most 100 characters):"
            " choose a shorter child name"
        )
    return job_id


@dataclass(frozen=True, slots=True)
class StartChild:
    """What ``ctx.start_child`` asks the store to record, once."""

    parent_job_id: str
    position: int
    name: str
    child_job_id: str
    workflow: str
    params: dict[str, Any]
    policy: ParentClosePolicy
    version: str | None  # the child workflow's version in the starting engine
    #: The params path of the child workflow's fairness lane (``Registry.lane_path``):
    #: None without flow control, () with flow control but no key.
    lane_path: tuple[str, ...] | None = None


_LEASE = sa.text(
    f"""
SELECT i.requested_action, j.traceparent
FROM onceflow_instances i JOIN onceflow_jobs j USING (job_id)
WHERE i.job_id = :job_id AND {held("i")}
FOR SHARE OF i
"""
)

# instance.created for each child the statement inserts (no Kafka record: kafka null),
# naming its parent.
_CHILD_CREATED_EVENTS = outbox_insert(
    "inst",
    f"'{LifecycleEvent.CREATED}'",
    "jsonb_build_object('priority', e.priority, 'parent_job_id', e.parent_job_id)",
    provenance=(f"'{Origin.CHILD}'", "NULL", "NULL", "NULL"),
)

#: All the children one call starts, in one statement: the job-id registry row (the
#: same unique constraint as every job), the instance when the row is new, and the
#: parent's history entry; per child, whether it was new, whose child an existing one
#: is, and whether its entry was recorded.
_START = sa.text(
    f"""
WITH input AS (
    SELECT * FROM jsonb_to_recordset(CAST(:rows AS jsonb)) AS r(
        child text, workflow text, digest text, params jsonb, version text, policy text,
        position integer, name text, lane_path text[])
),
job AS (
    INSERT INTO onceflow_jobs AS j (job_id, kind, type_name, params_digest, submitted_at,
                                    traceparent, origin)
    SELECT child, '{JobKind.WORKFLOW}', workflow, digest, now(), :traceparent, '{Origin.CHILD}'
    FROM input ORDER BY child
    ON CONFLICT ON CONSTRAINT onceflow_jobs_job_id_key DO UPDATE SET last_seen_at = now()
    RETURNING j.job_id, (j.xmax = 0) AS inserted, j.origin
),
inst AS (
    INSERT INTO onceflow_instances (job_id, workflow, params, version, parent_job_id,
                                    parent_close_policy, flow_lane, event_seq)
    SELECT i.child, i.workflow, i.params, i.version, :parent, i.policy,
           -- the fairness lane, bounded, as the create path stores it (migration 0014)
           onceflow_flow_lane(i.params, i.lane_path), {ONE_EVENT}
    FROM input i JOIN job ON job.job_id = i.child WHERE job.inserted
    RETURNING job_id, workflow, version, priority, event_seq AS seq, status, parent_job_id, run
),
created_events AS ({_CHILD_CREATED_EVENTS}
),
entry AS (
    INSERT INTO onceflow_steps (job_id, position, name, kind, status, child_job_id)
    SELECT :parent, position, name, '{StepKind.CHILD}', '{StepStatus.RUNNING}', child
    FROM input ORDER BY position
    ON CONFLICT ON CONSTRAINT onceflow_steps_pkey DO NOTHING
    RETURNING child_job_id
)
SELECT i.child, job.inserted, job.origin,
       (SELECT o.parent_job_id FROM onceflow_instances o WHERE o.job_id = i.child) AS parent,
       EXISTS (SELECT 1 FROM entry e WHERE e.child_job_id = i.child) AS recorded
FROM input i JOIN job ON job.job_id = i.child
"""
)


def _check_lease(conn: Connection, lease: Lease, job_id: str, what: str) -> str | None:
    """Hold the instance's row (``FOR SHARE``) while writing for it; its traceparent."""
    row = conn.execute(_LEASE, {"job_id": job_id, **lease._asdict()}).one_or_none()
    if row is None:
        raise LeaseLost(f"lease on {job_id} lost before {what}")
    if row.requested_action is not None:
        raise ControlRequested(row.requested_action)
    return row.traceparent


def start_children(db: Engine, lease: Lease, starts: list[StartChild]) -> list[bool]:
    """Create children (once each: the job-id constraint) and record them in their
    parent's history, in one statement and one transaction (the children a
    ``ctx.gather`` starts cost one commit); for each, True if this call created it."""
    if not starts:
        return []
    parent_job_id = starts[0].parent_job_id
    if len({s.name for s in starts}) < len(starts):
        raise NonDeterminismError("a child name is used twice in one workflow run")
    rows = orjson.dumps([_start_row(s) for s in starts]).decode()
    try:
        with db.begin() as conn:
            traceparent = _check_lease(conn, lease, parent_job_id, "starting children")
            found = {
                row.child: row
                for row in conn.execute(
                    _START, {"rows": rows, "traceparent": traceparent, "parent": parent_job_id}
                )
            }
            for start in starts:
                _check_started(start, found[start.child_job_id])
            created = [bool(found[s.child_job_id].inserted) for s in starts]
            if any(created):
                notify_runnable(conn)
            return created
    except IntegrityError as exc:
        if constraint_of(exc) == "onceflow_steps_name_key":
            names = ", ".join(repr(s.name) for s in starts)
            raise NonDeterminismError(
                f"a child name ({names}) is also used as a step name in this workflow"
            ) from None
        raise


def _start_row(start: StartChild) -> dict[str, Any]:
    return {
        "child": start.child_job_id,
        "lane_path": None if start.lane_path is None else list(start.lane_path),
        "workflow": start.workflow,
        "digest": params_digest(start.params),
        "params": start.params,
        "version": start.version,
        "policy": str(start.policy),
        "position": start.position,
        "name": start.name,
    }


def _check_started(start: StartChild, row: Any) -> None:
    """Refuse (rolling everything back) a child id taken by a stranger, or a position
    another entry holds."""
    # Not ours: an existing instance with another parent, or a job that no parent made
    # (a client's). An id of origin child whose instance retention pruned is ours: the
    # id spells its parent; ctx.child_result will report it gone.
    pruned_child = row.parent is None and row.origin == Origin.CHILD
    if not row.inserted and row.parent != start.parent_job_id and not pruned_child:
        raise ChildIdTaken(
            f"child id {start.child_job_id!r} is already the id of a job that is not"
            f" a child of {start.parent_job_id!r}"
        )
    if not row.recorded:
        raise NonDeterminismError(
            f"child {start.name!r} at position {start.position}: another entry is recorded there"
        )


@dataclass(frozen=True, slots=True)
class ChildOutcome:
    """A finished child as its parent records it: the entry's status (complete or
    failed), the child's result or error, and the child's own final status."""

    status: StepStatus
    result: Any
    error: str | None
    child_status: str


_CLOSE = sa.text(
    f"""
UPDATE onceflow_steps s
SET status = v.status, result = CAST(v.result AS jsonb), error = v.error, finished_at = now()
FROM unnest(CAST(:positions AS int[]), CAST(:statuses AS text[]), CAST(:results AS text[]),
            CAST(:errors AS text[])) AS v(position, status, result, error)
WHERE s.job_id = :parent AND s.position = v.position AND s.kind = '{StepKind.CHILD}'
  AND s.status IN ('{StepStatus.RUNNING}', '{StepStatus.WAITING}')
"""
)

_AWAIT = sa.text(
    f"""
UPDATE onceflow_steps SET status = '{StepStatus.WAITING}'
WHERE job_id = :parent AND position = ANY(:positions) AND kind = '{StepKind.CHILD}'
  AND status = '{StepStatus.RUNNING}'
"""
)


@dataclass(frozen=True, slots=True)
class Awaited:
    """A child entry of the parent's history that ``ctx.child_result`` asks about."""

    position: int
    child_job_id: str


_CHILD_ROWS = sa.text(
    "SELECT job_id, status, result, error FROM onceflow_instances WHERE job_id = ANY(:children)"
)


def collect(
    db: Engine, lease: Lease, parent_job_id: str, awaited: list[Awaited]
) -> list[ChildOutcome | None]:
    """Take finished children's results (or errors) into the parent's history, in one
    transaction; ``None`` for a child that has not finished (its entry now marked
    awaited, so its finish wakes the parent)."""
    with db.begin() as conn:
        _check_lease(conn, lease, parent_job_id, "taking child results")
        rows = {
            row.job_id: row
            for row in conn.execute(_CHILD_ROWS, {"children": [a.child_job_id for a in awaited]})
        }
        outcomes = [_outcome(rows.get(a.child_job_id)) for a in awaited]
        closed = [(a, o) for a, o in zip(awaited, outcomes, strict=True) if o is not None]
        pending = [a.position for a, o in zip(awaited, outcomes, strict=True) if o is None]
        if pending:
            conn.execute(_AWAIT, {"parent": parent_job_id, "positions": pending})
        if closed:
            conn.execute(
                _CLOSE,
                {
                    "parent": parent_job_id,
                    "positions": [a.position for a, _ in closed],
                    "statuses": [str(o.status) for _, o in closed],
                    "results": [orjson.dumps(_recorded(o)).decode() for _, o in closed],
                    "errors": [o.error for _, o in closed],
                },
            )
        return outcomes


def _recorded(outcome: ChildOutcome) -> Any:
    """What the parent's entry keeps: the result, or the child's final status."""
    if outcome.status == StepStatus.COMPLETE:
        return outcome.result
    return {"child_status": outcome.child_status}


def _outcome(row: Any) -> ChildOutcome | None:
    """How a child ended (None: it has not)."""
    if row is not None and InstanceStatus(row.status) not in TERMINAL_STATUSES:
        return None
    if row is None:  # pruned by retention before the parent took its result
        return ChildOutcome(StepStatus.FAILED, None, "the child instance no longer exists", "gone")
    if row.status == InstanceStatus.COMPLETE:
        return ChildOutcome(StepStatus.COMPLETE, row.result, None, row.status)
    error = row.error or f"child {row.status}"
    return ChildOutcome(StepStatus.FAILED, None, error, row.status)


def recorded_outcome(status: StepStatus, result: Any, error: str | None) -> ChildOutcome:
    """A child outcome as the parent's history recorded it (replay)."""
    if status == StepStatus.COMPLETE:
        return ChildOutcome(status, result, None, InstanceStatus.COMPLETE)
    child_status = result.get("child_status", "failed") if isinstance(result, dict) else "failed"
    return ChildOutcome(status, None, error, child_status)


# --- waking parents ------------------------------------------------------------------

_LOCK_PARENTS = sa.text(
    "SELECT job_id FROM onceflow_instances WHERE job_id = ANY(:parents) ORDER BY job_id FOR UPDATE"
)


def awaited_child_finished(parent: str) -> str:
    """SQL: "a child that the instance ``parent`` (its job id column) awaits has
    finished". The suspend's re-check (:func:`workflow_engine.store.writes.waits.suspend`),
    evaluated after the suspend has locked the parent's row."""
    return f"""EXISTS (
    SELECT 1 FROM onceflow_steps s JOIN onceflow_instances c ON c.job_id = s.child_job_id
    WHERE s.job_id = {parent} AND s.kind = '{StepKind.CHILD}'
      AND s.status = '{StepStatus.WAITING}' AND c.status IN ({TERMINAL}))"""


#: Parents waiting for one of the children this transaction finished.
_WAKE_FOR = sa.text(
    f"""
UPDATE onceflow_instances p SET run_after = now(), updated_at = now()
FROM (SELECT DISTINCT parent FROM unnest(CAST(:parents AS text[]), CAST(:children AS text[]))
          AS f(parent, child)
      WHERE EXISTS (
          SELECT 1 FROM onceflow_steps s
          WHERE s.job_id = f.parent AND s.child_job_id = f.child
            AND s.kind = '{StepKind.CHILD}' AND s.status = '{StepStatus.WAITING}')) AS w
WHERE p.job_id = w.parent AND p.status = '{InstanceStatus.WAITING}'
"""
)


def wake_parents(conn: Connection, finished: list[tuple[str, str]]) -> int:
    """In the transaction that finished some children (``(parent, child)`` pairs):
    wake those parents that wait for one of them. Locks the parents' rows first, then
    wakes in a new statement (a fresh snapshot), so a parent suspending at the same
    moment is seen either way."""
    if not finished:
        return 0
    parents = sorted({parent for parent, _ in finished})
    conn.execute(_LOCK_PARENTS, {"parents": parents})
    woken = conn.execute(
        _WAKE_FOR,
        {"parents": [p for p, _ in finished], "children": [c for _, c in finished]},
    ).rowcount
    if woken:
        notify_runnable(conn)
    return woken


# --- the tree, for describe ----------------------------------------------------------


@dataclass(frozen=True, slots=True)
class ChildView:
    job_id: str
    name: str
    workflow: str | None
    status: str  # the child's status; "gone" once retention pruned it
    parent_close_policy: str | None
    started_at: datetime


_CHILDREN = sa.text(
    f"""
SELECT s.child_job_id, s.name, c.workflow, coalesce(c.status, 'gone') AS status,
       c.parent_close_policy, s.started_at
FROM onceflow_steps s LEFT JOIN onceflow_instances c ON c.job_id = s.child_job_id
WHERE s.job_id = :job_id AND s.kind = '{StepKind.CHILD}'
ORDER BY s.started_at, s.position
"""
)


def list_children(conn: Connection, job_id: str) -> list[ChildView]:
    """The children a parent started, with their status now."""
    return [ChildView(*row) for row in conn.execute(_CHILDREN, {"job_id": job_id})]
