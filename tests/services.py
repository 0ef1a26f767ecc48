"""Where the tests find real Kafka and PostgreSQL.

Order of precedence:
1. ``KAFKA_BOOTSTRAP_SERVERS`` / ``DATABASE_URL`` when set (always win);
2. testcontainers, when a Docker engine is reachable;
3. the project's own local services (``onceflow dev up``), started if needed.

Integration tests never skip for a missing service: they fail, loudly.
"""

from __future__ import annotations

import os
from pathlib import Path

REPO = Path(__file__).resolve().parent.parent


def _docker_reachable() -> bool:
    try:
        import docker

        docker.from_env(timeout=3).ping()
        return True
    except Exception:
        return False


class Services:
    def __init__(self) -> None:
        self.kafka = os.environ.get("KAFKA_BOOTSTRAP_SERVERS", "")
        self.database_url = os.environ.get("DATABASE_URL", "")
        self._containers: list = []

    def start(self) -> Services:
        if self.kafka and self.database_url:
            return self
        if _docker_reachable():
            self._start_containers()
        else:
            from onceflow_tools.dev import DevServices

            dev = DevServices(REPO / ".onceflow")
            dev.up()
            self.kafka = self.kafka or dev.kafka.bootstrap
            self.database_url = self.database_url or dev.postgres.url
        return self

    def _start_containers(self) -> None:
        if not self.kafka:
            from testcontainers.kafka import KafkaContainer

            kafka = KafkaContainer("apache/kafka:4.1.1").with_kraft()
            kafka.start()
            self._containers.append(kafka)
            self.kafka = kafka.get_bootstrap_server()
        if not self.database_url:
            from testcontainers.postgres import PostgresContainer

            pg = PostgresContainer("postgres:16", driver=None)
            pg.start()
            self._containers.append(pg)
            self.database_url = pg.get_connection_url()

    def stop(self) -> None:
        for container in self._containers:
            container.stop()
