"""The StrEnums of ``onceflow.vocabulary`` allow exactly what the database's CHECK
constraints allow, read back from a migrated database."""

from __future__ import annotations

import re

import pytest
import sqlalchemy as sa

from onceflow.vocabulary import (
    RUNNABLE_STATUSES,
    ActionResult,
    AttemptOutcome,
    CatchupPolicy,
    ControlAction,
    DeadLetterReason,
    FrontEnd,
    InstanceStatus,
    JobKind,
    OperatorAction,
    Origin,
    OverlapPolicy,
    ParentClosePolicy,
    StepKind,
    StepStatus,
    TaskRunStatus,
    TickTrigger,
    TimeoutKind,
    WebhookDeadReason,
    WebhookOutcome,
    WebhookStatus,
)

# A quoted literal as PostgreSQL prints it back ('queued'::text); no value holds a quote.
_QUOTED = re.compile(r"'([^']*)'")


def _quoted_values(definition: str) -> set[str]:
    return set(_QUOTED.findall(definition))


@pytest.mark.parametrize(
    ("constraint", "vocabulary"),
    [
        ("onceflow_instances_status_check", InstanceStatus),
        ("onceflow_instances_timeout_kind_check", TimeoutKind),
        ("onceflow_steps_status_check", StepStatus),
        ("onceflow_steps_kind_check", StepKind),
        ("onceflow_step_attempts_outcome_check", AttemptOutcome),
        ("onceflow_instances_requested_action_check", ControlAction),
        ("onceflow_jobs_kind_check", JobKind),
        ("onceflow_task_runs_status_check", TaskRunStatus),
        ("onceflow_dead_letters_reason_check", DeadLetterReason),
        ("onceflow_jobs_origin_check", Origin),
        ("onceflow_instances_parent_close_policy_check", ParentClosePolicy),
        ("onceflow_schedules_catchup_check", CatchupPolicy),
        ("onceflow_schedules_overlap_check", OverlapPolicy),
        ("onceflow_schedule_ticks_trigger_check", TickTrigger),
        ("onceflow_operator_actions_front_end_check", FrontEnd),
        ("onceflow_operator_actions_action_check", OperatorAction),
        ("onceflow_operator_actions_result_check", ActionResult),
        ("onceflow_webhook_deliveries_status_check", WebhookStatus),
        ("onceflow_webhook_deliveries_dead_reason_check", WebhookDeadReason),
        ("onceflow_webhook_attempts_outcome_check", WebhookOutcome),
    ],
)
def test_check_constraint_allows_exactly_the_vocabulary(db, constraint, vocabulary):
    with db.connect() as conn:
        definitions = (
            conn.execute(
                sa.text(
                    "SELECT pg_get_constraintdef(c.oid) FROM pg_constraint c"
                    " JOIN pg_namespace n ON n.oid = c.connamespace"
                    # a partition (0012) repeats its parent's constraints
                    " JOIN pg_class r ON r.oid = c.conrelid AND NOT r.relispartition"
                    " WHERE c.conname = :name AND c.contype = 'c'"
                    " AND n.nspname = current_schema()"
                ),
                {"name": constraint},
            )
            .scalars()
            .all()
        )
    assert len(definitions) == 1, f"{constraint}: {definitions}"
    assert _quoted_values(definitions[0]) == {v.value for v in vocabulary}, definitions[0]


def test_the_runnable_index_covers_exactly_the_runnable_statuses(db):
    with db.connect() as conn:
        definition = conn.execute(
            sa.text(
                "SELECT pg_get_expr(i.indpred, i.indrelid) FROM pg_index i"
                " WHERE i.indexrelid = to_regclass('onceflow_instances_runnable_idx')"
            )
        ).scalar_one()
    assert definition.startswith("(status = ANY"), definition
    assert _quoted_values(definition) == {s.value for s in RUNNABLE_STATUSES}
