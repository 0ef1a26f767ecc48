"""``onceflow dev up --brokers N``: a KRaft cluster of N nodes on loopback, no Docker.

The same jars as the single dev broker (:class:`~onceflow_tools.dev.services.KafkaService`),
N JVMs of ``-Xmx384m``, each node broker and controller at once, the N controllers a
static voter quorum (``controller.quorum.voters``; every log dir formatted with the same
cluster id). Node ``i`` (1-based) listens on ``ports[2i-2]`` for clients and
``ports[2i-1]`` for the quorum: 29092/29093, 29094/29095, 29096/29097 by default,
clear of the single broker's 19092/19093 so both can run side by side.

Internal topics get ``min(3, N)`` replicas and a majority as ``min.insync.replicas``;
so do onceflow's topics with ``ONCEFLOW_TOPIC_REPLICATION_FACTOR=auto``.
"""

from __future__ import annotations

import base64
import logging
import os
import signal
import subprocess
import time
import uuid
from dataclasses import dataclass, field
from importlib import resources
from pathlib import Path

from onceflow.errors import ConfigurationError, ServiceUnavailable
from onceflow_tools.dev.services import (
    KafkaService,
    _broker_count,
    _java_command,
    _pid_alive,
    _port_open,
    _wait_until,
)

log = logging.getLogger(__name__)

CLUSTER_DIR = "kafka-cluster"
HEAP = "384m"


