"""``onceflow dev up`` with its ports already taken says which port, by which process,
and what to do (issue 23: a second checkout's ``dev up`` while the first one's services
held the ports failed with "pg_ctl failed: Examine the log output."). The ports are
bound here first, by this process or by a stand-in for another checkout's service."""

from __future__ import annotations

import os
import shutil
import socket
import subprocess
import sys
from collections.abc import Iterator
from pathlib import Path

import pytest

from onceflow.errors import ServiceUnavailable
from onceflow_tools.dev.ports import STATE_DIR_MARKER
from onceflow_tools.dev.services import KafkaService, PostgresService
from onceflow_tools.processes import free_port

# Listens on argv[1] and waits; the other arguments only make its command line look
# like a dev service's (what dev.ports reads to tell whose it is).
_LISTENER = (
    "import socket, sys, time\n"
    "s = socket.socket(); s.setsockopt(socket.SOL_SOCKET, socket.SO_REUSEADDR, 1)\n"
    "s.bind(('127.0.0.1', int(sys.argv[1]))); s.listen()\n"
    "print('listening', flush=True); time.sleep(120)\n"
)


@pytest.fixture
def listener() -> Iterator:
    procs: list[subprocess.Popen] = []

    def start(port: int, *argv: str) -> int:
        proc = subprocess.Popen(
            [sys.executable, "-c", _LISTENER, str(port), *argv],
            stdout=subprocess.PIPE,
            text=True,
        )
        procs.append(proc)
        assert proc.stdout is not None and proc.stdout.readline().strip() == "listening"
        return proc.pid

    yield start
    for proc in procs:
        proc.kill()
        proc.wait()


def test_postgres_port_held_by_a_process_not_ours_is_named_before_anything_starts(tmp_path):
    port = free_port()
    with socket.socket() as held:
        held.bind(("127.0.0.1", port))
        held.listen()
        service = PostgresService(tmp_path / ".onceflow", port)
        with pytest.raises(ServiceUnavailable) as info:
            service.up()
    said = str(info.value)
    assert said.startswith(f"port {port} (PostgreSQL) is taken by pid {os.getpid()} (")
    assert "onceflow did not start" in said and "stop it" in said
    assert not (service.root / "data").exists()  # no initdb, no pg_ctl


def test_another_checkouts_kafka_is_named_with_how_to_proceed(tmp_path, listener):
    other = tmp_path / "first" / ".onceflow"
    port = free_port()
    pid = listener(port, str(other / "kafka" / "server.properties"))
    with pytest.raises(ServiceUnavailable) as info:
        KafkaService(tmp_path / "second" / ".onceflow", port, free_port()).up()
    said = str(info.value)
    assert f"port {port} (Kafka) is taken by pid {pid} (" in said
    assert f"the dev services of another checkout (state directory {other})" in said
    assert f"`ONCEFLOW_STATE_DIR={other} onceflow dev down`" in said
    assert 'eval "$(onceflow dev env)"' in said


def test_another_checkouts_postgres_is_told_by_its_data_directory(tmp_path, listener):
    other = tmp_path / "first" / ".onceflow"
    cluster = tmp_path / "pg-of-first"
    cluster.mkdir()
    (cluster / STATE_DIR_MARKER).write_text(f"{other}\n")
    port = free_port()
    pid = listener(port, "-D", str(cluster / "data"))
    with pytest.raises(ServiceUnavailable) as info:
        PostgresService(tmp_path / "second" / ".onceflow", port).up()
    said = str(info.value)
    assert f"port {port} (PostgreSQL) is taken by pid {pid} (" in said
    assert f"(state directory {other})" in said


class _Stopped(Exception):
    pass


def _stop(*args, **kwargs):
    raise _Stopped


def test_up_leaves_the_marker_that_names_its_state_dir(tmp_path, monkeypatch):
    """What the second checkout reads: written by the first one's ``dev up`` (its
    server already running here, and the wait for it stubbed out)."""
    service = PostgresService(tmp_path / ".onceflow", free_port())
    monkeypatch.setattr(PostgresService, "bindir", lambda self: Path("/nonexistent"))
    monkeypatch.setattr(PostgresService, "running", lambda self: True)
    monkeypatch.setattr("onceflow_tools.dev.services._wait_until", _stop)
    try:
        (service.root / "data").mkdir(parents=True)
        (service.root / "data" / "PG_VERSION").write_text("17\n")
        with pytest.raises(_Stopped):
            service.up()
        marker = service.root / STATE_DIR_MARKER
        assert marker.read_text().strip() == str((tmp_path / ".onceflow").resolve())
    finally:
        shutil.rmtree(service.root, ignore_errors=True)  # as root: under /var/tmp


def test_a_dev_postgres_from_before_the_marker_is_still_told_for_what_it_is(tmp_path, listener):
    data = tmp_path / "onceflow-postgres-0123456789ab" / "data"
    port = free_port()
    listener(port, "-D", str(data))
    with pytest.raises(ServiceUnavailable) as info:
        PostgresService(tmp_path / "second" / ".onceflow", port).up()
    assert f"the dev PostgreSQL of another checkout (data in {data.parent})" in str(info.value)
