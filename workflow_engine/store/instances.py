"""Creating and reading workflow instances: the API other packages use.

``create_instances`` is the equivalent of ``env.ORDER_WORKFLOW.create({id, params})``
for a whole batch of Kafka deliveries, in one statement and one round trip:

* the first delivery of a job id inserts its ``onceflow_jobs`` row (the named unique
  constraint ``onceflow_jobs_job_id_key``) and its queued instance;
* every other delivery - a Kafka redelivery or a client resubmission, in this batch
  or any earlier one - is a no-op for the instance and becomes one audit row in
  ``onceflow_duplicate_deliveries``, flagged when its params differ from the winner's.
"""

from __future__ import annotations

from collections.abc import Sequence
from dataclasses import asdict, dataclass, field
from datetime import datetime
from typing import Any

import orjson
import sqlalchemy as sa
from sqlalchemy.engine import Connection, Engine

from onceflow.envelope import JobEnvelope, params_digest
from onceflow.vocabulary import (
    InstanceStatus,
    JobKind,
    Origin,
    StepKind,
    StepStatus,
)
from workflow_engine.store.fragments import TERMINAL

RUNNABLE_CHANNEL = "onceflow_runnable"


def notify_runnable(conn: Connection) -> None:
    """Wake the engines (delivered when the caller's transaction commits)."""
    conn.execute(sa.text("SELECT pg_notify(:c, '')"), {"c": RUNNABLE_CHANNEL})


@dataclass(frozen=True, slots=True)
class Delivery:
    """One consumed Kafka record carrying a valid job envelope."""

    envelope: JobEnvelope
    topic: str
    partition: int
    offset: int
    kind: JobKind = JobKind.WORKFLOW  # or TASK: a single-step job run by the streams worker
    enqueued_at: datetime | None = None  # the Kafka record's timestamp
    # The workflow definition's version in the creating process (the streams worker
    # loads the same workflow modules as the engines); the instance keeps it for life.
    version: str | None = None
    # Provenance when not the envelope's own (http/kafka): a schedule's tick.
    origin: Origin | None = None
    # The params key whose value becomes the instance's fairness lane (flow control:
    # workflow_engine.flow.lane_path); () for flow control without a key (lane '');
    # None: no flow control (no lane).
    lane_path: tuple[str, ...] | None = None


@dataclass(slots=True)
class CreateResult:
    """What one batch did. Every delivery is exactly one of: ``created`` (or
    ``tasks_created``), a new ``duplicates`` row, or ``already_recorded`` (its Kafka
    position already has a row: a redelivery seen before, nothing written)."""

    created: int = 0
    duplicates: int = 0  # new duplicate rows (redeliveries + resubmissions)
    mismatches: int = 0  # new duplicate rows whose params differ from the winner's
    redeliveries: int = 0  # new duplicate rows that are the same Kafka record again
    created_ids: list[str] = field(default_factory=list)
    duplicate_ids: list[str] = field(default_factory=list)
    mismatch_ids: list[str] = field(default_factory=list)
    tasks_created: int = 0
    # New duplicate rows whose workflow (or task) type differs from the winner's.
    workflow_mismatches: int = 0
    workflow_mismatch_ids: list[str] = field(default_factory=list)
    # Deliveries whose Kafka position was already recorded (as the creating record's
    # redelivery or as a duplicate): a redelivery again, which never counts twice.
    already_recorded: int = 0

    def add(self, other: CreateResult) -> None:
        self.created += other.created
        self.tasks_created += other.tasks_created
        self.duplicates += other.duplicates
        self.mismatches += other.mismatches
        self.redeliveries += other.redeliveries
        self.created_ids += other.created_ids
        self.duplicate_ids += other.duplicate_ids
        self.mismatch_ids += other.mismatch_ids
        self.workflow_mismatches += other.workflow_mismatches
        self.workflow_mismatch_ids += other.workflow_mismatch_ids
        self.already_recorded += other.already_recorded


