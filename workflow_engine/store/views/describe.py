"""One instance described (its row, steps, children, counts, whether an engine can run
it), what its steps returned, and a job's status whatever it became."""

from __future__ import annotations

from dataclasses import asdict, dataclass, field
from datetime import datetime
from typing import Any

import sqlalchemy as sa
from sqlalchemy.engine import Engine

from onceflow.vocabulary import (
    InstanceStatus,
    JobKind,
    Origin,
    StepKind,
    StepStatus,
)
from workflow_engine.store.fragments import TERMINAL
from workflow_engine.store.views.engines import ENGINE_HAS, ENGINE_STALE_SECONDS
from workflow_engine.store.views.listing import SCHEDULED_START
from workflow_engine.store.views.stream_values import stream_counts
from workflow_engine.store.views.webhooks import DeliveryView, deliveries_of


@dataclass(frozen=True)
class StepView:
    position: int
    name: str
    status: StepStatus
    attempts: int
    error: str | None
    started_at: datetime
    finished_at: datetime | None
    kind: StepKind = StepKind.STEP
    wake_at: datetime | None = None
    event_type: str | None = None


@dataclass(frozen=True)
class RunView:
    """An earlier run of a reused job id (``onceflow_runs``, migration 0027): how it
    ended and what it did, kept when the next run started."""

    run: int
    status: str
    created_at: datetime
    started_at: datetime | None
    finished_at: datetime | None
    error: str | None
    result: Any
    timeout_kind: str | None
    source: str | None  # the Kafka position of the record that started it
    steps: list[dict[str, Any]] = field(default_factory=list)

    @property
    def summary(self) -> str:
        """``run 1: errored (step 'two' failed: ...)`` in words, for describe."""
        failed = next((s for s in self.steps if s.get("status") == StepStatus.FAILED), None)
        what = f" at step {failed['name']!r}" if failed is not None else ""
        why = f" ({self.timeout_kind})" if self.timeout_kind else ""
        return f"run {self.run}: {self.status}{why}{what}, finished {self.finished_at}"


