"""``onceflow dev up|down|status``: real Kafka and PostgreSQL on loopback, no Docker.

* Kafka: Apache Kafka 4.x in single-node KRaft mode. Its jars are resolved from Maven
  Central with Maven (``kafka-pom.xml`` beside this file) into a cache shared by every
  checkout on the machine (``~/.cache/onceflow``), then run with Java 17.
* PostgreSQL: the server from Debian's packages (installed with apt-get when missing),
  a private cluster (``initdb``) under the state directory, listening on 127.0.0.1.

Everything is idempotent: ``up`` twice is fine, ``down`` leaves nothing running.
Readiness is checked (a metadata request, ``pg_isready``), never slept for.
"""

from __future__ import annotations

import glob
import hashlib
import logging
import os
import shutil
import signal
import socket
import subprocess
import sys
import time
from dataclasses import dataclass
from importlib import resources
from pathlib import Path
from typing import Protocol

from onceflow.errors import OnceflowError, ServiceUnavailable
from onceflow.settings import Settings
from onceflow_tools.dev.ports import STATE_DIR_MARKER, port_taken

log = logging.getLogger(__name__)

KAFKA_VERSION = "4.1.1"
SLF4J_VERSION = "2.0.16"
LOG4J_VERSION = "2.24.3"


def _cache_root() -> Path:
    return Path(os.environ.get("XDG_CACHE_HOME", Path.home() / ".cache")) / "onceflow"


def _port_open(host: str, port: int) -> bool:
    with socket.socket() as sock:
        sock.settimeout(0.5)
        return sock.connect_ex((host, port)) == 0


def _wait_until(check, timeout: float, what: str, proc: subprocess.Popen | None = None) -> None:
    deadline = time.monotonic() + timeout
    while time.monotonic() < deadline:
        if check():
            return
        if proc is not None and proc.poll() is not None:
            raise ServiceUnavailable(f"{what} exited with code {proc.returncode} while starting")
        time.sleep(0.2)
    raise ServiceUnavailable(f"{what} not ready after {timeout:.0f}s")


def _pid_alive(pid: int) -> bool:
    try:
        os.kill(pid, 0)
    except ProcessLookupError:
        return False
    except PermissionError:
        return True
    return True


def _stop_pid(pidfile: Path, what: str, timeout: float = 30.0) -> bool:
    if not pidfile.exists():
        return False
    pid = int(pidfile.read_text().strip() or 0)
    if pid and _pid_alive(pid):
        os.kill(pid, signal.SIGTERM)
        deadline = time.monotonic() + timeout
        while _pid_alive(pid) and time.monotonic() < deadline:
            time.sleep(0.2)
        if _pid_alive(pid):
            log.warning("%s did not stop in %.0fs, killing", what, timeout)
            os.kill(pid, signal.SIGKILL)
    pidfile.unlink(missing_ok=True)
    return True


def _run(cmd: list[str]) -> None:
    """Run a server tool; if it fails, say so in one line with its own last words."""
    result = subprocess.run(cmd, capture_output=True, text=True, check=False)
    if result.returncode != 0:
        said = (result.stderr or result.stdout).strip().splitlines()
        program = next((Path(c).name for c in cmd if "/" in c), cmd[0])
        raise ServiceUnavailable(f"{program} failed: {said[-1] if said else result.returncode}")


def _apt_install(*packages: str) -> None:
    if os.geteuid() != 0 or shutil.which("apt-get") is None:
        raise OnceflowError(f"please install {' '.join(packages)} (needs root and apt-get)")
    env = {**os.environ, "DEBIAN_FRONTEND": "noninteractive"}
    subprocess.run(["apt-get", "update", "-qq"], check=True, env=env)
    subprocess.run(["apt-get", "install", "-y", "-qq", *packages], check=True, env=env)


def _java_command(libs_dir: Path, *args: str, log_dir: Path, heap: str) -> list[str]:
    log4j = resources.files("onceflow_tools.dev").joinpath("log4j2.properties")
    return [
        "java",
        "-Xms256m",
        f"-Xmx{heap}",
        "-XX:+UseG1GC",
        "-Djava.awt.headless=true",
        f"-Dlog4j2.configurationFile={log4j}",
        f"-Dkafka.log.dir={log_dir}",
        "-cp",
        f"{libs_dir}/*",
        *args,
    ]


