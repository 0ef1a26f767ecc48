"""Running the streams worker process: one Faust app, built from the settings given."""

from __future__ import annotations

import asyncio
import logging
from concurrent.futures import ThreadPoolExecutor
from typing import Any

import faust

from onceflow import tracing
from onceflow.health import serve_metrics_and_health
from onceflow.settings import Settings
from onceflow.vocabulary import Process
from streams import agents
from streams.app import create_app
from streams.metrics import ASSIGNED_PARTITIONS, REBALANCES
from streams.monitor import LagMonitor, LagMonitorConfig
from workflow_engine.store import database_ready


def _logging_config(settings: Settings) -> dict[str, Any]:
    return {
        "version": 1,
        "disable_existing_loggers": False,
        "formatters": {
            "json": {
                "()": "onceflow.logs.JsonFormatter",
                "process_name": Process.WORKER.value,
            },
            "text": {"format": "%(asctime)s %(levelname)s %(name)s: %(message)s"},
        },
        "handlers": {
            "stderr": {"class": "logging.StreamHandler", "formatter": settings.log_format}
        },
        "root": {"level": settings.log_level.upper(), "handlers": ["stderr"]},
        "loggers": {name: {"level": "WARNING"} for name in ("aiokafka", "faust", "mode")},
    }


def lag_monitor_config(settings: Settings) -> LagMonitorConfig:
    """The lag monitor's config: the one place its settings are read."""
    return LagMonitorConfig(
        bootstrap_servers=settings.kafka_bootstrap_servers,
        consumer_group=settings.consumer_group,
        topic=settings.jobs_topic,
    )


def run_worker(settings: Settings) -> None:
    """Build the app, its topic and agent from ``settings``, and run until stopped."""
    tracing.setup(settings, Process.WORKER)
    app = create_app(settings)
    agents.register(app, settings)
    _count_rebalances(app, settings)
    monitor = LagMonitor(lag_monitor_config(settings)).start()
    serve_metrics_and_health(
        settings.streams_metrics_port,
        lambda: {
            "kafka": monitor.broker_answering(),
            "postgres": database_ready(settings.database_url),
        },
    )
    loop = asyncio.new_event_loop()
    asyncio.set_event_loop(loop)
    loop.set_default_executor(ThreadPoolExecutor(max_workers=settings.streams_concurrency + 4))
    worker = faust.Worker(
        app,
        loop=loop,
        loglevel=settings.log_level.upper(),
        logging_config=_logging_config(settings),
        quiet=True,
    )
    logging.getLogger(__name__).info("streams worker starting", extra={"event": "streams.starting"})
    worker.execute_from_commandline()


def _count_rebalances(app: faust.App, settings: Settings) -> None:
    """Count rebalances and show which partitions of the jobs topic this worker holds."""

    async def on_assigned(sender: Any, assigned: Any = (), **kwargs: Any) -> None:
        REBALANCES.inc()
        ASSIGNED_PARTITIONS.clear()
        for tp in assigned:
            if tp.topic == settings.jobs_topic:
                ASSIGNED_PARTITIONS.labels(str(tp.partition)).set(1)

    # mode's SignalHandlerT annotation is stricter than what it calls handlers with.
    app.on_partitions_assigned.connect(on_assigned)  # type: ignore[arg-type]
