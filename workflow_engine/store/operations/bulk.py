"""Bulk control operations: pause, resume, terminate or restart every instance a filter
matches.

:func:`start_bulk` records the operation and, in the same transaction, the job ids the
filter matches at that moment (its snapshot, ``onceflow_bulk_operation_items``): the
operation's ``total``. An empty filter (every instance) is refused here
(:func:`refuse_empty`), so every front end refuses it. :func:`run_bulk` then applies
the action in batches of job ids, in job-id order, one transaction per batch that also
records the progress (``last_job_id``) under the operation's row lock: a batch is
applied exactly once, whoever runs it, and an operation cut off continues after its
last committed batch.

Who runs an operation is a lease: a session-level advisory lock on the operation's id
(:func:`leased`), held by the connection that runs its batches. A process that dies
(SIGKILL, a crash, a stop between batches) loses the lock with its connection, and any
:class:`workflow_engine.store.operations.bulk_runner.BulkRunner` (the console's, the admin API's)
finds the operation still ``running`` and unleased (:func:`unleased`) and resumes it.
The lock holds no transaction open between batches.

Each instance goes through the per-instance rules of
:func:`workflow_engine.store.writes.requests.transition`: one an engine is running gets
a ``requested_action`` (the engine applies it at its next step boundary), the others
change at once. An instance the action does not apply to (resume of one that is not
paused, terminate of a finished one, one deleted since the snapshot, one whose job id
started a new run since (id reuse: the snapshot names the run it matched)) is counted as
``skipped``, not as an error."""

from __future__ import annotations

import logging
import time
from collections.abc import Callable, Iterator
from contextlib import contextmanager
from dataclasses import dataclass
from datetime import datetime

import sqlalchemy as sa
from sqlalchemy.engine import Connection, Engine, Row

from onceflow import failpoints
from onceflow.errors import OnceflowError
from onceflow.vocabulary import (
    BulkAction,
    BulkStatus,
    ControlAction,
    InstanceStatus,
    OperatorAction,
)
from workflow_engine.store import operator_audit
from workflow_engine.store.db import is_transient, retry_on_deadlock
from workflow_engine.store.fragments import notify_runnable
from workflow_engine.store.operator_audit import Actor
from workflow_engine.store.views.listing import InstanceFilter, InvalidFilter, where_clause
from workflow_engine.store.writes.requests import transition

log = logging.getLogger(__name__)

#: The advisory lock space of bulk leases (the two-key form: its keys never meet the
#: one-key locks of retention and migrations).
LEASE_LOCK_SPACE = 0x0CEF_B0
_INT4 = 2**31 - 1
#: How often :func:`run_bulk` looks at an operation another process runs.
FOLLOW_SECONDS = 0.5


class BulkOperationNotFound(OnceflowError):
    """No bulk operation has that id."""


class EmptyFilter(InvalidFilter):
    """A bulk operation's filter that narrows nothing (it would apply to every instance)."""


def refuse_empty(f: InstanceFilter) -> InstanceFilter:
    """``f``, or :class:`EmptyFilter` when it matches every instance: one rule for the
    CLI, the admin API and the console (each calls this before counting, and
    :func:`start_bulk` calls it again)."""
    if f.empty:
        raise EmptyFilter(
            "a bulk operation needs a filter that narrows something: the empty filter"
            " would apply it to every instance; narrow it (e.g. workflow=...)"
        )
    return f


@dataclass(frozen=True, slots=True)
class BulkOperation:
    id: int
    action: BulkAction
    filter: str  # InstanceFilter.describe() of the filter it was started with
    total: int  # instances the filter matched when the operation started
    done: int  # instances changed, or asked to change (running ones)
    skipped: int  # instances the action did not apply to
    status: str  # a BulkStatus: running | complete | failed
    created_at: datetime
    finished_at: datetime | None
    error: str | None

    @property
    def finished(self) -> bool:
        return self.status != BulkStatus.RUNNING

    def describe(self) -> str:
        return (
            f"bulk {self.action} #{self.id} [{self.filter or 'all instances'}]: {self.status},"
            f" {self.done} done, {self.skipped} skipped of {self.total}"
        )


_COLUMNS = "id, action, filter, total, done, skipped, status, created_at, finished_at, error"


