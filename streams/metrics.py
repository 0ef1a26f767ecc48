"""Prometheus metrics of the streams worker (served on ``ONCEFLOW_STREAMS_METRICS_PORT``)."""

from prometheus_client import Counter, Gauge, Histogram

RECORDS = Counter(
    "onceflow_streams_records_consumed_total", "Kafka records consumed", ["topic", "partition"]
)
CREATED = Counter("onceflow_streams_instances_created_total", "Workflow instances created")
DUPLICATES = Counter(
    "onceflow_streams_duplicates_collapsed_total",
    "Deliveries of a job id that already had an instance (no-ops), by kind",
    ["kind"],
)
MISMATCHES = Counter(
    "onceflow_streams_payload_mismatches_total",
    "Duplicate deliveries whose params differ from the first delivery's",
)
SINGLETON_DECISIONS = Counter(
    "onceflow_streams_singleton_decisions_total",
    "Singleton policy decisions taken when instances are created, by workflow and decision"
    " (SingletonDecision: active, skipped, cancelled)",
    ["workflow", "decision"],
)
ID_REUSE = Counter(
    "onceflow_streams_id_reuse_total",
    "Resubmissions of an existing job id under an id reuse policy other than never, by"
    " workflow and decision (IdReuseDecision: new_run, live, refused)",
    ["workflow", "decision"],
)
DEBOUNCE_DECISIONS = Counter(
    "onceflow_streams_debounce_decisions_total",
    "Debounce decisions taken when instances are created, by workflow and decision"
    " (DebounceDecision: opened, extended, debounced)",
    ["workflow", "decision"],
)
DEAD_LETTERED = Counter(
    "onceflow_streams_dead_lettered_total",
    "Records sent to the dead-letter topic, by reason code (DeadLetterReason)",
    ["reason"],
)
DEAD_LETTERS_TRUNCATED = Counter(
    "onceflow_streams_dead_letters_truncated_total",
    "Dead letters that keep only a prefix of a record too large for the dead-letter topic",
)
DLQ_RETRIES = Counter(
    "onceflow_streams_dlq_retries_total",
    "Dead-letter writes retried (smaller after a size refusal, or after a broker error)",
)
BATCH_SIZE = Histogram(
    "onceflow_streams_batch_size",
    "Records per batch handed to the database",
    buckets=(1, 5, 10, 25, 50, 100, 250, 500, 1000, 2500, 5000),
)
DB_LATENCY = Histogram(
    "onceflow_streams_db_latency_seconds",
    "Duration of one create-instances transaction",
    buckets=(0.001, 0.0025, 0.005, 0.01, 0.025, 0.05, 0.1, 0.25, 0.5, 1, 2.5, 5, 10),
)
DB_RETRIES = Counter(
    "onceflow_streams_db_retries_total", "Create-instances transactions retried after an error"
)
IN_FLIGHT = Gauge(
    "onceflow_streams_records_in_flight", "Records taken from Kafka not yet committed to Postgres"
)
TASKS = Counter(
    "onceflow_streams_tasks_total", "Plain task attempts by outcome", ["task", "outcome"]
)
_LAG_LABELS = ["consumer_group", "topic", "partition"]
LAG = Gauge(
    "onceflow_streams_consumer_lag",
    "Records not yet committed by the group, per partition (end offset - committed)",
    _LAG_LABELS,
)
LAG_TOTAL = Gauge(
    "onceflow_streams_consumer_lag_total",
    "Records not yet committed by the group, summed over the topic's partitions",
    ["consumer_group", "topic"],
)
END_OFFSET = Gauge(
    "onceflow_streams_topic_end_offset", "The broker's end offset per partition", _LAG_LABELS
)
COMMITTED_OFFSET = Gauge(
    "onceflow_streams_committed_offset",
    "The group's committed offset per partition",
    _LAG_LABELS,
)
REBALANCES = Counter(
    "onceflow_streams_rebalances_total", "Partition assignments received by this worker"
)
ASSIGNED_PARTITIONS = Gauge(
    "onceflow_streams_assigned_partition",
    "1 for each partition of the jobs topic this worker holds since the last rebalance",
    ["partition"],
)
