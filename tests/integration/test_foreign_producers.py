"""Producers that write the jobs topic directly (kcat, Java, Go): issue 17, item 2.

They write the natural record - ``{"job_id", "workflow", "params"}`` - with no ``v``,
no ``submitted_at``, often no headers and sometimes no key. The worker fills in the
defaults (v 1; the Kafka record's timestamp), records the provenance (``kafka``, no
request id), and still refuses what is wrong, with a code.
"""

from __future__ import annotations

import signal
from datetime import UTC, datetime

import orjson
import sqlalchemy as sa

from onceflow.envelope import HEADER_DLQ_REASON, HEADER_DLQ_SOURCE, JobEnvelope
from onceflow_tools.processes import ProcessGroup
from tests.conftest import settings_env
from tests.integration.kafka_helpers import consume_all, produce, produce_envelopes
from tests.integration.test_streams_worker import scalar, start_worker, wait_until


def _job(job_id, **extra):
    return orjson.dumps({"job_id": job_id, "workflow": "order-workflow", "params": {}, **extra})


def test_the_natural_record_format_creates_instances_with_defaults_and_provenance(
    settings, db, tmp_path
):
    bootstrap = settings.kafka_bootstrap_servers
    produce(
        bootstrap,
        settings.jobs_topic,
        [
            (b"fk_plain", _job("fk_plain"), []),  # what kcat -K: writes
            (b"fk_v1", _job("fk_v1", v=1), [("x-producer", b"java")]),  # v, no submitted_at
            (None, _job("fk_keyless"), []),  # keyless: the body's job id is the id
            (b"fk_v2", _job("fk_v2", v=2), []),  # a future version: refused
            (b"other", _job("fk_wrong_key"), []),  # a key naming another job: refused
        ],
    )
    produce_envelopes(
        bootstrap,
        settings.jobs_topic,
        [JobEnvelope("fk_http", "order-workflow", {}, request_id="req_abc")],
    )
    jobs = {m.key() or m.value(): m for m in consume_all(bootstrap, settings.jobs_topic, 6)}

    with ProcessGroup(settings_env(settings), tmp_path / "logs") as group:
        start_worker(group)
        wait_until(
            lambda: scalar(db, "SELECT count(*) FROM onceflow_instances") == 4,
            60,
            "four instances",
            group,
        )
        dead = consume_all(bootstrap, settings.dlq_topic, 2)
        assert group.stop("streams", signal.SIGTERM) == 0

    with db.connect() as conn:
        rows = {
            r.job_id: r
            for r in conn.execute(
                sa.text("SELECT job_id, request_id, submitted_at, origin FROM onceflow_jobs")
            )
        }
    assert set(rows) == {"fk_plain", "fk_v1", "fk_keyless", "fk_http"}
    for job_id in ("fk_plain", "fk_v1"):
        row = rows[job_id]
        _, ms = jobs[job_id.encode()].timestamp()
        assert row.submitted_at == datetime.fromtimestamp(ms / 1000, UTC)  # the record's time
        assert (row.request_id, row.origin) == (None, "kafka")
    assert rows["fk_keyless"].origin == "kafka"
    assert (rows["fk_http"].request_id, rows["fk_http"].origin) == ("req_abc", "http")

    reasons = {dict(m.headers())[HEADER_DLQ_REASON].decode() for m in dead}
    assert reasons == {"unsupported_version", "key_mismatch"}
    assert all(
        dict(m.headers())[HEADER_DLQ_SOURCE].startswith(settings.jobs_topic.encode()) for m in dead
    )
