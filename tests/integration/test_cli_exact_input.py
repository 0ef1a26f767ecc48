"""The CLI refuses an event payload or schedule params it would store as other values,
with one line (found in review: orjson read -0.0 and 1e-400 as 0, big integers as
floats), and stores an exact one as written."""

from __future__ import annotations

import subprocess
import sys

from onceflow.envelope import JobEnvelope
from tests.conftest import settings_env
from workflow_engine.model import Delivery
from workflow_engine.store.writes import create_instances


def onceflow(settings, *args):
    return subprocess.run(
        [sys.executable, "-c", "from onceflow_cli.main import main; main()", *args],
        env=settings_env(settings),
        capture_output=True,
        text=True,
        timeout=60,
    )


def test_send_event_refuses_an_inexact_payload_and_keeps_an_exact_one(settings, db):
    create_instances(db, [Delivery(JobEnvelope("cx_1", "approval-workflow", {}), "t", 0, 0)])
    bad = onceflow(
        settings, "instances", "send-event", "approval-workflow", "cx_1", "approved", '{"x": -0.0}'
    )
    assert bad.returncode != 0 and bad.stderr.count("\n") == 1, bad.stderr
    assert "payload refused" in bad.stderr
    good = onceflow(
        settings,
        "instances",
        "send-event",
        "approval-workflow",
        "cx_1",
        "approved",
        '{"n": 12345678901234567890}',
    )
    assert good.returncode == 0, good.stderr
    with db.connect() as conn:
        stored = conn.exec_driver_sql("SELECT payload FROM onceflow_events").scalars().all()
    assert stored == [{"n": 12345678901234567890}]


def test_schedule_params_are_refused_when_inexact(settings, db):
    bad = onceflow(
        settings,
        "schedules",
        "create",
        "nightly",
        "--workflow",
        "order-workflow",
        "--every",
        "60",
        "--params",
        '{"x": 1e-400}',
    )
    assert bad.returncode != 0 and "--params refused" in bad.stderr, bad.stderr
