"""Bulk control operations: pause, resume, terminate or restart every instance a filter
matches.

:func:`start_bulk` records the operation and, in the same transaction, the job ids the
filter matches at that moment (its snapshot, ``onceflow_bulk_operation_items``): the
operation's ``total``. :func:`run_bulk` then applies the action in batches of job ids,
in job-id order, one transaction per batch that also records the progress, so an
operation cut off (the process died) continues where it stopped when it is run again.

Each instance goes through the per-instance rules of :mod:`workflow_engine.store.control`:
one an engine is running gets a ``requested_action`` (the engine applies it at its next
step boundary), the others change at once. An instance the action does not apply to
(resume of one that is not paused, terminate of a finished one, one deleted since the
snapshot) is counted as ``skipped``, not as an error.
"""

from __future__ import annotations

import logging
from collections.abc import Callable
from dataclasses import dataclass
from datetime import datetime

import sqlalchemy as sa
from sqlalchemy.engine import Connection, Engine, Row

from onceflow.errors import OnceflowError
from onceflow.vocabulary import (
    BulkAction,
    BulkStatus,
    ControlAction,
    InstanceStatus,
)
from workflow_engine.store import control
from workflow_engine.store.db import retry_on_deadlock
from workflow_engine.store.instances import notify_runnable
from workflow_engine.store.listing import InstanceFilter, where_clause

log = logging.getLogger(__name__)


class BulkOperationNotFound(OnceflowError):
    """No bulk operation has that id."""


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


def start_bulk(engine: Engine, action: BulkAction, f: InstanceFilter) -> BulkOperation:
    """Record a bulk operation and the job ids ``f`` matches now (``total``); nothing is
    applied yet (:func:`run_bulk` does). An operation matching nothing is complete."""
    action = BulkAction(action)
    where, params = where_clause(f)
    with engine.begin() as conn:
        op_id = conn.execute(
            sa.text(
                "INSERT INTO onceflow_bulk_operations (action, filter, total)"
                " VALUES (:a, :f, 0) RETURNING id"
            ),
            {"a": str(action), "f": f.describe()},
        ).scalar_one()
        total = conn.execute(
            sa.text(
                "INSERT INTO onceflow_bulk_operation_items (operation_id, job_id)"
                f" SELECT :op, i.job_id FROM onceflow_instances i WHERE {where}"
            ),
            {**params, "op": op_id},
        ).rowcount
        row = conn.execute(
            sa.text(
                "UPDATE onceflow_bulk_operations SET total = :n,"
                " status = CASE WHEN :n = 0 THEN 'complete' ELSE status END,"
                " finished_at = CASE WHEN :n = 0 THEN now() END"
                f" WHERE id = :op RETURNING {_COLUMNS}"
            ),
            {"n": total, "op": op_id},
        ).one()
    op = _op(row)
    log.info(
        "bulk %s #%d started on %d instance(s)",
        action,
        op.id,
        total,
        extra={"event": "bulk.started", "bulk_id": op.id, "filter": op.filter},
    )
    return op


def bulk_status(engine: Engine, op_id: int) -> BulkOperation | None:
    with engine.connect() as conn:
        row = conn.execute(
            sa.text(f"SELECT {_COLUMNS} FROM onceflow_bulk_operations WHERE id = :id"),
            {"id": op_id},
        ).one_or_none()
    return _op(row) if row is not None else None


def recent_bulk(engine: Engine, limit: int = 20) -> list[BulkOperation]:
    """The latest operations, newest first."""
    with engine.connect() as conn:
        rows = conn.execute(
            sa.text(f"SELECT {_COLUMNS} FROM onceflow_bulk_operations ORDER BY id DESC LIMIT :n"),
            {"n": max(1, limit)},
        ).all()
    return [_op(r) for r in rows]


