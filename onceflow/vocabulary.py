"""One source of truth for onceflow's closed sets of words.

Each set is a ``StrEnum`` whose values are exactly what the database's CHECK
constraints allow (``tests/integration/test_vocabulary.py`` reads the constraints back
from a migrated database and compares), what the HTTP API and the CLI accept, and what
the metrics label. Import from here; never spell a status as a bare string elsewhere.
"""

from __future__ import annotations

from enum import StrEnum


class InstanceStatus(StrEnum):
    """``onceflow_instances.status``."""

    QUEUED = "queued"
    RUNNING = "running"
    SLEEPING = "sleeping"
    WAITING = "waiting"
    PAUSED = "paused"
    COMPLETE = "complete"
    ERRORED = "errored"
    TERMINATED = "terminated"
    # Never ran: a singleton policy (``skip``) found another instance of its key active
    # when it was created (``skipped_for`` names it; migration 0024).
    SKIPPED = "skipped"
    # A member of a batched workflow (``@workflow(batch=...)``, migration 0026): waiting in
    # its key's pool (no engine runs it), then in a batch run (``batch_id`` names it),
    # whose outcome becomes its own.
    BATCHING = "batching"
    BATCHED = "batched"
    # Never ran: a debounce took another job of its key instead, within the period
    # (``debounced_into`` names the instance that absorbed it; migration 0025).
    DEBOUNCED = "debounced"

    @property
    def terminal(self) -> bool:
        return self in TERMINAL_STATUSES

    @property
    def runnable(self) -> bool:
        return self in RUNNABLE_STATUSES


#: An instance in one of these never runs again (short of ``restart`` or ``retry``).
TERMINAL_STATUSES = frozenset(
    {
        InstanceStatus.COMPLETE,
        InstanceStatus.ERRORED,
        InstanceStatus.TERMINATED,
        InstanceStatus.SKIPPED,
        InstanceStatus.DEBOUNCED,
    }
)
#: The claim picks instances in these once ``run_after`` is due (the partial index
#: ``onceflow_instances_runnable_idx`` covers exactly these).
RUNNABLE_STATUSES = frozenset(
    {InstanceStatus.QUEUED, InstanceStatus.SLEEPING, InstanceStatus.WAITING}
)
#: ``retry`` (from the failed step) takes an instance in one of these: one that errored,
#: or that an operator terminated (it goes on from where it stopped).
RETRYABLE_STATUSES = frozenset({InstanceStatus.ERRORED, InstanceStatus.TERMINATED})


class TimeoutKind(StrEnum):
    """``onceflow_instances.timeout_kind``: the time limit that errored an instance
    (migration 0023; the metric's ``kind`` label, the lifecycle event's ``timeout``)."""

    START_TIMEOUT = "start_timeout"  # not first claimed within start_within
    TIMED_OUT = "timed_out"  # past its execution deadline (execution_timeout)


class StepStatus(StrEnum):
    """``onceflow_steps.status``."""

    RUNNING = "running"
    SLEEPING = "sleeping"
    WAITING = "waiting"
    COMPLETE = "complete"
    FAILED = "failed"


class StepKind(StrEnum):
    """``onceflow_steps.kind``: what the workflow asked for at that position."""

    STEP = "step"
    SLEEP = "sleep"
    EVENT = "event"
    PATCH = "patch"  # a ctx.patched() marker: this instance took the patched code
    CHILD = "child"  # ctx.start_child(): a child workflow started (and, later, its result)
    ATTRIBUTES = "attributes"  # ctx.set_attributes(): the update applied (its result)


class AttemptOutcome(StrEnum):
    """``onceflow_step_attempts.outcome`` (NULL while the attempt runs)."""

    COMPLETE = "complete"
    RETRY = "retry"
    FAILED = "failed"
    ABANDONED = "abandoned"


