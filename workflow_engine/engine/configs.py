"""The engine's service configs, built from the settings in one place.

:func:`engine_configs` is the only place the engine's services' settings are read: the
services take their own frozen configs (each defined, and validated, next to its
service; :mod:`onceflow.service_config`), never :class:`~onceflow.settings.Settings`.
"""

from __future__ import annotations

from dataclasses import dataclass

from onceflow.settings import Settings
from workflow_engine.engine.backpressure import BackpressureConfig
from workflow_engine.engine.batcher import BatcherConfig
from workflow_engine.engine.presence import PresenceConfig
from workflow_engine.engine.relay import RelayConfig
from workflow_engine.engine.scheduler import SchedulerConfig
from workflow_engine.engine.services import LeaseKeeperConfig, MaintenanceConfig, RescuerConfig
from workflow_engine.engine.webhook_dispatcher import DispatcherConfig


@dataclass(frozen=True, slots=True)
class EngineConfigs:
    """One config per service of an engine process."""

    lease_keeper: LeaseKeeperConfig
    rescuer: RescuerConfig
    maintenance: MaintenanceConfig
    presence: PresenceConfig
    scheduler: SchedulerConfig
    batcher: BatcherConfig
    #: The outbox relay inside the engine (None: events off, or ONCEFLOW_EVENTS_RELAY off).
    relay: RelayConfig | None = None
    #: The outbox watch and its backpressure on claims (None: events off).
    backpressure: BackpressureConfig | None = None
    #: The webhook dispatcher's, when this engine runs one (endpoints configured and
    #: ONCEFLOW_ENGINE_WEBHOOKS on).
    webhooks: DispatcherConfig | None = None


def relay_config(settings: Settings) -> RelayConfig:
    """The relay's config, for the engine's relay and `onceflow relay` alike."""
    return RelayConfig(
        bootstrap_servers=settings.kafka_bootstrap_servers,
        topic=settings.events_topic,
        batch=settings.events_relay_batch,
        interval_seconds=settings.events_relay_interval_seconds,
        busy_interval_seconds=settings.events_relay_busy_interval_seconds,
        busy_round=settings.events_relay_busy_round,
        max_message_bytes=settings.kafka_max_message_bytes,
    )


def engine_configs(settings: Settings) -> EngineConfigs:
    """Every service's config from ``settings`` (a bad value raises
    :class:`~onceflow.errors.ConfigurationError` naming the config and the field)."""
    s = settings
    lease = s.engine_lease_seconds
    return EngineConfigs(
        # A heartbeat every third of a lease: two can fail before a lease expires.
        lease_keeper=LeaseKeeperConfig(lease_seconds=lease, heartbeat_seconds=lease / 3),
        # Twice per lease, but not more than once a second (short test leases).
        rescuer=RescuerConfig(interval_seconds=max(1.0, lease / 2)),
        maintenance=MaintenanceConfig(
            interval_seconds=s.maintenance_interval_seconds,
            retention_instances_seconds=s.retention_instances_seconds,
            retention_job_ids_seconds=s.retention_job_ids_seconds,
            partition_seconds=s.retention_partition_seconds,
            partitions_ahead=s.retention_partitions_ahead,
            retention_operator_actions_seconds=s.retention_operator_actions_seconds,
        ),
        # As often as the heartbeat, so the engine's row is as fresh as its leases.
        presence=PresenceConfig(interval_seconds=lease / 3),
        scheduler=SchedulerConfig(),
        batcher=BatcherConfig(),
        relay=relay_config(s) if s.lifecycle_events and s.events_relay else None,
        backpressure=(
            BackpressureConfig(max_depth=s.events_outbox_max_depth) if s.lifecycle_events else None
        ),
        webhooks=(webhook_config(s) if s.engine_webhooks and s.webhook_endpoints else None),
    )


def webhook_config(settings: Settings) -> DispatcherConfig:
    """The webhook dispatcher's config from ``settings`` (in an engine or on its own)."""
    s = settings
    return DispatcherConfig(
        bootstrap_servers=s.kafka_bootstrap_servers,
        events_topic=s.events_topic,
        consumer_group=s.webhook_consumer_group,
        concurrency=s.webhook_concurrency,
        connect_timeout=s.webhook_connect_timeout_seconds,
        read_timeout=s.webhook_read_timeout_seconds,
        attempt_timeout=s.webhook_attempt_timeout_seconds,
        backoff_base=s.webhook_backoff_base_seconds,
        backoff_max=s.webhook_backoff_max_seconds,
        retry_seconds=s.webhook_retry_seconds,
        lease_seconds=s.webhook_lease_seconds,
        poll_interval=s.webhook_poll_interval_seconds,
    )
