"""Singleton policies under concurrent actors (issue 26, item 3): for each mode, 200
jobs of one key go through Kafka to two streams workers (one consumer group, the jobs
spread over the topic's partitions, so both create instances of the key at once) while
two engines run them. A sampler reads the database every 20 ms; every property is read
back from it (and the workers' counters from their /metrics)."""

from __future__ import annotations

import json
import threading
import time
from collections import defaultdict

import httpx
import pytest
import sqlalchemy as sa
from prometheus_client.parser import text_string_to_metric_families

from onceflow.envelope import JobEnvelope
from onceflow_tools.processes import ProcessGroup, free_port
from tests.conftest import settings_env
from tests.integration import singleton_workflows as wf
from tests.integration.kafka_helpers import produce_envelopes
from tests.integration.test_streams_worker import start_worker

MODULES = json.dumps(["onceflow_examples", "tests.integration.singleton_workflows"])
N = 200
KEY = "k1"


def scalar(db, sql, **params):
    with db.connect() as conn:
        return conn.execute(sa.text(sql), params).scalar()


def rows(db, sql, **params):
    with db.connect() as conn:
        return conn.execute(sa.text(sql), params).all()


class KeySampler(threading.Thread):
    """Every 20 ms: the most running and the most live instances any key of ``workflow``
    has, kept as maxima."""

    SQL = sa.text(
        "SELECT coalesce(max(running), 0), coalesce(max(live), 0) FROM ("
        " SELECT count(*) FILTER (WHERE status = 'running') AS running, count(*) AS live"
        " FROM onceflow_instances WHERE workflow = :w"
        " AND status IN ('queued', 'running', 'sleeping', 'waiting', 'paused')"
        " GROUP BY params ->> 'customer') x"
    )

    def __init__(self, db, workflow: str) -> None:
        super().__init__(daemon=True)
        self.db, self.workflow = db, workflow
        self.max_running = self.max_live = self.samples = 0
        self.halt = threading.Event()

    def run(self) -> None:
        while not self.halt.is_set():
            with self.db.connect() as conn:
                running, live = conn.execute(self.SQL, {"w": self.workflow}).one()
            self.max_running = max(self.max_running, running)
            self.max_live = max(self.max_live, live)
            self.samples += 1
            self.halt.wait(0.02)


class Stack:
    """Two streams workers and two engines, started for one test."""

    def __init__(self, settings, db, tmp_path) -> None:
        self.settings, self.db = settings, db
        env = {
            **settings_env(settings),
            "ONCEFLOW_WORKFLOW_MODULES": MODULES,
            "ONCEFLOW_ENGINE_POLL_INTERVAL_SECONDS": "0.05",
        }
        self.group = ProcessGroup(env, tmp_path / "logs")
        self.worker_ports: list[int] = []

    def __enter__(self) -> Stack:
        self.group.__enter__()
        with self.db.begin() as conn:
            conn.execute(wf.CREATE_EXECUTIONS)
        for name in ("engine-a", "engine-b"):
            port = free_port()
            self.group.start(name, "engine", env={"ONCEFLOW_ENGINE_METRICS_PORT": str(port)})
            self.group.wait_http(f"http://127.0.0.1:{port}/metrics", 60)
        for name in ("worker-a", "worker-b"):
            self.worker_ports.append(start_worker(self.group, name))
        return self

    def __exit__(self, *exc) -> None:
        self.group.__exit__(*exc)

    def submit(self, workflow: str, job_ids: list[str], seconds: float, burst=20, gap=0.1):
        for i in range(0, len(job_ids), burst):
            envs = [
                JobEnvelope(j, workflow, {"customer": KEY, "seconds": seconds})
                for j in job_ids[i : i + burst]
            ]
            produce_envelopes(self.settings.kafka_bootstrap_servers, self.settings.jobs_topic, envs)
            time.sleep(gap)

    def wait(self, sql: str, what: str, timeout: float = 120.0, **params) -> None:
        deadline = time.monotonic() + timeout
        while not scalar(self.db, sql, **params):
            assert time.monotonic() < deadline, f"timed out waiting for {what}"
            self.group.check_alive()
            time.sleep(0.1)

    def decisions(self, workflow: str) -> dict[str, float]:
        """The workers' onceflow_streams_singleton_decisions_total for ``workflow``."""
        found: dict[str, float] = defaultdict(float)
        for port in self.worker_ports:
            text = httpx.get(f"http://127.0.0.1:{port}/metrics", timeout=10).text
            for family in text_string_to_metric_families(text):
                for s in family.samples:
                    if (
                        s.name == "onceflow_streams_singleton_decisions_total"
                        and s.labels["workflow"] == workflow
                    ):
                        found[s.labels["decision"]] += s.value
        return dict(found)


