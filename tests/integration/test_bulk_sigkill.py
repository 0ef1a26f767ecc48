"""A bulk operation cut off by a SIGKILL of the process that runs it is resumed by the
next process (issue 23, case 8), on the real ingest process (admin API) and PostgreSQL:
the process is killed in the middle of a batch (waiting for a row the test holds), and
the next one finishes the operation after its last committed batch."""

from __future__ import annotations

import signal
import time

import httpx
import pytest
import sqlalchemy as sa

from onceflow.envelope import JobEnvelope
from onceflow.vocabulary import BulkStatus
from onceflow_tools.processes import ProcessGroup, free_port
from tests.conftest import settings_env
from workflow_engine.model import Delivery
from workflow_engine.store import operations
from workflow_engine.store.writes import create_instances


def _create(db, job_ids):
    for start in range(0, len(job_ids), 500):
        chunk = job_ids[start : start + 500]
        envelopes = [JobEnvelope(j, "approval-workflow", {}) for j in chunk]
        create_instances(db, [Delivery(e, "t", 0, start + n) for n, e in enumerate(envelopes)])


def _op(db, op_id) -> operations.BulkOperation:
    found = operations.bulk_status(db, op_id)
    assert found is not None
    return found


def _paused(db, prefix):
    with db.connect() as conn:
        return conn.execute(
            sa.text(
                "SELECT count(*) FILTER (WHERE status = 'paused'), count(*)"
                " FROM onceflow_instances WHERE job_id LIKE :p"
            ),
            {"p": prefix + "%"},
        ).one()


def _until(predicate, what, group, detail, timeout=60.0):
    deadline = time.monotonic() + timeout
    while time.monotonic() < deadline:
        group.check_alive()
        if predicate():
            return
        time.sleep(0.05)
    raise AssertionError(f"timed out waiting for {what}: {detail()}")


def _blocked_on(db, pid: int) -> bool:
    """Some backend waits for a lock the session ``pid`` holds."""
    with db.connect() as conn:
        return bool(
            conn.execute(
                sa.text(
                    "SELECT count(*) FROM pg_stat_activity WHERE :pid = ANY(pg_blocking_pids(pid))"
                ),
                {"pid": pid},
            ).scalar()
        )


def _ingest(group, settings, name):
    port = free_port()
    env = {
        "ONCEFLOW_INGEST_PORT": str(port),
        "ONCEFLOW_INGEST_METRICS_PORT": str(free_port()),
        "ONCEFLOW_AUTH_DISABLED": "true",
        "ONCEFLOW_ADMIN_API_ENABLED": "true",
    }
    group.start(name, "ingest", env=env)
    group.wait_http(f"http://127.0.0.1:{port}/healthz")
    return f"http://127.0.0.1:{port}"


@pytest.mark.timeout(180)
def test_an_operation_cut_off_by_sigkill_is_resumed_by_the_next_process(settings, db, tmp_path):
    ids = [f"bk_{i:04d}" for i in range(1500)]
    _create(db, ids)
    # The test holds one row of the third batch (of 500): the process that runs the
    # operation commits two batches, then waits inside the third for that row.
    hold = db.connect()
    hold.begin()
    hold.execute(
        sa.text("SELECT 1 FROM onceflow_instances WHERE job_id = :j FOR UPDATE"), {"j": ids[1200]}
    )
    hold_pid = hold.execute(sa.text("SELECT pg_backend_pid()")).scalar()
    try:
        with ProcessGroup(settings_env(settings), tmp_path / "logs") as group:
            first = _ingest(group, settings, "ingest-1")
            started = httpx.post(
                f"{first}/v1/instances/bulk/pause", json={"filter": "prefix=bk_"}, timeout=10
            )
            assert started.status_code == 202, started.text
            op_id = started.json()["id"]
            _until(
                lambda: _blocked_on(db, hold_pid) and _op(db, op_id).done == 1000,
                "two batches committed, the third waiting",
                group,
                lambda: _op(db, op_id).describe(),
            )
            group.stop("ingest-1", signal.SIGKILL)
            hold.rollback()  # the killed process's half-done batch rolls back
            cut = _op(db, op_id)
            assert (cut.status, cut.done) == (BulkStatus.RUNNING, 1000)

            _ingest(group, settings, "ingest-2")
            _until(
                lambda: _op(db, op_id).finished,
                "the operation resumed by the second process",
                group,
                lambda: _op(db, op_id).describe(),
            )
    finally:
        hold.close()
    final = _op(db, op_id)
    assert (final.status, final.done, final.skipped, final.total) == ("complete", 1500, 0, 1500)
    assert tuple(_paused(db, "bk_")) == (1500, 1500)