class ControlAction(StrEnum):
    """``onceflow_instances.requested_action``: asked of a running instance."""

    PAUSE = "pause"
    TERMINATE = "terminate"
    RESTART = "restart"


class JobKind(StrEnum):
    """``onceflow_jobs.kind``: a durable workflow, or a plain queue task."""

    WORKFLOW = "workflow"
    TASK = "task"


class TaskRunStatus(StrEnum):
    """``onceflow_task_runs.status``."""

    PENDING = "pending"
    SUCCEEDED = "succeeded"
    DEAD_LETTERED = "dead_lettered"


class Process(StrEnum):
    """The runtime processes: one name each in the CLI (``onceflow ingest``), the
    settings (``ONCEFLOW_INGEST_*``), the metrics (``process`` label, log field) and
    the Helm chart (``ingest:``, ``worker:``, ``engine:``, ``console:``)."""

    INGEST = "ingest"
    WORKER = "worker"
    ENGINE = "engine"
    CONSOLE = "console"  # the operator's web console (optional)


class DeadLetterReason(StrEnum):
    """Why a record went to the dead-letter topic: carried as a code on the dead letter
    (header ``onceflow-dlq-reason``), in ``onceflow_dead_letters.reason`` and in the
    metric label; the human text travels separately (``onceflow-dlq-detail``)."""

    NO_VALUE = "no_value"
    NOT_JSON = "not_json"
    NOT_AN_OBJECT = "not_an_object"
    UNSUPPORTED_VERSION = "unsupported_version"
    INVALID_JOB_ID = "invalid_job_id"
    KEY_MISMATCH = "key_mismatch"
    MISSING_WORKFLOW = "missing_workflow"
    INVALID_PARAMS = "invalid_params"
    INVALID_SUBMITTED_AT = "invalid_submitted_at"
    INVALID_PRIORITY = "invalid_priority"
    INVALID_RUN_AT = "invalid_run_at"  # run_at / start_after: not a time, or too far ahead
    INVALID_START_WITHIN = "invalid_start_within"  # not seconds in 0 < s <= a year
    TOO_LARGE = "too_large"
    UNKNOWN_TYPE = "unknown_type"
    TASK_FAILED = "task_failed"
    DATABASE_REFUSED = "database_refused"
    INVALID_CALLBACK = "invalid_callback"  # a job's callback is not an endpoint name
    UNKNOWN_CALLBACK = "unknown_callback"  # ... or names no configured endpoint
    INVALID_ATTRIBUTES = "invalid_attributes"  # attributes out of bounds, or on a task
    # id_reuse: not a policy's name, on a task, or looser than its workflow's
    INVALID_ID_REUSE = "invalid_id_reuse"


class Origin(StrEnum):
    """``onceflow_jobs.origin``: where a record came from: ingest (``http``), or a
    producer writing the topic directly (``kafka``), or a schedule's tick
    (``schedule``)."""

    HTTP = "http"
    KAFKA = "kafka"
    SCHEDULE = "schedule"  # a schedule's tick (workflow_engine.engine.scheduler)
    CHILD = "child"  # started by a parent workflow's ctx.start_child (no Kafka record)
    FORK = "fork"  # an operator's fork of another instance's history (no Kafka record)
    BATCH = "batch"  # a batch run, formed by an engine from its members (no Kafka record)


class BulkAction(StrEnum):
    """``onceflow_bulk_operations.action``: a control operation applied to every
    instance a filter matches (``onceflow instances pause --filter …``)."""

    PAUSE = "pause"
    RESUME = "resume"
    TERMINATE = "terminate"
    RESTART = "restart"
    RETRY = "retry"  # an errored (or terminated) instance, from its failed step


class BulkStatus(StrEnum):
    """``onceflow_bulk_operations.status``."""

    RUNNING = "running"
    COMPLETE = "complete"
    FAILED = "failed"


