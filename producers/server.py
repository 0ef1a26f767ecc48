"""Running the ingest service: uvicorn for the API, a separate port for metrics."""

from __future__ import annotations

import uvicorn
from prometheus_client import start_http_server

from onceflow.logs import setup_logging
from onceflow.settings import Settings
from producers.api import create_app


def serve(settings: Settings) -> None:
    setup_logging(settings.log_level, settings.log_format, "ingest")
    start_http_server(settings.ingest_metrics_port, addr="0.0.0.0")
    uvicorn.run(
        create_app(settings),
        host=settings.ingest_host,
        port=settings.ingest_port,
        log_config=None,
        access_log=False,
        timeout_graceful_shutdown=30,
    )