@dataclass
class KafkaCluster:
    state_dir: Path
    brokers: int = 3
    base_port: int = 29092
    # Client and controller port of each node in turn; derived from base_port if empty.
    ports: list[int] = field(default_factory=list)

    def __post_init__(self) -> None:
        if self.brokers < 2:
            raise ConfigurationError("a cluster has 2 brokers or more (1 is `dev up`)")
        if not self.ports:
            self.ports = [self.base_port + i for i in range(2 * self.brokers)]
        if len(self.ports) != 2 * self.brokers:
            raise ConfigurationError(f"{self.brokers} brokers need {2 * self.brokers} ports")

    # --- where things are -----------------------------------------------------------

    @property
    def root(self) -> Path:
        return self.state_dir / CLUSTER_DIR

    @property
    def nodes(self) -> range:
        return range(1, self.brokers + 1)

    def port(self, node: int) -> int:
        return self.ports[2 * node - 2]

    def controller_port(self, node: int) -> int:
        return self.ports[2 * node - 1]

    def address(self, node: int) -> str:
        return f"127.0.0.1:{self.port(node)}"

    @property
    def bootstrap(self) -> str:
        return ",".join(self.address(n) for n in self.nodes)

    @property
    def replicas(self) -> int:
        return min(3, self.brokers)

    @property
    def min_insync(self) -> int:
        return self.replicas // 2 + 1 if self.replicas >= 3 else 1

    def _node_dir(self, node: int) -> Path:
        return self.root / f"node-{node}"

    def _pidfile(self, node: int) -> Path:
        return self._node_dir(node) / "kafka.pid"

    def pid(self, node: int) -> int | None:
        pidfile = self._pidfile(node)
        if not pidfile.exists():
            return None
        pid = int(pidfile.read_text().strip() or 0)
        return pid if pid and _pid_alive(pid) else None

    # --- state ----------------------------------------------------------------------

    def running(self) -> bool:
        return all(self.pid(n) is not None for n in self.nodes)

    def ready(self) -> bool:
        if not _port_open("127.0.0.1", self.port(1)):
            return False
        return _broker_count(self.bootstrap) == self.brokers

    @classmethod
    def found(cls, state_dir: Path) -> KafkaCluster | None:
        """The cluster ``dev up --brokers N`` left in ``state_dir``, if any."""
        saved = state_dir / CLUSTER_DIR / "cluster.ports"
        if not saved.exists():
            return None
        ports = [int(p) for p in saved.read_text().split()]
        return cls(state_dir, brokers=len(ports) // 2, ports=ports)

    # --- start and stop -------------------------------------------------------------

    def _java(self, *args: str, log_dir: Path) -> list[str]:
        return _java_command(self._libs, *args, log_dir=log_dir, heap=HEAP)

    @property
    def _libs(self) -> Path:
        return KafkaService(self.state_dir).libs_dir

    def _cluster_id(self) -> str:
        path = self.root / "cluster.id"
        if not path.exists():
            raw = base64.urlsafe_b64encode(uuid.uuid4().bytes).decode().rstrip("=")
            path.write_text(raw)
        return path.read_text().strip()

    def _configure(self, node: int) -> Path:
        voters = ",".join(f"{n}@127.0.0.1:{self.controller_port(n)}" for n in self.nodes)
        template = resources.files("onceflow_tools.dev").joinpath("cluster.properties")
        props = self._node_dir(node) / "server.properties"
        props.write_text(
            template.read_text()
            .replace("@NODE_ID@", str(node))
            .replace("@PORT@", str(self.port(node)))
            .replace("@CONTROLLER_PORT@", str(self.controller_port(node)))
            .replace("@VOTERS@", voters)
            .replace("@LOG_DIR@", str((self._node_dir(node) / "data").resolve()))
            .replace("@REPLICAS@", str(self.replicas))
            .replace("@MIN_ISR@", str(self.min_insync))
        )
        return props

    def _format(self, nodes: list[int]) -> None:
        """Format the nodes' log dirs with one cluster id, in parallel (a JVM each)."""
        cluster_id = self._cluster_id()
        procs = {
            n: subprocess.Popen(
                self._java(
                    "kafka.tools.StorageTool",
                    "format",
                    "-t",
                    cluster_id,
                    "-c",
                    str(self._node_dir(n) / "server.properties"),
                    log_dir=self._node_dir(n) / "logs",
                ),
                stdout=subprocess.PIPE,
                stderr=subprocess.STDOUT,
                text=True,
            )
            for n in nodes
        }
        for n, proc in procs.items():
            said, _ = proc.communicate(timeout=120)
            if proc.returncode != 0:
                last = said.strip().splitlines()[-1:] or [str(proc.returncode)]
                raise ServiceUnavailable(f"formatting Kafka node {n} failed: {last[0]}")

    def start_node(self, node: int) -> subprocess.Popen:
        """Start one node (already configured and formatted) in its own session."""
        logs = self._node_dir(node) / "logs"
        with open(logs / "stdout.log", "ab") as out:
            proc = subprocess.Popen(
                self._java(
                    "kafka.Kafka", str(self._node_dir(node) / "server.properties"), log_dir=logs
                ),
                stdout=out,
                stderr=subprocess.STDOUT,
                start_new_session=True,
            )
        self._pidfile(node).write_text(str(proc.pid))
        return proc

    def up(self, timeout: float = 120.0) -> None:
        if self.running() and self.ready():
            return
        to_start = [n for n in self.nodes if self.pid(n) is None]
        for n in to_start:
            for port in (self.port(n), self.controller_port(n)):
                if _port_open("127.0.0.1", port):
                    raise ServiceUnavailable(
                        f"port {port} is taken by a process onceflow did not start"
                    )
        KafkaService(self.state_dir).ensure_jars()
        self.root.mkdir(parents=True, exist_ok=True)
        (self.root / "cluster.ports").write_text(" ".join(map(str, self.ports)))
        for n in self.nodes:
            (self._node_dir(n) / "logs").mkdir(parents=True, exist_ok=True)
            self._configure(n)
        self._format(
            [n for n in to_start if not (self._node_dir(n) / "data/meta.properties").exists()]
        )
        procs = [self.start_node(n) for n in to_start]

        def ready_or_dead() -> bool:
            for n, proc in zip(to_start, procs, strict=True):
                if proc.poll() is not None:
                    raise ServiceUnavailable(
                        f"Kafka node {n} exited with code {proc.returncode} while starting"
                        f" (logs: {self._node_dir(n) / 'logs'})"
                    )
            return self.ready()

        _wait_until(ready_or_dead, timeout, f"Kafka cluster on {self.bootstrap}")

    def kill(self, node: int, sig: int = signal.SIGKILL) -> None:
        """Signal one node (chaos and the broker-loss test); SIGKILL by default."""
        pid = self.pid(node)
        if pid is None:
            raise ServiceUnavailable(f"Kafka node {node} is not running")
        os.kill(pid, sig)

    def down(self, timeout: float = 20.0) -> bool:
        """Stop every node. All are signalled at once: one by one, the last ones wait
        for a controller quorum that has already gone (measured: 30 s each, then killed)."""
        pids = {n: self.pid(n) for n in self.nodes}
        for pid in pids.values():
            if pid is not None:
                os.kill(pid, signal.SIGTERM)
        deadline = time.monotonic() + timeout
        while any(p is not None and _pid_alive(p) for p in pids.values()):
            if time.monotonic() > deadline:
                for n, pid in pids.items():
                    if pid is not None and _pid_alive(pid):
                        log.warning("Kafka node %d did not stop in %.0fs, killing", n, timeout)
                        os.kill(pid, signal.SIGKILL)
                break
            time.sleep(0.2)
        for n in self.nodes:
            self._pidfile(n).unlink(missing_ok=True)
        return any(p is not None for p in pids.values())
