"""From consumed records to deliveries: decode, validate, or send to the dead-letter topic.

Pure functions over plain values so they can be unit-tested without Kafka.
"""

from __future__ import annotations

from dataclasses import dataclass
from datetime import UTC, datetime

from onceflow.envelope import JobEnvelope, KafkaHeaders
from onceflow.errors import InvalidEnvelope
from onceflow.ids import is_valid_job_id
from onceflow.vocabulary import DeadLetterReason, IdReuse, JobKind
from onceflow.webhooks import callback_problem
from workflow_engine.model import Delivery, Registry


@dataclass(frozen=True, slots=True)
class RawRecord:
    topic: str
    partition: int
    offset: int
    key: bytes | None
    value: bytes | None
    headers: KafkaHeaders
    timestamp: float | None = None  # the Kafka record's timestamp (seconds)

    @property
    def source(self) -> str:
        """Where it came from: ``topic/partition@offset``."""
        return f"{self.topic}/{self.partition}@{self.offset}"


@dataclass(frozen=True, slots=True)
class DeadLetter:
    """A record bound for the dead-letter topic: the code, and the text saying why."""

    record: RawRecord
    reason: DeadLetterReason
    detail: str
    job_id: str | None = None  # the job id the record named, when it named a valid one

    @classmethod
    def of(
        cls, record: RawRecord, reason: DeadLetterReason, detail: str, job_id: str | None = None
    ) -> DeadLetter:
        return cls(record, reason, detail, job_id or _key_job_id(record.key))


def classify(
    records: list[RawRecord],
    max_value_bytes: int,
    registry: Registry,
    callbacks: frozenset[str] = frozenset(),
) -> tuple[list[Delivery], list[DeadLetter]]:
    """Split records into valid deliveries (in order) and dead letters with a reason.

    ``registry`` says what a type name is (a workflow, a task, or nothing registered:
    the record is dead-lettered), and for a workflow the version and fairness lane a
    new instance records: this process's definition of it. ``callbacks`` are the
    webhook endpoints configured here: a job naming another is dead-lettered
    (``unknown_callback``), as is a task with a callback (a task has no lifecycle).
    """
    deliveries: list[Delivery] = []
    dead: list[DeadLetter] = []
    for rec in records:
        if rec.value is not None and len(rec.value) > max_value_bytes:
            detail = f"record value is {len(rec.value)} bytes, the limit is {max_value_bytes}"
            dead.append(DeadLetter.of(rec, DeadLetterReason.TOO_LARGE, detail))
            continue
        try:
            env = JobEnvelope.decode(rec.key, rec.value, rec.headers, rec.timestamp)
        except InvalidEnvelope as exc:
            dead.append(DeadLetter.of(rec, exc.reason, exc.detail))
            continue
        kind = registry.kind_of(env.workflow)
        if kind is None:
            detail = f"unknown workflow or task type {env.workflow!r}"
            dead.append(DeadLetter.of(rec, DeadLetterReason.UNKNOWN_TYPE, detail, env.job_id))
            continue
        workflow = kind == JobKind.WORKFLOW
        refused = _refusal(env, workflow, registry, callbacks)
        if refused is not None:
            dead.append(DeadLetter.of(rec, *refused, env.job_id))
            continue
        enqueued = datetime.fromtimestamp(rec.timestamp, UTC) if rec.timestamp else None
        deliveries.append(
            registry.delivery(
                env, rec.topic, rec.partition, rec.offset, kind=kind, enqueued_at=enqueued
            )
        )
    return deliveries, dead


def _refusal(
    env: JobEnvelope, workflow: bool, registry: Registry, callbacks: frozenset[str]
) -> tuple[DeadLetterReason, str] | None:
    """Why a decoded job cannot be created here (its callback, a task's options, its id
    reuse policy), or None."""
    return (
        _callback_refusal(env, workflow, callbacks)
        or _task_refusal(env, workflow)
        or _id_reuse_refusal(env, registry.id_reuse(env.workflow) if workflow else None)
        or _batch_refusal(env, registry)
    )