class CatchupPolicy(StrEnum):
    """``onceflow_schedules.catchup``: what a schedule does with ticks it missed (no
    engine ran, or the clock jumped): run none, the latest one, or all (bounded)."""

    SKIP = "skip"
    RUN_ONCE = "run-once"
    RUN_ALL = "run-all"


class OverlapPolicy(StrEnum):
    """``onceflow_schedules.overlap``: what a tick does while the previous tick's
    instance has not finished: skip it, start anyway, or keep one to start after."""

    SKIP = "skip"
    ALLOW = "allow"
    BUFFER_ONE = "buffer-one"


class TickTrigger(StrEnum):
    """``onceflow_schedule_ticks.trigger``: why a tick's instance was created."""

    ON_TIME = "on_time"
    CATCH_UP = "catch_up"  # missed, run on recovery by the catch-up policy
    BUFFERED = "buffered"  # held by overlap=buffer-one until the previous one finished
    BACKFILL = "backfill"  # an operator's backfill of a past range


class TickSkipReason(StrEnum):
    """Why a due tick created no instance (the metric's ``reason`` label)."""

    CATCHUP = "catchup"  # missed, and the catch-up policy does not run it
    OVERLAP = "overlap"  # the previous tick's instance was still running


class ParentClosePolicy(StrEnum):
    """``onceflow_instances.parent_close_policy``: what happens to a child that is still
    running when its parent is terminated (``ctx.start_child(..., on_parent_close=)``)."""

    TERMINATE = "terminate"  # terminated with the parent (the default)
    ABANDON = "abandon"  # left to run to its end


class FrontEnd(StrEnum):
    """``onceflow_operator_actions.front_end``: where an operator acted from."""

    ADMIN_API = "admin_api"  # the ingest process's /v1/instances… and /v1/admin…
    CONSOLE = "console"
    CLI = "cli"


class OperatorAction(StrEnum):
    """``onceflow_operator_actions.action``: what an operator did or tried to do (the
    audit trail, ``workflow_engine.store.operator_audit``). How it went is the
    :class:`ActionResult`: a refused login is ``login`` / ``refused``."""

    PAUSE = "pause"
    RESUME = "resume"
    TERMINATE = "terminate"
    RESTART = "restart"
    RETRY = "retry"  # from the failed step, completed steps kept
    FORK = "fork"  # a new job id from a copy of the history before a position
    SEND_EVENT = "send_event"
    BULK_PAUSE = "bulk_pause"  # a bulk operation started (its filter on the row)
    BULK_RESUME = "bulk_resume"
    BULK_TERMINATE = "bulk_terminate"
    BULK_RESTART = "bulk_restart"
    BULK_RETRY = "bulk_retry"
    REDRIVE = "redrive"  # dead letters sent back to the jobs topic
    LOGIN = "login"  # the console's login form
    LOGOUT = "logout"
    # A request refused at the door (401/403) whose action has no name of its own: a
    # read of the admin API, a console form naming no known action. Only ever refused.
    REQUEST = "request"

    @classmethod
    def of_control(cls, action: BulkAction) -> OperatorAction:
        """The single-instance action of a control operation (pause, resume, …)."""
        return cls(str(action))

    @classmethod
    def of_bulk(cls, action: BulkAction) -> OperatorAction:
        """The action of starting a bulk ``action`` (``bulk_pause``, …)."""
        return cls(f"bulk_{action}")


class ActionResult(StrEnum):
    """``onceflow_operator_actions.result``."""

    OK = "ok"  # done (or, for a running instance, requested of its engine)
    REFUSED = "refused"  # not allowed (key, scope, CSRF) or not applicable (state, input)
    ERROR = "error"  # failed on the way (the database, Kafka): it may or may not be done