def run_bulk(
    engine: Engine,
    op_id: int,
    batch: int = 500,
    on_progress: Callable[[BulkOperation], None] | None = None,
) -> BulkOperation:
    """Apply operation ``op_id`` to its remaining instances, ``batch`` per transaction,
    calling ``on_progress`` after each batch; return it finished (``complete``, or
    ``failed`` with the error if a batch raised: the error is re-raised too)."""
    if batch < 1:
        raise ValueError("batch must be at least 1")
    while True:
        try:
            op, more = _run_batch(engine, op_id, batch)
        except OnceflowError:
            raise
        except Exception as exc:
            _fail(engine, op_id, f"{type(exc).__name__}: {exc}")
            raise
        if on_progress is not None:
            on_progress(op)
        if not more:
            return op


@retry_on_deadlock
def _run_batch(engine: Engine, op_id: int, batch: int) -> tuple[BulkOperation, bool]:
    with engine.begin() as conn:
        head = conn.execute(
            sa.text(
                "SELECT action, status, coalesce(last_job_id, '') AS last"
                " FROM onceflow_bulk_operations WHERE id = :id FOR UPDATE"
            ),
            {"id": op_id},
        ).one_or_none()
        if head is None:
            raise BulkOperationNotFound(f"no bulk operation #{op_id}")
        if head.status != BulkStatus.RUNNING:
            return _read(conn, op_id), False
        job_ids = list(
            conn.execute(
                sa.text(
                    "SELECT job_id FROM onceflow_bulk_operation_items"
                    " WHERE operation_id = :id AND job_id > :last ORDER BY job_id LIMIT :n"
                ),
                {"id": op_id, "last": head.last, "n": batch},
            ).scalars()
        )
        done, skipped = _apply(conn, BulkAction(head.action), job_ids)
        more = len(job_ids) == batch
        conn.execute(
            sa.text(
                "UPDATE onceflow_bulk_operations SET done = done + :d, skipped = skipped + :s,"
                " last_job_id = coalesce(:last, last_job_id),"
                " status = CASE WHEN :more THEN status ELSE 'complete' END,"
                " finished_at = CASE WHEN :more THEN NULL ELSE now() END WHERE id = :id"
            ),
            {
                "d": done,
                "s": skipped,
                "last": job_ids[-1] if job_ids else None,
                "more": more,
                "id": op_id,
            },
        )
        if not more:
            conn.execute(
                sa.text("DELETE FROM onceflow_bulk_operation_items WHERE operation_id = :id"),
                {"id": op_id},
            )
        op = _read(conn, op_id)
    if not more:
        log.info(
            "%s",
            op.describe(),
            extra={"event": "bulk.finished", "bulk_id": op.id, "status": op.status},
        )
    return op, more


def _read(conn: Connection, op_id: int) -> BulkOperation:
    row = conn.execute(
        sa.text(f"SELECT {_COLUMNS} FROM onceflow_bulk_operations WHERE id = :id"),
        {"id": op_id},
    ).one()
    return _op(row)


def _fail(engine: Engine, op_id: int, error: str) -> None:
    with engine.begin() as conn:
        conn.execute(
            sa.text(
                "UPDATE onceflow_bulk_operations SET status = 'failed', finished_at = now(),"
                " error = :e WHERE id = :id AND status = 'running'"
            ),
            {"e": error[:2000], "id": op_id},
        )


def _apply(conn: Connection, action: BulkAction, job_ids: list[str]) -> tuple[int, int]:
    """Apply ``action`` to each of ``job_ids`` (locked in job-id order, like every
    multi-row write, to avoid deadlocks); (done, skipped)."""
    if not job_ids:
        return 0, 0
    rows = conn.execute(
        sa.text(
            "SELECT job_id, status, requested_action FROM onceflow_instances"
            " WHERE job_id = ANY(:ids) ORDER BY job_id FOR UPDATE"
        ),
        {"ids": job_ids},
    ).all()
    done = 0
    wake = False
    for row in rows:
        requested = ControlAction(row.requested_action) if row.requested_action else None
        outcome = control.transition(
            conn, row.job_id, action, InstanceStatus(row.status), requested
        )
        if outcome.changed and outcome.refused is None:
            done += 1
            wake = wake or outcome.runnable
    if wake:
        notify_runnable(conn)
    # Instances deleted since the snapshot (retention) count as skipped.
    return done, len(job_ids) - done
