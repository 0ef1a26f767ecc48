"""Debounce under concurrent actors (issue 26, item 1): a 1,000-job burst on 10 keys
goes through Kafka to two streams workers (one consumer group: the jobs of a key spread
over the partitions, so both workers create jobs of every key at once) while two
engines wait to run them; one engine is SIGKILLed while it runs the keys' instances.
Read back from the database: per key exactly one run (one instance not debounced, it
completes), every other job ``debounced`` into an instance of its key whose chain ends
at that run, no job lost, and no debounced job's step ever executed."""

from __future__ import annotations

import json
import signal
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
from tests.integration import debounce_workflows as wf
from tests.integration.kafka_helpers import produce_envelopes
from tests.integration.test_streams_worker import start_worker

MODULES = json.dumps(["onceflow_examples", "tests.integration.debounce_workflows"])
N, KEYS = 1000, 10
STEP_SECONDS = 1.0  # each of the two steps: the kill comes while runs are in a step


def scalar(db, sql, **params):
    with db.connect() as conn:
        return conn.execute(sa.text(sql), params).scalar()


def rows(db, sql, **params):
    with db.connect() as conn:
        return conn.execute(sa.text(sql), params).all()


def _wait(group, db, sql, what, timeout=120.0, **params):
    deadline = time.monotonic() + timeout
    while not scalar(db, sql, **params):
        assert time.monotonic() < deadline, f"timed out waiting for {what}"
        group.check_alive()
        time.sleep(0.1)


def _decisions(ports, workflow):
    """The workers' onceflow_streams_debounce_decisions_total for ``workflow``."""
    found: dict[str, float] = defaultdict(float)
    for port in ports:
        text = httpx.get(f"http://127.0.0.1:{port}/metrics", timeout=10).text
        for family in text_string_to_metric_families(text):
            for s in family.samples:
                if (
                    s.name == "onceflow_streams_debounce_decisions_total"
                    and s.labels["workflow"] == workflow
                ):
                    found[s.labels["decision"]] += s.value
    return dict(found)


def _produce(settings, envs):
    for i in range(0, len(envs), 100):
        produce_envelopes(settings.kafka_bootstrap_servers, settings.jobs_topic, envs[i : i + 100])


def _kill_an_engine_running(group, db, engines, workflow):
    """SIGKILL the engine that holds a running instance (its pid is in the lease owner,
    ``host:pid:suffix``); answers its name."""
    _wait(
        group,
        db,
        "SELECT count(*) > 0 FROM onceflow_instances WHERE status = 'running' AND workflow = :w",
        "a run in flight",
        w=workflow,
    )
    owner = scalar(db, "SELECT min(lease_owner) FROM onceflow_instances WHERE status = 'running'")
    pid = int(owner.split(":")[1])
    name = next((n for n in engines if group.procs[n].pid == pid), engines[0])
    group.stop(name, sig=signal.SIGKILL)
    return name


@pytest.mark.timeout(240)
@pytest.mark.parametrize("workflow", [wf.BURST, wf.BURST_LEADING], ids=["trailing", "leading"])
def test_a_burst_on_ten_keys_runs_once_per_key_through_a_sigkilled_engine(
    settings, db, tmp_path, workflow
):
    """Trailing, the runs start after the burst (the last job of each key); leading, the
    first job of each key starts at once, so the kill comes while the burst is still
    being decided."""
    env = {
        **settings_env(settings),
        "ONCEFLOW_WORKFLOW_MODULES": MODULES,
        "ONCEFLOW_ENGINE_POLL_INTERVAL_SECONDS": "0.05",
        "ONCEFLOW_ENGINE_LEASE_SECONDS": "2",  # a killed engine's runs are rescued soon
    }
    with ProcessGroup(env, tmp_path / "logs") as group:
        with db.begin() as conn:
            conn.execute(wf.CREATE_EXECUTIONS)
        engines = ["engine-a", "engine-b"]
        for name in engines:
            port = free_port()
            group.start(name, "engine", env={"ONCEFLOW_ENGINE_METRICS_PORT": str(port)})
            group.wait_http(f"http://127.0.0.1:{port}/metrics", 60)
        ports = [start_worker(group, name) for name in ("worker-a", "worker-b")]
        envs = [
            JobEnvelope(
                f"db_{i:04d}", workflow, {"tenant": f"t{i % KEYS}", "seconds": STEP_SECONDS}
            )
            for i in range(N)
        ]
        # produced beside the kill: leading runs start during the burst and may be over
        # before the last record is produced
        producing = threading.Thread(target=_produce, args=(settings, envs))
        producing.start()
        try:
            killed = _kill_an_engine_running(group, db, engines, workflow)
        finally:
            producing.join(60)
        _wait(group, db, "SELECT count(*) = :n FROM onceflow_instances", "every job created", n=N)
        _wait(
            group,
            db,
            "SELECT count(*) = :n AND bool_and(status IN ('complete', 'debounced'))"
            " FROM onceflow_instances",
            "every instance to end",
            n=N,
        )
        decisions = _decisions(ports, workflow)
    created_in = scalar(
        db, "SELECT extract(epoch FROM max(created_at) - min(created_at)) FROM onceflow_instances"
    )
    gap = scalar(
        db,
        "SELECT extract(epoch FROM max(gap)) FROM (SELECT created_at - lag(created_at) OVER"
        " (PARTITION BY params ->> 'tenant' ORDER BY created_at) AS gap"
        " FROM onceflow_instances) AS g",
    )
    print(
        f"1,000 jobs created over {created_in:.2f} s (the longest gap between two jobs of a"
        f" key {gap:.2f} s, the period 8 s); killed {killed}; decisions {decisions}"
    )
    _check(db, workflow)
    assert decisions.get("debounced") == N - KEYS
    assert decisions.get("opened") == KEYS  # one window per key


def _check(db, workflow):
    got = {
        r.job_id: r
        for r in rows(
            db,
            "SELECT i.job_id, i.status, i.debounce_key, i.debounced_into, i.claim_count,"
            " i.params ->> 'tenant' AS tenant FROM onceflow_instances i",
        )
    }
    assert sorted(got) == [f"db_{i:04d}" for i in range(N)]  # one instance each, none lost
    assert scalar(db, "SELECT count(*) FROM onceflow_jobs") == N
    runs = {r.tenant: r.job_id for r in got.values() if r.status != "debounced"}
    per_key = defaultdict(int)
    for r in got.values():
        per_key[r.tenant] += r.status != "debounced"
    assert per_key == {f"t{k}": 1 for k in range(KEYS)}, "not exactly one run per key"
    assert all(got[j].status == "complete" for j in runs.values())
    for r in got.values():
        if r.status != "debounced":
            continue
        seen, at = set(), r
        while at.status == "debounced":  # the chain of absorbers, all of its key
            into = got[at.debounced_into]
            assert into.tenant == r.tenant and into.debounce_key == r.debounce_key
            assert at.job_id not in seen
            seen.add(at.job_id)
            at = into
        assert at.job_id == runs[r.tenant]
    executed = {j for (j,) in rows(db, "SELECT DISTINCT job_id FROM test_debounce_executions")}
    assert executed == set(runs.values()), "a debounced job ran, or a run did not"
    assert any(got[j].claim_count > 1 for j in runs.values()), "the kill hit no run in flight"
