"""Prometheus metrics of the engine process (served on ``ONCEFLOW_ENGINE_METRICS_PORT``)."""

import functools
from typing import TypeVar

from prometheus_client import Counter, Gauge, Histogram

M = TypeVar("M", Counter, Gauge, Histogram)


@functools.cache
def labelled(metric: M, *values: str) -> M:
    """``metric.labels(*values)``, remembered: the per-step counters are labelled by
    workflow (and outcome), a few dozen children in all, and ``labels()`` takes a lock
    and checks its arguments on every call — eleven times per three-step workflow, a
    few per cent of the engine's CPU on quick steps (BENCHMARKS.md, "The engine before
    and after issue 23")."""
    return metric.labels(*values)


_LATENCY_BUCKETS = (0.001, 0.0025, 0.005, 0.01, 0.025, 0.05, 0.1, 0.25, 0.5, 1, 2.5, 5, 10)
_E2E_BUCKETS = (0.01, 0.025, 0.05, 0.1, 0.25, 0.5, 1, 2.5, 5, 10, 30, 60, 300, 900, 3600)

CLAIMED = Counter("onceflow_engine_instances_claimed_total", "Instances claimed by this engine")
FINISHED = Counter(
    "onceflow_engine_instances_finished_total",
    "Instances this engine brought to a final status",
    ["workflow", "status"],
)
TIME_LIMITS = Counter(
    "onceflow_engine_time_limits_total",
    "Instances errored by a time limit, by kind (start_timeout: not started within"
    " start_within; timed_out: past the execution_timeout deadline)",
    ["workflow", "kind"],
)
STEPS = Counter(
    "onceflow_engine_steps_total",
    "Step attempts by outcome (complete, retry, failed)",
    ["workflow", "outcome"],
)
STEPS_STARTED = Counter(
    "onceflow_engine_steps_started_total", "Step attempts started", ["workflow"]
)
STEP_DURATION = Histogram(
    "onceflow_engine_step_duration_seconds",
    "Duration of successful step attempts (the step's code, counted once checkpointed)",
    ["workflow"],
    buckets=_LATENCY_BUCKETS,
)
INLINE_SLOW = Counter(
    "onceflow_engine_inline_slow_steps_total",
    "Inline step attempts that held the event loop over 50 ms (run them in a thread)",
    ["workflow"],
)
CLAIM_LATENCY = Histogram(
    "onceflow_engine_claim_latency_seconds",
    "Time for one claim query",
    buckets=_LATENCY_BUCKETS,
)
SUBMIT_TO_COMPLETE = Histogram(
    "onceflow_engine_submission_to_completion_seconds",
    "From HTTP submission to instance completion",
    ["workflow"],
    buckets=_E2E_BUCKETS,
)
INFLIGHT = Gauge(
    "onceflow_engine_inflight_instances",
    "Instances this engine holds now (running, or claimed for a slot whose run is finishing)",
)
RESCUED = Counter("onceflow_engine_leases_rescued_total", "Expired leases re-queued by this engine")
INSTANCES_BY_STATUS = Gauge(
    "onceflow_engine_instances",
    "Instances in the database by workflow and status",
    ["workflow", "status"],
)
RUNNABLE_BACKLOG = Gauge(
    "onceflow_engine_runnable_backlog", "Instances due to run and not yet claimed"
)
PRUNED = Counter("onceflow_engine_pruned_total", "Rows removed by retention", ["kind"])
WRITE_BATCH_SIZE = Histogram(
    "onceflow_engine_write_batch_size",
    "Checkpoint writes committed together by the engine's group commit",
    buckets=(1, 2, 4, 8, 16, 32, 64, 128, 256, 512, 1024),
)
WORKFLOW_VERSION = Gauge(
    "onceflow_engine_workflow_version_info",
    "The workflow definition versions this engine runs (value 1)",
    ["workflow", "version"],
)
INSTANCES_WITHOUT_ENGINE = Gauge(
    "onceflow_engine_instances_without_engine",
    "Runnable instances whose workflow version no live engine has (version"
    " 'unversioned': created before versioning)",
    ["workflow", "version"],
)
# Schedules (workflow_engine.engine.scheduler). Counters count what this engine fired;
# sum over engines for the schedule's total (also kept in onceflow_schedules).
SCHEDULE_NEXT_FIRE = Gauge(
    "onceflow_engine_schedule_next_fire_timestamp_seconds",
    "When the schedule fires next (Unix seconds; no series while paused)",
    ["schedule"],
)
SCHEDULE_TICKS_FIRED = Counter(
    "onceflow_engine_schedule_ticks_fired_total",
    "Schedule ticks that created an instance, by trigger (on_time, catch_up, buffered)",
    ["schedule", "trigger"],
)
SCHEDULE_TICKS_SKIPPED = Counter(
    "onceflow_engine_schedule_ticks_skipped_total",
    "Due schedule ticks that created no instance, by reason (catchup, overlap)",
    ["schedule", "reason"],
)
SCHEDULE_LATENESS = Histogram(
    "onceflow_engine_schedule_lateness_seconds",
    "From a tick's time to the creation of its instance",
    ["schedule"],
    buckets=(0.01, 0.05, 0.1, 0.25, 0.5, 1, 2, 5, 10, 30, 60, 300, 3600),
)
# Lifecycle events (issue 25): the outbox, its relay, and the backpressure on claims.
# The relay's series come from the process that runs it (an engine, or `onceflow relay`).
EVENTS_PUBLISHED = Counter(
    "onceflow_events_published_total",
    "Lifecycle events this process's relay published and Kafka acknowledged, by type",
    ["type"],
)
RELAY_ACTIVE = Gauge(
    "onceflow_events_relay_active",
    "1 while this process's relay holds the relay lock (exactly one across processes)",
)
RELAY_ERRORS = Counter(
    "onceflow_events_relay_errors_total",
    "Relay rounds that failed, by kind (database, kafka, other)",
    ["kind"],
)
RELAY_LAG = Histogram(
    "onceflow_events_relay_lag_seconds",
    "Per relay round, the oldest event's time from its transaction to its deletion"
    " after Kafka acknowledged it",
    buckets=(0.005, 0.01, 0.025, 0.05, 0.1, 0.25, 0.5, 1, 2.5, 5, 10, 30, 60, 300, 900),
)
OUTBOX_DEPTH = Gauge(
    "onceflow_events_outbox_depth",
    "Events waiting in the outbox (counted up to twice the backpressure depth)",
)
OUTBOX_OLDEST_AGE = Gauge(
    "onceflow_events_outbox_oldest_age_seconds",
    "Age of the oldest event waiting in the outbox (0 when empty)",
)
OUTBOX_MAX_DEPTH = Gauge(
    "onceflow_events_outbox_max_depth",
    "The outbox depth past which engines stop claiming (ONCEFLOW_EVENTS_OUTBOX_MAX_DEPTH)",
)
BACKPRESSURE = Gauge(
    "onceflow_events_backpressure",
    "1 while this engine holds back its claims because the outbox is too deep",
)

