"""Fork an instance from a history position into a new job id (issue 26, item 6).

A fork is a new job whose history starts as a copy of its origin's finished entries
before position N, so its replay returns what the origin recorded there and runs the
rest. Its id is deterministic, ``<origin id>~fork<k>`` (``onceflow.ids.fork_job_id``;
``~`` is outside the client alphabet, so no submitted id can be one) or one the operator
names, and goes through the same unique constraint as every job
(``onceflow_jobs_job_id_key``): asking for the same fork twice collides and is reported
(:class:`ForkExists`), never a second instance.

What is copied, at positions < N: every entry that is finished, i.e. ``complete`` or
``failed`` steps (a caught failure is raised again on the fork's replay, so it takes the
origin's branch), ended sleeps, received events and timed-out waits (with their
payloads: the event rows themselves stay with the origin), patch markers and collected
children (their recorded results; the child instances stay the origin's). An entry
still open there (a step between retries, a sleep or wait not over, a child not yet
collected) is not copied and runs afresh in the fork, as do all entries at N and after.
Attempt rows are not copied: they are the origin's runs. The fork keeps the origin's
workflow version (its copied history was made by that code), priority and flow-control
lane; with new params, the copied entries are kept as recorded (steps before N saw the
old params) and only what runs from N on sees the new ones.
"""

from __future__ import annotations

from dataclasses import dataclass
from typing import Any

import orjson
import sqlalchemy as sa
from sqlalchemy.engine import Connection, Engine

from onceflow.envelope import params_digest
from onceflow.ids import MAX_DERIVED_JOB_ID, fork_job_id, is_valid_job_id
from onceflow.vocabulary import JobKind, LifecycleEvent, OperatorAction, Origin, StepStatus
from workflow_engine.store import lifecycle, operator_audit
from workflow_engine.store.db import retry_on_deadlock
from workflow_engine.store.fragments import notify_runnable as _notify
from workflow_engine.store.operations.control import ControlError, InstanceNotFound
from workflow_engine.store.operator_audit import ActionEntry, Actor

#: The most a fork's new params may take, encoded (the HTTP API's own job bound).
MAX_FORK_PARAMS_BYTES = 1 << 20


class ForkExists(ControlError):
    """The fork's job id is taken (the same fork asked for twice, or another job)."""


@dataclass(frozen=True)
class ForkResult:
    job_id: str  # the fork's
    forked_from: str
    position: int  # the entries before it were copied
    copied: int  # how many

    def describe(self) -> str:
        return (
            f"{self.job_id}: queued, forked from {self.forked_from} at position"
            f" {self.position} ({self.copied} history entr{'y' if self.copied == 1 else 'ies'}"
            " copied)"
        )


_LOCK_ORIGIN = sa.text(
    "SELECT workflow, params, version, priority, flow_lane, batch_key,"
    " batch_key IS NOT NULL OR batch_size IS NOT NULL AS batching"
    " FROM onceflow_instances WHERE job_id = :j FOR SHARE"
)
_POSITION_OF = sa.text("SELECT position FROM onceflow_steps WHERE job_id = :j AND name = :n")
_INSERT_JOB = sa.text(
    "INSERT INTO onceflow_jobs (job_id, kind, type_name, params_digest, submitted_at, origin)"
    " VALUES (:new, :kind, :workflow, :digest, now(), :origin)"
    " ON CONFLICT ON CONSTRAINT onceflow_jobs_job_id_key DO NOTHING RETURNING job_id"
)
# The fork starts with the origin's searchable attributes as they are now (migration
# 0022): the copied history's ``attributes`` entries are recorded, so its replay does
# not apply them again, and the job's own (a tenant, say) stay findable on the fork.
_INSERT_INSTANCE = sa.text(
    "INSERT INTO onceflow_instances (job_id, workflow, params, version, priority, flow_lane,"
    " forked_from, forked_at_position, attributes)"
    " VALUES (:new, :workflow, CAST(:params AS jsonb), :version, :priority, :lane, :origin, :at,"
    " (SELECT o.attributes FROM onceflow_instances o WHERE o.job_id = :origin))"
)
_COPY_HISTORY = sa.text(
    f"""
INSERT INTO onceflow_steps (job_id, position, name, status, attempts, result, error,
                            started_at, finished_at, kind, wake_at, event_type, child_job_id)
SELECT :new, position, name, status, attempts, result, error, started_at, finished_at, kind,
       wake_at, event_type, child_job_id
FROM onceflow_steps
WHERE job_id = :origin AND position < :at
  AND status IN ('{StepStatus.COMPLETE}', '{StepStatus.FAILED}')
ORDER BY position
"""
)
_TAKEN_BY = sa.text(
    "SELECT j.origin, i.forked_from, i.forked_at_position, i.status"
    " FROM onceflow_jobs j LEFT JOIN onceflow_instances i USING (job_id) WHERE j.job_id = :j"
)