def _op(row: Row) -> BulkOperation:
    return BulkOperation(
        id=int(row.id),
        action=BulkAction(row.action),
        filter=row.filter,
        total=int(row.total),
        done=int(row.done),
        skipped=int(row.skipped),
        status=str(BulkStatus(row.status)),
        created_at=row.created_at,
        finished_at=row.finished_at,
        error=row.error,
    )


def start_bulk(
    db: Engine, action: BulkAction, f: InstanceFilter, *, actor: Actor | None = None
) -> BulkOperation:
    """Record a bulk operation and the job ids ``f`` matches now (``total``); nothing is
    applied yet (:func:`run_bulk` does). An operation matching nothing is complete.
    Raises :class:`EmptyFilter` for a filter that narrows nothing.

    With an ``actor``, the operator's audit-trail row (``bulk_<action>``, the filter,
    the operation's id) commits with the operation; a refusal is recorded on its own."""
    action = BulkAction(action)
    audit_as = OperatorAction.of_bulk(action)
    with operator_audit.failures_recorded(db, actor, audit_as, filter=f.as_params()):
        op, audited = _start(db, action, f, actor)
    operator_audit.announce(audited)
    return op


_INSERT_OPERATION = sa.text(
    "INSERT INTO onceflow_bulk_operations (action, filter, total) VALUES (:a, :f, 0) RETURNING id"
)


def _snapshot_items(where: str) -> sa.TextClause:
    """The snapshot of the job ids a filter matches; built per call, since ``where`` is
    the filter's own WHERE clause (:func:`~workflow_engine.store.views.listing.where_clause`)."""
    return sa.text(
        "INSERT INTO onceflow_bulk_operation_items (operation_id, job_id, run)"
        f" SELECT :op, i.job_id, i.run FROM onceflow_instances i WHERE {where}"
    )


# An operation whose snapshot is empty is complete at once: no runner has work to do.
_SET_TOTAL = sa.text(
    "UPDATE onceflow_bulk_operations SET total = :n,"
    " status = CASE WHEN :n = 0 THEN 'complete' ELSE status END,"
    " finished_at = CASE WHEN :n = 0 THEN now() END"
    f" WHERE id = :op RETURNING {_COLUMNS}"
)


def _start(
    db: Engine, action: BulkAction, f: InstanceFilter, actor: Actor | None
) -> tuple[BulkOperation, operator_audit.ActionEntry | None]:
    refuse_empty(f)
    where, params = where_clause(f)
    audited = None
    with db.begin() as conn:
        op_id = conn.execute(_INSERT_OPERATION, {"a": str(action), "f": f.describe()}).scalar_one()
        total = conn.execute(_snapshot_items(where), {**params, "op": op_id}).rowcount
        row = conn.execute(_SET_TOTAL, {"n": total, "op": op_id}).one()
        op = _op(row)
        if actor is not None:
            audited = operator_audit.record(
                conn,
                actor,
                OperatorAction.of_bulk(action),
                filter=f.as_params(),
                bulk_id=op.id,
                detail=f"bulk {action} #{op.id} started on {total} instance(s)",
            )
    log.info(
        "bulk %s #%d started on %d instance(s)",
        action,
        op.id,
        total,
        extra={"event": "bulk.started", "bulk_id": op.id, "filter": op.filter},
    )
    return op, audited


_OPERATION = sa.text(f"SELECT {_COLUMNS} FROM onceflow_bulk_operations WHERE id = :id")


def bulk_status(db: Engine, op_id: int) -> BulkOperation | None:
    with db.connect() as conn:
        row = conn.execute(_OPERATION, {"id": op_id}).one_or_none()
    return _op(row) if row is not None else None


_RECENT = sa.text(f"SELECT {_COLUMNS} FROM onceflow_bulk_operations ORDER BY id DESC LIMIT :n")


def recent_bulk(db: Engine, limit: int = 20) -> list[BulkOperation]:
    """The latest operations, newest first."""
    with db.connect() as conn:
        rows = conn.execute(_RECENT, {"n": max(1, limit)}).all()
    return [_op(r) for r in rows]


# A lease is held while its two-key advisory lock (objsubid 2) is granted to a session.
_UNLEASED = sa.text(
    "SELECT o.id FROM onceflow_bulk_operations o WHERE o.status = 'running'"
    " AND NOT EXISTS (SELECT 1 FROM pg_locks l WHERE l.locktype = 'advisory'"
    " AND l.classid::bigint = :space AND l.objid::bigint = o.id % :int4"
    " AND l.objsubid = 2 AND l.granted"
    # an advisory lock is per database; pg_locks lists the whole server's
    " AND l.database = (SELECT oid FROM pg_database"
    " WHERE datname = current_database())) ORDER BY o.id"
)