@dataclass(frozen=True)
class InstanceView:
    job_id: str
    workflow: str
    status: InstanceStatus
    params: dict[str, Any]
    created_at: datetime
    started_at: datetime | None
    finished_at: datetime | None
    error: str | None
    result: Any
    request_id: str | None
    submitted_at: datetime | None
    source: str
    duplicates: int
    redeliveries: int
    mismatches: int
    restart_count: int
    steps: list[StepView]
    workflow_mismatches: int = 0  # duplicates that named another workflow (or task) type
    origin: str = "http"  # "http": through ingest; "kafka": produced straight to the topic
    dead_letters: int = 0  # records of this id that were dead-lettered
    version: str | None = None  # the definition version it was created with
    # Whether a live engine has that version (None once the instance is final).
    engine_available: bool | None = None
    priority: int = 3  # 1 (claimed first) .. 5
    # Why a runnable instance is not running yet (flow control; None: not runnable).
    held_because: str | None = None
    # The tree (ctx.start_child): this instance's parent, if a child, and its children.
    parent_job_id: str | None = None
    parent_close_policy: str | None = None
    children: list[Any] = field(default_factory=list)  # store.children.ChildView
    # The webhook endpoint the job named (its callback), and the instance's deliveries.
    callback: str | None = None
    deliveries: list[DeliveryView] = field(default_factory=list)
    # Retry and fork (migration 0020): the step an errored instance failed at (what
    # ``retry`` runs again), how often it was retried, the instance and history position
    # it was forked from, and the forks made from it.
    failed_position: int | None = None
    retry_count: int = 0
    forked_from: str | None = None
    forked_at_position: int | None = None
    forks: list[str] = field(default_factory=list)
    # A delayed start not reached yet (run_at / start_after): it is queued until then.
    scheduled_start: datetime | None = None
    # Time limits (migration 0023): the execution deadline (execution_timeout, set at its
    # first start), the latest first start (start_within, while it has not started),
    # and which limit errored it (start_timeout, timed_out), if one did.
    deadline: datetime | None = None
    start_by: datetime | None = None
    timeout_kind: str | None = None
    # Values held per output stream (ctx.emit), by stream name.
    streams: dict[str, int] = field(default_factory=dict)
    # Searchable attributes (migration 0022): set at submit, ctx.set_attributes.
    attributes: dict[str, Any] = field(default_factory=dict)
    # Singleton policies (migration 0024): the key's value (as stored, bounded), the live
    # instance a skipped one gave way to, the newer instance that cancelled this one.
    singleton_key: str | None = None
    skipped_for: str | None = None
    cancelled_by: str | None = None
    # Id reuse (migration 0027): the current run of the job id, and the earlier ones.
    run: int = 1
    earlier_runs: list[RunView] = field(default_factory=list)

    @property
    def run_note(self) -> str:
        """``run 2 of job X`` (the id reuse policies' run number, from 1)."""
        return f"run {self.run} of job {self.job_id}"

    # Batching (migration 0026): a member's key, its batch run and its place there
    # (0-based), that run's size; on a batch run, its size and its members in order.
    batch_key: str | None = None
    batch_id: str | None = None
    batch_index: int | None = None
    batch_size: int | None = None
    batch_members: list[str] = field(default_factory=list)

    @property
    def batch_note(self) -> str | None:
        """Where batching put it, in words (None: not batched)."""
        if self.batch_members:
            return f"batch run of {len(self.batch_members)} members"
        if self.batch_id is not None and self.batch_index is not None:
            return f"in batch {self.batch_id}, member {self.batch_index + 1} of {self.batch_size}"
        if self.status == InstanceStatus.BATCHING:
            return f"waiting to be batched (key {self.batch_key!r})"
        return None

    # Debounce (migration 0025): the key's value (as stored, bounded), when its window
    # opened, the instance that absorbed a debounced one, and the end of that chain (a
    # trailing absorber may itself be absorbed later): the instance that runs instead.
    debounce_key: str | None = None
    debounce_window_start: datetime | None = None
    debounced_into: str | None = None
    debounce_runs_as: str | None = None

    @property
    def debounce_note(self) -> str | None:
        """What a debounce decided for it, in words (None: not debounced)."""
        if self.debounced_into is None or self.status != InstanceStatus.DEBOUNCED:
            return None
        note = f"debounced into {self.debounced_into} (key {self.debounce_key!r})"
        if self.debounce_runs_as not in (None, self.debounced_into):
            note += f"; its window runs as {self.debounce_runs_as}"
        return note

    @property
    def debounce_window(self) -> str | None:
        """For an instance of a debounced workflow that was not debounced: its window."""
        if self.debounce_window_start is None or self.status == InstanceStatus.DEBOUNCED:
            return None
        opened = self.debounce_window_start.isoformat()
        return f"debounce window of key {self.debounce_key!r} opened at {opened}"

    @property
    def singleton_note(self) -> str | None:
        """What a singleton policy decided for it, in words (None: nothing)."""
        if self.skipped_for is not None and self.status == InstanceStatus.SKIPPED:
            return (
                f"skipped: another instance {self.skipped_for} of key"
                f" {self.singleton_key!r} was active"
            )
        if self.cancelled_by is not None:
            return (
                f"{self.cancel_outcome} by {self.cancelled_by}, a newer instance of key"
                f" {self.singleton_key!r}"
            )
        return None

    @property
    def cancel_outcome(self) -> str:
        """How far a singleton cancellation (``cancelled_by``) got: a running instance is
        stopped at its next step, and one that finishes its last step first keeps its
        outcome (the request is void), so only a terminated one was cancelled."""
        if self.status == InstanceStatus.TERMINATED:
            return "cancelled"
        if self.status.terminal:
            return f"{self.status} before its cancellation took effect; superseded"
        return "being cancelled (at its next step)"

    @property
    def waiting_for_engine(self) -> str | None:
        """Why it cannot run, when no live engine has its version."""
        if self.engine_available is not False:
            return None
        return (
            f"waiting for an engine with version {self.version or '(any)'}"
            f" of workflow {self.workflow!r}: no live engine has it"
        )

    @property
    def provenance(self) -> str:
        if self.origin == Origin.KAFKA:
            return "produced directly to Kafka"
        if self.origin == Origin.SCHEDULE:
            return "a schedule's tick"
        if self.origin == Origin.CHILD:
            return f"child of {self.parent_job_id or '(pruned parent)'}"
        if self.origin == Origin.BATCH:
            return "a batch run, formed by an engine from its members"
        if self.origin == Origin.FORK:
            return f"fork of {self.forked_from} from position {self.forked_at_position}"
        return f"HTTP request {self.request_id or '-'}"

    def to_dict(self) -> dict[str, Any]:
        doc = {k: v for k, v in self.__dict__.items() if k != "steps"}
        doc["steps"] = [s.__dict__ for s in self.steps]
        doc["children"] = [asdict(c) for c in self.children]
        doc["deliveries"] = [asdict(d) for d in self.deliveries]
        doc["earlier_runs"] = [asdict(r) for r in self.earlier_runs]
        doc["provenance"] = self.provenance
        return doc


