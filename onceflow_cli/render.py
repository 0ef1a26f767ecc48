"""Human-readable rendering for the CLI: an instance (``onceflow instances describe``)
and a job's timeline (``onceflow trace``)."""

from __future__ import annotations

import orjson
from sqlalchemy.engine import Engine

from onceflow.vocabulary import StepKind, StepStatus
from workflow_engine.store.views import (
    DeadLetterView,
    InstanceView,
    TraceEvent,
    dead_letters_for,
    job_status,
)

_STEP_LABELS = {
    StepKind.STEP: "step",
    StepKind.SLEEP: "sleep",
    StepKind.EVENT: "wait",
    StepKind.PATCH: "patch",
    StepKind.CHILD: "child",
    StepKind.ATTRIBUTES: "attributes",
}


def _with_priority(reason: str, priority: int) -> str:
    """The hold reason with the instance's priority, said once: "waiting for its turn
    (priority 3, …)" names it already (onceflow_hold_reason), a limit's reason does not."""
    if f"(priority {priority}" in reason:
        return reason
    return f"{reason} (priority {priority})"


def _time_limits(view: InstanceView) -> list[str]:
    """The instance's time limits (README, "Time limits") and the one that ended it."""
    lines = []
    if view.start_by:
        lines.append(f"must start by: {view.start_by.isoformat()} (start_within)")
    if view.deadline:
        lines.append(f"execution deadline: {view.deadline.isoformat()} (execution_timeout)")
    if view.timeout_kind:
        lines.append(f"time limit reached: {view.timeout_kind}")
    return lines


def _runs(view: InstanceView) -> list[str]:
    """``run 2 of job X`` and each earlier run's outcome (id reuse), once there are runs."""
    if view.run == 1:
        return []
    lines = [f"{view.run_note} (earlier runs kept: id reuse)"]
    for run in view.earlier_runs:
        lines.append(f"    {run.summary}")
        if run.error:
            lines.append(f"        error: {run.error}")
    return lines


def render_instance(view: InstanceView) -> str:
    lines = [
        f"job id: {view.job_id}",
        f"workflow: {view.workflow}",
        f"status: {view.status}",
        f"version: {view.version or '(none: created before versioning)'}",
        f"submitted: {view.submitted_at.isoformat() if view.submitted_at else '-'}"
        f" ({view.provenance})",
        f"created from: {view.source or view.provenance} at {view.created_at.isoformat()}",
        f"duplicates collapsed: {view.duplicates}"
        f" ({view.redeliveries} redeliveries, {view.mismatches} with different params,"
        f" {view.workflow_mismatches} naming another workflow)",
    ]
    if view.attributes:
        pairs = sorted(view.attributes.items())
        shown = ", ".join(f"{k}={orjson.dumps(v).decode()}" for k, v in pairs)
        lines.append(f"attributes: {shown}")
    if view.scheduled_start:
        lines.append(f"scheduled to start at: {view.scheduled_start.isoformat()}")
    lines += _runs(view) + _time_limits(view)
    if view.singleton_note:
        lines.append(view.singleton_note)
    if view.batch_note:
        lines.append(view.batch_note)
    if debounce := view.debounce_note or view.debounce_window:
        lines.append(debounce)
    if view.waiting_for_engine:
        lines.append(view.waiting_for_engine)
    if view.held_because:
        lines.append(f"held back: {_with_priority(view.held_because, view.priority)}")
    if view.dead_letters:
        lines.append(f"records of this id dead-lettered: {view.dead_letters}")
    if view.parent_job_id:
        lines.append(f"parent: {view.parent_job_id} (on parent close: {view.parent_close_policy})")
    for child in view.children:
        lines.append(f"child {child.name!r}: {child.job_id} ({child.workflow}) {child.status}")
    lines += _lineage(view)
    if view.streams:
        counts = ", ".join(f"{name} {n}" for name, n in view.streams.items())
        lines.append(f"output streams: {counts} (GET /v1/jobs/{view.job_id}/stream)")
    if view.started_at:  # its first claim (a delayed start's line is gone by then)
        lines.append(f"started: {view.started_at.isoformat()}")
    for step in view.steps:
        state = str(step.status)
        if step.kind == StepKind.STEP and (step.status == StepStatus.RUNNING or step.attempts > 1):
            state += f" (attempt {step.attempts})"
        if step.kind == StepKind.SLEEP and step.status == StepStatus.SLEEPING and step.wake_at:
            state += f" until {step.wake_at.isoformat()}"
        if step.kind == StepKind.EVENT and step.status == StepStatus.WAITING:
            state += f" for event {step.event_type!r}"
        lines.append(f'{_STEP_LABELS[step.kind]} "{step.name}": {state}')
        if step.error and step.status != StepStatus.COMPLETE:
            lines.append(f"    last error: {step.error}")
    if view.error:
        lines.append(f"error: {view.error}")
    if view.finished_at:
        lines.append(f"finished: {view.finished_at.isoformat()}")
    lines += _delivery_lines(view)
    return "\n".join(lines)


