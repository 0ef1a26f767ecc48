"""``onceflow audit``: check the property the system exists for.

Every job id accepted by ingest — every valid record in the jobs topic, since ingest
answers 202 only for acknowledged records — must have exactly one workflow instance
or task run once the streams workers have consumed it; none may have two; records
that are not valid jobs must be on the dead-letter topic.

The audit reads the topics itself (the ingest hot path is untouched) and judges only
records below the consumer group's committed offsets: records the workers have not
consumed yet are reported as pending, not missing.

A record the workers dead-lettered (unknown type, invalid envelope, too large …) was
consumed too: it is known by its source position, from the dead-letter topic's
``onceflow-dlq-source`` header and from ``onceflow_dead_letters``, and counted by
reason. A job id whose every consumed record was dead-lettered is "dead-lettered", not
pending (it will never have an instance), so the audit settles.
"""

from __future__ import annotations

import time
import uuid
from dataclasses import dataclass, field

from confluent_kafka import OFFSET_BEGINNING, Consumer, KafkaError, TopicPartition
from sqlalchemy.engine import Engine

from onceflow.envelope import HEADER_DLQ_REASON, HEADER_DLQ_SOURCE, JobEnvelope
from onceflow.errors import InvalidEnvelope
from onceflow.lag import PartitionLag, consumer_lag
from onceflow.settings import Settings
from workflow_engine.store.views import (
    dead_letter_sources,
    stored_job_ids,
    workflow_mismatch_job_ids,
)


@dataclass
class AuditReport:
    topic: str
    group: str
    records: int = 0
    job_ids: int = 0
    consumed_job_ids: int = 0
    pending_job_ids: int = 0
    instances: int = 0
    task_runs: int = 0
    dead_lettered_records: int = 0
    invalid_records: int = 0
    lag: int = 0
    missing: list[str] = field(default_factory=list)
    doubled: list[str] = field(default_factory=list)
    invalid_not_dead_lettered: list[str] = field(default_factory=list)
    unknown_origin: int = 0
    # Instances started inside onceflow (schedule ticks, child workflows, batch runs): no record.
    started_inside: int = 0
    # Records of the jobs topic the workers dead-lettered, by reason code, and the job
    # ids that have nothing but dead letters (consumed; no instance will ever exist).
    dead_lettered_by_reason: dict[str, int] = field(default_factory=dict)
    dead_lettered_job_ids: int = 0
    # Job ids delivered again under another workflow type (reported, not a violation).
    workflow_mismatch_job_ids: int = 0
    # Set when lag > 0 and no committed offset moved between two reads: the workers are
    # stuck (or not running), and "not consumed yet" would otherwise look benign.
    not_progressing: str | None = None

    @property
    def clean(self) -> bool:
        return not (
            self.missing or self.doubled or self.invalid_not_dead_lettered or self.not_progressing
        )

    def _dead_letter_rows(self) -> list[tuple[str, int]]:
        total = sum(self.dead_lettered_by_reason.values())
        rows = [(f"{total} dead-lettered (by reason)", total)]
        rows += [(f"  {reason}", n) for reason, n in sorted(self.dead_lettered_by_reason.items())]
        rows.append(("job ids only dead-lettered (no instance)", self.dead_lettered_job_ids))
        return rows

    def render(self) -> str:
        rows = [
            ("records in the jobs topic", self.records),
            ("distinct job ids", self.job_ids),
            ("  consumed by the workers", self.consumed_job_ids),
            ("  not consumed yet (consumer lag)", self.pending_job_ids),
            ("consumer lag (records)", self.lag),
            ("workflow instances", self.instances),
            ("task runs", self.task_runs),
            ("records on the dead-letter topic", self.dead_lettered_records),
            ("invalid records in the jobs topic", self.invalid_records),
            ("instances started by schedules, parents or batches", self.started_inside),
            ("instances/runs not from the topic (retention)", self.unknown_origin),
            *self._dead_letter_rows(),
            ("job ids delivered again as another workflow", self.workflow_mismatch_job_ids),
            ("MISSING: consumed job id, no instance or task run", len(self.missing)),
            ("DOUBLED: job id with an instance and a task run", len(self.doubled)),
            ("invalid record not dead-lettered", len(self.invalid_not_dead_lettered)),
        ]
        lines = [f"audit of topic {self.topic} (consumer group {self.group})"]
        lines += [f"  {name:<52}{value:>9}" for name, value in rows]
        lines += [f"  missing: {job_id}" for job_id in self.missing]
        lines += [f"  doubled: {job_id}" for job_id in self.doubled]
        lines += [f"  invalid, not dead-lettered: {src}" for src in self.invalid_not_dead_lettered]
        if self.not_progressing:
            lines.append(f"  {self.not_progressing}")
        if not self.clean:
            lines.append("result: VIOLATIONS FOUND")
        elif self.pending_job_ids or self.lag:
            lines.append("result: CLEAN so far (the workers have not consumed everything yet)")
        else:
            lines.append("result: CLEAN")
        return "\n".join(lines)


