"""Prometheus metrics of the ingest process (served on ``ONCEFLOW_INGEST_METRICS_PORT``)."""

from prometheus_client import Counter, Gauge, Histogram

REQUESTS = Counter(
    "onceflow_ingest_requests_total", "HTTP requests to /v1/jobs by status code", ["status"]
)
JOBS_ACCEPTED = Counter(
    "onceflow_ingest_jobs_accepted_total", "Jobs acknowledged by Kafka and answered 202"
)
JOBS_REJECTED = Counter(
    "onceflow_ingest_jobs_rejected_total", "Jobs not accepted, by reason", ["reason"]
)
PRODUCE_LATENCY = Histogram(
    "onceflow_ingest_produce_latency_seconds",
    "From produce() to the last delivery report of one request",
    buckets=(0.001, 0.0025, 0.005, 0.01, 0.025, 0.05, 0.1, 0.25, 0.5, 1, 2.5, 5, 10, 30),
)
QUEUE_DEPTH = Gauge(
    "onceflow_ingest_producer_queue_depth",
    "Records waiting in the producers' local queues (both lanes)",
)
KAFKA_ERRORS = Counter("onceflow_ingest_kafka_errors_total", "Records Kafka did not acknowledge")
DEPENDENCY_UP = Gauge(
    "onceflow_ingest_dependency_up",
    "1 while ingest reaches the dependency (kafka: a broker connection; postgres: used"
    " by the admin API only, never part of readiness), else 0",
    ["dependency"],
)
STREAM_READERS = Gauge(
    "onceflow_ingest_stream_readers",
    "Open GET /v1/jobs/{id}/stream readers, waiting ones included",
)
STREAM_REFUSED = Counter(
    "onceflow_ingest_stream_refused_total",
    "Stream readers answered 503 because every slot was taken",
)
STREAM_LISTENING = Gauge(
    "onceflow_ingest_stream_listening",
    "1 while the stream readers' LISTEN connection is up, else 0",
)
WAITING_REQUESTS = Gauge(
    "onceflow_ingest_waiting_requests",
    "Requests waiting for their jobs' outcome (Prefer: wait, GET /v1/jobs/{id}/result)",
)
WAIT_OUTCOMES = Counter(
    "onceflow_ingest_wait_outcomes_total",
    "How waits ended: final (answered 200), timeout (202 after the wait), degraded (202"
    " at once: events not watched, PostgreSQL down, shutting down), refused (202 at once:"
    " the jobs waited for over ingest_max_waiters)",
    ["outcome"],
)
EVENTS_CONSUMED = Counter(
    "onceflow_ingest_events_consumed_total",
    "Records the start-and-wait consumer read from the events topic (all kinds, all ids)",
)
