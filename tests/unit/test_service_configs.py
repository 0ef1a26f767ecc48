"""Each long-running service's config refuses bad values when built, and the one
function per process builds them from the settings as the services used them before."""

from __future__ import annotations

import math
from dataclasses import fields

import pytest

from onceflow.errors import ConfigurationError
from onceflow.settings import Settings
from streams.monitor import LagMonitorConfig
from streams.worker import lag_monitor_config
from workflow_engine.engine.batcher import BatcherConfig
from workflow_engine.engine.configs import engine_configs
from workflow_engine.engine.presence import PresenceConfig
from workflow_engine.engine.scheduler import SchedulerConfig
from workflow_engine.engine.services import LeaseKeeperConfig, MaintenanceConfig, RescuerConfig
from workflow_engine.store import writes

RETENTION = {"retention_instances_seconds": 7 * 86400, "retention_job_ids_seconds": 30 * 86400}


@pytest.mark.parametrize("heartbeat", [30.0, 45.0])
def test_a_heartbeat_must_be_shorter_than_the_lease(heartbeat):
    with pytest.raises(ConfigurationError, match=r"heartbeat_seconds .* must be shorter than"):
        LeaseKeeperConfig(lease_seconds=30.0, heartbeat_seconds=heartbeat)


@pytest.mark.parametrize(
    ("lease", "heartbeat", "field"),
    [(0.0, 1.0, "lease_seconds"), (-5.0, 1.0, "lease_seconds"), (30.0, 0.0, "heartbeat_seconds")],
)
def test_a_lease_and_a_heartbeat_must_be_above_zero(lease, heartbeat, field):
    with pytest.raises(ConfigurationError, match=rf"LeaseKeeperConfig\.{field} must be above zero"):
        LeaseKeeperConfig(lease_seconds=lease, heartbeat_seconds=heartbeat)


@pytest.mark.parametrize("interval", [0.0, -1.0, math.nan])
def test_a_rescuer_and_a_presence_need_an_interval_above_zero(interval):
    with pytest.raises(ConfigurationError, match=r"RescuerConfig\.interval_seconds must be above"):
        RescuerConfig(interval_seconds=interval)
    with pytest.raises(ConfigurationError, match=r"PresenceConfig\.interval_seconds must be above"):
        PresenceConfig(interval_seconds=interval)


@pytest.mark.parametrize("field", [field.name for field in fields(MaintenanceConfig)])
def test_maintenance_refuses_a_field_not_above_zero(field):
    values = {"interval_seconds": 15.0, **RETENTION, field: 0}
    with pytest.raises(ConfigurationError, match=rf"MaintenanceConfig\.{field} must be above zero"):
        MaintenanceConfig(**values)


def test_maintenance_defaults_are_the_store_s_own():
    config = MaintenanceConfig(interval_seconds=15.0, **RETENTION)
    assert config.partition_seconds == writes.DAY
    assert config.retention_operator_actions_seconds == writes.OPERATOR_ACTIONS_RETENTION


def test_the_scheduler_needs_an_interval_above_zero_and_a_grace_of_zero_or_more():
    with pytest.raises(ConfigurationError, match=r"SchedulerConfig\.interval_seconds must be"):
        SchedulerConfig(interval_seconds=0)
    with pytest.raises(ConfigurationError, match=r"SchedulerConfig\.grace_seconds must be zero"):
        SchedulerConfig(grace_seconds=-1.0)
    assert SchedulerConfig(grace_seconds=0).grace_seconds == 0


@pytest.mark.parametrize(
    ("writers", "max_batch", "field"), [(0, 10, "writers"), (3, 0, "max_batch")]
)
def test_the_batcher_needs_a_writer_and_room_for_a_write(writers, max_batch, field):
    with pytest.raises(ConfigurationError, match=rf"BatcherConfig\.{field} must be above zero"):
        BatcherConfig(writers=writers, max_batch=max_batch)


def test_the_lag_monitor_needs_an_interval_and_names():
    with pytest.raises(ConfigurationError, match=r"LagMonitorConfig\.interval_seconds must be"):
        LagMonitorConfig("127.0.0.1:9092", "group", "topic", interval_seconds=0)
    with pytest.raises(ConfigurationError, match=r"LagMonitorConfig\.topic must not be empty"):
        LagMonitorConfig("127.0.0.1:9092", "group", "")


