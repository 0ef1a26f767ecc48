"""A real webhook receiver for the tests: an HTTP server on loopback, in a thread.

It answers from a script (one behaviour per request, the last repeated), keeps every
request (headers, body) and counts every connection it accepted, so a test can say
"never contacted" by a count that would have moved."""

from __future__ import annotations

import threading
import time
from dataclasses import dataclass, field
from http.server import BaseHTTPRequestHandler, ThreadingHTTPServer
from typing import Any


@dataclass(frozen=True)
class Answer:
    status: int = 200
    hang_seconds: float = 0.0  # wait this long before answering (a hanging receiver)
    location: str | None = None  # a redirect's target


@dataclass
class Received:
    path: str
    headers: dict[str, str]
    body: bytes


@dataclass
class Receiver:
    script: list[Answer] = field(default_factory=lambda: [Answer()])
    requests: list[Received] = field(default_factory=list)
    connections: int = 0
    lock: threading.Lock = field(default_factory=threading.Lock)
    server: ThreadingHTTPServer | None = None
    released: threading.Event = field(default_factory=threading.Event)

    @property
    def port(self) -> int:
        assert self.server is not None
        return self.server.server_address[1]

    @property
    def url(self) -> str:
        return f"http://127.0.0.1:{self.port}/hooks"

    def answer_for(self, n: int) -> Answer:
        return self.script[min(n, len(self.script) - 1)]

    def count(self) -> int:
        with self.lock:
            return len(self.requests)

    def stop(self) -> None:
        self.released.set()  # a hanging answer ends now
        if self.server is not None:
            self.server.shutdown()
            self.server.server_close()


def start_receiver(script: list[Answer] | None = None) -> Receiver:
    receiver = Receiver(script or [Answer()])

    class Handler(BaseHTTPRequestHandler):
        def do_POST(self) -> None:
            body = self.rfile.read(int(self.headers.get("content-length", "0")))
            with receiver.lock:
                n = len(receiver.requests)
                receiver.requests.append(
                    Received(self.path, {k.lower(): v for k, v in self.headers.items()}, body)
                )
            answer = receiver.answer_for(n)
            if answer.hang_seconds:
                receiver.released.wait(answer.hang_seconds)
            self.send_response(answer.status)
            if answer.location:
                self.send_header("location", answer.location)
            self.send_header("content-length", "2")
            self.end_headers()
            self.wfile.write(b"ok")

        def log_message(self, format: str, *args: Any) -> None:
            pass

    class Server(ThreadingHTTPServer):
        daemon_threads = True

        def verify_request(self, request: Any, client_address: Any) -> bool:
            with receiver.lock:
                receiver.connections += 1
            return True

    receiver.server = Server(("127.0.0.1", 0), Handler)
    threading.Thread(target=receiver.server.serve_forever, daemon=True).start()
    return receiver


def wait_for(condition: Any, timeout: float = 20.0, what: str = "condition") -> Any:
    """Poll ``condition()`` until it returns something truthy; that value."""
    deadline = time.monotonic() + timeout
    while time.monotonic() < deadline:
        value = condition()
        if value:
            return value
        time.sleep(0.05)
    raise AssertionError(f"{what} not reached within {timeout} s")
