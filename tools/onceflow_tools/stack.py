"""An isolated onceflow stack on the configured Kafka and PostgreSQL servers.

Used by the demo, the benchmarks, chaos and the acceptance tests: a fresh database
(migrated, with the sample workflows' tables), fresh topics and consumer group named
after a run id, free ports, and the three processes started as subprocesses with their
logs in files. The sample workflows (``onceflow_examples``) are turned on explicitly.
"""

from __future__ import annotations

import time
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

import orjson
import sqlalchemy as sa
from confluent_kafka import Consumer, TopicPartition
from sqlalchemy.engine import Engine, make_url

import onceflow_examples
from onceflow.settings import Settings, settings_env
from onceflow.topics import ensure_topics
from onceflow_tools.processes import ProcessGroup, free_port
from producers.client import IngestClient
from workflow_engine.store import check_connection, make_engine, migrate, sqlalchemy_url

EXAMPLES = "onceflow_examples"


def database_url_for(base_url: str, database: str) -> str:
    url = make_url(sqlalchemy_url(base_url)).set(database=database)
    return url.render_as_string(hide_password=False).replace(
        "postgresql+psycopg2://", "postgresql://"
    )


def recreate_database(base_url: str, database: str) -> str:
    """Drop and create ``database`` on the server of ``base_url``; return its URL."""
    admin = make_engine(database_url_for(base_url, "postgres"), pool_size=1)
    check_connection(admin)
    with admin.connect().execution_options(isolation_level="AUTOCOMMIT") as conn:
        conn.execute(sa.text(f'DROP DATABASE IF EXISTS "{database}" WITH (FORCE)'))
        conn.execute(sa.text(f'CREATE DATABASE "{database}"'))
    admin.dispose()
    return database_url_for(base_url, database)


def drop_database(base_url: str, database: str) -> None:
    """Drop ``database`` (a scratch one) on the server of ``base_url``, if it exists."""
    admin = make_engine(database_url_for(base_url, "postgres"), pool_size=1)
    with admin.connect().execution_options(isolation_level="AUTOCOMMIT") as conn:
        conn.execute(sa.text(f'DROP DATABASE IF EXISTS "{database}" WITH (FORCE)'))
    admin.dispose()


def topic_record_count(settings: Settings, topic: str) -> int:
    """Records in a topic (sum of high minus low watermarks over its partitions)."""
    consumer = Consumer(
        {
            "bootstrap.servers": settings.kafka_bootstrap_servers,
            "group.id": "onceflow-watermarks",
            "enable.auto.commit": False,
        }
    )
    try:
        md = consumer.list_topics(topic, timeout=10)
        total = 0
        for p in md.topics[topic].partitions:
            low, high = consumer.get_watermark_offsets(TopicPartition(topic, p), timeout=10)
            total += high - low
        return total
    finally:
        consumer.close()


@dataclass
class Stack:
    base: Settings
    run_id: str
    log_dir: Path
    partitions: int = 4
    env: dict[str, str] = field(default_factory=dict)
    settings: Settings | None = None
    db: Engine | None = None
    group: ProcessGroup | None = None
    api_key: str = ""

    def prepare(self) -> Stack:
        from producers.auth import SCOPES, hash_key, new_key

        self.api_key = new_key()
        keys = [{"name": "stack", "sha256": hash_key(self.api_key), "scopes": list(SCOPES)}]
        database = f"onceflow_{self.run_id}".lower().replace("-", "_")
        url = recreate_database(self.base.database_url, database)
        self.settings = self.base.model_copy(
            update={
                "database_url": url,
                "jobs_topic": f"onceflow.{self.run_id}.jobs",
                "dlq_topic": f"onceflow.{self.run_id}.jobs.dlq",
                "events_topic": f"onceflow.{self.run_id}.events",
                "consumer_group": f"onceflow-{self.run_id}",
                "topic_partitions": self.partitions,
                "state_dir": self.log_dir / "state",
                "workflow_modules": [
                    *self.base.workflow_modules,
                    *([] if EXAMPLES in self.base.workflow_modules else [EXAMPLES]),
                ],
            }
        )
        self.env = {
            **settings_env(self.settings),
            "ONCEFLOW_INGEST_PORT": str(free_port()),
            "ONCEFLOW_INGEST_METRICS_PORT": str(free_port()),
            "ONCEFLOW_API_KEYS": orjson.dumps(keys).decode(),
        }
        self.db = make_engine(url, pool_size=2)
        migrate(self.db)
        migrate(self.db, onceflow_examples.MIGRATIONS)
        ensure_topics(self.settings)
        self.group = ProcessGroup(self.env, self.log_dir)
        return self

    @property
    def auth_headers(self) -> dict[str, str]:
        return {"Authorization": f"Bearer {self.api_key}"}

    def client(self, **kwargs: Any) -> IngestClient:
        return IngestClient(self.ingest_url, api_key=self.api_key, **kwargs)

    @property
    def ingest_url(self) -> str:
        return f"http://127.0.0.1:{self.env['ONCEFLOW_INGEST_PORT']}"

    def start_ingest(self) -> None:
        assert self.group is not None
        self.group.start("ingest", "ingest")
        self.group.wait_http(f"{self.ingest_url}/readyz", timeout=60)

    def start_worker(self, name: str = "streams", failpoints: str = "", **extra_env: str) -> int:
        """Start a streams worker (``failpoints`` armed in it, if given); its metrics port."""
        assert self.group is not None
        port = free_port()
        self.group.start(
            name,
            "worker",
            env={"ONCEFLOW_STREAMS_METRICS_PORT": str(port), **extra_env},
            failpoints=failpoints,
        )
        self.group.wait_http(f"http://127.0.0.1:{port}/metrics", timeout=60)
        return port

    def start_engine(self, name: str = "engine", **extra_env: str) -> int:
        assert self.group is not None
        port = free_port()
        self.group.start(
            name, "engine", env={"ONCEFLOW_ENGINE_METRICS_PORT": str(port), **extra_env}
        )
        self.group.wait_http(f"http://127.0.0.1:{port}/metrics", timeout=60)
        return port

    def scalar(self, sql: str, **params: object) -> int:
        """A query's one number: for tests' own assertions. The tools read their figures
        through :mod:`onceflow_tools.figures`."""
        assert self.db is not None
        with self.db.connect() as conn:
            return int(conn.execute(sa.text(sql), params).scalar() or 0)

    def wait_for(self, predicate, timeout: float, what: str, interval: float = 0.25) -> None:
        deadline = time.monotonic() + timeout
        while time.monotonic() < deadline:
            if self.group is not None:
                self.group.check_alive()
            if predicate():
                return
            time.sleep(interval)
        raise TimeoutError(f"timed out after {timeout:.0f}s waiting for {what}")

    def close(self) -> None:
        if self.group is not None:
            self.group.stop_all()
        if self.db is not None:
            self.db.dispose()