# Duplicate rows are idempotent per Kafka position: the named unique constraint
# onceflow_duplicate_deliveries_position_key turns a record redelivered again (the
# worker died between the database commit and the offset commit, twice) into a no-op.
# A delivery is a redelivery when its position is the creating record's; one whose
# position already has a duplicate row is skipped before the insert (``known``) and
# by the constraint (a concurrent batch), so it never counts twice.
_CREATE_SQL = sa.text(
    """
WITH input AS (
    SELECT * FROM jsonb_to_recordset(CAST(:rows AS jsonb)) AS r(
        ord integer, job_id text, kind text, workflow text, params jsonb, params_digest text,
        request_id text, submitted_at timestamptz, traceparent text, origin text,
        topic text, part integer, off bigint, enqueued_at timestamptz, version text,
        priority smallint, lane_path text[])
),
firsts AS (
    SELECT DISTINCT ON (job_id) * FROM input ORDER BY job_id, ord
),
upsert AS (
    INSERT INTO onceflow_jobs AS j (
        job_id, kind, type_name, params_digest, request_id, submitted_at, traceparent,
        origin, source_topic, source_partition, source_offset, enqueued_at)
    SELECT job_id, kind, workflow, params_digest, request_id, submitted_at,
           traceparent, origin, topic, part, off, enqueued_at
    FROM firsts
    ORDER BY job_id
    ON CONFLICT ON CONSTRAINT onceflow_jobs_job_id_key
        DO UPDATE SET last_seen_at = now()
    RETURNING j.job_id, j.params_digest AS winner_digest, j.type_name AS winner_type,
              j.source_topic, j.source_partition, j.source_offset, (j.xmax = 0) AS inserted,
              j.received_at AS job_received_at
),
known AS (
    SELECT DISTINCT d.source_topic, d.source_partition, d.source_offset
    FROM onceflow_duplicate_deliveries d
    JOIN input i ON (d.source_topic, d.source_partition, d.source_offset)
                    = (i.topic, i.part, i.off)
),
candidates AS (
    SELECT DISTINCT ON (i.topic, i.part, i.off) i.*, u.winner_digest, u.winner_type,
           u.job_received_at,
           (i.topic, i.part, i.off)
             = (u.source_topic, u.source_partition, u.source_offset) AS redelivery
    FROM input i
    JOIN upsert u USING (job_id)
    JOIN firsts f USING (job_id)
    WHERE NOT (u.inserted AND i.ord = f.ord)
      AND NOT EXISTS (
          SELECT 1 FROM known k
          WHERE (k.source_topic, k.source_partition, k.source_offset) = (i.topic, i.part, i.off))
    ORDER BY i.topic, i.part, i.off, i.ord
),
dups AS (
    INSERT INTO onceflow_duplicate_deliveries (
        job_id, source_topic, source_partition, source_offset, params_digest, params_match,
        workflow, workflow_match, redelivery, request_id, submitted_at, enqueued_at,
        job_received_at)
    SELECT c.job_id, c.topic, c.part, c.off, c.params_digest,
           c.params_digest = c.winner_digest, c.workflow, c.workflow = c.winner_type,
           c.redelivery, c.request_id, c.submitted_at, c.enqueued_at, c.job_received_at
    FROM candidates c
    ORDER BY c.topic, c.part, c.off
    ON CONFLICT ON CONSTRAINT onceflow_duplicate_deliveries_position_key DO NOTHING
    RETURNING job_id, params_match, workflow_match, redelivery
),
inst AS (
    INSERT INTO onceflow_instances (job_id, workflow, params, version, priority, flow_lane)
    SELECT f.job_id, f.workflow, f.params, f.version, f.priority,
           -- bounded (migration 0014): the lane index takes any key's value
           onceflow_flow_lane(f.params, f.lane_path)
    FROM firsts f JOIN upsert u USING (job_id)
    WHERE u.inserted AND f.kind = :workflow_kind
    RETURNING job_id
),
task_runs AS (
    INSERT INTO onceflow_task_runs (job_id, task, params)
    SELECT f.job_id, f.workflow, f.params
    FROM firsts f JOIN upsert u USING (job_id)
    WHERE u.inserted AND f.kind = :task_kind
    RETURNING job_id
),
notified AS (
    SELECT pg_notify(:channel, '') FROM (SELECT 1 FROM inst LIMIT 1) AS any_created
)
SELECT 'created' AS kind, job_id, true AS params_match, true AS workflow_match,
       false AS redelivery FROM inst
UNION ALL
SELECT 'task', job_id, true, true, false FROM task_runs
UNION ALL
SELECT 'duplicate', job_id, params_match, workflow_match, redelivery FROM dups
UNION ALL
SELECT 'notify', NULL, true, true, false FROM notified
"""
)


