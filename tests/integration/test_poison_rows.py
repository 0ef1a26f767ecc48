"""A row the database refuses never wedges the streams worker (issue 23, case 1).

Real Kafka, real PostgreSQL, the real worker as a subprocess. Errors are classified by
SQLSTATE (``workflow_engine.store.db.classify``): "index row too large" (54000) is an
``OperationalError`` like a dropped connection, but it is the row's fault, so the
worker dead-letters that record (``database_refused``) and the partition moves on,
while a database that does not answer is retried, blocking, until SIGTERM.
"""

from __future__ import annotations

import secrets
import signal
import time
import urllib.request

import sqlalchemy as sa

from onceflow.envelope import HEADER_DLQ_DETAIL, HEADER_DLQ_REASON, JobEnvelope
from onceflow_tools.processes import ProcessGroup, free_port
from tests.conftest import settings_env
from tests.integration import flow_workflows as wf
from tests.integration import poison_tasks
from tests.integration.kafka_helpers import committed_offsets, consume_all
from tests.integration.test_flow_control import MODULES, run_until
from tests.integration.test_poison_records import _produce_to_partition_0
from tests.integration.test_streams_worker import scalar, start_worker, wait_until

#: Random text does not compress: 20,000 characters make an index entry of ~20 kB,
#: far over a B-tree page's third (~2.7 kB).
HUGE_KEY = secrets.token_hex(10_000)


def _committed(settings) -> int:
    offsets = committed_offsets(
        settings.kafka_bootstrap_servers, settings.consumer_group, settings.jobs_topic, 1
    )
    return offsets[0]


def test_a_20000_character_fairness_key_does_not_stop_its_partition(settings, db, tmp_path):
    """The lane index holds a bounded form of the key: the job is created like any
    other, and the job behind it on the same partition is created too."""
    jobs = [
        JobEnvelope("job_fair_before", wf.FAIR, {"tenant": "small"}),
        JobEnvelope("job_fair_huge", wf.FAIR, {"tenant": HUGE_KEY}),
        JobEnvelope("job_fair_after", wf.FAIR, {"tenant": "small"}),
        JobEnvelope("job_plain_after", "order-workflow", {"i": 1}),
    ]
    _produce_to_partition_0(
        settings.kafka_bootstrap_servers, settings.jobs_topic, [(e.key(), e.encode()) for e in jobs]
    )
    env = {**settings_env(settings), "ONCEFLOW_WORKFLOW_MODULES": MODULES}
    with ProcessGroup(env, tmp_path / "logs") as group:
        start_worker(group)
        wait_until(
            lambda: scalar(db, "SELECT count(*) FROM onceflow_instances") == 4,
            60,
            "the four jobs' instances (the ones behind the huge key included)",
            group,
        )
        wait_until(lambda: _committed(settings) == 4, 30, "partition 0 committed to its end")
        assert group.stop("streams", signal.SIGTERM) == 0
    with db.connect() as conn:
        tenant, lane = conn.execute(
            sa.text(
                "SELECT params->>'tenant', flow_lane FROM onceflow_instances"
                " WHERE job_id = 'job_fair_huge'"
            )
        ).one()
    assert tenant == HUGE_KEY  # the params are stored exactly ...
    assert len(lane) < 100  # ... the lane holds a bounded form of the key
    # and the engine's flow-controlled claim takes it like any other
    done = (
        "SELECT count(*) FROM onceflow_instances"
        f" WHERE workflow = '{wf.FAIR}' AND status = 'complete'"
    )
    run_until(settings, db, lambda: scalar(db, done) == 3)


