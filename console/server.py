"""Running the console: uvicorn for the pages, the probes and metrics on their own port."""

from __future__ import annotations

import signal
from http.server import ThreadingHTTPServer

import uvicorn

from console.app import create_app
from onceflow.health import serve_metrics_and_health
from onceflow.logs import setup_logging
from onceflow.settings import Settings
from onceflow.vocabulary import Process
from workflow_engine.store import database_ready


def serve(settings: Settings) -> None:
    setup_logging(settings.log_level, settings.log_format, Process.CONSOLE)
    app = create_app(settings)
    start_probe_server(settings)
    # As ingest: uvicorn drains on SIGTERM/SIGINT and re-raises the signal against the
    # handler found at start; a no-op handler there makes a clean drain exit 0.
    for sig in (signal.SIGTERM, signal.SIGINT):
        signal.signal(sig, lambda *_: None)
    uvicorn.run(
        app,
        host=settings.console_host,
        port=settings.console_port,
        log_config=None,
        access_log=False,
        timeout_graceful_shutdown=15,
    )


def start_probe_server(settings: Settings, host: str = "0.0.0.0") -> ThreadingHTTPServer:
    """Ready means PostgreSQL answers: every page reads it. Kafka (the lag and the
    dead letters) is informational: without it the rest of the console still works."""

    def kafka() -> dict[str, bool]:
        from onceflow.errors import ServiceUnavailable
        from onceflow.lag import consumer_lag

        try:
            consumer_lag(
                settings.kafka_bootstrap_servers, settings.consumer_group, settings.jobs_topic, 3.0
            )
            return {"kafka": True}
        except ServiceUnavailable:
            return {"kafka": False}

    return serve_metrics_and_health(
        settings.console_metrics_port,
        lambda: {"postgres": database_ready(settings.database_url)},
        host,
        informational=kafka,
    )
