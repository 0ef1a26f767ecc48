"""The worker's spans: one ``process <topic>`` span per consumed job record.

Each is a child of the record's ``traceparent`` (the ingest send span), so it sits in
the job's trace; it covers the batch's database transaction that created the instance
(its start and end are the chunk's), and says what became of the record:
``onceflow.outcome`` = ``created``, ``duplicate`` (with a ``duplicate collapsed``
event) or ``already_recorded`` (a redelivery whose position was recorded before).
Built only when tracing is on; :class:`~streams.batch.BatchHandler` checks one boolean.
"""

from __future__ import annotations

from collections.abc import Sequence

from opentelemetry.trace import SpanKind

from onceflow import tracing
from workflow_engine.model import CreateResult, Delivery

_tracer = tracing.tracer("onceflow.worker")


def record_spans(
    chunk: Sequence[Delivery], result: CreateResult, start_ns: int, end_ns: int
) -> None:
    created = set(result.created_ids)
    duplicates = set(result.duplicate_ids)
    mismatched = set(result.mismatch_ids) | set(result.workflow_mismatch_ids)
    seen: set[str] = set()
    for d in chunk:
        env = d.envelope
        job_id = env.job_id
        first = job_id not in seen
        seen.add(job_id)
        if first and job_id in created:
            outcome = "created"
        elif job_id in duplicates:
            outcome = "duplicate"
        else:
            outcome = "already_recorded"
        span = _tracer.start_span(
            f"process {d.topic}",
            context=tracing.context_from_traceparent(env.traceparent),
            kind=SpanKind.CONSUMER,
            start_time=start_ns,
            attributes={
                "messaging.system": "kafka",
                "messaging.operation.type": "process",
                "messaging.destination.name": d.topic,
                "messaging.batch.message_count": len(chunk),
                tracing.PARTITION: d.partition,
                tracing.OFFSET: d.offset,
                tracing.JOB_ID: job_id,
                tracing.WORKFLOW: env.workflow,
                "onceflow.kind": str(d.kind),
                "onceflow.outcome": outcome,
            },
        )
        if outcome == "duplicate":
            span.add_event(
                "duplicate collapsed",
                {tracing.JOB_ID: job_id, "onceflow.params_match": job_id not in mismatched},
                timestamp=end_ns,
            )
        span.end(end_time=end_ns)