def unleased(db: Engine) -> list[int]:
    """Running operations no process holds the lease of (its runner died or stopped),
    oldest first: what a runner resumes."""
    with db.connect() as conn:
        ids = conn.execute(_UNLEASED, {"space": LEASE_LOCK_SPACE, "int4": _INT4}).scalars()
        return [int(i) for i in ids]


_TRY_LEASE = sa.text("SELECT pg_try_advisory_lock(:space, :key)")
_RELEASE = sa.text("SELECT pg_advisory_unlock(:space, :key)")


@contextmanager
def leased(db: Engine, op_id: int) -> Iterator[Connection | None]:
    """Hold operation ``op_id``'s lease for the block: the connection to run its batches
    on, or None when another process holds it. The lease is a session-level advisory
    lock, so it ends with the connection: a process that dies releases it at once
    (PostgreSQL sees the socket close), and no transaction stays open between batches."""
    conn = db.connect()
    try:
        key = {"space": LEASE_LOCK_SPACE, "key": op_id % _INT4}
        taken = conn.execute(_TRY_LEASE, key).scalar()
        conn.commit()
        if not taken:
            yield None
            return
        try:
            yield conn
        finally:
            _unlock(conn, key)
    finally:
        conn.close()


def _unlock(conn: Connection, key: dict[str, int]) -> None:
    """Release the lease; a connection that cannot is closed for good, never handed back
    to the pool still holding it."""
    try:
        conn.rollback()
        conn.execute(_RELEASE, key)
        conn.commit()
    except Exception:
        conn.invalidate()


def run_bulk(
    db: Engine,
    op_id: int,
    batch: int = 500,
    on_progress: Callable[[BulkOperation], None] | None = None,
    should_stop: Callable[[], bool] | None = None,
) -> BulkOperation:
    """Apply operation ``op_id`` to its remaining instances, ``batch`` per transaction,
    calling ``on_progress`` after each batch; return it finished (``complete``, or
    ``failed`` with the error if a batch raised: the error is re-raised too).

    When another process holds its lease (a runner took it up first), follow that one's
    progress until it finishes instead. ``should_stop`` is asked between batches: when
    it answers True the operation is returned still ``running``, its lease released, for
    a runner to resume."""
    if batch < 1:
        raise ValueError("batch must be at least 1")
    with leased(db, op_id) as conn:
        if conn is not None:
            return run_leased(conn, op_id, batch, on_progress, should_stop)
    return _follow(db, op_id, on_progress, should_stop)


def run_leased(
    conn: Connection,
    op_id: int,
    batch: int,
    on_progress: Callable[[BulkOperation], None] | None = None,
    should_stop: Callable[[], bool] | None = None,
) -> BulkOperation:
    """:func:`run_bulk`'s loop, on the connection that holds the lease. A database that
    cannot answer (:func:`~workflow_engine.store.db.is_transient`) leaves the operation
    running, to be resumed; any other error fails it."""
    while True:
        try:
            op, more = _run_batch(conn, op_id, batch)
        except OnceflowError:
            raise
        except Exception as exc:
            if not is_transient(exc):
                _fail(conn, op_id, f"{type(exc).__name__}: {exc}")
            raise
        if on_progress is not None:
            on_progress(op)
        if not more:
            return op
        failpoints.hit("bulk.between_batches", str(op_id))
        if should_stop is not None and should_stop():
            log.info(
                "bulk #%d stopped between batches; it resumes where it stopped",
                op_id,
                extra={"event": "bulk.stopped", "bulk_id": op_id},
            )
            return op


def _follow(
    db: Engine,
    op_id: int,
    on_progress: Callable[[BulkOperation], None] | None,
    should_stop: Callable[[], bool] | None,
) -> BulkOperation:
    """Wait for an operation another process runs, reporting its progress; take the
    lease over if that process lets it go before the end."""
    seen = None
    while True:
        op = bulk_status(db, op_id)
        if op is None:
            raise BulkOperationNotFound(f"no bulk operation #{op_id}")
        if on_progress is not None and (op.done, op.skipped) != seen:
            seen = (op.done, op.skipped)
            on_progress(op)
        if op.finished or (should_stop is not None and should_stop()):
            return op
        if op_id in unleased(db):
            return run_bulk(db, op_id, on_progress=on_progress, should_stop=should_stop)
        time.sleep(FOLLOW_SECONDS)


