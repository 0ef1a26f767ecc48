"""Human-readable rendering for the CLI: an instance (``onceflow instances describe``)
and a job's timeline (``onceflow trace``)."""

from __future__ import annotations

from workflow_engine.store.instances import InstanceView
from workflow_engine.store.trace import TraceEvent


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
        state = step.status
        if step.kind == "step" and (step.status == "running" or step.attempts > 1):
            state += f" (attempt {step.attempts})"
        if step.kind == "sleep" and step.status == "sleeping" and step.wake_at:
            state += f" until {step.wake_at.isoformat()}"
        if step.kind == "event" and step.status == "waiting":
            state += f" for event {step.event_type!r}"
        label = {"step": "step", "sleep": "sleep", "event": "wait"}[step.kind]
        lines.append(f'{label} "{step.name}": {state}')
        if step.error and step.status != "complete":
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