_DESCRIBE_SQL = sa.text(
    f"""
SELECT i.job_id, i.workflow, i.status, i.params, i.created_at, i.started_at,
       i.finished_at, i.error, i.result,
       -- a run after the first (id reuse): the submission that started it
       CASE WHEN cr.run IS NULL THEN j.request_id ELSE cr.request_id END AS request_id,
       CASE WHEN cr.run IS NULL THEN j.submitted_at ELSE cr.submitted_at END AS submitted_at,
       CASE WHEN cr.run IS NULL
            THEN j.source_topic || '/' || j.source_partition || '@' || j.source_offset
            ELSE cr.source_topic || '/' || cr.source_partition || '@' || cr.source_offset
       END AS source,
       dd.duplicates, dd.redeliveries, dd.mismatches,
       i.restart_count,
       dd.workflow_mismatches,
       j.origin,
       (SELECT count(*) FROM onceflow_dead_letters dl
         WHERE dl.job_id = i.job_id) AS dead_letters,
       i.version,
       CASE WHEN i.status IN ({TERMINAL}) THEN NULL ELSE EXISTS (
           SELECT 1 FROM onceflow_engines e
           WHERE e.last_seen_at > now() - make_interval(secs => :stale)
             AND {ENGINE_HAS}) END AS engine_available,
       i.priority, onceflow_hold_reason(i.job_id) AS held_because,
       i.parent_job_id, i.parent_close_policy, i.callback,
       i.failed_position, i.retry_count, i.forked_from, i.forked_at_position,
       ARRAY(SELECT f.job_id FROM onceflow_instances f WHERE f.forked_from = i.job_id
             ORDER BY f.job_id) AS forks,
       {SCHEDULED_START} AS scheduled_start, i.attributes,
       i.deadline, CASE WHEN i.started_at IS NULL THEN i.start_by END AS start_by,
       i.timeout_kind, i.singleton_key, i.skipped_for, i.cancelled_by, i.run,
       i.batch_key, i.batch_id, i.batch_index,
       coalesce(i.batch_size, (SELECT b.batch_size FROM onceflow_instances b
                               WHERE b.job_id = i.batch_id)) AS batch_size,
       CASE WHEN i.batch_size IS NULL THEN ARRAY[]::text[] ELSE ARRAY(
           SELECT m.job_id FROM onceflow_instances m WHERE m.batch_id = i.job_id
           ORDER BY m.batch_index) END AS batch_members,
       i.debounce_key, i.debounce_window_start, i.debounced_into,
       CASE WHEN i.status = '{InstanceStatus.DEBOUNCED}' THEN (
           -- the chain of absorbers (primary-key lookups), to the one not debounced
           WITH RECURSIVE chain(job_id, into_id, depth) AS (
               SELECT i.job_id, i.debounced_into, 0
               UNION ALL
               SELECT n.job_id, n.debounced_into, c.depth + 1
               FROM chain c JOIN onceflow_instances n ON n.job_id = c.into_id
               WHERE c.depth < 10000)
           SELECT job_id FROM chain WHERE into_id IS NULL LIMIT 1) END AS debounce_runs_as
FROM onceflow_instances i JOIN onceflow_jobs j USING (job_id)
LEFT JOIN onceflow_runs cr ON cr.job_id = i.job_id AND cr.run = i.run AND i.run > 1
-- One pass over the job id's duplicate rows, in its one partition (job_received_at,
-- migration 0012): planning a partitioned table costs per partition and per reference.
LEFT JOIN LATERAL (
    SELECT count(*) AS duplicates,
           count(*) FILTER (WHERE d.redelivery) AS redeliveries,
           count(*) FILTER (WHERE NOT d.params_match) AS mismatches,
           count(*) FILTER (WHERE d.workflow_match IS FALSE) AS workflow_mismatches
    FROM onceflow_duplicate_deliveries d
    WHERE d.job_id = i.job_id AND d.job_received_at = j.received_at
) dd ON true
WHERE i.job_id = :job_id
"""
)