# The operation's row lock serialises batches: whoever runs the next one reads the
# progress the last one committed.
_LOCK_OPERATION = sa.text(
    "SELECT action, status, coalesce(last_job_id, '') AS last"
    " FROM onceflow_bulk_operations WHERE id = :id FOR UPDATE"
)
_NEXT_ITEMS = sa.text(
    "SELECT job_id, run FROM onceflow_bulk_operation_items"
    " WHERE operation_id = :id AND job_id > :last ORDER BY job_id LIMIT :n"
)
# The progress commits with the batch it counts; a short batch was the last one.
_RECORD_BATCH = sa.text(
    "UPDATE onceflow_bulk_operations SET done = done + :d, skipped = skipped + :s,"
    " last_job_id = coalesce(:last, last_job_id),"
    " status = CASE WHEN :more THEN status ELSE 'complete' END,"
    " finished_at = CASE WHEN :more THEN NULL ELSE now() END WHERE id = :id"
)
_DROP_ITEMS = sa.text("DELETE FROM onceflow_bulk_operation_items WHERE operation_id = :id")


@retry_on_deadlock
def _run_batch(conn: Connection, op_id: int, batch: int) -> tuple[BulkOperation, bool]:
    with conn.begin():
        head = conn.execute(_LOCK_OPERATION, {"id": op_id}).one_or_none()
        if head is None:
            raise BulkOperationNotFound(f"no bulk operation #{op_id}")
        if head.status != BulkStatus.RUNNING:
            return _read(conn, op_id), False
        next_items = conn.execute(_NEXT_ITEMS, {"id": op_id, "last": head.last, "n": batch})
        items = {r.job_id: r.run for r in next_items}
        job_ids = list(items)
        done, skipped = _apply(conn, BulkAction(head.action), items)
        more = len(job_ids) == batch
        conn.execute(
            _RECORD_BATCH,
            {
                "d": done,
                "s": skipped,
                "last": job_ids[-1] if job_ids else None,
                "more": more,
                "id": op_id,
            },
        )
        if not more:
            conn.execute(_DROP_ITEMS, {"id": op_id})
        op = _read(conn, op_id)
    if not more:
        log.info(
            "%s",
            op.describe(),
            extra={"event": "bulk.finished", "bulk_id": op.id, "status": op.status},
        )
    return op, more


def _read(conn: Connection, op_id: int) -> BulkOperation:
    row = conn.execute(_OPERATION, {"id": op_id}).one()
    return _op(row)


_FAIL = sa.text(
    "UPDATE onceflow_bulk_operations SET status = 'failed', finished_at = now(),"
    " error = :e WHERE id = :id AND status = 'running'"
)


def _fail(conn: Connection, op_id: int, error: str) -> None:
    conn.rollback()
    with conn.begin():
        conn.execute(_FAIL, {"e": error[:2000], "id": op_id})


_LOCK_INSTANCES = sa.text(
    "SELECT job_id, run, status, requested_action FROM onceflow_instances"
    " WHERE job_id = ANY(:ids) ORDER BY job_id FOR UPDATE"
)


def _apply(conn: Connection, action: BulkAction, items: dict[str, int]) -> tuple[int, int]:
    """Apply ``action`` to each snapshot item (job id: the run the filter matched;
    locked in job-id order, like every multi-row write, to avoid deadlocks); (done,
    skipped)."""
    if not items:
        return 0, 0
    rows = conn.execute(_LOCK_INSTANCES, {"ids": list(items)}).all()
    done = 0
    wake = False
    for row in rows:
        if row.run != items[row.job_id]:
            continue  # a new run of the id since the snapshot (id reuse): not the one matched
        requested = ControlAction(row.requested_action) if row.requested_action else None
        outcome = transition(conn, row.job_id, action, InstanceStatus(row.status), requested)
        if outcome.changed and outcome.refused is None:
            done += 1
            wake = wake or outcome.runnable
    if wake:
        notify_runnable(conn)
    # Instances deleted (retention) or given a new run since the snapshot count as skipped.
    return done, len(items) - done
