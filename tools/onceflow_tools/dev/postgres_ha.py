"""``onceflow dev up --postgres-ha``: PostgreSQL with a synchronous standby and automatic
failover, on loopback, with pg_auto_failover (Debian's ``postgresql-<major>-auto-failover``,
installed with apt-get when missing, like the server itself).

Three ``pg_autoctl`` services, each in its own session: a monitor (25440) and two data
nodes (25441, 25442), clear of the single dev server on 15432 so both run side by side.
The second node is cloned from the first (``pg_basebackup``) and becomes its synchronous
standby: pg_auto_failover sets ``synchronous_standby_names = 'ANY 1 (…)'`` on the primary,
so a commit returns only once the standby has the WAL (``synchronous_commit = on``).
Clients connect with a multi-host URL and ``target_session_attrs=read-write``; libpq
finds whichever node is the primary now.

Timeouts: pg_auto_failover's defaults take ~35 s to fail over (20 s before a node is
unhealthy, then 30 s ``primary_demote_timeout`` for the old primary to demote itself).
The dev formation shortens them (below) to a few seconds; the demote timeout stays above
the keepers' ``network_partition_timeout``, the order that prevents two primaries.
docs/operations.md, "PostgreSQL high availability", says what to use in production.
"""

from __future__ import annotations

import contextlib
import hashlib
import logging
import os
import shutil
import signal
import subprocess
import time
from dataclasses import dataclass
from pathlib import Path

from onceflow.errors import ServiceUnavailable
from onceflow_tools.dev.services import (
    PostgresService,
    _apt_install,
    _pid_alive,
    _port_open,
    _wait_until,
)

log = logging.getLogger(__name__)

HA_DIR = "postgres-ha"
NODES = ("node1", "node2")

# The monitor's failure detection and the keepers' self-demotion (seconds or GUC text).
MONITOR_SETTINGS = {
    "pgautofailover.health_check_period": "1s",
    "pgautofailover.health_check_timeout": "1s",
    "pgautofailover.health_check_max_retries": "1",
    "pgautofailover.health_check_retry_delay": "500ms",
    "pgautofailover.node_considered_unhealthy_timeout": "3s",
    "pgautofailover.primary_demote_timeout": "4s",
}
NETWORK_PARTITION_TIMEOUT = 2  # keeper: demote myself when the monitor and standby are gone