def _callback_refusal(
    env: JobEnvelope, workflow: bool, callbacks: frozenset[str]
) -> tuple[DeadLetterReason, str] | None:
    if env.callback is None:
        return None
    if not workflow:
        detail = (
            f"callback {env.callback!r} on task {env.workflow!r}: a task has no lifecycle events"
        )
        return DeadLetterReason.INVALID_CALLBACK, detail
    problem = callback_problem(env.callback, callbacks)
    return None if problem is None else (DeadLetterReason(problem[0]), problem[1])


def _task_refusal(env: JobEnvelope, workflow: bool) -> tuple[DeadLetterReason, str] | None:
    """What a task cannot have: a delayed start, a start limit, attributes (it has no
    instance)."""
    if workflow:
        return None
    if env.run_at is not None:
        detail = f"{env.workflow!r} is a task: a delayed start (run_at) is for workflows"
        return DeadLetterReason.INVALID_RUN_AT, detail
    if env.start_within is not None:
        detail = f"{env.workflow!r} is a task: a start limit (start_within) is for workflows"
        return DeadLetterReason.INVALID_START_WITHIN, detail
    if env.attributes:
        detail = f"{env.workflow!r} is a task: attributes are for workflow instances"
        return DeadLetterReason.INVALID_ATTRIBUTES, detail
    return None


def _id_reuse_refusal(
    env: JobEnvelope, declared: IdReuse | None
) -> tuple[DeadLetterReason, str] | None:
    """A job's ``id_reuse`` may only be as strict as its workflow's or stricter: a looser
    one is refused, not narrowed (nothing submitted is silently changed); a task has no
    instance to run again."""
    if env.id_reuse is None:
        return None
    if declared is None:
        detail = f"{env.workflow!r} is a task: id_reuse is for workflow instances"
        return DeadLetterReason.INVALID_ID_REUSE, detail
    if env.id_reuse.strictness < declared.strictness:
        detail = (
            f"id_reuse {env.id_reuse.value!r} is looser than workflow {env.workflow!r}'s"
            f" {declared.value!r}: a job may only ask for its workflow's or a stricter one"
        )
        return DeadLetterReason.INVALID_ID_REUSE, detail
    return None


def _batch_refusal(env: JobEnvelope, registry: Registry) -> tuple[DeadLetterReason, str] | None:
    """What a member of a batched workflow cannot have: a start limit (a member is never
    started on its own; its batch run is, README "Flow control")."""
    if env.start_within is None or registry.batch_key(env.workflow) is None:
        return None
    detail = (
        f"{env.workflow!r} runs its jobs in batches: a start limit (start_within) is for"
        " jobs that start on their own"
    )
    return DeadLetterReason.INVALID_START_WITHIN, detail


def split_by_partition(deliveries: list[Delivery], groups: int) -> list[list[Delivery]]:
    """At most ``groups`` chunks; all records of one partition stay in one chunk, in order.

    Each chunk is one transaction. Keeping a partition together means the same job id
    (always on one partition when keyed) is never written by two of our transactions
    at once.
    """
    by_partition: dict[tuple[str, int], list[Delivery]] = {}
    for d in deliveries:
        by_partition.setdefault((d.topic, d.partition), []).append(d)
    chunks: list[list[Delivery]] = [[] for _ in range(max(1, min(groups, len(by_partition))))]
    for i, part in enumerate(sorted(by_partition)):
        chunks[i % len(chunks)].extend(by_partition[part])
    return [c for c in chunks if c]


def _key_job_id(key: bytes | None) -> str | None:
    if key is None or len(key) > 100:
        return None
    try:
        text = key.decode()
    except UnicodeDecodeError:
        return None
    return text if is_valid_job_id(text) else None
