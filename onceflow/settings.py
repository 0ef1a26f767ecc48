"""All settings in one place.

Every setting is read from an environment variable named ``ONCEFLOW_<NAME>``; the two
service addresses also accept the conventional ``KAFKA_BOOTSTRAP_SERVERS`` and
``DATABASE_URL``. CLI flags, where a command has them, override these. The README's
configuration table is the documentation of this class.
"""

from __future__ import annotations

import json
from functools import lru_cache
from pathlib import Path
from typing import Annotated, Literal, get_args

from pydantic import AliasChoices, BaseModel, Field
from pydantic_settings import BaseSettings, SettingsConfigDict

from onceflow.webhooks import EndpointName, WebhookEndpoint

Scope = Literal["jobs:submit", "jobs:read", "instances:control"]
SCOPES: tuple[str, ...] = get_args(Scope)


class ApiKey(BaseModel):
    """One API key, stored only as the SHA-256 hex digest of the key."""

    name: str = Field(min_length=1, max_length=100)
    sha256: str = Field(pattern=r"^[0-9a-f]{64}$")
    scopes: list[Scope] = Field(min_length=1)


class Settings(BaseSettings):
    model_config = SettingsConfigDict(env_prefix="ONCEFLOW_", extra="ignore")

    # --- services -----------------------------------------------------------------
    kafka_bootstrap_servers: str = Field(
        default="127.0.0.1:19092",
        validation_alias=AliasChoices(
            "ONCEFLOW_KAFKA_BOOTSTRAP_SERVERS", "KAFKA_BOOTSTRAP_SERVERS"
        ),
    )
    database_url: str = Field(
        default="postgresql://postgres@127.0.0.1:15432/onceflow",
        validation_alias=AliasChoices("ONCEFLOW_DATABASE_URL", "DATABASE_URL"),
    )

    # --- topics ---------------------------------------------------------------------
    jobs_topic: str = "onceflow.jobs"
    dlq_topic: str = "onceflow.jobs.dlq"
    topic_partitions: int = Field(default=4, ge=1)
    # "auto": as many replicas as there are brokers, up to 3 (counted when the topics
    # are created), so the same settings fit the one-broker dev Kafka and a cluster.
    topic_replication_factor: Annotated[int, Field(ge=1)] | Literal["auto"] = 1
    # The topics' `min.insync.replicas`; unset: a majority of the replicas when there
    # are 3 or more (2 of 3), else 1. With acks=all a write then survives one broker
    # loss and is refused, not silently under-replicated, after two.
    topic_min_insync_replicas: int | None = Field(default=None, ge=1)
    # The largest record batch the topics take (their `max.message.bytes`), the largest
    # record the dead-letter producer sends (`message.max.bytes`), and what the worker
    # fetches per partition at least. Keep the broker's `message.max.bytes` the same
    # (tools/onceflow_tools/dev/server.properties); README, "The record format".
    kafka_max_message_bytes: int = Field(default=4 * 1024 * 1024, ge=64 * 1024)

    # --- ingest (producers/) ------------------------------------------------------
    ingest_host: str = "127.0.0.1"
    ingest_port: int = 8080
    ingest_metrics_port: int = 9101
    ingest_max_batch: int = Field(default=1000, ge=1)
    ingest_max_params_bytes: int = Field(default=65536, ge=2)
    ingest_ack_timeout_seconds: float = Field(default=15.0, gt=0)
    ingest_retry_after_seconds: int = Field(default=2, ge=1)
    producer_linger_ms: int = Field(default=2, ge=0)
    # A request finding no other record in flight, and none sent within the linger,
    # skips the linger (a second producer with linger 0; none when the linger is 0):
    # light load's latency without giving up heavy load's batches.
    producer_express_when_idle: bool = True
    # Serve the instance admin API (/v1/instances…) from the ingest process.
    admin_api_enabled: bool = True
    # API keys (JSON list of {"name", "sha256", "scopes"}; `onceflow keys new`).
    api_keys: list[ApiKey] = Field(default_factory=list)
    # Development only: accept requests without keys.
    auth_disabled: bool = False
    # Refuse jobs whose type no module in workflow_modules registers (422 at the edge
    # instead of a dead letter later).
    ingest_validate_types: bool = True
    ingest_max_body_bytes: int = Field(default=4 * 1024 * 1024, ge=1024)
    # Per client (API key, or address when auth is disabled): sustained requests/s,
    # burst, and requests in flight at once. 0 disables the rate limit.
    ingest_rate_limit_per_second: float = Field(default=200.0, ge=0)
    ingest_rate_limit_burst: int = Field(default=400, ge=1)
    ingest_max_inflight_per_client: int = Field(default=32, ge=1)
    # Bind the ingest port with SO_REUSEPORT, so that several ingest processes (each
    # with its own metrics port) share it and the kernel spreads connections over them.
    ingest_reuse_port: bool = False
    # GET /v1/jobs/{id}/stream (Server-Sent Events): at most this many readers open at
    # once per ingest process (503 past it). All of them share one LISTEN connection and
    # one poll of PostgreSQL every ingest_stream_poll_seconds (the fallback for a lost
    # notification, and how a reader learns its instance was created or finished); a
    # reader of an id with no instance yet waits up to ingest_stream_wait_seconds for
    # it (the job may still be in Kafka) before its 404.
    ingest_stream_max_readers: int = Field(default=1000, ge=1)
    ingest_stream_poll_seconds: float = Field(default=1.0, gt=0)
    ingest_stream_wait_seconds: float = Field(default=60.0, ge=0)
    # Start and wait (README, "Start and wait"): the longest a request may wait for its
    # job's outcome (`Prefer: wait=N` and `GET /v1/jobs/{id}/result?wait=N` are capped
    # to it); 0 turns waiting off (no events consumer, every submission a plain 202).
    ingest_max_wait_seconds: int = Field(default=60, ge=0)
    # Jobs waited for at once per ingest process (a batch counts each of its jobs);
    # a request that would go past it is answered 202 at once (counted in
    # onceflow_ingest_wait_outcomes_total{outcome="refused"}).
    ingest_max_waiters: int = Field(default=10000, ge=1)

    # --- streams worker (streams/) ------------------------------------------------
    consumer_group: str = "onceflow-streams"
    streams_batch_size: int = Field(default=500, ge=1)
    # A batch is taken when full, or at once when nothing more is queued behind its
    # last record; this is the longest wait for records still arriving (streams/gather.py).
    streams_batch_within_seconds: float = Field(default=0.02, gt=0)
    streams_concurrency: int = Field(default=4, ge=1)
    streams_metrics_port: int = 9102
    streams_commit_interval_seconds: float = Field(default=2.8, gt=0)
    streams_shutdown_grace_seconds: float = Field(default=30.0, gt=0)
    # How soon a dead worker's partitions move to the others (Kafka session timeout).
    streams_session_timeout_seconds: float = Field(default=10.0, ge=6)

    # --- console (console/) ------------------------------------------------------
    # The operator's web console (`onceflow console`): its page port and its probes.
    console_host: str = "127.0.0.1"
    console_port: int = 8090
    console_metrics_port: int = 9104

    # --- audit (onceflow audit) ---------------------------------------------------------
    # With lag > 0, the committed offsets are read twice this far apart: if none moved,
    # the consumer group is not making progress and the audit fails.
    audit_progress_seconds: float = Field(default=5.0, ge=0)

    # --- workflow engine (workflow_engine/) ---------------------------------------
    # Instances are coroutines whose checkpoints share a group commit: more in flight
    # means bigger batches (64-128 is best on 2 cores, BENCHMARKS.md).
    engine_concurrency: int = Field(default=64, ge=1)
    # Unset: a quarter of engine_concurrency, at least 32 (claim_batch_size).
    engine_claim_batch: int | None = Field(default=None, ge=1)
    engine_lease_seconds: float = Field(default=30.0, gt=0)
    engine_poll_interval_seconds: float = Field(default=1.0, gt=0)
    engine_metrics_port: int = 9103
    workflow_modules: list[str] = Field(default_factory=list)
    step_result_max_bytes: int = Field(default=1024 * 1024, ge=2)
    # Output streams (ctx.emit): the largest value (JSON bytes), and per instance at most
    # this many values and bytes in all; an emit past a bound raises StreamLimitReached
    # in the workflow (README, "Step-output streams").
    stream_value_max_bytes: int = Field(default=64 * 1024, ge=2)
    stream_max_values: int = Field(default=10_000, ge=1)
    stream_max_bytes: int = Field(default=16 * 1024 * 1024, ge=2)
    # Finished instances (and their steps) are deleted this long after finishing; the
    # job-id record that makes a late duplicate collapse is kept longer.
    retention_instances_seconds: float = Field(default=7 * 86400, gt=0)
    retention_job_ids_seconds: float = Field(default=30 * 86400, gt=0)
    # Step attempts and duplicate deliveries live in time partitions of this width
    # (migration 0012); retention drops whole partitions, and instances / job ids are
    # deleted up to one interval later so that DELETE never reaches those tables.
    # Partitions are created this many intervals ahead of now.
    retention_partition_seconds: float = Field(default=86400, ge=3600)
    retention_partitions_ahead: int = Field(default=3, ge=1)
    # The operators' audit trail (onceflow_operator_actions: actions, logins, refusals)
    # is deleted this long after each row was written, whatever the instances' retention.
    retention_operator_actions_seconds: float = Field(default=90 * 86400, gt=0)
    maintenance_interval_seconds: float = Field(default=15.0, gt=0)

    # The database role the services use, granted read/write by `onceflow migrate`.
    app_db_role: str = ""

    # --- lifecycle events (issue 25; README, "Lifecycle events") -------------------------
    # Write a lifecycle event into the outbox with every change of an instance, in the
    # change's transaction (off: no outbox row is written; every process reads it).
    lifecycle_events: bool = True
    # The topic the relay publishes the events to (keyed by job id, CloudEvents binary
    # mode), created by the topic setup with topic_partitions partitions; read by
    # ingest's start-and-wait and the webhook dispatcher.
    events_topic: str = "onceflow.events"
    # Run the relay inside each engine process (one active across engines, by an
    # advisory lock). Off: events are still written; run `onceflow relay`, or let
    # Debezium's outbox event router read the table (docs/operations.md).
    events_relay: bool = True
    # Events per relay round (read, publish, await the acknowledgements, delete).
    events_relay_batch: int = Field(default=2000, ge=1)
    # How long the relay waits after a round that caught up (fewer events than a batch,
    # or none) at light load: the floor of the delay.
    events_relay_interval_seconds: float = Field(default=0.02, gt=0)
    # ... and under load: events arriving fast enough that a round after the short wait
    # would carry events_relay_busy_round or more (judged by the rate), so that each
    # round carries hundreds of events.
    events_relay_busy_interval_seconds: float = Field(default=0.1, gt=0)
    events_relay_busy_round: int = Field(default=32, ge=1)
    # Backpressure: past this many events waiting in the outbox, engines stop claiming
    # new work until it is back under 90% of it (0: never). Nothing is dropped.
    events_outbox_max_depth: int = Field(default=500_000, ge=0)
    # The metrics and health port of `onceflow relay` (the relay as its own process).
    relay_metrics_port: int = 9105
    # --- webhooks (README, "Webhooks"; docs/operations.md, "Webhooks") ---------------
    # The allow-list: a JSON object {name: {"url", "secret": "whsec_...", "kinds"?,
    # "allow_private"?, "allowed_cidrs"?}}. A job's `callback` and a workflow's
    # `webhooks=[...]` name these; nothing else is ever a target. Give the same value to
    # ingest and the worker (they refuse unknown callbacks) and to the engines.
    webhook_endpoints: dict[EndpointName, WebhookEndpoint] = Field(default_factory=dict)
    # The dispatcher runs inside each engine process when endpoints are configured
    # (off: run `onceflow webhooks run` as its own process instead).
    engine_webhooks: bool = True
    webhook_consumer_group: str = "onceflow.webhooks"
    # Deliveries in flight at once per dispatcher.
    webhook_concurrency: int = Field(default=16, ge=1)
    # One attempt: to connect, to wait for each read, and in all (headers and the
    # bounded body). A slower receiver's attempt is a timeout, retried.
    webhook_connect_timeout_seconds: float = Field(default=5.0, gt=0)
    webhook_read_timeout_seconds: float = Field(default=10.0, gt=0)
    webhook_attempt_timeout_seconds: float = Field(default=15.0, gt=0)
    # Retries: exponential backoff with full jitter (a random delay up to
    # base * 2^(attempt-1), capped at max), for at most retry_seconds after the event
    # was first taken; then the delivery is dead (`onceflow webhooks redrive`).
    webhook_backoff_base_seconds: float = Field(default=5.0, gt=0)
    webhook_backoff_max_seconds: float = Field(default=3600.0, gt=0)
    webhook_retry_seconds: float = Field(default=24 * 3600.0, gt=0)
    # How long a claimed attempt is a dispatcher's own; must exceed the attempt timeout
    # (a dispatcher sends only while its lease outlasts the attempt).
    webhook_lease_seconds: float = Field(default=60.0, gt=0)
    webhook_poll_interval_seconds: float = Field(default=1.0, gt=0)
    # The metrics/health port of `onceflow webhooks run` (in an engine: the engine's).
    webhooks_metrics_port: int = 9106

    # --- traces (OpenTelemetry; README, "Tracing") ------------------------------------
    # The OTLP/HTTP endpoint (e.g. http://127.0.0.1:4318): set, it turns tracing on.
    # The standard OTEL_EXPORTER_OTLP_ENDPOINT is read too (and _TRACES_ENDPOINT).
    otel_exporter_otlp_endpoint: str = Field(
        default="",
        validation_alias=AliasChoices(
            "ONCEFLOW_OTEL_EXPORTER_OTLP_ENDPOINT", "OTEL_EXPORTER_OTLP_ENDPOINT"
        ),
    )
    # The share of new traces kept (parent-based: a job's spans follow its root's choice).
    otel_sampling_ratio: float = Field(default=1.0, ge=0, le=1)
    # service.name is "<prefix>-<process>" (onceflow-ingest, …) unless OTEL_SERVICE_NAME.
    otel_service_name_prefix: str = Field(default="onceflow", min_length=1)

    # --- process-wide ---------------------------------------------------------------
    state_dir: Path = Path(".onceflow")
    log_level: str = "INFO"
    log_format: str = Field(default="json", pattern="^(json|text)$")

    @property
    def claim_batch_size(self) -> int:
        """Most instances one claim query takes: ``engine_claim_batch``, or a quarter of
        the engine's slots and at least 32. Every claim walks the queue's index past
        the entries of instances claimed since the last vacuum, so fewer, larger claims
        cost PostgreSQL less: at 512 in flight, claims of 32 cost 6.5 ms each and a
        quarter of the database's CPU (BENCHMARKS.md, "Lease checks by job id, claims
        sized to the engine")."""
        if self.engine_claim_batch is not None:
            return self.engine_claim_batch
        return max(32, self.engine_concurrency // 4)


def settings_env(s: Settings) -> dict[str, str]:
    """The environment that gives a subprocess the same services, topics and group."""
    return {
        "ONCEFLOW_DATABASE_URL": s.database_url,
        "ONCEFLOW_KAFKA_BOOTSTRAP_SERVERS": s.kafka_bootstrap_servers,
        "ONCEFLOW_JOBS_TOPIC": s.jobs_topic,
        "ONCEFLOW_DLQ_TOPIC": s.dlq_topic,
        "ONCEFLOW_EVENTS_TOPIC": s.events_topic,
        "ONCEFLOW_LIFECYCLE_EVENTS": str(s.lifecycle_events).lower(),
        "ONCEFLOW_CONSUMER_GROUP": s.consumer_group,
        "ONCEFLOW_TOPIC_PARTITIONS": str(s.topic_partitions),
        "ONCEFLOW_TOPIC_REPLICATION_FACTOR": str(s.topic_replication_factor),
        **(
            {"ONCEFLOW_TOPIC_MIN_INSYNC_REPLICAS": str(s.topic_min_insync_replicas)}
            if s.topic_min_insync_replicas is not None
            else {}
        ),
        "ONCEFLOW_STATE_DIR": str(s.state_dir),
        "ONCEFLOW_LOG_FORMAT": "json",
        "ONCEFLOW_WORKFLOW_MODULES": json.dumps(s.workflow_modules),
        "ONCEFLOW_WEBHOOK_ENDPOINTS": json.dumps(
            {name: e.model_dump() for name, e in s.webhook_endpoints.items()}
        ),
        "ONCEFLOW_OTEL_SAMPLING_RATIO": str(s.otel_sampling_ratio),
        "ONCEFLOW_OTEL_SERVICE_NAME_PREFIX": s.otel_service_name_prefix,
        # Only when set: an empty value would hide OTEL_EXPORTER_OTLP_ENDPOINT.
        **(
            {"ONCEFLOW_OTEL_EXPORTER_OTLP_ENDPOINT": s.otel_exporter_otlp_endpoint}
            if s.otel_exporter_otlp_endpoint
            else {}
        ),
    }


@lru_cache(maxsize=1)
def get_settings() -> Settings:
    """The process's settings, read once from the environment."""
    return Settings()
