"""A record never stops a partition, whatever its size or content (issue 17, item 1).

Real Kafka, real PostgreSQL, the real worker as a subprocess. The big records reach the
jobs topic the ways they do in the field: compressed (the broker checks the compressed
batch, so a valid envelope of several megabytes gets in), or plain but under the
topics' limit. The worker must dead-letter each one - whole when the dead-letter topic
takes it, else a bounded prefix with the original's size and sha256 - and go on with
the records behind it on the same partition.
"""

from __future__ import annotations

import hashlib
import os
import signal
import subprocess
import urllib.request

import sqlalchemy as sa
from confluent_kafka import Producer

from onceflow.envelope import (
    HEADER_DLQ_DETAIL,
    HEADER_DLQ_ORIGINAL_SIZE,
    HEADER_DLQ_REASON,
    HEADER_DLQ_SHA256,
    HEADER_DLQ_SOURCE,
    HEADER_DLQ_TRUNCATED,
    JobEnvelope,
)
from onceflow_tools.processes import ProcessGroup, onceflow_command
from tests.conftest import settings_env
from tests.integration.kafka_helpers import committed_offsets, consume_all
from tests.integration.test_streams_worker import scalar, start_worker, wait_until


def _produce_to_partition_0(bootstrap: str, topic: str, records, compression: str = "none"):
    producer = Producer(
        {
            "bootstrap.servers": bootstrap,
            "acks": "all",
            # The huge record goes in a batch of its own: without idempotence a retried
            # first batch may land behind it, and the offsets asserted below move.
            "enable.idempotence": True,
            "compression.type": compression,
            "message.max.bytes": 64 * 1024 * 1024,  # the client would refuse before the broker
        }
    )
    for key, value in records:
        producer.produce(topic, key=key, value=value, partition=0)
    assert producer.flush(60) == 0


def test_records_of_any_size_are_dead_lettered_and_the_partition_moves_on(settings, db, tmp_path):
    bootstrap = settings.kafka_bootstrap_servers
    huge = JobEnvelope("job_huge", "order-workflow", {"blob": "a" * (6 * 1024 * 1024)}).encode()
    junk = os.urandom(1_500_000)  # not JSON, does not compress: fits the topics' 4 MiB
    before = [JobEnvelope(f"job_before_{i}", "order-workflow", {"i": i}) for i in range(3)]
    after = [JobEnvelope(f"job_after_{i}", "order-workflow", {"i": i}) for i in range(5)]
    # 6 MiB of JSON, compressed into a batch the broker takes (its limit is 4 MiB)
    _produce_to_partition_0(
        bootstrap,
        settings.jobs_topic,
        [(e.key(), e.encode()) for e in before] + [(b"job_huge", huge)],
        compression="zstd",
    )
    _produce_to_partition_0(bootstrap, settings.jobs_topic, [(b"junk", junk)])
    _produce_to_partition_0(bootstrap, settings.jobs_topic, [(e.key(), e.encode()) for e in after])

    with ProcessGroup(settings_env(settings), tmp_path / "logs") as group:
        port = start_worker(group)
        wait_until(
            lambda: scalar(db, "SELECT count(*) FROM onceflow_instances") == 8,
            90,
            "the records behind the poison ones",
            group,
        )
        dead = consume_all(bootstrap, settings.dlq_topic, 2)
        wait_until(
            lambda: (
                committed_offsets(bootstrap, settings.consumer_group, settings.jobs_topic, 1)[0]
                == 10
            ),
            30,
            "partition 0 committed to its end",
            group,
        )
        metrics = urllib.request.urlopen(f"http://127.0.0.1:{port}/metrics").read().decode()
        assert group.stop("streams", signal.SIGTERM) == 0  # never exited 70 on the way

    assert 'onceflow_streams_dead_lettered_total{reason="too_large"} 2.0' in metrics
    by_source = {dict(m.headers())[HEADER_DLQ_SOURCE].decode(): m for m in dead}
    assert set(by_source) == {f"{settings.jobs_topic}/0@3", f"{settings.jobs_topic}/0@4"}

    cut = by_source[f"{settings.jobs_topic}/0@3"]
    headers = dict(cut.headers())
    assert headers[HEADER_DLQ_REASON] == b"too_large"
    assert b"the limit is 1048576" in headers[HEADER_DLQ_DETAIL]
    assert headers[HEADER_DLQ_TRUNCATED] == b"true"
    assert headers[HEADER_DLQ_ORIGINAL_SIZE] == str(len(huge)).encode()
    assert headers[HEADER_DLQ_SHA256] == hashlib.sha256(huge).hexdigest().encode()
    assert cut.key() == b"job_huge"
    assert huge.startswith(cut.value())
    assert 3 * 1024 * 1024 < len(cut.value()) <= settings.kafka_max_message_bytes

    whole = dict(by_source[f"{settings.jobs_topic}/0@4"].headers())
    assert by_source[f"{settings.jobs_topic}/0@4"].value() == junk
    assert whole[HEADER_DLQ_TRUNCATED] == b"false"
    assert whole[HEADER_DLQ_REASON] == b"too_large"

    # ... and each is recorded in the database with where it went.
    with db.connect() as conn:
        rows = conn.execute(
            sa.text(
                "SELECT source_offset, job_id, reason, truncated, original_size, sha256,"
                " dlq_offset IS NOT NULL FROM onceflow_dead_letters ORDER BY source_offset"
            )
        ).all()
    assert [tuple(r) for r in rows] == [
        (3, "job_huge", "too_large", True, len(huge), hashlib.sha256(huge).hexdigest(), True),
        (4, "junk", "too_large", False, len(junk), hashlib.sha256(junk).hexdigest(), True),
    ]


def _audit(settings, **env):
    return subprocess.run(
        [*onceflow_command(), "audit"],
        env={**os.environ, **settings_env(settings), **env},
        capture_output=True,
        text=True,
        timeout=120,
        check=False,
    )


def test_audit_fails_loudly_when_the_group_is_not_making_progress(settings, db, tmp_path):
    envs = [JobEnvelope(f"job_{i}", "order-workflow", {"i": i}) for i in range(6)]
    _produce_to_partition_0(
        settings.kafka_bootstrap_servers, settings.jobs_topic, [(e.key(), e.encode()) for e in envs]
    )
    # Nobody consumes: lag 6, and the committed offsets do not move.
    stuck = _audit(settings, ONCEFLOW_AUDIT_PROGRESS_SECONDS="2")
    assert stuck.returncode == 1, stuck.stdout + stuck.stderr
    assert (
        f"consumer group {settings.consumer_group} is not making progress: lag 6,"
        " committed offsets unchanged for 2s"
    ) in stuck.stdout

    with ProcessGroup(settings_env(settings), tmp_path / "logs") as group:
        start_worker(group)
        wait_until(
            lambda: (
                committed_offsets(
                    settings.kafka_bootstrap_servers,
                    settings.consumer_group,
                    settings.jobs_topic,
                    1,
                )[0]
                == 6
            ),
            60,
            "offsets committed",
            group,
        )
        group.stop("streams")
    drained = _audit(settings, ONCEFLOW_AUDIT_PROGRESS_SECONDS="2")
    assert drained.returncode == 0, drained.stdout + drained.stderr
    assert "not making progress" not in drained.stdout