def _read_topic(settings: Settings, topic: str):
    """Yield every record of ``topic`` present now, partition by partition."""
    consumer = Consumer(
        {
            "bootstrap.servers": settings.kafka_bootstrap_servers,
            "group.id": f"onceflow-audit-{uuid.uuid4().hex}",
            "enable.auto.commit": False,
            "enable.partition.eof": True,
        }
    )
    try:
        md = consumer.list_topics(topic, timeout=10)
        if topic not in md.topics or md.topics[topic].error is not None:
            return
        ends = {}
        for p in md.topics[topic].partitions:
            low, high = consumer.get_watermark_offsets(TopicPartition(topic, p), timeout=10)
            if high > low:
                ends[p] = high
        if not ends:
            return
        consumer.assign([TopicPartition(topic, p, OFFSET_BEGINNING) for p in ends])
        done: set[int] = set()
        while len(done) < len(ends):
            msg = consumer.poll(1.0)
            if msg is None:
                continue
            partition, offset, error = msg.partition() or 0, msg.offset() or 0, msg.error()
            if error is not None:
                if error.code() == KafkaError._PARTITION_EOF:
                    done.add(partition)
                continue
            if offset < ends[partition]:
                yield msg
            if offset + 1 >= ends[partition]:
                done.add(partition)
    finally:
        consumer.close()


def _lags(settings: Settings) -> dict[int, PartitionLag]:
    read = consumer_lag(
        settings.kafka_bootstrap_servers, settings.consumer_group, settings.jobs_topic
    )
    return {p.partition: p for p in read}


def not_progressing(
    settings: Settings, first: dict[int, PartitionLag], first_at: float
) -> str | None:
    """Read the committed offsets again (at least ``audit_progress_seconds`` after the
    first read): lag left and not one offset moved means the group is stuck."""
    if sum(p.lag for p in first.values()) == 0:
        return None
    waited = time.monotonic() - first_at
    if waited < settings.audit_progress_seconds:
        time.sleep(settings.audit_progress_seconds - waited)
        waited = settings.audit_progress_seconds
    second = _lags(settings)
    lag = sum(p.lag for p in second.values())
    moved = any(
        p.committed != (first[n].committed if n in first else None) for n, p in second.items()
    )
    if lag == 0 or moved:
        return None
    stuck = ", ".join(
        f"{n}@{p.committed if p.committed is not None else '-'}"
        for n, p in sorted(second.items())
        if p.lag
    )
    return (
        f"consumer group {settings.consumer_group} is not making progress: lag {lag},"
        f" committed offsets unchanged for {waited:.0f}s (partition@committed: {stuck})"
    )


def run_audit(settings: Settings, db: Engine) -> AuditReport:
    report = AuditReport(settings.jobs_topic, settings.consumer_group)
    first_at = time.monotonic()
    lags = _lags(settings)
    report.lag = sum(p.lag for p in lags.values())

    dead_sources = _dead_letter_sources(settings, db, report)

    consumed: dict[str, bool] = {}  # job id -> some record of it was consumed and kept
    seen: set[str] = set()
    dead_ids: set[str] = set()  # job ids with a dead-lettered record
    for msg in _read_topic(settings, settings.jobs_topic):
        report.records += 1
        source = f"{msg.topic()}/{msg.partition()}@{msg.offset()}"
        committed = lags[msg.partition()].committed if msg.partition() in lags else None
        is_consumed = committed is not None and msg.offset() < committed
        _count_dead_letter(report, dead_sources.get(source))
        try:
            job_id = JobEnvelope.decode(msg.key(), msg.value()).job_id
        except InvalidEnvelope:
            report.invalid_records += 1
            if is_consumed and source not in dead_sources:
                report.invalid_not_dead_lettered.append(source)
            continue
        seen.add(job_id)
        if source in dead_sources:
            dead_ids.add(job_id)
        if is_consumed and source not in dead_sources:
            consumed[job_id] = True
        else:
            consumed.setdefault(job_id, False)

    stored = stored_job_ids(db)
    report.instances, report.task_runs = len(stored.instances), len(stored.task_runs)
    report.job_ids = len(seen)
    report.consumed_job_ids = sum(1 for v in consumed.values() if v)
    only_dead = _only_dead_lettered(consumed, dead_ids, stored.all)
    report.dead_lettered_job_ids = len(only_dead)
    report.consumed_job_ids += len(only_dead)
    report.pending_job_ids = sum(
        1
        for job_id, v in consumed.items()
        if not v and job_id not in stored.all and job_id not in only_dead
    )
    report.missing = sorted(j for j, v in consumed.items() if v and j not in stored.all)
    report.doubled = sorted(stored.doubled)
    report.started_inside = len(stored.started_inside)
    report.unknown_origin = len(stored.all - seen - stored.started_inside)
    report.workflow_mismatch_job_ids = len(workflow_mismatch_job_ids(db))
    report.not_progressing = not_progressing(settings, lags, first_at)
    return report


def _dead_letter_sources(settings: Settings, db: Engine, report: AuditReport) -> dict[str, str]:
    """Every dead-lettered source position (``topic/partition@offset``) with its reason
    code: the DLQ topic's headers, completed by ``onceflow_dead_letters`` (the table
    wins on the reason; the topic may have lost old records to retention)."""
    sources: dict[str, str] = {}
    for msg in _read_topic(settings, settings.dlq_topic):
        report.dead_lettered_records += 1
        headers = dict(msg.headers() or [])
        source = headers.get(HEADER_DLQ_SOURCE)
        if source:
            reason = headers.get(HEADER_DLQ_REASON)
            sources[source.decode()] = reason.decode() if reason else "unknown"
    sources.update({source: str(r) for source, r in dead_letter_sources(db).items()})
    return sources


def _count_dead_letter(report: AuditReport, reason: str | None) -> None:
    if reason is not None:
        report.dead_lettered_by_reason[reason] = report.dead_lettered_by_reason.get(reason, 0) + 1


def _only_dead_lettered(
    consumed: dict[str, bool], dead_ids: set[str], stored: frozenset[str]
) -> set[str]:
    """Job ids consumed only as dead letters: settled, with no instance to wait for."""
    return {j for j in dead_ids if not consumed.get(j) and j not in stored}
