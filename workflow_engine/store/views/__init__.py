"""What is read: one instance described, the one list API, a job's trace, status and
outcome (what a start-and-wait caller is answered),
counts for the console and the audit, schedules, dead letters, live engines, the operator
audit trail.
"""

from __future__ import annotations

from workflow_engine.store.operator_audit import (
    ActionFilter,
    ActionPage,
    InvalidAuditFilter,
    list_actions,
)
from workflow_engine.store.schedule_rows import (
    ScheduleNotFound,
    ScheduleView,
)
from workflow_engine.store.views.audit import (
    StoredJobIds,
    stored_job_ids,
    workflow_mismatch_job_ids,
)
from workflow_engine.store.views.describe import (
    InstanceView,
    StepView,
    describe_instance,
    job_status,
    step_results,
)
from workflow_engine.store.views.engines import (
    ENGINE_STALE_SECONDS,
    LiveEngine,
    Stranded,
    instances_without_engine,
    live_engines,
)
from workflow_engine.store.views.listing import (
    ATTR_PREFIX,
    MAX_LIMIT,
    SORTS,
    InstanceFilter,
    InstanceRow,
    InvalidFilter,
    Overview,
    Page,
    as_utc,
    count_matching,
    decode_cursor,
    encode_cursor,
    explain_list,
    list_page,
    overview,
    where_clause,
)
from workflow_engine.store.views.outcomes import (
    JobOutcome,
    Record,
    Submission,
    job_outcomes,
    submission_outcomes,
)
from workflow_engine.store.views.schedules import (
    TickView,
    get_schedule,
    list_schedules,
    next_fire_times,
    tick_of,
)
from workflow_engine.store.views.stream_values import (
    StreamRead,
    StreamState,
    StreamValue,
    read_values,
    stream_counts,
    stream_states,
)
from workflow_engine.store.views.trace import (
    TraceEvent,
    job_trace,
)
from workflow_engine.store.views.unpublished import PendingEvent, pending_events
from workflow_engine.store.views.webhooks import (
    DeliveryView,
    deliveries_of,
)
from workflow_engine.store.writes.dead_letters import (
    DeadLetterRow,
    DeadLetterView,
    dead_letter_counts,
    dead_letter_sources,
    dead_letters_for,
)

__all__ = [
    "ATTR_PREFIX",
    "ENGINE_STALE_SECONDS",
    "MAX_LIMIT",
    "SORTS",
    "ActionFilter",
    "ActionPage",
    "DeadLetterRow",
    "DeadLetterView",
    "DeliveryView",
    "InstanceFilter",
    "InstanceRow",
    "InstanceView",
    "InvalidAuditFilter",
    "InvalidFilter",
    "JobOutcome",
    "LiveEngine",
    "Overview",
    "Page",
    "PendingEvent",
    "Record",
    "ScheduleNotFound",
    "ScheduleView",
    "StepView",
    "StoredJobIds",
    "Stranded",
    "StreamRead",
    "StreamState",
    "StreamValue",
    "Submission",
    "TickView",
    "TraceEvent",
    "as_utc",
    "count_matching",
    "dead_letter_counts",
    "dead_letter_sources",
    "dead_letters_for",
    "decode_cursor",
    "deliveries_of",
    "describe_instance",
    "encode_cursor",
    "explain_list",
    "get_schedule",
    "instances_without_engine",
    "job_outcomes",
    "job_status",
    "job_trace",
    "list_actions",
    "list_page",
    "list_schedules",
    "live_engines",
    "next_fire_times",
    "overview",
    "pending_events",
    "read_values",
    "step_results",
    "stored_job_ids",
    "stream_counts",
    "stream_states",
    "submission_outcomes",
    "tick_of",
    "where_clause",
    "workflow_mismatch_job_ids",
]
