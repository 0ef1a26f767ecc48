"""Plain queue tasks through the real streams worker: retries, dead letters, no rerun."""

from __future__ import annotations

import signal

import sqlalchemy as sa

from onceflow.envelope import (
    HEADER_DLQ_DETAIL,
    HEADER_DLQ_REASON,
    HEADER_JOB_ID,
    JobEnvelope,
)
from onceflow_tools.processes import ProcessGroup
from tests.conftest import settings_env
from tests.integration.kafka_helpers import consume_all, produce_envelopes
from tests.integration.test_streams_worker import scalar, start_worker, wait_until


def test_tasks_run_once_retry_and_dead_letter(settings, db, tmp_path):
    ok = [
        JobEnvelope(
            f"mail_{i}", "send-welcome-email", {"job_id": f"mail_{i}", "email": f"u{i}@example.org"}
        )
        for i in range(5)
    ]
    broken = JobEnvelope(
        "mail_broken", "send-welcome-email", {"job_id": "mail_broken", "fail": True}
    )
    unknown = JobEnvelope("mystery_1", "no-such-type", {})
    produce_envelopes(
        settings.kafka_bootstrap_servers, settings.jobs_topic, [*ok, broken, unknown, ok[0], ok[1]]
    )  # two resubmissions
    with ProcessGroup(settings_env(settings), tmp_path / "logs") as group:
        start_worker(group)
        wait_until(
            lambda: (
                scalar(db, "SELECT count(*) FROM onceflow_task_runs WHERE status <> 'pending'") == 6
            ),
            60,
            "tasks",
            group,
        )
        dead = consume_all(settings.kafka_bootstrap_servers, settings.dlq_topic, 2)
        assert group.stop("streams", signal.SIGTERM) == 0

    assert scalar(db, "SELECT count(*) FROM onceflow_task_runs WHERE status = 'succeeded'") == 5
    # one side effect per successful task, although two were delivered twice
    assert scalar(db, "SELECT count(*) FROM onceflow_demo_side_effects") == 5
    assert scalar(db, "SELECT count(*) FROM onceflow_duplicate_deliveries") == 2
    assert scalar(db, "SELECT count(*) FROM onceflow_instances") == 0  # no workflows
    with db.connect() as conn:
        attempts, status, error = conn.execute(
            sa.text(
                "SELECT attempts, status, error FROM onceflow_task_runs"
                " WHERE job_id = 'mail_broken'"
            )
        ).one()
    assert (attempts, status) == (3, "dead_lettered")  # first try + 2 retries
    assert "mail server refused" in error

    reasons = {
        dict(m.headers())[HEADER_JOB_ID].decode(): (
            dict(m.headers())[HEADER_DLQ_REASON].decode(),
            dict(m.headers())[HEADER_DLQ_DETAIL].decode(),
        )
        for m in dead
    }
    assert reasons["mail_broken"][0] == "task_failed"
    assert reasons["mail_broken"][1].startswith("task 'send-welcome-email' failed after 3")
    assert reasons["mystery_1"] == (
        "unknown_type",
        "unknown workflow or task type 'no-such-type'",
    )


def test_recording_an_attempt_twice_counts_it_once(db):
    """The worker runs ``record_attempt`` again when a connection drops with the
    commit's outcome unknown; the second run of the same attempt changes nothing."""
    from onceflow.vocabulary import JobKind, TaskRunStatus
    from workflow_engine.model import Delivery
    from workflow_engine.store.writes import RETRY, create_instances, pending, record_attempt

    task = JobEnvelope("once_1", "send-welcome-email", {"email": "x@example.org"})
    create_instances(db, [Delivery(task, "t", 0, 0, kind=JobKind.TASK)])
    for _ in range(2):
        record_attempt(db, "once_1", 1, RETRY, None, "down")
    assert [p.attempts for p in pending(db, ["once_1"])] == [1]
    for _ in range(2):
        record_attempt(db, "once_1", 2, TaskRunStatus.SUCCEEDED, b'"ok"', None)
    assert pending(db, ["once_1"]) == []
    assert scalar(db, "SELECT attempts FROM onceflow_task_runs WHERE job_id = 'once_1'") == 2