def _broker_count(bootstrap: str) -> int:
    """Brokers a metadata request sees (0 when none answers)."""
    from confluent_kafka.admin import AdminClient

    try:
        md = AdminClient({"bootstrap.servers": bootstrap}).list_topics(timeout=2)
    except Exception:
        return 0
    return len(md.brokers)


@dataclass
class KafkaService:
    state_dir: Path
    port: int = 19092
    controller_port: int = 19093

    @property
    def root(self) -> Path:
        return self.state_dir / "kafka"

    @property
    def bootstrap(self) -> str:
        return f"127.0.0.1:{self.port}"

    @property
    def libs_dir(self) -> Path:
        return _cache_root() / f"kafka-{KAFKA_VERSION}" / "libs"

    def ensure_jars(self) -> Path:
        """Resolve the broker's jars from Maven Central once; reuse the cache after."""
        marker = self.libs_dir / ".complete"
        if marker.exists():
            return self.libs_dir
        if shutil.which("java") is None:
            _apt_install("openjdk-17-jre-headless")
        if shutil.which("mvn") is None:
            _apt_install("maven")
        work = self.libs_dir.parent / "resolve"
        work.mkdir(parents=True, exist_ok=True)
        pom = resources.files("onceflow_tools.dev").joinpath("kafka-pom.xml").read_text()
        pom = (
            pom.replace("@KAFKA_VERSION@", KAFKA_VERSION)
            .replace("@SLF4J_VERSION@", SLF4J_VERSION)
            .replace("@LOG4J_VERSION@", LOG4J_VERSION)
        )
        (work / "pom.xml").write_text(pom)
        tmp = self.libs_dir.with_suffix(".tmp")
        shutil.rmtree(tmp, ignore_errors=True)
        print(f"fetching Apache Kafka {KAFKA_VERSION} jars from Maven Central…", file=sys.stderr)
        subprocess.run(
            [
                "mvn",
                "-q",
                "-B",
                "dependency:copy-dependencies",
                "-DincludeScope=runtime",
                f"-DoutputDirectory={tmp}",
            ],
            cwd=work,
            check=True,
        )
        shutil.rmtree(self.libs_dir, ignore_errors=True)
        tmp.rename(self.libs_dir)
        marker.touch()
        return self.libs_dir

    def _java(self, *args: str, log_dir: Path) -> list[str]:
        return _java_command(self.libs_dir, *args, log_dir=log_dir, heap="1g")

    def running(self) -> bool:
        pidfile = self.root / "kafka.pid"
        if not pidfile.exists():
            return False
        return _pid_alive(int(pidfile.read_text().strip() or 0))

    def ready(self) -> bool:
        if not _port_open("127.0.0.1", self.port):
            return False
        from confluent_kafka.admin import AdminClient

        try:
            md = AdminClient({"bootstrap.servers": self.bootstrap}).list_topics(timeout=2)
        except Exception:
            return False
        return bool(md.brokers)

    def up(self) -> None:
        if self.running() and self.ready():
            return
        for port in (self.port, self.controller_port):
            if _port_open("127.0.0.1", port):
                raise port_taken(port, "Kafka", self.state_dir)
        self.ensure_jars()
        data, logs = self.root / "data", self.root / "logs"
        logs.mkdir(parents=True, exist_ok=True)
        template = resources.files("onceflow_tools.dev").joinpath("server.properties").read_text()
        props = self.root / "server.properties"
        props.write_text(
            template.replace("@PORT@", str(self.port))
            .replace("@CONTROLLER_PORT@", str(self.controller_port))
            .replace("@LOG_DIR@", str(data.resolve()))
        )
        if not (data / "meta.properties").exists():
            cluster_id = (
                subprocess.run(
                    self._java("kafka.tools.StorageTool", "random-uuid", log_dir=logs),
                    check=True,
                    capture_output=True,
                    text=True,
                )
                .stdout.strip()
                .splitlines()[-1]
            )
            subprocess.run(
                self._java(
                    "kafka.tools.StorageTool",
                    "format",
                    "--standalone",
                    "-t",
                    cluster_id,
                    "-c",
                    str(props),
                    log_dir=logs,
                ),
                check=True,
                capture_output=True,
                text=True,
            )
        with open(logs / "stdout.log", "ab") as out:
            proc = subprocess.Popen(
                self._java("kafka.Kafka", str(props), log_dir=logs),
                stdout=out,
                stderr=subprocess.STDOUT,
                start_new_session=True,
            )
        (self.root / "kafka.pid").write_text(str(proc.pid))
        _wait_until(self.ready, 90, f"Kafka on {self.bootstrap} (logs: {logs})", proc)

    def down(self) -> bool:
        return _stop_pid(self.root / "kafka.pid", "Kafka")