class LifecycleEvent(StrEnum):
    """The kinds of lifecycle event (issue 25; docs/events.md): ``onceflow_outbox.type``
    and the CloudEvents ``ce_type`` are ``dev.onceflow.<kind>``."""

    CREATED = "instance.created"
    DUPLICATE = "instance.duplicate"
    PAYLOAD_MISMATCH = "instance.payload_mismatch"
    STARTED = "instance.started"
    STEP_COMPLETED = "step.completed"
    STEP_FAILED = "step.failed"
    STEP_RETRYING = "step.retrying"
    WAITING = "instance.waiting"
    SLEEPING = "instance.sleeping"
    HELD = "instance.held"
    PAUSED = "instance.paused"
    RESUMED = "instance.resumed"
    COMPLETE = "instance.complete"
    ERRORED = "instance.errored"
    TERMINATED = "instance.terminated"
    RESTARTED = "instance.restarted"
    RETRIED = "instance.retried"  # an operator's retry from the failed step (issue 26)
    # A singleton policy's decision at creation (issue 26): ``skipped`` (final: it never
    # runs) and ``superseded`` (a newer instance of its key cancels it; its
    # ``instance.terminated`` follows when it stops).
    SKIPPED = "instance.skipped"
    SUPERSEDED = "instance.superseded"
    # A member taken into a batch run (issue 26): the run's job id and its place in it;
    # its instance.complete / errored / terminated follow when the run ends.
    BATCHED = "instance.batched"
    # A debounce's decision at creation (issue 26): final, it never runs; the data
    # names the instance that absorbed it.
    DEBOUNCED = "instance.debounced"

    @property
    def ce_type(self) -> str:
        """The CloudEvents type (``dev.onceflow.<kind>``)."""
        return f"{EVENT_TYPE_PREFIX}{self.value}"

    @property
    def final(self) -> bool:
        """An event after which the instance does nothing more (short of a restart)."""
        return self in FINAL_EVENTS


#: The prefix of every lifecycle event's CloudEvents type.
EVENT_TYPE_PREFIX = "dev.onceflow."
#: The events that answer a start-and-wait caller: the instance's final status.
FINAL_EVENTS = frozenset(
    {
        LifecycleEvent.COMPLETE,
        LifecycleEvent.ERRORED,
        LifecycleEvent.TERMINATED,
        LifecycleEvent.SKIPPED,
        LifecycleEvent.DEBOUNCED,
    }
)
#: The events that say the worker wrote a job's record down: a run it started, or the
#: record collapsed into an existing one (what a caller waiting on a resubmission of an
#: id that may run again waits for first: producers/waiters.py).
RECORDED_EVENTS = frozenset(
    {LifecycleEvent.CREATED, LifecycleEvent.DUPLICATE, LifecycleEvent.PAYLOAD_MISMATCH}
)


class SingletonMode(StrEnum):
    """``@workflow(singleton=Singleton(key, mode))``: what a new instance does while
    another instance of its key is live (README, "Flow control")."""

    QUEUE = "queue"  # waits its turn: one running per key (max_per_key=1, held while waiting)
    SKIP = "skip"  # recorded skipped (terminal), naming the live one
    CANCEL_IN_PROGRESS = "cancel_in_progress"  # the live ones are terminated, it runs
    # Hatchet's name for skip: the newest (the arriving one) is the one that gives way.
    CANCEL_NEWEST = "cancel_newest"


class SingletonDecision(StrEnum):
    """What the creating transaction decided for a new singleton instance (the
    ``onceflow_streams_singleton_decisions_total`` counter's ``decision`` label)."""

    ACTIVE = "active"  # no other live instance of its key: it is the one
    SKIPPED = "skipped"
    CANCELLED = "cancelled"  # an older live instance it superseded (one per older one)


