"""One small HTTP server per process, on its metrics port: ``/metrics`` (Prometheus),
``/healthz`` (the process is alive), ``/readyz`` (the dependencies it needs to do its
job answer) and ``/readyz/details`` (every dependency it talks to, with its state and
whether readiness depends on it).

Readiness means "can do my job", so each process names only what it cannot work
without (docs/operations.md): ingest Kafka (not PostgreSQL: the queue exists for the
database's outages), the streams worker Kafka and PostgreSQL, the engine PostgreSQL.
Other dependencies are ``informational``: listed in the details, never failing a probe.

Kept apart from the ingest API port, so that probes and scrapes are never throttled or
authenticated like job submissions, and never compete with them. Errors (404, 503)
have the API's one error shape: ``error``, ``message``, ``fields``, ``accepted``,
``rejected``, ``details``.
"""

from __future__ import annotations

import json
import logging
import threading
import time
from collections.abc import Callable
from http.server import BaseHTTPRequestHandler, ThreadingHTTPServer

from prometheus_client import CONTENT_TYPE_LATEST, generate_latest

log = logging.getLogger(__name__)

ReadinessCheck = Callable[[], dict[str, bool]]


class _Readiness:
    """Caches the readiness answer briefly so frequent probes do not hammer Kafka/Postgres."""

    def __init__(self, check: ReadinessCheck, ttl: float = 2.0) -> None:
        self.check = check
        self.ttl = ttl
        self._at = 0.0
        self._value: dict[str, bool] = {}
        self._lock = threading.Lock()

    def get(self) -> dict[str, bool]:
        with self._lock:
            if time.monotonic() - self._at > self.ttl:
                try:
                    self._value = self.check()
                except Exception:
                    log.exception("readiness check failed", extra={"event": "health.error"})
                    self._value = {"check": False}
                self._at = time.monotonic()
            return dict(self._value)


def _error(error: str, message: str, details: dict[str, str] | None = None) -> bytes:
    """The API's one error shape (producers.models.ErrorBody), spelled out here: the
    core layer does not import the ingest package."""
    body = {
        "error": error,
        "message": message,
        "fields": [],
        "accepted": [],
        "rejected": [],
        "details": details or {},
    }
    return json.dumps(body).encode()


def _word(ok: bool) -> str:
    return "ok" if ok else "unavailable"


def serve_metrics_and_health(
    port: int,
    ready: ReadinessCheck,
    host: str = "0.0.0.0",
    *,
    informational: ReadinessCheck | None = None,
    on_state: Callable[[dict[str, bool]], None] | None = None,
) -> ThreadingHTTPServer:
    """Serve the probes and ``/metrics``. ``ready`` checks what the process needs;
    ``informational`` what it only reports. ``on_state`` sees every fresh answer of
    both (e.g. to set gauges); when given, a scrape refreshes them first (cached)."""
    server = _Server((host, port), _Probes(ready, informational, on_state))
    server.daemon_threads = True
    threading.Thread(target=server.serve_forever, name="metrics-http", daemon=True).start()
    return server


class _Probes:
    """The answers of the readiness checks (required and informational), cached."""

    def __init__(
        self,
        ready: ReadinessCheck,
        informational: ReadinessCheck | None,
        on_state: Callable[[dict[str, bool]], None] | None,
    ) -> None:
        self.readiness = _Readiness(ready)
        self.info = _Readiness(informational or dict)
        self.on_state = on_state

    def state(self) -> tuple[dict[str, bool], dict[str, bool]]:
        required, optional = self.readiness.get(), self.info.get()
        if self.on_state is not None:
            self.on_state({**optional, **required})
        return required, optional


class _Server(ThreadingHTTPServer):
    """The HTTP server of one process's probes (``_Handler`` reads them here)."""

    def __init__(self, address: tuple[str, int], probes: _Probes) -> None:
        super().__init__(address, _Handler)
        self.probes = probes


class _Handler(BaseHTTPRequestHandler):
    server: _Server

    def do_GET(self) -> None:
        probes = self.server.probes
        path = self.path.split("?")[0]
        if path == "/metrics":
            if probes.on_state is not None:
                probes.state()
            self._send(200, generate_latest(), CONTENT_TYPE_LATEST)
        elif path == "/healthz":
            self._send(200, b'{"status":"ok"}')
        elif path == "/readyz":
            self._readyz(probes.state()[0])
        elif path == "/readyz/details":
            self._details(*probes.state())
        else:
            message = "no such path: /metrics, /healthz, /readyz, /readyz/details"
            self._send(404, _error("not_found", message))

    def _readyz(self, required: dict[str, bool]) -> None:
        if required and all(required.values()):
            self._send(200, json.dumps(dict.fromkeys(required, "ok")).encode())
            return
        down = sorted(k for k, v in required.items() if not v) or ["readiness check"]
        self._send(
            503,
            _error(
                "not_ready",
                f"not ready: {', '.join(down)} unavailable",
                {k: _word(v) for k, v in required.items()},
            ),
        )

    def _details(self, required: dict[str, bool], optional: dict[str, bool]) -> None:
        deps = {k: {"state": _word(v), "required": False} for k, v in optional.items()}
        deps.update({k: {"state": _word(v), "required": True} for k, v in required.items()})
        ok = bool(required) and all(required.values())
        self._send(200, json.dumps({"ready": ok, "dependencies": deps}).encode())

    def _send(self, status: int, body: bytes, ctype: str = "application/json") -> None:
        self.send_response(status)
        self.send_header("Content-Type", ctype)
        self.send_header("Content-Length", str(len(body)))
        self.end_headers()
        self.wfile.write(body)

    def log_message(self, format: str, *args: object) -> None:  # quiet access log
        return
