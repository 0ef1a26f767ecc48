"""A task of test_task_redrive.py, loaded by its worker (``ONCEFLOW_WORKFLOW_MODULES``):
it fails while the file its params name exists (the downstream is down), and records
one side effect per successful run."""

from __future__ import annotations

from pathlib import Path
from typing import Any

import sqlalchemy as sa

from onceflow.settings import get_settings
from workflow_engine.definitions import task
from workflow_engine.store import shared_engine


class DownstreamDown(Exception):
    pass


@task("test-flaky-task", max_retries=1, delay=0.05)
def flaky(params: dict[str, Any]) -> dict[str, Any]:
    if Path(params["broken_while"]).exists():
        raise DownstreamDown("the downstream service refused the connection")
    with shared_engine(get_settings().database_url).begin() as conn:
        conn.execute(
            sa.text(
                "INSERT INTO onceflow_demo_side_effects (job_id, step, idempotency_key,"
                " performed_by) VALUES (:j, 'test-flaky-task', :j, 'streams')"
            ),
            {"j": params["job_id"]},
        )
    return {"sent": True}
