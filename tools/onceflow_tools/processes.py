"""Starting onceflow's own processes as subprocesses (the demo and acceptance tests)."""

from __future__ import annotations

import os
import signal
import socket
import subprocess
import sys
import time
from pathlib import Path

import httpx

from onceflow.errors import ServiceUnavailable


def free_port() -> int:
    with socket.socket() as sock:
        sock.bind(("127.0.0.1", 0))
        return sock.getsockname()[1]


def onceflow_command(failpoints: str = "") -> list[str]:
    """The ``onceflow`` entry point of the running interpreter's environment; with
    ``failpoints`` (``name=action[@job_id][*times],...``), the test launcher that arms
    them in the process first (:mod:`onceflow_tools.failpoint_main`)."""
    if failpoints:
        launcher = "onceflow_tools.failpoint_main"
        return [sys.executable, "-m", launcher, "--failpoints", failpoints, "--"]
    return [sys.executable, "-m", "onceflow_cli"]


class ProcessGroup:
    """Named subprocesses with their logs in files; stopped together."""

    def __init__(self, env: dict[str, str], log_dir: Path) -> None:
        self.env = {**os.environ, **env}
        self.log_dir = log_dir
        self.log_dir.mkdir(parents=True, exist_ok=True)
        self.procs: dict[str, subprocess.Popen] = {}

    def start(
        self,
        name: str,
        *args: str,
        env: dict[str, str] | None = None,
        module: str | None = None,
        failpoints: str = "",
    ) -> subprocess.Popen:
        """Start ``onceflow <args>`` (or ``python -m <module> <args>``) as ``name``;
        ``failpoints`` armed in it (:func:`onceflow_command`)."""
        log = open(self.log_dir / f"{name}.log", "ab")  # noqa: SIM115 (kept open for the child)
        command = [sys.executable, "-m", module] if module else onceflow_command(failpoints)
        proc = subprocess.Popen(
            [*command, *args],
            env={**self.env, **(env or {})},
            stdout=log,
            stderr=subprocess.STDOUT,
            stdin=subprocess.DEVNULL,
            start_new_session=True,
        )
        self.procs[name] = proc
        return proc

    def check_alive(self) -> None:
        for name, proc in self.procs.items():
            if proc.poll() is not None:
                tail = self.tail(name)
                raise ServiceUnavailable(f"{name} exited with code {proc.returncode}:\n{tail}")

    def tail(self, name: str, lines: int = 20) -> str:
        path = self.log_dir / f"{name}.log"
        if not path.exists():
            return ""
        return "\n".join(path.read_text(errors="replace").splitlines()[-lines:])

    def wait_http(self, url: str, timeout: float = 60.0) -> None:
        deadline = time.monotonic() + timeout
        while time.monotonic() < deadline:
            self.check_alive()
            try:
                if httpx.get(url, timeout=1.0).status_code == 200:
                    return
            except httpx.HTTPError:
                pass
            time.sleep(0.2)
        raise ServiceUnavailable(f"{url} not ready after {timeout:.0f}s")

    def stop(self, name: str, sig: int = signal.SIGTERM, timeout: float = 30.0) -> int | None:
        proc = self.procs.pop(name, None)
        if proc is None:
            return None
        if proc.poll() is None:
            proc.send_signal(sig)
            try:
                proc.wait(timeout)
            except subprocess.TimeoutExpired:
                proc.kill()
                proc.wait()
        return proc.returncode

    def stop_all(self, timeout: float = 30.0) -> None:
        for name in list(self.procs):
            self.stop(name, timeout=timeout)

    def __enter__(self) -> ProcessGroup:
        return self

    def __exit__(self, *exc: object) -> None:
        self.stop_all()