def describe_instance(db: Engine, job_id: str) -> InstanceView | None:
    with db.connect() as conn:
        row = conn.execute(
            _DESCRIBE_SQL, {"job_id": job_id, "stale": ENGINE_STALE_SECONDS}
        ).one_or_none()
        if row is None:
            return None
        steps = [
            StepView(
                r.position,
                r.name,
                StepStatus(r.status),
                r.attempts,
                r.error,
                r.started_at,
                r.finished_at,
                StepKind(r.kind),
                r.wake_at,
                r.event_type,
            )
            for r in conn.execute(_STEPS_SQL, {"job_id": job_id})
        ]
        # Imported here: the children module uses this one's notify_runnable.
        from workflow_engine.store.writes.children import list_children

        children = list_children(conn, job_id)
        deliveries = deliveries_of(conn, job_id)
        streams = stream_counts(conn, job_id)
        earlier = earlier_runs(conn, job_id) if row.run > 1 else []
    fields = dict(row._mapping)
    fields["status"] = InstanceStatus(fields["status"])
    return InstanceView(
        **fields,
        steps=steps,
        children=children,
        deliveries=deliveries,
        streams=streams,
        earlier_runs=earlier,
    )


_EARLIER_RUNS = sa.text(
    """
SELECT run, status, created_at, started_at, finished_at, error, result, timeout_kind,
       source_topic || '/' || source_partition || '@' || source_offset AS source, steps
FROM onceflow_runs WHERE job_id = :j AND status IS NOT NULL ORDER BY run
"""
)


def earlier_runs(conn: sa.Connection, job_id: str) -> list[RunView]:
    """The finished earlier runs of a reused job id, oldest first."""
    return [RunView(**r._mapping) for r in conn.execute(_EARLIER_RUNS, {"j": job_id})]


_TASK_RUN_STATUS = sa.text(
    "SELECT t.job_id, t.task, t.status, t.attempts, t.error, t.created_at,"
    " t.finished_at, j.request_id, j.submitted_at,"
    " (SELECT count(*) FROM onceflow_duplicate_deliveries d"
    "   WHERE d.job_id = t.job_id) AS duplicates"
    " FROM onceflow_task_runs t JOIN onceflow_jobs j USING (job_id)"
    " WHERE t.job_id = :j"
)


def job_status(db: Engine, job_id: str) -> dict[str, Any] | None:
    """A job's state, whatever it became: a workflow instance or a plain task run."""
    view = describe_instance(db, job_id)
    if view is not None:
        return {"kind": JobKind.WORKFLOW, **view.to_dict()}
    with db.connect() as conn:
        row = conn.execute(_TASK_RUN_STATUS, {"j": job_id}).one_or_none()
    if row is None:
        return None
    return {"kind": JobKind.TASK, **dict(row._mapping)}


_STEPS_SQL = sa.text(
    """
SELECT position, name, status, attempts, error, started_at, finished_at, kind, wake_at,
       event_type
FROM onceflow_steps WHERE job_id = :job_id ORDER BY position
"""
)


_STEP_RESULTS = sa.text(
    "SELECT position, result FROM onceflow_steps WHERE job_id = :job_id ORDER BY position"
)


def step_results(db: Engine, job_id: str) -> dict[int, Any]:
    """What each recorded step of the instance returned, by position (None for one that
    returned nothing or has not finished): the console shows it beside the step. Kept
    out of :func:`describe_instance`, whose view the CLI and the API print whole."""
    with db.connect() as conn:
        return {r.position: r.result for r in conn.execute(_STEP_RESULTS, {"job_id": job_id})}