def test_the_configs_are_frozen():
    config = RescuerConfig(interval_seconds=1.0)
    with pytest.raises(AttributeError):
        config.interval_seconds = 0  # type: ignore[misc]


def test_the_engine_s_configs_come_from_the_settings_as_before():
    """The values the services derived from the settings before they took configs."""
    s = Settings(
        engine_lease_seconds=12.0,
        maintenance_interval_seconds=7.0,
        retention_instances_seconds=100.0,
        retention_job_ids_seconds=200.0,
        retention_partition_seconds=7200.0,
        retention_partitions_ahead=4,
        retention_operator_actions_seconds=300.0,
    )
    c = engine_configs(s)
    assert c.lease_keeper == LeaseKeeperConfig(lease_seconds=12.0, heartbeat_seconds=4.0)
    assert c.rescuer == RescuerConfig(interval_seconds=6.0)
    assert c.maintenance == MaintenanceConfig(7.0, 100.0, 200.0, 7200.0, 4, 300.0)
    assert c.presence == PresenceConfig(interval_seconds=4.0)
    assert c.scheduler == SchedulerConfig(interval_seconds=1.0, grace_seconds=60.0)
    assert c.batcher == BatcherConfig(writers=3, max_batch=1000)
    # A short (test) lease: the rescuer still waits a second between passes.
    assert engine_configs(Settings(engine_lease_seconds=0.6)).rescuer.interval_seconds == 1.0


def test_a_bad_value_that_skipped_the_settings_checks_is_refused_by_its_config():
    """``model_copy(update=...)`` (the tests' and the harness's way) does not validate."""
    s = Settings().model_copy(update={"retention_partitions_ahead": 0})
    with pytest.raises(ConfigurationError, match=r"MaintenanceConfig\.partitions_ahead"):
        engine_configs(s)


def test_the_worker_s_lag_monitor_watches_its_group_on_the_jobs_topic():
    s = Settings(kafka_bootstrap_servers="k:1", consumer_group="g", jobs_topic="t")
    assert lag_monitor_config(s) == LagMonitorConfig("k:1", "g", "t", interval_seconds=5.0)


def test_the_relay_waits_the_short_interval_after_a_light_round_and_the_long_one_under_load():
    from workflow_engine.engine.configs import relay_config
    from workflow_engine.engine.relay import OutboxRelay

    s = Settings(
        events_relay_interval_seconds=0.02,
        events_relay_busy_interval_seconds=0.1,
        events_relay_busy_round=32,
    )
    relay = OutboxRelay(db=None, config=relay_config(s))  # type: ignore[arg-type]
    assert [relay.pause_after(n) for n in (0, 1, 31)] == [0.02, 0.02, 0.02]
    assert [relay.pause_after(n) for n in (32, 500, 1999)] == [0.1, 0.1, 0.1]
    # judged by the rate: 40 events over 25 ms (1,600/s) is load, and so is 168 over the
    # long pause's 105 ms; 60 over 105 ms (~570/s) is not, though a round of 60 is over 32
    assert relay.pause_after(40, 0.025) == 0.1
    assert relay.pause_after(168, 0.105) == 0.1
    assert relay.pause_after(60, 0.105) == 0.02
    assert relay.pause_after(20, 0.025) == 0.02


def test_the_relays_long_pause_cannot_be_shorter_than_its_short_one():
    from workflow_engine.engine.relay import RelayConfig

    with pytest.raises(ConfigurationError, match="must not be shorter than interval_seconds"):
        RelayConfig(
            "127.0.0.1:9092", "onceflow.events", interval_seconds=0.5, busy_interval_seconds=0.1
        )
    RelayConfig(
        "127.0.0.1:9092", "onceflow.events", interval_seconds=0.1, busy_interval_seconds=0.1
    )


@pytest.mark.parametrize("field", ["busy_interval_seconds", "busy_round"])
def test_the_relays_busy_pacing_must_be_above_zero(field):
    from workflow_engine.engine.relay import RelayConfig

    with pytest.raises(ConfigurationError, match=rf"RelayConfig\.{field} must be above zero"):
        RelayConfig("127.0.0.1:9092", "onceflow.events", **{field: 0})
