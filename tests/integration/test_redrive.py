"""Reading the dead-letter topic and re-driving letters (real Kafka, the real worker)."""

from __future__ import annotations

import pytest

from onceflow.envelope import (
    HEADER_DLQ_DETAIL,
    HEADER_DLQ_REASON,
    HEADER_DLQ_SOURCE,
    HEADER_DLQ_TRUNCATED,
    HEADER_JOB_ID,
    JobEnvelope,
)
from onceflow.errors import OnceflowError
from onceflow.partitioning import partition_for
from onceflow.redrive import parse_position, read_dead_letters, redrive
from onceflow_tools.processes import ProcessGroup
from tests.conftest import settings_env
from tests.integration.kafka_helpers import consume_all, produce, produce_envelopes
from tests.integration.test_streams_worker import scalar, start_worker, wait_until


def _letter(envelope: JobEnvelope, reason: str, offset: int, truncated: bool = False):
    """A dead letter as the worker writes it: the original plus our headers."""
    value = envelope.encode()
    ours = [
        (HEADER_DLQ_REASON, reason.encode()),
        (HEADER_DLQ_DETAIL, b"the database said no"),
        (HEADER_DLQ_SOURCE, f"onceflow.jobs/0@{offset}".encode()),
        (HEADER_DLQ_TRUNCATED, b"true" if truncated else b"false"),
    ]
    return envelope.key(), value[:20] if truncated else value, envelope.headers() + ours


def test_read_filters_and_pages_in_position_order(settings):
    envs = [JobEnvelope(f"rl_{i}", "order-workflow", {"i": i}) for i in range(6)]
    reasons = ["not_json", "database_refused"] * 3
    produce(
        settings.kafka_bootstrap_servers,
        settings.dlq_topic,
        [_letter(e, r, n) for n, (e, r) in enumerate(zip(envs, reasons, strict=True))],
    )
    every = read_dead_letters(settings, limit=100)
    assert len(every) == 6
    positions = [(r.dlq_partition, r.dlq_offset) for r in every]
    assert positions == sorted(positions)
    refused = read_dead_letters(settings, reason="database_refused")
    assert sorted(r.key for r in refused) == [b"rl_1", b"rl_3", b"rl_5"]
    assert all(r.detail == "the database said no" and not r.truncated for r in refused)
    first = read_dead_letters(settings, limit=2)
    rest = read_dead_letters(settings, limit=100, after=positions[1])
    assert first + rest == every
    assert read_dead_letters(settings, after=positions[-1]) == []
    assert parse_position("3@17") == (3, 17)
    with pytest.raises(OnceflowError, match="PARTITION@OFFSET"):
        parse_position("3:17")


def test_redrive_produces_the_originals_and_an_existing_id_collapses(settings, db, tmp_path):
    bootstrap = settings.kafka_bootstrap_servers
    existing = JobEnvelope("rd_existing", "order-workflow", {"n": 1})
    fresh = JobEnvelope("rd_fresh", "order-workflow", {"n": 2})
    cut = JobEnvelope("rd_cut", "order-workflow", {"n": 3})
    produce_envelopes(bootstrap, settings.jobs_topic, [existing])
    produce(
        bootstrap,
        settings.dlq_topic,
        [
            _letter(existing, "database_refused", 0),
            _letter(fresh, "database_refused", 1),
            _letter(cut, "too_large", 2, truncated=True),
        ],
    )
    letters = read_dead_letters(settings)
    assert len(letters) == 3

    with ProcessGroup(settings_env(settings), tmp_path / "logs") as group:
        start_worker(group)
        wait_until(
            lambda: scalar(db, "SELECT count(*) FROM onceflow_instances") == 1,
            90,
            "the existing job's instance",
            group,
        )
        result = redrive(settings, letters)
        assert result.produced == 2 and result.failed == []
        truncated = next(x for x in letters if x.key == b"rd_cut")
        assert [(r.dlq_partition, r.dlq_offset) for r in result.refused] == [
            (truncated.dlq_partition, truncated.dlq_offset)
        ]
        assert "truncated" in result.refused[0].why
        wait_until(
            lambda: scalar(db, "SELECT count(*) FROM onceflow_duplicate_deliveries") == 1,
            90,
            "the re-driven existing id collapsing",
            group,
        )
        wait_until(
            lambda: scalar(db, "SELECT count(*) FROM onceflow_instances") == 2,
            90,
            "the re-driven fresh id's instance",
            group,
        )
        # ... and re-driving again never makes a second instance
        assert redrive(settings, letters).produced == 2
        wait_until(
            lambda: scalar(db, "SELECT count(*) FROM onceflow_duplicate_deliveries") == 3,
            90,
            "the second redrive collapsing",
            group,
        )

    assert scalar(db, "SELECT count(*) FROM onceflow_instances") == 2
    assert scalar(db, "SELECT count(*) FROM onceflow_instances WHERE job_id = 'rd_cut'") == 0
    assert (
        scalar(
            db,
            "SELECT count(*) FROM onceflow_duplicate_deliveries"
            " WHERE job_id = 'rd_existing' AND params_match AND NOT redelivery",
        )
        == 2
    )
    records = consume_all(bootstrap, settings.jobs_topic, 5)
    redriven = [m for m in records if m.offset() > 0 or m.key() != b"rd_existing"]
    assert len(records) == 5
    for msg in redriven:
        key = msg.key().decode()
        assert msg.partition() == partition_for(key, settings.topic_partitions)
        names = [name for name, _ in msg.headers()]
        assert HEADER_JOB_ID in names
        assert not [n for n in names if n.startswith("onceflow-dlq-")]