# --- the webhook dispatcher (in the engine, or `onceflow webhooks run`) -------------------
_WEBHOOK_BUCKETS = (0.005, 0.01, 0.025, 0.05, 0.1, 0.25, 0.5, 1, 2.5, 5, 10, 30)

WEBHOOK_EVENTS = Counter(
    "onceflow_webhook_events_total",
    "Lifecycle events read by the dispatcher, by what became of them (subscribed: one or"
    " more deliveries; unsubscribed; skipped: not a lifecycle event it can read)",
    ["result"],
)
WEBHOOK_ATTEMPTS = Counter(
    "onceflow_webhook_attempts_total",
    "Webhook attempts by outcome (delivered, failed, refused, lost)",
    ["endpoint", "outcome"],
)
WEBHOOK_DELIVERIES = Counter(
    "onceflow_webhook_deliveries_total",
    "Webhook deliveries finished, by outcome (delivered, dead) and, when dead, reason",
    ["endpoint", "outcome", "reason"],
)
WEBHOOK_ATTEMPT_DURATION = Histogram(
    "onceflow_webhook_attempt_duration_seconds",
    "One webhook attempt, from resolving the host to the bounded body read",
    ["endpoint"],
    buckets=_WEBHOOK_BUCKETS,
)
WEBHOOK_PENDING = Gauge(
    "onceflow_webhook_deliveries_pending", "Webhook deliveries not yet delivered nor dead"
)
WEBHOOK_DEAD = Gauge(
    "onceflow_webhook_deliveries_dead", "Dead webhook deliveries (`onceflow webhooks redrive`)"
)
BATCHES = Counter(
    "onceflow_engine_batches_total",
    "Batch runs this engine formed from waiting members, by trigger (size: max_size"
    " members waited; wait: the oldest waited max_wait)",
    ["workflow", "trigger"],
)
BATCH_SIZE = Histogram(
    "onceflow_engine_batch_size",
    "Members per batch run this engine formed",
    ["workflow"],
    buckets=(1, 2, 5, 10, 25, 50, 100, 250, 500, 1000),
)