def _row(ord_: int, d: Delivery) -> dict[str, Any]:
    env = d.envelope
    return {
        "ord": ord_,
        "job_id": env.job_id,
        "kind": d.kind,
        "workflow": env.workflow,
        "params": env.params,
        "params_digest": params_digest(env.params),
        "request_id": env.request_id or None,
        "submitted_at": env.submitted_at.isoformat(),
        "traceparent": env.traceparent or None,
        "origin": str(d.origin or env.origin),
        "topic": d.topic,
        "part": d.partition,
        "off": d.offset,
        "enqueued_at": d.enqueued_at.isoformat() if d.enqueued_at else None,
        "version": d.version,
        "priority": env.priority,
        "lane_path": d.lane_path,
    }


# The instances' duplicate flags (migration 0015: what the list's has_duplicates and
# payload_mismatch filters read), set for the job ids that got a duplicate row. Its own
# statement, after _CREATE_SQL: a statement's snapshot is taken when it starts, and an
# instance another worker committed while _CREATE_SQL waited on the job id's registry
# row (keyless records of one id on two partitions) is visible only to a later one; the
# instances created in this batch are too. Only the rows that change are locked, in job
# id order (LockRows sits above the sort), so two workers flagging the same ids cannot
# deadlock; a deadlock with an engine's write batch re-runs the transaction (40P01).
_FLAG_DUPLICATED_SQL = sa.text(
    """
WITH flags AS (
    SELECT job_id, bool_or(mismatch) AS mismatch
    FROM unnest(CAST(:job_ids AS text[]), CAST(:mismatches AS boolean[])) AS f(job_id, mismatch)
    GROUP BY job_id
),
locked AS (
    SELECT i.job_id, f.mismatch FROM onceflow_instances i JOIN flags f USING (job_id)
    WHERE NOT i.duplicated OR (f.mismatch AND NOT i.mismatched)
    ORDER BY i.job_id
    FOR UPDATE OF i
)
UPDATE onceflow_instances i
SET duplicated = true, mismatched = i.mismatched OR l.mismatch
FROM locked l WHERE i.job_id = l.job_id
"""
)


def _flag_duplicated(conn: Connection, flags: dict[str, bool]) -> None:
    """Mark the instances of ``flags``' job ids duplicated (and mismatched where True)."""
    if flags:
        conn.execute(
            _FLAG_DUPLICATED_SQL,
            {"job_ids": list(flags), "mismatches": list(flags.values())},
        )


def create_instances_in(conn: Connection, deliveries: Sequence[Delivery]) -> CreateResult:
    """Create instances for a batch of deliveries inside the caller's transaction.

    Deliveries must be in consumption order: within the batch, the earliest delivery
    of a job id is the one that can win.
    """
    result = CreateResult()
    if not deliveries:
        return result
    rows = orjson.dumps([_row(i, d) for i, d in enumerate(deliveries)]).decode()
    flags: dict[str, bool] = {}  # job id -> a duplicate of it mismatched
    for kind, job_id, params_match, workflow_match, redelivery in conn.execute(
        _CREATE_SQL,
        {
            "rows": rows,
            "channel": RUNNABLE_CHANNEL,
            "workflow_kind": str(JobKind.WORKFLOW),
            "task_kind": str(JobKind.TASK),
        },
    ):
        if kind == "created":
            result.created += 1
            result.created_ids.append(job_id)
        elif kind == "task":
            result.tasks_created += 1
            result.created_ids.append(job_id)
        elif kind == "duplicate":
            result.duplicates += 1
            result.duplicate_ids.append(job_id)
            mismatch = not params_match or workflow_match is False
            flags[job_id] = flags.get(job_id, False) or mismatch
            if redelivery:
                result.redeliveries += 1
            if not params_match:
                result.mismatches += 1
                result.mismatch_ids.append(job_id)
            if not workflow_match:
                result.workflow_mismatches += 1
                result.workflow_mismatch_ids.append(job_id)
    _flag_duplicated(conn, flags)
    result.already_recorded = (
        len(deliveries) - result.created - result.tasks_created - result.duplicates
    )
    return result


