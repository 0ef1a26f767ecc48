"""Running the ingest service: uvicorn for the API, a separate port for metrics."""

from __future__ import annotations

import signal
import socket
import sys
from http.server import ThreadingHTTPServer

import uvicorn

from onceflow import tracing
from onceflow.health import serve_metrics_and_health
from onceflow.heap import INGEST_YOUNG_THRESHOLD, settle_heap
from onceflow.logs import setup_logging
from onceflow.settings import Settings
from onceflow.vocabulary import Process
from producers.api import IngestFront, create_app, ingest_registry
from producers.kafka import JobProducer, JobSender
from producers.metrics import DEPENDENCY_UP
from workflow_engine.store import database_ready


def serve(settings: Settings) -> None:
    setup_logging(settings.log_level, settings.log_format, Process.INGEST)
    tracing.setup(settings, Process.INGEST)

    producer = JobProducer(settings)
    start_probe_server(settings, producer)
    # uvicorn drains on SIGTERM/SIGINT (stops accepting, finishes requests, runs the
    # lifespan shutdown that flushes the producer), then re-raises the signal against
    # the handler found at start. A no-op handler there makes a clean drain exit 0.
    for sig in (signal.SIGTERM, signal.SIGINT):
        signal.signal(sig, lambda *_: None)
    app = create_app(settings, producer, ingest_registry(settings))
    # Everything built so far (the app, its models, the producer) lives for the whole
    # process: out of the collector's sight, so the full collections that the
    # per-request garbage triggers do not scan it (they showed up as p99 spikes).
    settle_heap(INGEST_YOUNG_THRESHOLD)
    config = uvicorn.Config(
        app,
        host=settings.ingest_host,
        port=settings.ingest_port,
        log_config=None,
        # uvloop and httptools (C) instead of asyncio's loop and h11 (pure Python):
        # a single-job POST went from 0.95-1.5 to 0.77-1.03 ms of process CPU
        # (BENCHMARKS.md, "Single-job requests: where the time goes"). No access log:
        # the job.accepted line is the request's trail.
        loop="uvloop",
        http="httptools",
        access_log=False,
        timeout_graceful_shutdown=30,
    )
    _front_first(config, app)
    server = IngestServer(config, app)
    if settings.ingest_reuse_port:
        server.run(sockets=[reuse_port_socket(settings.ingest_host, settings.ingest_port)])
    else:
        server.run()
    if not server.started:  # as uvicorn.run: it could not start (e.g. port in use)
        sys.exit(3)


class IngestServer(uvicorn.Server):
    """uvicorn's server, which on SIGTERM first lets every request waiting for its jobs'
    outcome (``Prefer: wait``) go with its 202 (the jobs are in Kafka): uvicorn's drain
    waits for open requests, and a wait may be longer than its grace."""

    def __init__(self, config: uvicorn.Config, app: IngestFront) -> None:
        super().__init__(config)
        self.front = app

    async def shutdown(self, sockets: list[socket.socket] | None = None) -> None:
        waiters = self.front.state.ingest.waiters
        if waiters is not None:
            waiters.close()
        await super().shutdown(sockets)


def _front_first(config: uvicorn.Config, app: IngestFront) -> None:
    """Serve ``app`` as it is, with uvicorn's proxy-headers middleware (the same, with
    the same trusted addresses) inside it, around what reads the peer address
    (:meth:`IngestFront.trust_proxies`), rather than around the whole app."""
    app.trust_proxies(config.forwarded_allow_ips)
    config.proxy_headers = False


def reuse_port_socket(host: str, port: int) -> socket.socket:
    """The listening socket of one of several ingest processes sharing ``port``
    (``ONCEFLOW_INGEST_REUSE_PORT``): the kernel spreads new connections over them."""
    family = socket.AF_INET6 if ":" in host else socket.AF_INET
    sock = socket.socket(family, socket.SOCK_STREAM)
    sock.setsockopt(socket.SOL_SOCKET, socket.SO_REUSEADDR, 1)
    sock.setsockopt(socket.SOL_SOCKET, socket.SO_REUSEPORT, 1)
    sock.bind((host, port))
    sock.set_inheritable(True)
    return sock


def start_probe_server(
    settings: Settings, producer: JobSender, host: str = "0.0.0.0"
) -> ThreadingHTTPServer:
    """The metrics port's probes. Ready means Kafka answers, nothing else: submissions
    need only Kafka, and an ingest pulled from service while PostgreSQL is down would
    drop the very buffer that outage needs. PostgreSQL (the admin API's, when enabled)
    is reported in ``/readyz/details`` and ``onceflow_ingest_dependency_up``."""

    def optional() -> dict[str, bool]:
        if not settings.admin_api_enabled:
            return {}
        return {"postgres": database_ready(settings.database_url)}

    def gauges(state: dict[str, bool]) -> None:
        # "kafka" is the producer's connection, set by its BrokerLink as it changes.
        for dependency, up in state.items():
            if dependency != "kafka":
                DEPENDENCY_UP.labels(dependency).set(1 if up else 0)

    return serve_metrics_and_health(
        settings.ingest_metrics_port,
        lambda: {"kafka": producer.ready()},
        host,
        informational=optional,
        on_state=gauges,
    )
