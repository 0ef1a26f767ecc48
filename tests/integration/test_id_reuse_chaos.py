"""Id reuse (issue 26, item 8) under concurrent actors: 40 job ids fail their first run;
each is then resubmitted twice, keyless, so the two copies spread over the topic's
partitions and the two streams workers resubmit one id at once, while two engines run
the new runs and one engine is SIGKILLed in the middle of them. A sampler reads the
database every 20 ms. Every property is read back from the database."""

from __future__ import annotations

import json
import signal
import threading
import time
from collections import Counter

import pytest
import sqlalchemy as sa

from onceflow.envelope import JobEnvelope
from onceflow_tools.processes import ProcessGroup, free_port
from tests.conftest import settings_env
from tests.integration import reuse_workflows as wf
from tests.integration.kafka_helpers import produce
from tests.integration.test_streams_worker import start_worker

MODULES = json.dumps(["onceflow_examples", "tests.integration.reuse_workflows"])
N = 40


def scalar(db, sql, **params):
    with db.connect() as conn:
        return conn.execute(sa.text(sql), params).scalar()


def rows(db, sql, **params):
    with db.connect() as conn:
        return conn.execute(sa.text(sql), params).all()


class RunSampler(threading.Thread):
    """Every 20 ms: job ids with two runs not finished (two open onceflow_runs rows, or
    an open one that is not the instance's run), and with a run-2 step executing while
    a run-1 step was recorded after it began (never: run 1 was over)."""

    SQL = sa.text(
        "SELECT (SELECT count(*) FROM (SELECT job_id FROM onceflow_runs WHERE status IS NULL"
        "  GROUP BY job_id HAVING count(*) > 1) x)"
        " + (SELECT count(*) FROM onceflow_runs r JOIN onceflow_instances i USING (job_id)"
        "  WHERE r.status IS NULL AND r.run <> i.run)"
        " + (SELECT count(*) FROM onceflow_instances i JOIN onceflow_runs r USING (job_id)"
        "  WHERE r.run > i.run)"
    )

    def __init__(self, db) -> None:
        super().__init__(daemon=True)
        self.db = db
        self.violations = self.samples = 0
        self.halt = threading.Event()

    def run(self) -> None:
        while not self.halt.is_set():
            self.violations = max(self.violations, scalar(self.db, self.SQL.text))
            self.samples += 1
            self.halt.wait(0.02)


def _engine(group: ProcessGroup, name: str) -> None:
    port = free_port()
    group.start(
        name,
        "engine",
        env={
            "ONCEFLOW_ENGINE_METRICS_PORT": str(port),
            "ONCEFLOW_ENGINE_LEASE_SECONDS": "2",
            "ONCEFLOW_ENGINE_POLL_INTERVAL_SECONDS": "0.05",
        },
    )
    group.wait_http(f"http://127.0.0.1:{port}/metrics", 60)


def _wait(group, db, sql, what, timeout=90.0):
    deadline = time.monotonic() + timeout
    while not scalar(db, sql):
        assert time.monotonic() < deadline, f"timed out waiting for {what}"
        group.check_alive()
        time.sleep(0.05)


def _send(settings, envelopes, keyed: bool) -> None:
    records = [(e.key() if keyed else None, e.encode(), e.headers()) for e in envelopes]
    produce(settings.kafka_bootstrap_servers, settings.jobs_topic, records)


@pytest.mark.timeout(240)
def test_two_runs_of_one_id_never_at_once_through_a_sigkill(settings, db, tmp_path):
    ids = [f"rk_{i:02d}" for i in range(N)]
    env = {**settings_env(settings), "ONCEFLOW_WORKFLOW_MODULES": MODULES}
    sampler = RunSampler(db)
    with ProcessGroup(env, tmp_path / "logs") as group:
        with db.begin() as conn:
            conn.execute(wf.CREATE_EXECUTIONS)
        _engine(group, "engine-a")
        _engine(group, "engine-b")
        start_worker(group, "worker-a")
        start_worker(group, "worker-b")
        first = {"attempt": "first", "fail": True, "seconds": 0.02}
        _send(settings, [JobEnvelope(j, wf.AFTER_FAILURE, first) for j in ids], keyed=True)
        _wait(
            group,
            db,
            f"SELECT count(*) = {N} FROM onceflow_instances WHERE status = 'errored'",
            "every first run to fail",
        )
        sampler.start()
        second = {"attempt": "second", "seconds": 0.4}
        copies = [JobEnvelope(j, wf.AFTER_FAILURE, second) for j in ids for _ in range(2)]
        _send(settings, copies, keyed=False)
        # killed while second runs are in their steps
        _wait(
            group,
            db,
            "SELECT count(*) > 0 FROM onceflow_instances WHERE run = 2 AND status = 'running'",
            "a second run running",
        )
        at_kill = scalar(db, "SELECT count(*) FROM onceflow_instances WHERE status = 'running'")
        group.stop("engine-a", sig=signal.SIGKILL)
        _wait(
            group,
            db,
            f"SELECT count(*) = {N} FROM onceflow_instances WHERE run = 2 AND status = 'complete'",
            "every second run to complete",
            120,
        )
        sampler.halt.set()
        sampler.join()
    again = scalar(
        db,
        "SELECT count(*) - count(DISTINCT (job_id, step)) FROM test_reuse_executions"
        " WHERE attempt = 'second'",
    )
    print(
        f"\n{sampler.samples} samples, violations {sampler.violations}, {at_kill} running at"
        f" the kill, {again} run-2 steps executed again after it,"
        f" {scalar(db, 'SELECT count(*) FROM onceflow_duplicate_deliveries WHERE redelivery')}"
        " redeliveries"
    )
    assert sampler.samples > 20 and sampler.violations == 0
    got = rows(db, "SELECT job_id, run, status, result FROM onceflow_instances ORDER BY job_id")
    assert [(r.job_id, r.run, r.status, r.result) for r in got] == [
        (j, 2, "complete", "two:second") for j in ids
    ]
    # exactly one new run per id, whichever worker took it: run 1 archived errored with
    # its steps, run 2 the current one; the other copy collapsed as a duplicate
    history = rows(db, "SELECT job_id, run, status, steps FROM onceflow_runs ORDER BY job_id, run")
    assert [(r.job_id, r.run, r.status) for r in history] == [
        (j, n, s) for j in ids for n, s in ((1, "errored"), (2, None))
    ]
    assert all([s["name"] for s in r.steps] == ["one", "two"] for r in history if r.run == 1)
    found = rows(
        db,
        "SELECT job_id, redelivery, source_partition, source_offset, params_match"
        " FROM onceflow_duplicate_deliveries ORDER BY job_id, source_offset",
    )
    dups = Counter(r.job_id for r in found if not r.redelivery)
    assert dups == Counter({j: 1 for j in ids}), found[:6]
    spread = scalar(db, "SELECT count(DISTINCT source_partition) FROM onceflow_runs WHERE run = 2")
    assert spread >= 2  # both workers started new runs
    # run 1 never executed after run 2 began: the first label's last execution per id
    # is before the second label's first
    order = rows(
        db,
        "SELECT job_id, max(at) FILTER (WHERE attempt = 'first') AS last_first,"
        " min(at) FILTER (WHERE attempt = 'second') AS first_second"
        " FROM test_reuse_executions GROUP BY job_id",
    )
    assert len(order) == N and all(r.last_first < r.first_second for r in order)
