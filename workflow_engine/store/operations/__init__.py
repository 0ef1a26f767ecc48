"""What operators do, from whichever front-end (the admin API, the console, the CLI):
control an instance (pause, resume, terminate, restart, retry from its failed step),
fork one from a history position, send it an event, run bulk actions (one background
runner), re-drive dead letters, manage schedules. Each records who did it in the operator
audit trail.

What an operator may send is checked here, not in the front ends: ``send_event`` applies
the one event rule (:func:`check_event`, refusing with :class:`InvalidEvent`), and
``start_bulk`` refuses the empty filter (:func:`refuse_empty`). A front end may call the
check early (the console shows a refusal on its confirmation page) and maps the error to
its own answer.
"""

from __future__ import annotations

from onceflow.instance_events import (
    MAX_EVENT_PAYLOAD_BYTES,
    MAX_EVENT_TYPE_CHARS,
    EventRefusal,
    InvalidEvent,
    check_event,
)
from workflow_engine.store.operations.bulk import (
    LEASE_LOCK_SPACE,
    BulkOperation,
    BulkOperationNotFound,
    EmptyFilter,
    bulk_status,
    leased,
    recent_bulk,
    refuse_empty,
    run_bulk,
    run_leased,
    start_bulk,
    unleased,
)
from workflow_engine.store.operations.bulk_runner import (
    BulkRunner,
)
from workflow_engine.store.operations.control import (
    ControlError,
    ControlResult,
    InstanceNotFound,
    pause,
    restart,
    resume,
    retry,
    send_event,
    terminate,
)
from workflow_engine.store.operations.forks import (
    ForkExists,
    ForkResult,
    fork,
)
from workflow_engine.store.operations.redrives import (
    Verdict,
    redrive_letters,
)
from workflow_engine.store.operations.schedules import (
    MAX_BACKFILL,
    BackfillResult,
    backfill,
    create_schedule,
    delete_schedule,
    pause_schedule,
    resume_schedule,
)
from workflow_engine.store.operations.webhooks import (
    NothingToRedrive,
    WebhookRedrive,
    redrive_webhooks,
)
from workflow_engine.store.operator_audit import (
    ActionEntry,
    Actor,
    announce,
    entry,
    failures_recorded,
    record,
    record_quietly,
)
from workflow_engine.store.schedule_rows import (
    ScheduleExists,
    ScheduleNotFound,
)

__all__ = [
    "LEASE_LOCK_SPACE",
    "MAX_BACKFILL",
    "MAX_EVENT_PAYLOAD_BYTES",
    "MAX_EVENT_TYPE_CHARS",
    "ActionEntry",
    "Actor",
    "BackfillResult",
    "BulkOperation",
    "BulkOperationNotFound",
    "BulkRunner",
    "ControlError",
    "ControlResult",
    "EmptyFilter",
    "EventRefusal",
    "ForkExists",
    "ForkResult",
    "InstanceNotFound",
    "InvalidEvent",
    "NothingToRedrive",
    "ScheduleExists",
    "ScheduleNotFound",
    "Verdict",
    "WebhookRedrive",
    "announce",
    "backfill",
    "bulk_status",
    "check_event",
    "create_schedule",
    "delete_schedule",
    "entry",
    "failures_recorded",
    "fork",
    "leased",
    "pause",
    "pause_schedule",
    "recent_bulk",
    "record",
    "record_quietly",
    "redrive_letters",
    "redrive_webhooks",
    "refuse_empty",
    "restart",
    "resume",
    "resume_schedule",
    "retry",
    "run_bulk",
    "run_leased",
    "send_event",
    "start_bulk",
    "terminate",
    "unleased",
]
