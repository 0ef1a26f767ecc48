"""The figures the demo and the chaos run prove the property with, on real PostgreSQL:
``onceflow_tools.figures``, the store's ``workflow_engine.store.views`` (the audit's
reads) and the samples' own counts agree with the plain SQL the demo prints for anyone
to re-check, on data that breaks the property on purpose."""

from __future__ import annotations

import sqlalchemy as sa

from onceflow.envelope import JobEnvelope
from onceflow.vocabulary import InstanceStatus, JobKind
from onceflow_examples import ORDER_STEPS, applied_effect_counts, side_effect_counts
from onceflow_tools.demo import PROOF_SQL, _figures
from onceflow_tools.figures import (
    checkpoints_written_twice,
    consumption,
    count_instances,
    duplicate_counts,
    instance_counts,
    instance_job_ids,
    latency,
)
from onceflow_tools.stack import Stack
from workflow_engine.model import Delivery
from workflow_engine.store.views import stored_job_ids
from workflow_engine.store.writes import create_instances


def delivery(job_id, offset, params=None, kind=JobKind.WORKFLOW):
    return Delivery(
        JobEnvelope(job_id, "order-workflow", params or {}), "jobs", 0, offset, kind=kind
    )


def populate(db):
    """Three instances (one complete), one task run; a redelivery, a resubmission and a
    payload mismatch; side effects with one step done twice and one never; one step
    checkpointed twice."""
    create_instances(
        db,
        [
            delivery("o1", 0),
            delivery("o2", 1),
            delivery("o3", 2),
            delivery("t1", 3, kind=JobKind.TASK),
            delivery("o1", 0),  # the same record again
            delivery("o2", 4),  # resubmitted, same params
            delivery("o3", 5, {"other": 1}),  # resubmitted, other params
        ],
    )
    with db.begin() as conn:
        conn.execute(
            sa.text(
                "UPDATE onceflow_instances SET status = 'complete', started_at = now(),"
                " finished_at = now() WHERE job_id = 'o1'"
            )
        )
        conn.execute(
            sa.text(
                "INSERT INTO onceflow_steps (job_id, position, name, status, finished_at)"
                " VALUES ('o1', 0, 'charge payment', 'complete', now())"
            )
        )
        conn.execute(
            sa.text(
                "INSERT INTO onceflow_step_attempts (job_id, position, attempt, engine_id,"
                " finished_at, outcome) VALUES ('o1', 0, 1, 'e', now(), 'complete'),"
                " ('o1', 0, 2, 'e', now(), 'complete')"
            )
        )
        effects = [(j, s) for j in ("o1", "o2", "o3") for s in ORDER_STEPS]
        effects.remove(("o3", "ship"))  # never performed
        effects.append(("o2", "ship"))  # performed twice
        for job_id, step in effects:
            conn.execute(
                sa.text(
                    "INSERT INTO onceflow_demo_side_effects (job_id, step, idempotency_key,"
                    " performed_by) VALUES (:j, :s, :j || :s, '1')"
                ),
                {"j": job_id, "s": step},
            )
            conn.execute(
                sa.text(
                    "INSERT INTO onceflow_demo_applied_effects (idempotency_key, job_id, step)"
                    " VALUES (:j || :s, :j, :s) ON CONFLICT (idempotency_key)"
                    " DO UPDATE SET executions = onceflow_demo_applied_effects.executions + 1"
                ),
                {"j": job_id, "s": step},
            )


def test_store_figures_on_broken_data(db):
    populate(db)
    counts = instance_counts(db)
    assert (counts.total, counts.distinct_job_ids, counts.complete, counts.finished) == (3, 3, 1, 1)
    assert counts.by_status == {InstanceStatus.COMPLETE: 1, InstanceStatus.QUEUED: 2}
    assert count_instances(db) == 3
    assert count_instances(db, InstanceStatus.QUEUED, InstanceStatus.COMPLETE) == 3
    assert count_instances(db, InstanceStatus.ERRORED) == 0
    dups = duplicate_counts(db)
    assert (dups.total, dups.redeliveries, dups.mismatches) == (3, 1, 1)
    assert consumption(db).records == 3 + 3
    assert instance_job_ids(db) == {"o1", "o2", "o3"}
    assert checkpoints_written_twice(db) == 1
    assert latency(db, "o").jobs == 1 and latency(db, "o_").jobs == 0  # a literal prefix

    stored = stored_job_ids(db)
    assert (stored.instances, stored.task_runs, stored.doubled) == (
        {"o1", "o2", "o3"},
        {"t1"},
        frozenset(),
    )

    performed = side_effect_counts(db)
    assert performed.rows == 9
    assert performed.not_exactly_once({"o1", "o2", "o3"}) == 2
    applied = applied_effect_counts(db)
    assert (applied.rows, applied.re_executions) == (8, 1)
    assert applied.not_exactly_once({"o1", "o2", "o3"}) == 1


def test_the_printed_sql_gives_the_demos_figures(base_settings, db, tmp_path):
    """The SQL the demo prints for a human computes the same numbers as its checks."""
    populate(db)
    stack = Stack(base_settings, "figures", tmp_path, db=db)
    figures, have = _figures(stack)
    assert list(figures) == list(PROOF_SQL)
    with db.connect() as conn:
        by_sql = {name: conn.execute(sa.text(sql)).scalar() for name, sql in PROOF_SQL.items()}
    assert figures == by_sql
    assert have == {"o1", "o2", "o3"}