def create_instances(engine: Engine, deliveries: Sequence[Delivery]) -> CreateResult:
    """Create instances for a batch of deliveries in one transaction (one statement)."""
    with engine.begin() as conn:
        return create_instances_in(conn, deliveries)


# --- reading -----------------------------------------------------------------------


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
        return f"HTTP request {self.request_id or '-'}"

    def to_dict(self) -> dict[str, Any]:
        doc = {k: v for k, v in self.__dict__.items() if k != "steps"}
        doc["steps"] = [s.__dict__ for s in self.steps]
        doc["children"] = [asdict(c) for c in self.children]
        doc["provenance"] = self.provenance
        return doc


#: How long an engine may go unseen before it counts as gone (its heartbeat runs every
#: third of a lease; the default lease is 30 s).
ENGINE_STALE_SECONDS = 60.0
#: Engine ``e`` can run instance ``i``: it has the instance's version of its workflow
#: (an instance without a version: any version of it).
ENGINE_HAS = (
    "(CASE WHEN i.version IS NULL THEN e.workflows ? i.workflow"
    " ELSE e.workflows ->> i.workflow = i.version END)"
)
_ENGINE_HAS = ENGINE_HAS

_DESCRIBE_SQL = sa.text(
    f"""
SELECT i.job_id, i.workflow, i.status, i.params, i.created_at, i.started_at,
       i.finished_at, i.error, i.result, j.request_id, j.submitted_at,
       j.source_topic || '/' || j.source_partition || '@' || j.source_offset AS source,
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
             AND {_ENGINE_HAS}) END AS engine_available,
       i.priority, onceflow_hold_reason(i.job_id) AS held_because,
       i.parent_job_id, i.parent_close_policy
FROM onceflow_instances i JOIN onceflow_jobs j USING (job_id)
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

_STEPS_SQL = sa.text(
    """
SELECT position, name, status, attempts, error, started_at, finished_at, kind, wake_at,
       event_type
FROM onceflow_steps WHERE job_id = :job_id ORDER BY position
"""
)


def describe_instance(engine: Engine, job_id: str) -> InstanceView | None:
    with engine.connect() as conn:
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
        from workflow_engine.store.children import list_children

        children = list_children(conn, job_id)
    fields = dict(row._mapping)
    fields["status"] = InstanceStatus(fields["status"])
    return InstanceView(**fields, steps=steps, children=children)


def job_status(engine: Engine, job_id: str) -> dict[str, Any] | None:
    """A job's state, whatever it became: a workflow instance or a plain task run."""
    view = describe_instance(engine, job_id)
    if view is not None:
        return {"kind": JobKind.WORKFLOW, **view.to_dict()}
    with engine.connect() as conn:
        row = conn.execute(
            sa.text(
                "SELECT t.job_id, t.task, t.status, t.attempts, t.error, t.created_at,"
                " t.finished_at, j.request_id, j.submitted_at,"
                " (SELECT count(*) FROM onceflow_duplicate_deliveries d"
                "   WHERE d.job_id = t.job_id) AS duplicates"
                " FROM onceflow_task_runs t JOIN onceflow_jobs j USING (job_id)"
                " WHERE t.job_id = :j"
            ),
            {"j": job_id},
        ).one_or_none()
    if row is None:
        return None
    return {"kind": JobKind.TASK, **dict(row._mapping)}