@dataclass
class PostgresHA:
    state_dir: Path
    monitor_port: int = 25440
    node_ports: tuple[int, int] = (25441, 25442)
    database: str = "onceflow"

    # --- where things are -----------------------------------------------------------

    @property
    def root(self) -> Path:
        """``<state dir>/postgres-ha``; as root, the servers run as 'postgres', so if that
        user cannot reach the state directory, a private place under /var/tmp."""
        root = self.state_dir.resolve() / HA_DIR
        if os.geteuid() != 0 or _world_traversable(self.state_dir.resolve()):
            return root
        digest = hashlib.sha256(str(root).encode()).hexdigest()[:12]
        return Path("/var/tmp") / f"onceflow-postgres-ha-{digest}"

    def port(self, node: str) -> int:
        return self.node_ports[NODES.index(node)]

    @property
    def url(self) -> str:
        hosts = ",".join(f"127.0.0.1:{p}" for p in self.node_ports)
        return f"postgresql://postgres@{hosts}/{self.database}?target_session_attrs=read-write"

    @property
    def monitor_url(self) -> str:
        return f"postgresql://autoctl_node@127.0.0.1:{self.monitor_port}/pg_auto_failover?sslmode=disable"

    def _pgdata(self, name: str) -> Path:
        return self.root / name

    def _pidfile(self, name: str) -> Path:
        return self.root / f"{name}.pid"

    # --- commands -------------------------------------------------------------------

    def bindir(self) -> Path:
        return PostgresService(self.state_dir).bindir()

    def _pg_autoctl(self, *args: str) -> list[str]:
        """``pg_autoctl`` as the 'postgres' user, its config and state under the root."""
        if shutil.which("pg_autoctl") is None:
            major = self.bindir().parent.name
            _apt_install(f"postgresql-{major}-auto-failover")
        env = [
            "env",
            f"XDG_CONFIG_HOME={self.root / 'config'}",
            f"XDG_DATA_HOME={self.root / 'share'}",
            f"PATH={self.bindir()}:/usr/bin:/bin",
        ]
        cmd = [*env, "pg_autoctl", *args]
        return ["runuser", "-u", "postgres", "--", *cmd] if os.geteuid() == 0 else cmd

    def _sql(self, port: int, sql: str, database: str = "postgres") -> str:
        result = subprocess.run(
            [
                *(str(self.bindir() / "psql"), "-X", "-q", "-t", "-A", "-v", "ON_ERROR_STOP=1"),
                *("-h", "127.0.0.1", "-p", str(port), "-U", "postgres", "-d", database, "-c", sql),
            ],
            capture_output=True,
            text=True,
            check=False,
            timeout=10,
        )
        if result.returncode != 0:
            raise ServiceUnavailable(f"psql on port {port}: {result.stderr.strip()[:200]}")
        return result.stdout.strip()

    def _configured(self, name: str) -> bool:
        pgdata = self._pgdata(name).resolve()
        return (self.root / "config" / "pg_autoctl" / str(pgdata).lstrip("/")).exists()

    # --- state ----------------------------------------------------------------------

    def pid(self, name: str) -> int | None:
        """The session (process group) of one pg_autoctl service, if it runs."""
        pidfile = self._pidfile(name)
        if not pidfile.exists():
            return None
        pid = int(pidfile.read_text().strip() or 0)
        return pid if pid and _alive(pid) else None

    def states(self) -> dict[str, tuple[str, str]]:
        """Each data node's (reported, goal) state, as the monitor sees them."""
        try:
            rows = self._sql(
                self.monitor_port,
                "SELECT nodename, reportedstate, goalstate FROM pgautofailover.node",
                "pg_auto_failover",
            )
        except (ServiceUnavailable, subprocess.TimeoutExpired):
            return {}
        return {n: (r, g) for n, r, g in (line.split("|") for line in rows.splitlines())}

    def primary(self) -> str | None:
        """The node that accepts writes now (reported and goal 'primary' or 'wait_primary',
        or 'single' before the standby joined)."""
        writable = {"primary", "wait_primary", "single"}
        for name, (reported, goal) in self.states().items():
            if reported in writable and goal in writable:
                return name
        return None

    def ready(self) -> bool:
        """A primary and a synchronous standby in place, both seen healthy by the
        monitor (after a restart, the states it kept from before are stale)."""
        states = self.states()
        if sorted(states.values()) != [("primary", "primary"), ("secondary", "secondary")]:
            return False
        try:
            healthy = self._sql(
                self.monitor_port,
                "SELECT count(*) FROM pgautofailover.node WHERE health = 1",
                "pg_auto_failover",
            )
        except (ServiceUnavailable, subprocess.TimeoutExpired):
            return False
        return healthy == str(len(NODES))

    def writable(self) -> bool:
        """A write through the multi-host URL commits (whoever is primary)."""
        result = subprocess.run(
            [
                *(str(self.bindir() / "psql"), "-X", "-q", "-t", "-A", "-c", "SELECT 1"),
                self.url.replace("read-write", "read-write&connect_timeout=2"),
            ],
            capture_output=True,
            check=False,
            timeout=10,
        )
        return result.returncode == 0

    # --- start and stop -------------------------------------------------------------

    def _spawn(self, name: str, args: list[str]) -> subprocess.Popen:
        log_path = self.root / f"{name}.log"
        with open(log_path, "ab") as out:
            proc = subprocess.Popen(
                self._pg_autoctl(*args),
                stdout=out,
                stderr=subprocess.STDOUT,
                stdin=subprocess.DEVNULL,
                start_new_session=True,
            )
        self._pidfile(name).write_text(str(proc.pid))
        return proc

    def _prepare_root(self) -> None:
        self.root.mkdir(parents=True, exist_ok=True)
        for port in (self.monitor_port, *self.node_ports):
            if _port_open("127.0.0.1", port) and not self._owns_port(port):
                raise ServiceUnavailable(
                    f"port {port} is taken by a process onceflow did not start"
                )
        if os.geteuid() == 0:
            shutil.chown(self.root, "postgres", "postgres")

    def _owns_port(self, port: int) -> bool:
        names = ("monitor", *NODES)
        ports = (self.monitor_port, *self.node_ports)
        return self.pid(names[ports.index(port)]) is not None

    def _start_monitor(self) -> None:
        if self.pid("monitor") is not None:
            return
        pgdata = str(self._pgdata("monitor"))
        if not self._configured("monitor"):
            result = subprocess.run(
                self._pg_autoctl(
                    "create",
                    "monitor",
                    "--pgdata",
                    pgdata,
                    "--pgport",
                    str(self.monitor_port),
                    "--hostname",
                    "127.0.0.1",
                    "--auth",
                    "trust",
                    "--no-ssl",
                ),
                capture_output=True,
                text=True,
                check=False,
            )
            if result.returncode != 0:
                said = result.stderr.strip().splitlines()[-1:] or [str(result.returncode)]
                raise ServiceUnavailable(f"pg_autoctl create monitor failed: {said[0]}")
        proc = self._spawn("monitor", ["run", "--pgdata", pgdata])
        _wait_until(
            lambda: _port_open("127.0.0.1", self.monitor_port), 60, "pg_auto_failover monitor", proc
        )
        _wait_until(lambda: self._monitor_answers(), 30, "pg_auto_failover monitor", proc)

    def _tune_monitor(self) -> None:
        for key, value in MONITOR_SETTINGS.items():
            self._sql(self.monitor_port, f"ALTER SYSTEM SET {key} = '{value}'", "pg_auto_failover")
        self._sql(self.monitor_port, "SELECT pg_reload_conf()", "pg_auto_failover")

    def _monitor_answers(self) -> bool:
        try:
            self._sql(self.monitor_port, "SELECT 1", "pg_auto_failover")
        except (ServiceUnavailable, subprocess.TimeoutExpired):
            return False
        return True

    def start_node(self, name: str) -> subprocess.Popen | None:
        """Start (creating on first use) one data node: a new node registers with the
        monitor, which makes it the primary if none exists, else a standby cloned from it;
        a node that was primary before rejoins as a standby (pg_rewind)."""
        if self.pid(name) is not None:
            return None
        pgdata = str(self._pgdata(name))
        if self._configured(name):
            return self._spawn(name, ["run", "--pgdata", pgdata])
        return self._spawn(
            name,
            [
                "create",
                "postgres",
                "--pgdata",
                pgdata,
                "--pgport",
                str(self.port(name)),
                "--hostname",
                "127.0.0.1",
                "--name",
                name,
                "--auth",
                "trust",
                "--no-ssl",
                "--dbname",
                self.database,
                "--monitor",
                self.monitor_url,
                "--run",
            ],
        )

    def _tune_keeper(self, name: str) -> None:
        pgdata = str(self._pgdata(name))
        for args in (
            [
                "config",
                "set",
                "--pgdata",
                pgdata,
                "timeout.network_partition_timeout",
                str(NETWORK_PARTITION_TIMEOUT),
            ],
            ["reload", "--pgdata", pgdata],
        ):
            subprocess.run(self._pg_autoctl(*args), capture_output=True, check=False)

    def up(self, timeout: float = 180.0) -> None:
        """Start the monitor, then the nodes one after the other; return once a primary
        and its synchronous standby are in place."""
        if self.ready() and all(self.pid(n) is not None for n in ("monitor", *NODES)):
            self._tune_monitor()  # idempotent, and brings an older formation up to date
            for name in NODES:
                self._tune_keeper(name)
            return
        self._prepare_root()
        self._start_monitor()
        self._tune_monitor()
        deadline = time.monotonic() + timeout
        first = next((n for n in NODES if self._configured(n)), NODES[0])
        for name in (first, *(n for n in NODES if n != first)):
            proc = self.start_node(name)
            _wait_until(
                lambda n=name: self._node_settled(n),
                max(1.0, deadline - time.monotonic()),
                f"PostgreSQL node {name} (log: {self.root / f'{name}.log'})",
                proc,
            )
            self._tune_keeper(name)
        _wait_until(self.ready, max(1.0, deadline - time.monotonic()), "primary and standby")

    def _node_settled(self, name: str) -> bool:
        """The node reached a steady state; meanwhile, a standby being cloned waits for
        a checkpoint that ``pg_basebackup`` requests 'spread' (minutes when idle):
        a CHECKPOINT on the primary ends it at once."""
        reported, _ = self.states().get(name, ("", ""))
        if reported in {"single", "primary", "secondary"}:
            return True
        primary = self.primary()
        if reported in {"wait_standby", "catchingup", ""} and primary not in (None, name):
            with contextlib.suppress(ServiceUnavailable, subprocess.TimeoutExpired):
                self._sql(self.port(primary), "CHECKPOINT")
        return False

    def kill(self, name: str, sig: int = signal.SIGKILL) -> None:
        """Signal a whole node: its pg_autoctl supervisor, keeper and postgres (one
        process group). Killing postgres alone is not a failover: the keeper restarts it."""
        pid = self.pid(name)
        if pid is None:
            raise ServiceUnavailable(f"PostgreSQL node {name} is not running")
        os.killpg(pid, sig)

    def down(self, timeout: float = 30.0) -> bool:
        """Stop the nodes, then the monitor. SIGINT: a 'fast' stop of pg_autoctl and of
        postgres (SIGTERM would be 'smart', waiting for every client to disconnect)."""
        stopped = False
        for group in ([n for n in NODES], ["monitor"]):
            pids = [p for p in (self.pid(n) for n in group) if p is not None]
            for pid in pids:
                os.killpg(pid, signal.SIGINT)
            deadline = time.monotonic() + timeout
            while any(_alive(p) for p in pids) and time.monotonic() < deadline:
                time.sleep(0.2)
            for pid in pids:
                if _alive(pid):
                    log.warning("pg_autoctl group %d did not stop in %.0fs, killing", pid, timeout)
                    os.killpg(pid, signal.SIGKILL)
            stopped |= bool(pids)
            for n in group:
                self._pidfile(n).unlink(missing_ok=True)
        return stopped

    def status(self) -> str:
        states = self.states()
        if not states:
            return f"down {self.url}"
        nodes = ", ".join(f"{n} {r}" for n, (r, _) in sorted(states.items()))
        return f"{'up' if self.ready() else 'degraded'} ({nodes}) {self.url}"


def _alive(pid: int) -> bool:
    """Whether a pg_autoctl session leader runs. One this process started (the tests
    do) stays a zombie until reaped, which ``kill(pid, 0)`` cannot tell from alive."""
    with contextlib.suppress(ChildProcessError):
        if os.waitpid(pid, os.WNOHANG)[0] == pid:
            return False
    return _pid_alive(pid)


def _world_traversable(path: Path) -> bool:
    """Every directory from / to ``path`` lets others through (o+x)."""
    return all(os.stat(p).st_mode & 0o001 for p in (path, *path.parents) if p.exists())