def _run(settings, db, tmp_path, workflow, submit):
    sampler = KeySampler(db, workflow)
    with Stack(settings, db, tmp_path) as stack:
        sampler.start()
        try:
            submit(stack)
            stack.wait(
                "SELECT count(*) = :n AND bool_and(status IN"
                " ('complete', 'errored', 'terminated', 'skipped')) FROM onceflow_instances"
                " WHERE workflow = :w",
                "every instance to end",
                n=N,
                w=workflow,
            )
        finally:
            sampler.halt.set()
            sampler.join()
        decisions = stack.decisions(workflow)
    partitions = scalar(
        db,
        "SELECT count(DISTINCT source_partition) FROM onceflow_jobs WHERE type_name = :w",
        w=workflow,
    )
    print(
        f"\n{workflow}: {sampler.samples} samples, max running per key {sampler.max_running},"
        f" max live per key {sampler.max_live}, decisions {decisions},"
        f" {partitions} partitions"
    )
    assert sampler.samples > 50
    assert sampler.max_running == 1  # never two running of one key (and one ran)
    assert partitions >= 2  # both workers' consumers had jobs of the key
    return sampler, decisions


def _instances(db, workflow):
    return {
        r.job_id: r
        for r in rows(
            db,
            "SELECT job_id, status, skipped_for, cancelled_by, created_at, error"
            " FROM onceflow_instances WHERE workflow = :w",
            w=workflow,
        )
    }


def _executions(db):
    found = defaultdict(list)
    for job_id, step, seen in rows(
        db, "SELECT job_id, step, cancelled_seen FROM test_singleton_executions ORDER BY at"
    ):
        found[job_id].append((step, seen))
    return found


@pytest.mark.timeout(300)
def test_skip_200_jobs_of_one_key_two_workers_two_engines(settings, db, tmp_path):
    ids = [f"sp_{i:03d}" for i in range(N)]
    sampler, decisions = _run(
        settings, db, tmp_path, wf.SKIP, lambda s: s.submit(wf.SKIP, ids, 0.05)
    )
    assert sampler.max_live == 1  # skip: never two live instances of the key, sampled
    got = _instances(db, wf.SKIP)
    assert set(got) == set(ids)
    complete = {j for j, r in got.items() if r.status == "complete"}
    skipped = {j: r for j, r in got.items() if r.status == "skipped"}
    assert complete | set(skipped) == set(ids)  # each one either ran or was skipped
    for job_id, r in skipped.items():
        # named the live one, which ran (not created_at order: a creating transaction
        # that began later can take the key's lock first, and did here)
        assert r.skipped_for in complete, (job_id, r.skipped_for)
    runs = _executions(db)
    assert not set(runs) & set(skipped)  # a skipped one never ran a step
    assert all(len(runs[j]) == 3 for j in complete)
    assert len(complete) >= 2 and skipped  # the key became free again and jobs were skipped
    assert decisions == {"active": len(complete), "skipped": len(skipped)}


@pytest.mark.timeout(300)
def test_cancel_in_progress_200_jobs_the_last_one_completes(settings, db, tmp_path):
    ids = [f"cp_{i:03d}" for i in range(N)]

    def submit(stack):
        # 3 s a run: the last of these cannot finish before the last job arrives
        stack.submit(wf.CANCEL, ids[:-1], 1.0)
        stack.wait(
            "SELECT count(*) = :n FROM onceflow_instances WHERE workflow = :w",
            "the first jobs' instances",
            n=N - 1,
            w=wf.CANCEL,
        )
        stack.submit(wf.CANCEL, ids[-1:], 1.0)  # the last one, after every other exists

    _, decisions = _run(settings, db, tmp_path, wf.CANCEL, submit)
    got = _instances(db, wf.CANCEL)
    assert got[ids[-1]].status == "complete" and got[ids[-1]].cancelled_by is None
    earlier = [got[j] for j in ids[:-1]]
    wrong = [(r.job_id, r.status, r.cancelled_by) for r in earlier if r.status != "terminated"]
    assert not wrong and all(r.cancelled_by for r in earlier), wrong
    assert all(r.error == f"cancelled by {r.cancelled_by} (singleton)" for r in earlier)
    runs = _executions(db)
    assert len(runs[ids[-1]]) == 3
    ran = [r.job_id for r in earlier if runs.get(r.job_id)]
    for job_id in ran:
        # A step in flight when the cancellation committed finishes (steps are not
        # interrupted); none starts after it: only the last execution may have seen it.
        seen = [n for n, (_, s) in enumerate(runs[job_id]) if s]
        assert seen in ([], [len(runs[job_id]) - 1]), (job_id, runs[job_id])
        assert len(runs[job_id]) < 3, (job_id, runs[job_id])  # stopped before its end
    assert ran  # running instances were cancelled, not only queued ones
    # each earlier one cancelled once; a batch's newest is the live one at its commit
    assert decisions["cancelled"] == N - 1 and 1 <= decisions["active"] <= N, decisions
    print(f"cancelled while running: {len(ran)}; while queued: {N - 1 - len(ran)}")


@pytest.mark.timeout(300)
def test_queue_200_jobs_of_one_key_run_one_at_a_time(settings, db, tmp_path):
    ids = [f"qu_{i:03d}" for i in range(N)]
    sampler, decisions = _run(
        settings, db, tmp_path, wf.QUEUE, lambda s: s.submit(wf.QUEUE, ids, 0.0, burst=50)
    )
    got = _instances(db, wf.QUEUE)
    assert all(r.status == "complete" for r in got.values()) and len(got) == N
    assert sampler.max_live > 1  # they queued behind each other
    assert decisions == {}  # queue takes no decision at creation: the claim's limit