class IdReuse(StrEnum):
    """``@workflow(id_reuse=...)`` and a job's ``id_reuse``: whether a new submission of
    a job id whose instance has finished starts a new run of it (README, "Flow
    control"). Temporal's WorkflowIdReusePolicy: RejectDuplicate, AllowDuplicateFailedOnly,
    AllowDuplicate."""

    NEVER = "never"  # a job id runs once (within retention): every resubmission collapses
    AFTER_FAILURE = "after_failure"  # a new run after a run that ended in FAILED_STATUSES
    AFTER_COMPLETION = "after_completion"  # a new run after any finished run

    @property
    def strictness(self) -> int:
        """Higher is stricter: a job may ask for its workflow's policy or a stricter one."""
        return _ID_REUSE_STRICTNESS[self]

    @property
    def reusable(self) -> frozenset[InstanceStatus]:
        """The statuses of a finished run that a new submission may follow."""
        if self is IdReuse.AFTER_FAILURE:
            return FAILED_STATUSES
        if self is IdReuse.AFTER_COMPLETION:
            return TERMINAL_STATUSES
        return frozenset()


_ID_REUSE_STRICTNESS = {IdReuse.AFTER_COMPLETION: 0, IdReuse.AFTER_FAILURE: 1, IdReuse.NEVER: 2}

#: A run that ended in one of these failed (``after_failure`` may start a new run):
#: errored (a step's failure, or a time limit: start_timeout, timed_out - both are
#: ``errored`` with a ``timeout_kind``) or terminated (an operator, a parent's close
#: policy, a singleton cancel_in_progress). ``skipped`` is not a failure: it never ran
#: because another instance of its key was live (only ``after_completion`` follows it).
FAILED_STATUSES = frozenset({InstanceStatus.ERRORED, InstanceStatus.TERMINATED})


class IdReuseDecision(StrEnum):
    """What creating decided for a resubmission of a job id under a reuse policy (the
    ``onceflow_streams_id_reuse_total`` counter's ``decision`` label)."""

    NEW_RUN = "new_run"  # its finished run allowed it: run N+1 started
    LIVE = "live"  # the run is not finished: a duplicate, as always
    REFUSED = "refused"  # finished, but not in a way the policy follows: a duplicate


class DebounceMode(StrEnum):
    """``@workflow(debounce=Debounce(key, period, mode=...))``: which job of a key's
    window starts (README, "Flow control")."""

    TRAILING = "trailing"  # the last one, once no other came for ``period`` (or max_wait)
    LEADING = "leading"  # the first one, at once; the others within ``period`` are not


class DebounceDecision(StrEnum):
    """What the creating transaction decided (the
    ``onceflow_streams_debounce_decisions_total`` counter's ``decision`` label)."""

    OPENED = "opened"  # a new job that opens a window (trailing: none pending; leading: leader)
    EXTENDED = "extended"  # a trailing job that took its key's pending instance's place
    DEBOUNCED = "debounced"  # an instance recorded debounced (a new job, or the pending one)


class WebhookStatus(StrEnum):
    """``onceflow_webhook_deliveries.status``."""

    PENDING = "pending"  # due at next_attempt_at
    SENDING = "sending"  # claimed by a dispatcher (a lease)
    DELIVERED = "delivered"
    DEAD = "dead"  # gave up: dead_reason says why; `onceflow webhooks redrive`


class WebhookDeadReason(StrEnum):
    """``onceflow_webhook_deliveries.dead_reason``: why a delivery is dead."""

    RETRIES_EXHAUSTED = "retries_exhausted"  # failed until the retry window closed
    REFUSED_ADDRESS = "refused_address"  # the target resolved to an address not allowed
    UNKNOWN_ENDPOINT = "unknown_endpoint"  # the endpoint is no longer configured


class WebhookOutcome(StrEnum):
    """``onceflow_webhook_attempts.outcome`` (NULL while the attempt is in flight)."""

    DELIVERED = "delivered"  # a 2xx answer
    FAILED = "failed"  # another answer, a timeout, a connection error: retried
    REFUSED = "refused"  # the address was refused before connecting: not retried
    LOST = "lost"  # the lease ran out before the outcome was recorded
