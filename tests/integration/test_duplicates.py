"""Duplicate rows are idempotent per Kafka position (issue 17, defect 4), and a
different workflow type on the same job id is a mismatch too (defect 3)."""

from __future__ import annotations

import sqlalchemy as sa

from onceflow.envelope import JobEnvelope
from onceflow.vocabulary import JobKind
from workflow_engine.model import Delivery
from workflow_engine.store.views import describe_instance, job_trace
from workflow_engine.store.writes import create_instances


def d(job_id, offset, params=None, workflow="order-workflow", partition=0, request="req"):
    env = JobEnvelope(job_id, workflow, params or {}, request)
    return Delivery(env, "jobs", partition, offset)


def counts(db) -> tuple[int, int, int, int, int]:
    with db.connect() as conn:
        return tuple(
            conn.execute(
                sa.text(
                    "SELECT (SELECT count(*) FROM onceflow_instances),"
                    " (SELECT count(*) FROM onceflow_duplicate_deliveries),"
                    " (SELECT count(*) FROM onceflow_duplicate_deliveries WHERE redelivery),"
                    " (SELECT count(*) FROM onceflow_duplicate_deliveries"
                    "   WHERE NOT params_match),"
                    " (SELECT count(*) FROM onceflow_duplicate_deliveries"
                    "   WHERE workflow_match IS FALSE)"
                )
            ).one()
        )


def test_a_batch_replayed_after_a_crash_never_counts_twice(db):
    """The worker dies between the database commit and the offset commit, more than
    once: Kafka hands the same batch back each time."""
    create_instances(db, [d("old", 1, {"n": 1})])  # created in an earlier batch
    batch = [
        d("a", 10),
        d("b", 11),
        d("old", 12, {"n": 2}),  # a client resubmission of "old", other params
        d("a", 13),  # a resubmission of "a" in the same batch
    ]
    first = create_instances(db, batch)
    assert (first.created, first.duplicates, first.redeliveries, first.mismatches) == (2, 2, 0, 1)
    after_first = counts(db)
    assert after_first == (3, 2, 0, 1, 0)

    # Redelivered: only the records that created "a" and "b" are new positions in the
    # duplicate table (each once, as a redelivery); the resubmissions are not recorded again.
    second = create_instances(db, batch)
    assert (second.created, second.duplicates, second.redeliveries) == (0, 2, 2)
    assert (second.mismatches, second.already_recorded) == (0, 2)
    assert sorted(second.duplicate_ids) == ["a", "b"]
    after_second = counts(db)
    assert after_second == (3, 4, 2, 1, 0)

    # ... and again, and again: nothing grows any more.
    for _ in range(3):
        again = create_instances(db, batch)
        assert (again.created, again.duplicates, again.mismatches) == (0, 0, 0)
        assert again.already_recorded == len(batch)
        assert counts(db) == after_second

    view = describe_instance(db, "old")
    assert (view.duplicates, view.redeliveries, view.mismatches) == (1, 0, 1)
    assert sum("PAYLOAD MISMATCH" in e.detail for e in job_trace(db, "old")) == 1


def test_a_redelivered_position_inside_one_batch_is_recorded_once(db):
    create_instances(db, [d("x", 5)])
    result = create_instances(db, [d("x", 5), d("x", 5), d("x", 6)])
    assert (result.duplicates, result.redeliveries, result.already_recorded) == (2, 1, 1)
    assert counts(db)[1:3] == (2, 1)


def test_another_workflow_type_on_the_same_id_is_a_mismatch(db):
    create_instances(db, [d("w1", 1, {"n": 1})])
    result = create_instances(
        db,
        [
            d("w1", 2, {"n": 1}, workflow="refund-workflow"),  # same params, other type
            d("w1", 3, {"n": 1}),  # a plain resubmission
        ],
    )
    assert (result.created, result.duplicates, result.mismatches) == (0, 2, 0)
    assert (result.workflow_mismatches, result.workflow_mismatch_ids) == (1, ["w1"])
    # Nothing started for the other type; the first one won.
    view = describe_instance(db, "w1")
    assert view.workflow == "order-workflow"
    assert (view.duplicates, view.mismatches, view.workflow_mismatches) == (2, 0, 1)
    with db.connect() as conn:
        row = conn.execute(
            sa.text(
                "SELECT workflow, workflow_match FROM onceflow_duplicate_deliveries"
                " WHERE source_offset = 2"
            )
        ).one()
    assert tuple(row) == ("refund-workflow", False)
    details = [e.detail for e in job_trace(db, "w1") if "WORKFLOW MISMATCH" in e.detail]
    assert details == [
        "jobs/0@2, request req, WORKFLOW MISMATCH (refund-workflow, not order-workflow)"
    ]
    # Redelivered: still one.
    again = create_instances(db, [d("w1", 2, {"n": 1}, workflow="refund-workflow")])
    assert (again.duplicates, again.workflow_mismatches) == (0, 0)
    assert counts(db)[4] == 1


def test_a_task_delivered_under_a_workflow_id_is_a_workflow_mismatch(db):
    create_instances(db, [d("t1", 1)])
    task = Delivery(JobEnvelope("t1", "send-welcome-email", {}, "req"), "jobs", 0, 2, JobKind.TASK)
    result = create_instances(db, [task])
    assert (result.tasks_created, result.workflow_mismatches) == (0, 1)
    with db.connect() as conn:
        runs = conn.execute(sa.text("SELECT count(*) FROM onceflow_task_runs")).scalar()
    assert runs == 0


def test_origin_is_recorded_and_shown(db):
    direct = Delivery(JobEnvelope("k1", "order-workflow", {}, None), "jobs", 0, 1)
    create_instances(db, [direct, d("h1", 2, request="req_9")])
    kafka, http = describe_instance(db, "k1"), describe_instance(db, "h1")
    assert (kafka.origin, kafka.provenance) == ("kafka", "produced directly to Kafka")
    assert (http.origin, http.provenance) == ("http", "HTTP request req_9")
    received = {j: job_trace(db, j)[0] for j in ("k1", "h1")}
    assert (received["k1"].event, received["k1"].layer) == ("received", "kafka")
    assert received["k1"].detail == "produced directly to Kafka"
    assert (received["h1"].detail, received["h1"].layer) == ("HTTP request req_9", "ingest")
