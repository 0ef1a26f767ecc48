"""``onceflow audit`` settles after dead-lettered records (issue 17, defect 5).

A record the workers dead-lettered was consumed: the audit must count it, by reason,
and not wait forever for an instance of its job id. Real Kafka and PostgreSQL; the
test plays the worker's part (instances, dead letters, the committed offsets) so the
audit alone is under test.
"""

from __future__ import annotations

import hashlib

from confluent_kafka import Consumer, Producer, TopicPartition

from onceflow.envelope import HEADER_DLQ_REASON, HEADER_DLQ_SOURCE, JobEnvelope
from onceflow.vocabulary import DeadLetterReason
from onceflow_cli.audit import run_audit
from workflow_engine.model import Delivery
from workflow_engine.store.views import DeadLetterRow
from workflow_engine.store.writes import create_instances, record_dead_letters


def _produce(bootstrap: str, topic: str, records: list[tuple[bytes | None, bytes, list]]):
    """Write records to partition 0 in order; return their offsets."""
    producer = Producer({"bootstrap.servers": bootstrap, "acks": "all"})
    offsets: list[int] = []

    def delivered(err, msg):
        assert err is None, err
        offsets.append(msg.offset())

    for key, value, headers in records:
        producer.produce(
            topic, key=key, value=value, headers=headers, partition=0, on_delivery=delivered
        )
        producer.flush(30)  # one at a time: offsets in the order given
    producer.poll(0)
    assert producer.flush(30) == 0
    return offsets


def _commit(settings, offset: int) -> None:
    """Commit the consumer group's offset on partition 0, as the workers would."""
    consumer = Consumer(
        {
            "bootstrap.servers": settings.kafka_bootstrap_servers,
            "group.id": settings.consumer_group,
            "enable.auto.commit": False,
        }
    )
    try:
        consumer.commit(
            offsets=[TopicPartition(settings.jobs_topic, 0, offset)], asynchronous=False
        )
    finally:
        consumer.close()


def _row(settings, offset, job_id, reason, value) -> DeadLetterRow:
    return DeadLetterRow(
        source_topic=settings.jobs_topic,
        source_partition=0,
        source_offset=offset,
        job_id=job_id,
        reason=reason,
        detail="",
        original_size=len(value),
        sha256=hashlib.sha256(value).hexdigest(),
        truncated=False,
        dlq_topic=settings.dlq_topic,
        dlq_partition=None,
        dlq_offset=None,
        headers={},
    )


def test_the_audit_counts_dead_letters_as_consumed_and_settles(settings, db):
    bootstrap, topic = settings.kafka_bootstrap_servers, settings.jobs_topic
    good = JobEnvelope("aud_good", "order-workflow", {}, "req_1")
    unknown = JobEnvelope("aud_unknown", "no-such-workflow", {}, "req_1")
    lost = JobEnvelope("aud_lost_dlq", "no-such-workflow", {}, "req_1")
    again = JobEnvelope("aud_good", "refund-workflow", {}, "req_2")
    not_json = b"{not json"
    offsets = _produce(
        bootstrap,
        topic,
        [
            (good.key(), good.encode(), good.headers()),
            (unknown.key(), unknown.encode(), unknown.headers()),
            (b"aud_bad", not_json, []),
            (lost.key(), lost.encode(), lost.headers()),
            (again.key(), again.encode(), again.headers()),
        ],
    )
    assert offsets == [0, 1, 2, 3, 4]

    # The worker's part: one instance; the record of "aud_good" under another type
    # collapses as a workflow mismatch; three dead letters - two on the DLQ topic (the
    # header says where from), one known only to the table (the DLQ lost it to retention).
    create_instances(db, [Delivery(good, topic, 0, 0), Delivery(again, topic, 0, 4)])
    _produce(
        bootstrap,
        settings.dlq_topic,
        [
            (
                key,
                value,
                [
                    (HEADER_DLQ_REASON, reason.encode()),
                    (HEADER_DLQ_SOURCE, f"{topic}/0@{o}".encode()),
                ],
            )
            for key, value, reason, o in (
                (unknown.key(), unknown.encode(), DeadLetterReason.UNKNOWN_TYPE, 1),
                (b"aud_bad", not_json, DeadLetterReason.NOT_JSON, 2),
            )
        ],
    )
    record_dead_letters(
        db,
        [
            _row(settings, 1, "aud_unknown", DeadLetterReason.UNKNOWN_TYPE, unknown.encode()),
            _row(settings, 3, "aud_lost_dlq", DeadLetterReason.UNKNOWN_TYPE, lost.encode()),
        ],
    )
    _commit(settings, 5)  # everything consumed

    report = run_audit(settings, db)
    assert report.clean, report.render()
    assert (report.lag, report.pending_job_ids, report.missing) == (0, 0, [])
    assert report.dead_lettered_by_reason == {"unknown_type": 2, "not_json": 1}
    assert report.dead_lettered_job_ids == 2  # aud_unknown, aud_lost_dlq
    assert report.consumed_job_ids == 3  # aud_good, and the two dead-lettered ids
    assert report.workflow_mismatch_job_ids == 1
    text = report.render()
    assert "3 dead-lettered (by reason)" in text
    assert "result: CLEAN\n" in text + "\n" and "so far" not in text