@dataclass
class PostgresService:
    state_dir: Path
    port: int = 15432
    database: str = "onceflow"

    @property
    def root(self) -> Path:
        if os.geteuid() != 0:
            return self.state_dir / "postgres"
        # As root the server runs as the 'postgres' user, who may not be able to reach a
        # checkout under a private directory (mktemp -d is 0700): keep the cluster in a
        # world-traversable place, one per state directory.
        digest = hashlib.sha256(str(self.state_dir.resolve()).encode()).hexdigest()[:12]
        return Path("/var/tmp") / f"onceflow-postgres-{digest}"

    @property
    def url(self) -> str:
        return f"postgresql://postgres@127.0.0.1:{self.port}/{self.database}"

    def bindir(self) -> Path:
        found = sorted(
            glob.glob("/usr/lib/postgresql/*/bin/pg_ctl"), key=lambda p: int(p.split("/")[4])
        )
        if not found:
            _apt_install("postgresql")
            return self.bindir()
        return Path(found[-1]).parent

    def _as_owner(self, cmd: list[str]) -> list[str]:
        # initdb and postgres refuse to run as root: run them as the 'postgres' user.
        if os.geteuid() == 0:
            return ["runuser", "-u", "postgres", "--", *cmd]
        return cmd

    def running(self) -> bool:
        pidfile = self.root / "data" / "postmaster.pid"
        if not pidfile.exists():
            return False
        return _pid_alive(int(pidfile.read_text().splitlines()[0]))

    def ready(self) -> bool:
        result = subprocess.run(
            [str(self.bindir() / "pg_isready"), "-q", "-h", "127.0.0.1", "-p", str(self.port)],
            check=False,
        )
        return result.returncode == 0

    def _psql(self, sql: str, database: str = "postgres") -> str:
        return subprocess.run(
            [
                str(self.bindir() / "psql"),
                "-X",
                "-q",
                "-t",
                "-A",
                "-v",
                "ON_ERROR_STOP=1",
                "-h",
                "127.0.0.1",
                "-p",
                str(self.port),
                "-U",
                "postgres",
                "-d",
                database,
                "-c",
                sql,
            ],
            check=True,
            capture_output=True,
            text=True,
        ).stdout.strip()

    def up(self) -> None:
        # Before anything else: pg_ctl would only say "Examine the log output."
        if not self.running() and _port_open("127.0.0.1", self.port):
            raise port_taken(self.port, "PostgreSQL", self.state_dir)
        bindir = self.bindir()
        data = self.root / "data"
        self.root.mkdir(parents=True, exist_ok=True)
        # Whose cluster this is, for a second checkout's `dev up` to name (dev.ports).
        (self.root / STATE_DIR_MARKER).write_text(f"{self.state_dir.resolve()}\n")
        if not (data / "PG_VERSION").exists():
            shutil.rmtree(data, ignore_errors=True)
            data.mkdir()
            if os.geteuid() == 0:
                shutil.chown(self.root, "postgres", "postgres")
                shutil.chown(data, "postgres", "postgres")
            _run(
                self._as_owner(
                    [
                        str(bindir / "initdb"),
                        "-D",
                        str(data.resolve()),
                        "-U",
                        "postgres",
                        "--auth=trust",
                        "-E",
                        "UTF8",
                        "--locale=C.UTF-8",
                    ]
                )
            )
            with open(data / "postgresql.conf", "a") as conf:
                conf.write(
                    "\n# onceflow dev cluster\n"
                    "listen_addresses = '127.0.0.1'\n"
                    f"port = {self.port}\n"
                    f"unix_socket_directories = '{data.resolve()}'\n"
                    "max_connections = 300\n"
                    "shared_buffers = 256MB\n"
                    "fsync = on\n"
                    "synchronous_commit = on\n"
                    "logging_collector = off\n"
                )
        if not self.running():
            logfile = self.root / "postgres.log"
            logfile.touch()
            if os.geteuid() == 0:
                shutil.chown(logfile, "postgres", "postgres")
            _run(
                self._as_owner(
                    [
                        str(bindir / "pg_ctl"),
                        "-D",
                        str(data.resolve()),
                        "-l",
                        str(logfile.resolve()),
                        "-w",
                        "-t",
                        "60",
                        "start",
                    ]
                )
            )
        _wait_until(self.ready, 60, f"PostgreSQL on 127.0.0.1:{self.port}")
        exists = self._psql(f"SELECT 1 FROM pg_database WHERE datname = '{self.database}'")
        if not exists:
            self._psql(f'CREATE DATABASE "{self.database}"')

    def down(self) -> bool:
        data = self.root / "data"
        if not self.running():
            return False
        _run(
            self._as_owner(
                [
                    str(self.bindir() / "pg_ctl"),
                    "-D",
                    str(data.resolve()),
                    "-m",
                    "fast",
                    "-w",
                    "stop",
                ]
            )
        )
        return True