def test_a_row_refused_by_an_index_is_dead_lettered_and_the_partition_moves_on(
    settings, db, tmp_path
):
    """A limit missed somewhere (here an operator's expression index over params): the
    insert fails with SQLSTATE 54000, the worker isolates the record, dead-letters it
    with reason ``database_refused`` and the SQLSTATE, and creates the rest."""
    with db.begin() as conn:
        conn.execute(
            sa.text("CREATE INDEX test_blob_idx ON onceflow_instances ((params->>'blob'))")
        )
    jobs = [
        JobEnvelope("job_before", "order-workflow", {"i": 0}),
        JobEnvelope("job_poison", "order-workflow", {"blob": secrets.token_hex(10_000)}),
        *(JobEnvelope(f"job_after_{i}", "order-workflow", {"i": i}) for i in range(3)),
    ]
    _produce_to_partition_0(
        settings.kafka_bootstrap_servers, settings.jobs_topic, [(e.key(), e.encode()) for e in jobs]
    )
    with ProcessGroup(settings_env(settings), tmp_path / "logs") as group:
        port = start_worker(group)
        wait_until(
            lambda: scalar(db, "SELECT count(*) FROM onceflow_instances") == 4,
            60,
            "the four healthy jobs' instances",
            group,
        )
        dead = consume_all(settings.kafka_bootstrap_servers, settings.dlq_topic, 1)
        wait_until(lambda: _committed(settings) == 5, 30, "partition 0 committed to its end")
        metrics = urllib.request.urlopen(f"http://127.0.0.1:{port}/metrics").read().decode()
        assert group.stop("streams", signal.SIGTERM) == 0

    assert [m.key() for m in dead] == [b"job_poison"]
    headers = dict(dead[0].headers())
    assert headers[HEADER_DLQ_REASON] == b"database_refused"
    assert b"SQLSTATE 54000" in headers[HEADER_DLQ_DETAIL]
    assert 'onceflow_streams_dead_lettered_total{reason="database_refused"} 1.0' in metrics
    with db.connect() as conn:
        rows = conn.execute(
            sa.text("SELECT job_id, reason, detail FROM onceflow_dead_letters")
        ).all()
    assert [(r.job_id, r.reason) for r in rows] == [("job_poison", "database_refused")]
    assert "SQLSTATE 54000" in rows[0].detail
    assert scalar(db, "SELECT count(*) FROM onceflow_instances WHERE job_id = 'job_poison'") == 0


def test_a_worker_retrying_an_unreachable_database_stops_on_sigterm(settings, tmp_path):
    """Nothing listens on the database's port: the worker retries the batch, blocking
    the partition; SIGTERM still stops it within its grace, without committing."""
    grace = 5.0
    closed = f"postgresql://onceflow@127.0.0.1:{free_port()}/nowhere?connect_timeout=2"
    _produce_to_partition_0(
        settings.kafka_bootstrap_servers,
        settings.jobs_topic,
        [(b"job_blocked", JobEnvelope("job_blocked", "order-workflow", {}).encode())],
    )
    env = {
        **settings_env(settings),
        "ONCEFLOW_DATABASE_URL": closed,
        "ONCEFLOW_STREAMS_SHUTDOWN_GRACE_SECONDS": str(grace),
    }
    with ProcessGroup(env, tmp_path / "logs") as group:
        port = start_worker(group)

        def retrying() -> bool:
            text = urllib.request.urlopen(f"http://127.0.0.1:{port}/metrics").read().decode()
            return any(
                line.startswith("onceflow_streams_db_retries_total ")
                and float(line.split()[1]) >= 2
                for line in text.splitlines()
            )

        wait_until(retrying, 60, "the worker retrying the unreachable database", group)
        started = time.monotonic()
        code = group.stop("streams", signal.SIGTERM, timeout=grace + 20)
        took = time.monotonic() - started
    assert code == 70, f"exit {code} after {took:.1f} s"  # stopped, without committing
    assert took < grace + 5, f"took {took:.1f} s to stop, the grace is {grace} s"
    assert _committed(settings) < 0  # nothing was committed (no offset: OFFSET_INVALID)


def test_a_task_result_the_database_refuses_is_dead_lettered_not_rerun(settings, db, tmp_path):
    """Before, the refusal escaped the batch: the worker exited 70, and every restart ran
    the task again and exited again."""
    jobs = [
        JobEnvelope("job_task_nul", poison_tasks.NUL_RESULT, {}),
        JobEnvelope("job_after_task", "order-workflow", {"i": 1}),
    ]
    _produce_to_partition_0(
        settings.kafka_bootstrap_servers, settings.jobs_topic, [(e.key(), e.encode()) for e in jobs]
    )
    modules = '["onceflow_examples", "tests.integration.poison_tasks"]'
    env = {**settings_env(settings), "ONCEFLOW_WORKFLOW_MODULES": modules}
    with ProcessGroup(env, tmp_path / "logs") as group:
        start_worker(group)
        dead = consume_all(settings.kafka_bootstrap_servers, settings.dlq_topic, 1)
        wait_until(lambda: _committed(settings) == 2, 30, "partition 0 committed", group)
        assert group.stop("streams", signal.SIGTERM) == 0
    assert [m.key() for m in dead] == [b"job_task_nul"]
    headers = dict(dead[0].headers())
    assert headers[HEADER_DLQ_REASON] == b"database_refused"
    assert b"refused its result: SQLSTATE 22P05" in headers[HEADER_DLQ_DETAIL]
    with db.connect() as conn:
        status, attempts = conn.execute(
            sa.text("SELECT status, attempts FROM onceflow_task_runs WHERE job_id = 'job_task_nul'")
        ).one()
    assert (status, attempts) == ("dead_lettered", 1)
    after = "SELECT count(*) FROM onceflow_instances WHERE job_id = 'job_after_task'"
    assert scalar(db, after) == 1
