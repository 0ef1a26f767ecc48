"""Re-driving a dead letter whose record had no key (found in review).

Foreign producers may write keyless records (the envelope names the job id; the worker
takes them). The re-drive planned each letter by its record's key alone, so a keyless
letter was "delivered again (the record has no key)" without a look at the database: a
dead-lettered task run was not reopened, and its re-driven record only collapsed as a
duplicate of its own id while the tool said "re-driven 1" (issue 23, case 7, for a
keyless record); one whose job id has an instance was sent again too, to collapse.
Real Kafka and PostgreSQL: the re-drive produces to the jobs topic.
"""

from __future__ import annotations

from onceflow.envelope import JobEnvelope
from onceflow.redrive import DeadLetterRecord
from onceflow.vocabulary import JobKind, TaskRunStatus
from workflow_engine.model import Delivery
from workflow_engine.store import operations, writes
from workflow_engine.store.writes import create_instances


def _letter(offset: int, env: JobEnvelope, reason: str) -> DeadLetterRecord:
    return DeadLetterRecord(
        dlq_partition=0,
        dlq_offset=offset,
        key=None,  # a keyless record, as a foreign producer may write it
        value=env.encode(),
        headers=[("onceflow-dlq-reason", reason.encode())],
        reason=reason,
        detail="",
        source=f"jobs/0@{offset}",
        truncated=False,
        timestamp_ms=0,
    )


def test_a_keyless_letter_is_planned_by_the_job_id_its_value_names(settings, db):
    failed = JobEnvelope("keyless_task", "send-welcome-email", {"email": "x@example.org"})
    done = JobEnvelope("keyless_flow", "order-workflow", {})
    create_instances(db, [Delivery(failed, "jobs", 0, 0, kind=JobKind.TASK)])
    create_instances(db, [Delivery(done, "jobs", 0, 1)])
    dead = TaskRunStatus.DEAD_LETTERED
    writes.record_attempt(db, "keyless_task", 3, dead, None, "mail server refused")

    report = operations.redrive_letters(
        settings, db, [_letter(0, failed, "task_failed"), _letter(1, done, "database_refused")]
    )

    by_job = {o.job_id: o for o in report.outcomes}
    assert set(by_job) == {"keyless_task", "keyless_flow"}, report.outcomes
    assert by_job["keyless_task"].verdict == operations.Verdict.REDRIVEN
    assert by_job["keyless_task"].what == "task 'send-welcome-email' attempt 4 queued"
    # reopened before its record went back: the worker's delivery runs attempt 4
    state = writes.states(db, ["keyless_task"])["keyless_task"]
    assert (state.status, state.attempts) == (TaskRunStatus.PENDING, 3)
    assert by_job["keyless_flow"].verdict == operations.Verdict.SKIPPED
    assert "already has an instance" in by_job["keyless_flow"].what
