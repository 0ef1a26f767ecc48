"""One small HTTP server per process, on its metrics port: ``/metrics`` (Prometheus),
``/healthz`` (the process is alive) and ``/readyz`` (its dependencies answer).

Kept apart from the ingest API port, so that probes and scrapes are never throttled or
authenticated like job submissions, and never compete with them.
"""

from __future__ import annotations

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


def serve_metrics_and_health(
    port: int, ready: ReadinessCheck, host: str = "0.0.0.0"
) -> ThreadingHTTPServer:
    readiness = _Readiness(ready)

    class Handler(BaseHTTPRequestHandler):
        def do_GET(self) -> None:
            path = self.path.split("?")[0]
            if path == "/metrics":
                self._send(200, generate_latest(), CONTENT_TYPE_LATEST)
            elif path == "/healthz":
                self._send(200, b'{"status":"ok"}')
            elif path == "/readyz":
                state = readiness.get()
                ok = bool(state) and all(state.values())
                body = ",".join(f'"{k}":"{"ok" if v else "unavailable"}"' for k, v in state.items())
                self._send(200 if ok else 503, ("{" + body + "}").encode())
            else:
                self._send(404, b'{"error":"not_found"}')

        def _send(self, status: int, body: bytes, ctype: str = "application/json") -> None:
            self.send_response(status)
            self.send_header("Content-Type", ctype)
            self.send_header("Content-Length", str(len(body)))
            self.end_headers()
            self.wfile.write(body)

        def log_message(self, format: str, *args: object) -> None:  # quiet access log
            return

    server = ThreadingHTTPServer((host, port), Handler)
    server.daemon_threads = True
    threading.Thread(target=server.serve_forever, name="metrics-http", daemon=True).start()
    return server