def _delivery_lines(view: InstanceView) -> list[str]:
    """The callback and each webhook delivery: endpoint, kind, status, attempts, last
    code (or error), when the next attempt is due or why it is dead."""
    lines = [f"callback: {view.callback}"] if view.callback else []
    for d in view.deliveries:
        state = f"{d.status}, {d.attempts} attempt{'s' if d.attempts != 1 else ''}"
        if d.last_code is not None:
            state += f", last HTTP {d.last_code}"
        if d.dead_reason:
            state += f" ({d.dead_reason})"
        if d.next_attempt_at is not None and d.attempts:
            state += f", next at {d.next_attempt_at.isoformat()}"
        lines.append(f"webhook {d.endpoint} {d.kind} ({d.event_id}): {state}")
        if d.last_error and d.status != "delivered":
            lines.append(f"    last error: {d.last_error}")
    return lines


def _lineage(view: InstanceView) -> list[str]:
    """Where it was forked from, its forks, its retries and the step a retry runs."""
    lines = []
    if view.forked_from:
        lines.append(
            f"forked from: {view.forked_from} at position {view.forked_at_position}"
            " (the entries before it copied from there)"
        )
    if view.forks:
        lines.append(f"forks: {', '.join(view.forks)}")
    if view.retry_count:
        lines.append(f"retried: {view.retry_count} time(s) from its failed step")
    if view.failed_position is not None:
        failed = next((s.name for s in view.steps if s.position == view.failed_position), "?")
        lines.append(
            f"failed at: step {failed!r} (position {view.failed_position});"
            " `onceflow instances retry` runs it again"
        )
    return lines


def render_trace(job_id: str, events: list[TraceEvent]) -> str:
    lines = [f"trace of {job_id}:"]
    for e in events:
        at = e.at.isoformat(timespec="milliseconds") if e.at else "-"
        lines.append(f"  {at:<29}  {e.layer:<8}  {e.event:<22}  {e.detail}")
    return "\n".join(lines)


def describe_elsewhere(db: Engine, workflow: str, job_id: str, view: InstanceView | None) -> str:
    """Why ``instances describe <workflow> <job_id>`` found no such instance: the id
    belongs to another workflow, is a task run, was dead-lettered, or is unknown."""
    if view is not None:
        return (
            f"job id {job_id!r} belongs to workflow {view.workflow!r}"
            f" (status {view.status}), not {workflow!r}"
        )
    status = job_status(db, job_id)
    if status is not None:
        return (
            f"job id {job_id!r} is a task run of {status['task']!r}"
            f" (status {status['status']}), not an instance of {workflow!r}"
        )
    dead = dead_letters_for(db, job_id)
    if dead:
        return f"job id {job_id!r} has no instance: it was " + render_dead_letter(dead[-1])
    return f"no instance of {workflow!r} with job id {job_id!r}"


def render_dead_letter(dead: DeadLetterView) -> str:
    """One dead letter in words: why, and where it was and went."""
    detail = f" ({dead.detail})" if dead.detail else ""
    return f"dead-lettered: {dead.reason}{detail}; record {dead.source}, dead letter {dead.dlq}"