class Kafka(Protocol):
    """What the CLI needs of a dev Kafka: one broker or a cluster."""

    @property
    def bootstrap(self) -> str: ...

    def up(self) -> None: ...

    def down(self) -> bool: ...

    def ready(self) -> bool: ...


class DevServices:
    """Both services together, as the CLI, the demo and CI use them. ``brokers > 1``
    makes Kafka a cluster (:mod:`onceflow_tools.dev.cluster`) beside the single broker's
    ports, in the same state directory; ``postgres_ha`` makes PostgreSQL a primary and a
    synchronous standby under pg_auto_failover (:mod:`onceflow_tools.dev.postgres_ha`)
    beside the single server's port."""

    def __init__(
        self,
        state_dir: Path,
        kafka_port: int = 19092,
        postgres_port: int = 15432,
        brokers: int = 1,
        postgres_ha: bool = False,
    ):
        from onceflow_tools.dev.cluster import KafkaCluster
        from onceflow_tools.dev.postgres_ha import PostgresHA

        self.state_dir = state_dir.resolve()
        self.brokers = brokers
        self.single = KafkaService(self.state_dir, kafka_port, kafka_port + 1)
        self.cluster: KafkaCluster | None
        self.kafka: Kafka
        if brokers > 1:
            self.kafka = self.cluster = KafkaCluster(self.state_dir, brokers)
        else:
            self.kafka, self.cluster = self.single, KafkaCluster.found(self.state_dir)
        self.postgres = PostgresService(self.state_dir, postgres_port)
        self.postgres_ha = postgres_ha
        self.ha = PostgresHA(self.state_dir)

    def up(self) -> None:
        self.state_dir.mkdir(parents=True, exist_ok=True)
        if self.postgres_ha:
            self.ha.up()
        else:
            self.postgres.up()
        self.kafka.up()

    def down(self) -> None:
        """Stop everything this state directory runs: the broker, a cluster, PostgreSQL
        (and its HA formation, if one was started); with ``postgres_ha``, that alone."""
        if not self.postgres_ha:
            self.single.down()
            if self.cluster is not None:
                self.cluster.down()
            self.postgres.down()
        self.ha.down()

    def status(self) -> dict[str, str]:
        status = {
            "kafka": f"{'up' if self.single.ready() else 'down'} {self.single.bootstrap}",
            "postgres": f"{'up' if self.postgres.ready() else 'down'} {self.postgres.url}",
        }
        if self.cluster is not None:
            state = "up" if self.cluster.ready() else "down"
            status["kafka-cluster"] = (
                f"{state} {self.cluster.brokers} brokers {self.cluster.bootstrap}"
            )
        if self.postgres_ha or self.ha.pid("monitor") is not None:
            status["postgres-ha"] = self.ha.status()
        return status

    def env(self) -> dict[str, str]:
        postgres = self.ha.url if self.postgres_ha else self.postgres.url
        env = {"KAFKA_BOOTSTRAP_SERVERS": self.kafka.bootstrap, "DATABASE_URL": postgres}
        if self.brokers > 1:
            # The topics then get min(3, brokers) replicas and a majority as min ISR.
            env["ONCEFLOW_TOPIC_REPLICATION_FACTOR"] = "auto"
        return env


def local_dev_services(settings: Settings) -> DevServices | None:
    """The dev services, if the configured Kafka and PostgreSQL are them (so chaos runs
    and benchmarks may restart them); None for external services."""
    dev = DevServices(settings.state_dir)
    if settings.database_url == dev.ha.url:  # `dev env --postgres-ha`
        dev = DevServices(settings.state_dir, postgres_ha=True)
    same_kafka = settings.kafka_bootstrap_servers == dev.kafka.bootstrap
    same_pg = dev.postgres_ha or f"127.0.0.1:{dev.postgres.port}/" in settings.database_url
    return dev if same_kafka and same_pg else None