def fork(
    db: Engine,
    workflow: str,
    job_id: str,
    *,
    from_step: str | None = None,
    from_position: int | None = None,
    number: int = 1,
    new_job_id: str | None = None,
    params: dict[str, Any] | None = None,
    actor: Actor | None = None,
) -> ForkResult:
    """Fork ``job_id`` from the step named ``from_step`` (or history position
    ``from_position``) into ``new_job_id`` or ``<job_id>~fork<number>``; new ``params``
    apply from that position on. Raises :class:`ForkExists` when that id is taken,
    :class:`InstanceNotFound` or :class:`ControlError` for a request that cannot apply."""
    target = {"workflow": workflow, "job_id": job_id}
    with operator_audit.failures_recorded(db, actor, OperatorAction.FORK, **target):
        new_id = _fork_id(job_id, number, new_job_id)
        encoded = _encoded_params(params)
        result, audited = _fork(
            db, workflow, job_id, new_id, from_step, from_position, encoded, actor
        )
    operator_audit.announce(audited)
    return result


def _fork_id(job_id: str, number: int, new_job_id: str | None) -> str:
    if new_job_id is not None:
        if not is_valid_job_id(new_job_id):
            raise ControlError(
                f"new job id {new_job_id!r} is not a valid job id"
                " (letters, digits, '_' and '-', at most 100 characters)"
            )
        return new_job_id
    if number < 1:
        raise ControlError(f"fork number {number} must be 1 or more")
    new_id = fork_job_id(job_id, number)
    if len(new_id) > MAX_DERIVED_JOB_ID:
        raise ControlError(
            f"fork id {new_id!r} is over {MAX_DERIVED_JOB_ID} characters: name the new job id"
        )
    return new_id


def _encoded_params(params: dict[str, Any] | None) -> bytes | None:
    if params is None:
        return None
    if not isinstance(params, dict):
        raise ControlError("params must be a JSON object")
    encoded = orjson.dumps(params)
    if len(encoded) > MAX_FORK_PARAMS_BYTES:
        raise ControlError(f"params are {len(encoded)} bytes, over {MAX_FORK_PARAMS_BYTES}")
    return encoded


@retry_on_deadlock
def _fork(
    db: Engine,
    workflow: str,
    job_id: str,
    new_id: str,
    from_step: str | None,
    from_position: int | None,
    params: bytes | None,
    actor: Actor | None,
) -> tuple[ForkResult, ActionEntry | None]:
    with db.begin() as conn:
        # FOR SHARE: the origin's history cannot be reset (restart, retry: FOR UPDATE)
        # while it is copied; its engine's checkpoints (FOR SHARE too) go on.
        origin = conn.execute(_LOCK_ORIGIN, {"j": job_id}).one_or_none()
        if origin is None or origin.workflow != workflow:
            raise InstanceNotFound(f"no instance of {workflow!r} with job id {job_id!r}")
        _refuse_batched(origin, workflow, job_id)
        at = _position(conn, job_id, from_step, from_position)
        new_params = params.decode() if params is not None else orjson.dumps(origin.params).decode()
        taken = conn.execute(
            _INSERT_JOB,
            {
                "new": new_id,
                "kind": str(JobKind.WORKFLOW),
                "workflow": workflow,
                "digest": params_digest(orjson.loads(new_params)),
                "origin": str(Origin.FORK),
            },
        ).scalar_one_or_none()
        if taken is None:
            raise ForkExists(_taken(conn, new_id))
        conn.execute(
            _INSERT_INSTANCE,
            {
                "new": new_id,
                "workflow": workflow,
                "params": new_params,
                "version": origin.version,
                "priority": origin.priority,
                "lane": origin.flow_lane,
                "origin": job_id,
                "at": at,
            },
        )
        copied = conn.execute(_COPY_HISTORY, {"new": new_id, "origin": job_id, "at": at}).rowcount
        created = {"priority": origin.priority, "forked_from": job_id, "forked_at_position": at}
        lifecycle.emit(conn, [(new_id, LifecycleEvent.CREATED, created)])
        _notify(conn)
        result = ForkResult(new_id, job_id, at, copied)
        audited = None
        if actor is not None:
            audited = operator_audit.record(
                conn,
                actor,
                OperatorAction.FORK,
                workflow=workflow,
                job_id=job_id,
                detail=result.describe(),
            )
        return result, audited


def _refuse_batched(origin: Any, workflow: str, job_id: str) -> None:
    """A batch member or run is not forked: a fork runs on its own (migration 0026), and
    the engine would error it."""
    if origin.batching:
        raise ControlError(
            f"{job_id} is a batch {'run' if origin.batch_key is None else 'member'}:"
            f" {workflow!r} runs its jobs in batches, and a fork would run on its own"
            " (restart or retry the batch run instead)"
        )


def _position(
    conn: Connection, job_id: str, from_step: str | None, from_position: int | None
) -> int:
    """The history position the fork starts at, from a step's name or a number."""
    if (from_step is None) == (from_position is None):
        raise ControlError("fork needs a step name or a position to fork from (one of them)")
    if from_position is not None:
        if from_position < 0:
            raise ControlError(f"position {from_position} must be 0 or more")
        return from_position
    at = conn.execute(_POSITION_OF, {"j": job_id, "n": from_step}).scalar_one_or_none()
    if at is None:
        raise ControlError(f"{job_id} has no step named {from_step!r} in its history")
    return int(at)


def _taken(conn: Connection, new_id: str) -> str:
    row = conn.execute(_TAKEN_BY, {"j": new_id}).one()
    if row.forked_from is not None:
        return (
            f"{new_id} already exists: forked from {row.forked_from} at position"
            f" {row.forked_at_position}, now {row.status or 'pruned'};"
            " pass another fork number or a new job id for another fork"
        )
    return f"{new_id} already exists ({row.origin} job); choose another new job id"
