"""What the streams worker and the engines write: the create path, claims and leases,
checkpoints, waits and events consumed, children, schedule firing, task runs, presence and
maintenance. Every guarded write names the lease it belongs to (:class:`Lease`).
"""

from __future__ import annotations

from workflow_engine.store.commands import (
    Answer,
    Appended,
    AppendValue,
    Chain,
    FinishInstance,
    FinishStep,
    Heartbeat,
    Lease,
    Started,
    StartStep,
    Write,
)
from workflow_engine.store.fragments import (
    RUNNABLE_CHANNEL,
    notify_runnable,
)
from workflow_engine.store.partitions import (
    DUPLICATE_DELIVERIES,
    PARTITIONED_TABLES,
    START_AHEAD,
    STEP_ATTEMPTS,
    Partition,
    Retired,
    add_partition,
    aligned,
    ensure_partitions,
    first_new_lower,
    partitions,
    retire_expired,
)
from workflow_engine.store.writes.children import (
    Awaited,
    ChildIdTaken,
    ChildOutcome,
    StartChild,
    child_job_id,
    collect,
    recorded_outcome,
    start_children,
)
from workflow_engine.store.writes.claim import (
    Claimed,
    claim,
    load_steps,
    release,
    rescue_expired,
    seconds_until_next_due,
)
from workflow_engine.store.writes.create import (
    create_instances,
    create_instances_in,
)
from workflow_engine.store.writes.dead_letters import (
    record_dead_letters,
    record_dead_letters_in,
)
from workflow_engine.store.writes.execution import (
    encode_result,
    error_answer,
    write_batch,
    write_each,
)
from workflow_engine.store.writes.maintenance import (
    DAY,
    OPERATOR_ACTIONS_RETENTION,
    StatusCounts,
    prune,
    status_counts,
)
from workflow_engine.store.writes.presence import (
    announce,
    retire,
)
from workflow_engine.store.writes.requests import (
    LOST,
    apply_requested,
)
from workflow_engine.store.writes.stream_values import STREAM_CHANNEL
from workflow_engine.store.writes.task_runs import (
    RETRY,
    PendingTask,
    TaskRunState,
    pending,
    record_attempt,
    reopen,
    states,
)
from workflow_engine.store.writes.ticks import (
    FiredTick,
    TickReport,
    fire_due,
    seconds_until_next_fire,
    upsert_declared,
)
from workflow_engine.store.writes.waits import (
    begin_wait,
    close_entry,
    consume_event,
    record_marker,
    suspend,
)

__all__ = [
    "DAY",
    "DUPLICATE_DELIVERIES",
    "LOST",
    "OPERATOR_ACTIONS_RETENTION",
    "PARTITIONED_TABLES",
    "RETRY",
    "RUNNABLE_CHANNEL",
    "START_AHEAD",
    "STEP_ATTEMPTS",
    "STREAM_CHANNEL",
    "Answer",
    "AppendValue",
    "Appended",
    "Awaited",
    "Chain",
    "ChildIdTaken",
    "ChildOutcome",
    "Claimed",
    "FinishInstance",
    "FinishStep",
    "FiredTick",
    "Heartbeat",
    "Lease",
    "Partition",
    "PendingTask",
    "Retired",
    "StartChild",
    "StartStep",
    "Started",
    "StatusCounts",
    "TaskRunState",
    "TickReport",
    "Write",
    "add_partition",
    "aligned",
    "announce",
    "apply_requested",
    "begin_wait",
    "child_job_id",
    "claim",
    "close_entry",
    "collect",
    "consume_event",
    "create_instances",
    "create_instances_in",
    "encode_result",
    "ensure_partitions",
    "error_answer",
    "fire_due",
    "first_new_lower",
    "load_steps",
    "notify_runnable",
    "partitions",
    "pending",
    "prune",
    "record_attempt",
    "record_dead_letters",
    "record_dead_letters_in",
    "record_marker",
    "recorded_outcome",
    "release",
    "reopen",
    "rescue_expired",
    "retire",
    "retire_expired",
    "seconds_until_next_due",
    "seconds_until_next_fire",
    "start_children",
    "states",
    "status_counts",
    "suspend",
    "upsert_declared",
    "write_batch",
    "write_each",
]
