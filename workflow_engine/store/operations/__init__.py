"""What operators do, from whichever front-end (the admin API, the console, the CLI):
control an instance, send it an event, run bulk actions (one background runner), re-drive
dead letters, manage schedules. Each records who did it in the operator audit trail.
"""

from __future__ import annotations

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
    send_event,
    terminate,
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
    "ActionEntry",
    "Actor",
    "BackfillResult",
    "BulkOperation",
    "BulkOperationNotFound",
    "BulkRunner",
    "ControlError",
    "ControlResult",
    "EmptyFilter",
    "InstanceNotFound",
    "ScheduleExists",
    "ScheduleNotFound",
    "Verdict",
    "announce",
    "backfill",
    "bulk_status",
    "create_schedule",
    "delete_schedule",
    "entry",
    "failures_recorded",
    "leased",
    "pause",
    "pause_schedule",
    "recent_bulk",
    "record",
    "record_quietly",
    "redrive_letters",
    "refuse_empty",
    "restart",
    "resume",
    "resume_schedule",
    "run_bulk",
    "run_leased",
    "send_event",
    "start_bulk",
    "terminate",
    "unleased",
]
