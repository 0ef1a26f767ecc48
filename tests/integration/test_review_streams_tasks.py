"""A task whose failure message PostgreSQL cannot store as it is (a NUL character, a
lone surrogate) never wedges its partition (found in review, issue 23's "a record must
never stop a partition, whatever its content").

Before: recording the failed attempt raised the driver's ``ValueError`` ("A string
literal cannot contain NUL (0x00) characters"; a ``UnicodeEncodeError`` for the
surrogate), which is no database error at all, so it escaped the batch: the worker
exited 70 without committing, and every restart ran the task again, dead-lettered it
again and exited again. Real Kafka, real PostgreSQL, the real worker as a subprocess.
"""

from __future__ import annotations

import signal

import sqlalchemy as sa

from onceflow.envelope import HEADER_DLQ_DETAIL, HEADER_DLQ_REASON, JobEnvelope
from onceflow_tools.processes import ProcessGroup
from tests.conftest import settings_env
from tests.integration import review_tasks
from tests.integration.kafka_helpers import committed_offsets, consume_all
from tests.integration.test_poison_records import _produce_to_partition_0
from tests.integration.test_streams_worker import scalar, start_worker, wait_until

MODULES = '["onceflow_examples", "tests.integration.review_tasks"]'


def _committed(settings) -> int:
    offsets = committed_offsets(
        settings.kafka_bootstrap_servers, settings.consumer_group, settings.jobs_topic, 1
    )
    return offsets[0]


def test_a_task_failure_message_postgres_cannot_hold_does_not_stop_its_partition(
    settings, db, tmp_path
):
    jobs = [
        JobEnvelope("job_nul_retried", review_tasks.NUL_ERROR_RETRIED, {}),
        JobEnvelope("job_nul_final", review_tasks.NUL_ERROR_FINAL, {}),
        JobEnvelope("job_surrogate", review_tasks.SURROGATE_ERROR, {}),
        JobEnvelope("job_after_tasks", "order-workflow", {"i": 1}),
    ]
    _produce_to_partition_0(
        settings.kafka_bootstrap_servers, settings.jobs_topic, [(e.key(), e.encode()) for e in jobs]
    )
    env = {**settings_env(settings), "ONCEFLOW_WORKFLOW_MODULES": MODULES}
    with ProcessGroup(env, tmp_path / "logs") as group:
        start_worker(group)
        wait_until(lambda: _committed(settings) == len(jobs), 60, "partition 0 committed", group)
        dead = consume_all(settings.kafka_bootstrap_servers, settings.dlq_topic, 3)
        assert group.stop("streams", signal.SIGTERM) == 0
    # One letter each: the task was not run again (and dead-lettered again) by restarts.
    assert sorted(m.key() for m in dead) == [b"job_nul_final", b"job_nul_retried", b"job_surrogate"]
    for letter in dead:
        headers = dict(letter.headers())
        assert headers[HEADER_DLQ_REASON] == b"task_failed"
        assert b"the downstream answered" in headers[HEADER_DLQ_DETAIL]
    with db.connect() as conn:
        runs = {
            r.job_id: (r.status, r.attempts, r.error)
            for r in conn.execute(
                sa.text("SELECT job_id, status, attempts, error FROM onceflow_task_runs")
            )
        }
    assert runs["job_nul_retried"][:2] == ("dead_lettered", 2)  # first try + 1 retry
    assert runs["job_nul_final"][:2] == ("dead_lettered", 1)
    assert runs["job_surrogate"][:2] == ("dead_lettered", 1)
    # The message is kept, its unstorable characters escaped rather than dropped.
    assert "b'\\x00': not a receipt" in runs["job_nul_final"][2]
    assert "'\\udcff'" in runs["job_surrogate"][2]
    # ... and the letters are in the dead-letter table too (the console's index of them).
    assert scalar(db, "SELECT count(*) FROM onceflow_dead_letters") == 3
    after = "SELECT count(*) FROM onceflow_instances WHERE job_id = 'job_after_tasks'"
    assert scalar(db, after) == 1
