"""SIGTERM drains every process cleanly."""

from __future__ import annotations

import signal
import time

import orjson
import sqlalchemy as sa

from onceflow.envelope import JobEnvelope
from onceflow_tools.processes import ProcessGroup, free_port
from tests.conftest import settings_env
from workflow_engine.model import Delivery
from workflow_engine.store.writes import create_instances


def test_engine_releases_unfinished_instances_on_sigterm(settings, db, tmp_path):
    create_instances(
        db,
        [
            Delivery(JobEnvelope(f"slow_{i}", "order-workflow", {"step_seconds": 6}), "t", 0, i)
            for i in range(3)
        ],
    )
    env = {**settings_env(settings), "ONCEFLOW_ENGINE_LEASE_SECONDS": "4"}
    with ProcessGroup(env, tmp_path / "logs") as group:
        group.start("engine", "engine", env={"ONCEFLOW_ENGINE_METRICS_PORT": str(free_port())})
        deadline = time.monotonic() + 30
        while True:
            with db.connect() as conn:
                running = conn.execute(
                    sa.text("SELECT count(*) FROM onceflow_steps WHERE status = 'running'")
                ).scalar()
            if running == 3:
                break
            assert time.monotonic() < deadline, "the engine did not start the steps"
            time.sleep(0.1)
        started = time.monotonic()
        assert group.stop("engine", signal.SIGTERM, timeout=30) == 0
        took = time.monotonic() - started
    with db.connect() as conn:
        rows = conn.execute(sa.text("SELECT status, lease_owner FROM onceflow_instances")).all()
    # Released at once for another engine, not left to a lease expiry.
    assert rows == [("queued", None)] * 3
    assert took < 15


def test_ingest_flushes_and_exits_cleanly_on_sigterm(settings, tmp_path):
    from onceflow.settings import ApiKey
    from producers.auth import SCOPES, hash_key, new_key
    from producers.client import IngestClient

    key = new_key()
    keys = [ApiKey(name="t", sha256=hash_key(key), scopes=list(SCOPES)).model_dump()]
    port = free_port()
    env = {
        **settings_env(settings),
        "ONCEFLOW_INGEST_PORT": str(port),
        "ONCEFLOW_INGEST_METRICS_PORT": str(free_port()),
        "ONCEFLOW_API_KEYS": orjson.dumps(keys).decode(),
    }
    with ProcessGroup(env, tmp_path / "logs") as group:
        group.start("ingest", "ingest")
        group.wait_http(f"http://127.0.0.1:{port}/readyz")
        with IngestClient(f"http://127.0.0.1:{port}", api_key=key) as client:
            accepted = client.submit([{"workflow": "order-workflow"} for _ in range(20)])
        assert len(accepted["accepted"]) == 20
        assert group.stop("ingest", signal.SIGTERM, timeout=30) == 0
    events = [
        orjson.loads(line).get("event")
        for line in (tmp_path / "logs" / "ingest.log").read_text().splitlines()
        if line.startswith("{")
    ]
    assert "ingest.stopped" in events
