"""Human-readable rendering of an instance (``onceflow instances describe``)."""

from __future__ import annotations

from workflow_engine.instances import InstanceView


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
