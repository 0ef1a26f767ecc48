"""Human-readable rendering for the CLI: an instance (``onceflow instances describe``)
and a job's timeline (``onceflow trace``)."""

from __future__ import annotations

from onceflow.core.vocabulary import StepKind, StepStatus
from workflow_engine.store.instances import InstanceView
from workflow_engine.store.trace import TraceEvent

_STEP_LABELS = {StepKind.STEP: "step", StepKind.SLEEP: "sleep", StepKind.EVENT: "wait"}


def render_instance(view: InstanceView) -> str:
    lines = [
        f"job id: {view.job_id}",
        f"workflow: {view.workflow}",
        f"status: {view.status}",
        f"submitted: {view.submitted_at.isoformat() if view.submitted_at else '-'}"
        f" (request {view.request_id or '-'})",
        f"created from: {view.source} at {view.created_at.isoformat()}",
        f"duplicates collapsed: {view.duplicates}"
        f" ({view.redeliveries} redeliveries, {view.mismatches} with different params)",
    ]
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
    return "\n".join(lines)


def render_trace(job_id: str, events: list[TraceEvent]) -> str:
    lines = [f"trace of {job_id}:"]
    for e in events:
        at = e.at.isoformat(timespec="milliseconds") if e.at else "-"
        lines.append(f"  {at:<29}  {e.layer:<8}  {e.event:<22}  {e.detail}")
    return "\n".join(lines)
