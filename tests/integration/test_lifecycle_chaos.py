"""Lifecycle events through engine crashes (issue 25): the engine, which runs the relay,
SIGKILLed at random points while hundreds of workflows run; and the relay's take-over
from an engine that died. Engines are real subprocesses (``onceflow engine``)."""

from __future__ import annotations

import os
import random
import signal
import time

import httpx
import pytest
import sqlalchemy as sa

from onceflow.envelope import JobEnvelope
from onceflow_tools.processes import ProcessGroup, free_port
from tests.conftest import settings_env
from tests.integration.events_helpers import read_topic, sequences
from workflow_engine.model import Delivery
from workflow_engine.store.writes import create_instances, outbox_depth

ORDER_KINDS = [
    "instance.created",
    "instance.started",
    "step.completed",
    "step.completed",
    "step.completed",
    "instance.complete",
]


def _deliver(db, prefix, n, workflow, params):
    for start in range(0, n, 250):
        create_instances(
            db,
            [
                Delivery(JobEnvelope(f"{prefix}{i:05d}", workflow, params), "jobs", 0, i)
                for i in range(start, min(n, start + 250))
            ],
        )


def _count(db, sql):
    with db.connect() as conn:
        return conn.execute(sa.text(sql)).scalar()


def _complete(db):
    return _count(db, "SELECT count(*) FROM onceflow_instances WHERE status = 'complete'")


def _engine(group, name, port, failpoints=""):
    group.start(
        name,
        "engine",
        failpoints=failpoints,
        env={
            "ONCEFLOW_ENGINE_METRICS_PORT": str(port),
            # a killed engine's leases expire (and its instances are rescued) quickly
            "ONCEFLOW_ENGINE_LEASE_SECONDS": "2",
            "ONCEFLOW_ENGINE_POLL_INTERVAL_SECONDS": "0.2",
        },
    )


@pytest.mark.timeout(240)
def test_sigkilled_engine_every_committed_change_has_exactly_one_event(settings, db, tmp_path):
    # 800 in CI (about 15 s here); ONCEFLOW_TEST_CHAOS_JOBS=2000 for the count
    n = int(os.environ.get("ONCEFLOW_TEST_CHAOS_JOBS", "800"))
    rng = random.Random()
    seed = rng.randrange(1_000_000)
    rng.seed(seed)
    _deliver(db, "chaos_", n, "order-workflow", {"step_seconds": 0.01})
    kills = 0
    with ProcessGroup(settings_env(settings), tmp_path / "logs") as group:
        port = free_port()
        _engine(group, "engine-0", port)
        deadline = time.monotonic() + 180
        # killed at three random points of the run: after a random share of the jobs
        # completed, plus a random fraction of a second (mid-batch, mid-relay-round)
        for share in sorted(rng.uniform(0.05, 0.85) for _ in range(3)):
            while _complete(db) < share * n:
                assert time.monotonic() < deadline, f"stuck at {_complete(db)} (seed {seed})"
                group.check_alive()
                time.sleep(0.02)
            time.sleep(rng.uniform(0, 0.3))
            group.stop(f"engine-{kills}", sig=signal.SIGKILL)
            kills += 1
            # the second one also dies between Kafka's acknowledgement and the delete
            # of its relay's first round: those events are published twice
            fail = "relay.after_publish=kill*1" if kills == 2 else ""
            _engine(group, f"engine-{kills}", free_port(), fail)
            if fail:
                while group.procs[f"engine-{kills}"].poll() is None:
                    assert time.monotonic() < deadline, "the relay failpoint was not reached"
                    time.sleep(0.02)
                group.procs.pop(f"engine-{kills}")
                kills += 1
                _engine(group, f"engine-{kills}", free_port())
        while _complete(db) < n or outbox_depth(db, 10**6).events > 0:
            assert time.monotonic() < deadline, f"{_complete(db)} of {n} (seed {seed})"
            group.check_alive()
            time.sleep(0.1)

    records = read_topic(settings.kafka_bootstrap_servers, settings.events_topic, timeout=60)
    jobs = sequences(records)  # deduped by (job id, sequence); 1..n each, in order
    assert len(jobs) == n, seed
    wrong = {job: [e.kind for e in events] for job, events in jobs.items()}
    wrong = {job: kinds for job, kinds in wrong.items() if kinds != ORDER_KINDS}
    assert wrong == {}, (seed, list(wrong.items())[:3])
    # what the database says happened: the counter is the last sequence, and each
    # job's step.completed events are its completed steps, by name, once each
    with db.connect() as conn:
        counters = dict(
            conn.execute(sa.text("SELECT job_id, event_seq FROM onceflow_instances")).all()
        )
        steps = conn.execute(
            sa.text(
                "SELECT job_id, array_agg(name ORDER BY position) FROM onceflow_steps"
                " WHERE status = 'complete' GROUP BY job_id"
            )
        ).all()
    assert {job: len(events) for job, events in jobs.items()} == counters
    for job, names in steps:
        assert [e.data["step"]["name"] for e in jobs[job] if e.kind == "step.completed"] == names
    republished = len(records) - 6 * n
    assert republished > 0, "the kill after the acknowledgement republished nothing"
    print(f"seed {seed}: {kills} kills, {len(records)} records, {republished} republished")


def _relay_active(port: int) -> bool:
    text = httpx.get(f"http://127.0.0.1:{port}/metrics", timeout=2).text
    return "onceflow_events_relay_active 1.0" in text


@pytest.mark.timeout(120)
def test_the_relay_moves_to_another_engine_when_its_engine_dies(settings, db, tmp_path):
    with ProcessGroup(settings_env(settings), tmp_path / "logs") as group:
        ports = {"engine-a": free_port(), "engine-b": free_port()}
        for name, port in ports.items():
            _engine(group, name, port)
            group.wait_http(f"http://127.0.0.1:{port}/metrics")
        _deliver(db, "before_", 20, "noop-workflow", {})
        deadline = time.monotonic() + 60
        while outbox_depth(db, 10**6).events > 0 or _complete(db) < 20:
            assert time.monotonic() < deadline
            time.sleep(0.1)
        active = [name for name, port in ports.items() if _relay_active(port)]
        assert len(active) == 1, active  # exactly one relay across the engines
        group.stop(active[0], sig=signal.SIGKILL)
        (survivor,) = [name for name in ports if name != active[0]]
        _deliver(db, "after_", 20, "noop-workflow", {})
        while outbox_depth(db, 10**6).events > 0 or _complete(db) < 40:
            assert time.monotonic() < deadline, "the surviving engine's relay did not take over"
            time.sleep(0.1)
        assert _relay_active(ports[survivor])
    jobs = sequences(read_topic(settings.kafka_bootstrap_servers, settings.events_topic))
    assert len(jobs) == 40
    assert all([e.kind for e in events][-1] == "instance.complete" for events in jobs.values())
