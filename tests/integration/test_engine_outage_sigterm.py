"""An engine cut off from PostgreSQL mid-run (its claims, writes and give-backs all
failing and retried) still stops on SIGTERM within its grace (half a lease; issue 23:
a process that is retrying still stops on SIGTERM)."""

from __future__ import annotations

import contextlib
import signal
import socket
import threading
import time
from urllib.parse import urlsplit

import pytest
import sqlalchemy as sa

from onceflow.envelope import JobEnvelope
from onceflow_tools.processes import ProcessGroup, free_port
from tests.conftest import settings_env
from workflow_engine.model import Delivery
from workflow_engine.store.writes import create_instances


class Cuttable:
    """A TCP proxy on loopback in front of PostgreSQL that can be cut: every
    connection dropped and new ones refused, as in an outage."""

    def __init__(self, target: tuple[str, int]) -> None:
        self.target = target
        self.port = free_port()
        self._server = socket.create_server(("127.0.0.1", self.port))
        self._conns: list[socket.socket] = []
        self._lock = threading.Lock()
        threading.Thread(target=self._accept, daemon=True).start()

    def _accept(self) -> None:
        while True:
            try:
                client, _ = self._server.accept()
            except OSError:
                return
            upstream = socket.create_connection(self.target)
            with self._lock:
                self._conns += [client, upstream]
            for a, b in ((client, upstream), (upstream, client)):
                threading.Thread(target=self._pipe, args=(a, b), daemon=True).start()

    @staticmethod
    def _pipe(src: socket.socket, dst: socket.socket) -> None:
        with contextlib.suppress(OSError):
            while data := src.recv(65536):
                dst.sendall(data)
        with contextlib.suppress(OSError):
            dst.shutdown(socket.SHUT_RDWR)

    def cut(self) -> None:
        self._server.close()
        with self._lock:
            for conn in self._conns:
                with contextlib.suppress(OSError):
                    conn.shutdown(socket.SHUT_RDWR)
                conn.close()


def _status_counts(db) -> dict[str, int]:
    with db.connect() as conn:
        rows = conn.execute(sa.text("SELECT status, count(*) FROM onceflow_instances GROUP BY 1"))
        return dict(rows.all())


@pytest.mark.timeout(120)
def test_an_engine_retrying_through_an_outage_stops_on_sigterm(settings, db, db_url, tmp_path):
    parts = urlsplit(db_url)
    proxy = Cuttable((parts.hostname or "127.0.0.1", parts.port or 5432))
    via_proxy = db_url.replace(f"{parts.hostname}:{parts.port}", f"127.0.0.1:{proxy.port}")
    lease = 6.0
    create_instances(
        db,
        [
            Delivery(JobEnvelope(f"out_{i}", "order-workflow", {"step_seconds": 0.5}), "t", 0, i)
            for i in range(8)
        ],
    )
    env = {
        **settings_env(settings),
        "ONCEFLOW_DATABASE_URL": via_proxy + "?connect_timeout=2",
        "ONCEFLOW_ENGINE_LEASE_SECONDS": str(lease),
        "ONCEFLOW_ENGINE_POLL_INTERVAL_SECONDS": "0.2",
    }
    with ProcessGroup(env, tmp_path / "logs") as group:
        group.start("engine", "engine", env={"ONCEFLOW_ENGINE_METRICS_PORT": str(free_port())})
        deadline = time.monotonic() + 30
        while _status_counts(db).get("running", 0) == 0:
            assert time.monotonic() < deadline, "the engine claimed nothing"
            group.check_alive()
            time.sleep(0.05)
        proxy.cut()  # the outage: every write, claim and give-back now fails
        time.sleep(1.0)  # long enough for its runs to meet it and start retrying
        group.check_alive()
        started = time.monotonic()
        code = group.stop("engine", signal.SIGTERM, timeout=lease + 20)
        took = time.monotonic() - started
    log = (tmp_path / "logs" / "engine.log").read_text()
    assert "engine.claim_error" in log or "instance.crashed" in log  # it met the outage
    assert "engine.stopped" in log, log[-2000:]  # a clean stop, not the test's SIGKILL
    assert took < lease / 2 + 5, f"took {took:.1f} s to stop; the grace is {lease / 2} s"
    assert code is not None and code != -signal.SIGKILL, code
