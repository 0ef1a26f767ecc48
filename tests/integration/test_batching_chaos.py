"""Batching through Kafka on two engines, one SIGKILLed mid-run (issue 26, item 2): 5,000
jobs of a batched workflow (max_size 50, five tenants) are produced to the real jobs
topic; the real streams worker creates their instances; two real engines
(``onceflow engine``) form the batches and run them; engine-0 is SIGKILLed once a third
of the members are done, while it runs a batch (which engine-1 takes over). Read back
from the database: every batch run holds at most max_size members of one tenant, every
member is in exactly one batch run and its result is its own, no member ran in two
batch runs, and nothing is lost."""

from __future__ import annotations

import json
import os
import signal
import time

import pytest

from onceflow.envelope import JobEnvelope
from onceflow_tools.processes import ProcessGroup, free_port
from tests.conftest import settings_env
from tests.integration import batch_workflows as wf
from tests.integration.engine_processes import start_engine
from tests.integration.interleavings import rows, scalar, wait_for
from tests.integration.kafka_helpers import produce_envelopes
from tests.integration.test_streams_worker import start_worker
from workflow_engine.store.views import ENGINE_STALE_SECONDS, live_engines

N = int(os.environ.get("ONCEFLOW_TEST_BATCH_JOBS", "5000"))
TENANTS = 5
MAX_SIZE = 50


@pytest.mark.timeout(240)
def test_5000_jobs_two_engines_one_sigkilled_every_member_in_one_batch(settings, db, tmp_path):
    with db.begin() as conn:
        conn.execute(wf.CREATE_RUNS)
    env = {
        **settings_env(settings),
        "ONCEFLOW_WORKFLOW_MODULES": json.dumps(["tests.integration.batch_workflows"]),
        "ONCEFLOW_DATABASE_URL": settings.database_url,
        "BATCH_SECONDS": "0.2",  # a run is in flight long enough for the kill to cut one
    }
    members = f"SELECT count(*) FROM onceflow_instances WHERE workflow = '{wf.CHAOS}'"
    done = members + " AND batch_size IS NULL AND status = 'complete'"
    with ProcessGroup(env, tmp_path / "logs") as group:
        start_engine(group, "engine-0", 0.2)
        start_engine(group, "engine-1", 0.2)
        start_worker(group)
        wait_for(lambda: len(live_engines(db, ENGINE_STALE_SECONDS)) == 2, "both engines up", 60)
        produce_envelopes(
            settings.kafka_bootstrap_servers,
            settings.jobs_topic,
            [
                JobEnvelope(f"bc_{i:05d}", wf.CHAOS, {"tenant": f"t{i % TENANTS}", "n": i})
                for i in range(N)
            ],
        )
        wait_for(lambda: scalar(db, done) >= N // 3, "a third of the members done", 120)
        # killed while it runs a batch (its lease owner is host:pid:...), so the kill
        # cuts a run in flight, which the survivor must take over and finish
        pid = group.procs["engine-0"].pid
        held = (
            "SELECT min(job_id) FROM onceflow_instances WHERE batch_size IS NOT NULL"
            f" AND status = 'running' AND lease_owner LIKE '%:{pid}:%'"
        )
        wait_for(lambda: scalar(db, held) is not None, "engine-0 running a batch", 60)
        done_at_kill = scalar(db, done)
        group.stop("engine-0", sig=signal.SIGKILL)
        cut = scalar(db, held)
        started = time.monotonic()
        wait_for(lambda: scalar(db, done) == N, "every member complete", 150)
        after_kill = time.monotonic() - started
    found = rows(
        db,
        "SELECT job_id, status, batch_id, batch_index, result, params FROM onceflow_instances"
        f" WHERE workflow = '{wf.CHAOS}' AND batch_size IS NULL",
    )
    runs = {
        r[0]: r[1:]
        for r in rows(
            db,
            "SELECT job_id, batch_size, status, params FROM onceflow_instances"
            f" WHERE workflow = '{wf.CHAOS}' AND batch_size IS NOT NULL",
        )
    }
    assert len(found) == N  # one instance per job id, none lost
    assert {r.status for r in found} == {"complete"}
    assert all(size <= MAX_SIZE for size, _, _ in runs.values())
    assert {status for _, status, _ in runs.values()} == {"complete"}
    assert sum(size for size, _, _ in runs.values()) == N  # every member in one run
    for job_id, _, batch_id, index, result, params in found:
        _, _, run_params = runs[batch_id]
        assert run_params["members"][index]["job_id"] == job_id
        assert run_params["key"] == params["tenant"]
        assert result == {"n": params["n"]}
    # the runs' step code: a member was run by one batch run only (a run's step may
    # run again after the kill: at least once, within its own run)
    two = rows(
        db,
        "SELECT member FROM test_batch_runs GROUP BY member HAVING count(DISTINCT batch_id) > 1",
    )
    assert two == []
    assert scalar(db, "SELECT count(DISTINCT member) FROM test_batch_runs") == N
    # each member's lifecycle events (the counter on its row; the relay deletes what it
    # published): three, created, batched and one final, though the kill cut a run
    seqs = rows(
        db,
        "SELECT event_seq, count(*) FROM onceflow_instances"
        f" WHERE workflow = '{wf.CHAOS}' AND batch_size IS NULL GROUP BY event_seq",
    )
    assert [tuple(r) for r in seqs] == [(3, N)]
    sizes = sorted(size for size, _, _ in runs.values())
    rescued = scalar(
        db,
        f"SELECT count(*) FROM onceflow_instances WHERE workflow = '{wf.CHAOS}'"
        " AND batch_size IS NOT NULL AND claim_count > 1",
    )
    print(
        f"batching through a SIGKILL: {N} members in {len(runs)} runs (sizes"
        f" {sizes[0]}..{sizes[-1]}, {sum(s == MAX_SIZE for s in sizes)} full),"
        f" {done_at_kill} done at the kill, the rest {after_kill:.1f} s after it;"
        f" {rescued} runs claimed again after the kill"
    )
    assert 0 < done_at_kill < N
    assert cut is not None and runs[cut][1] == "complete"  # a run the kill cut, finished
    assert scalar(db, f"SELECT claim_count FROM onceflow_instances WHERE job_id = '{cut}'") > 1


@pytest.mark.timeout(120)
def test_an_engine_killed_mid_formation_leaves_the_pool_whole(settings, db, tmp_path):
    """engine-0 is SIGKILLed by a failpoint with a batch's members locked and nothing
    written; its transaction dies with it: engine-1, started then, forms every batch
    and no member is lost or in two."""
    n = 300
    with db.begin() as conn:
        conn.execute(wf.CREATE_RUNS)
    env = {
        **settings_env(settings),
        "ONCEFLOW_WORKFLOW_MODULES": json.dumps(["tests.integration.batch_workflows"]),
    }
    members = f"SELECT count(*) FROM onceflow_instances WHERE workflow = '{wf.CHAOS}'"
    with ProcessGroup(env, tmp_path / "logs") as group:
        start_worker(group)
        produce_envelopes(
            settings.kafka_bootstrap_servers,
            settings.jobs_topic,
            [JobEnvelope(f"bk_{i:04d}", wf.CHAOS, {"tenant": "t", "n": i}) for i in range(n)],
        )
        wait_for(lambda: scalar(db, members) == n, "every member created", 60)
        group.start(
            "engine-0",
            "engine",
            failpoints="batch.after_lock=kill",
            env={"ONCEFLOW_ENGINE_METRICS_PORT": str(free_port())},
        )
        wait_for(lambda: group.procs["engine-0"].poll() is not None, "engine-0 killed", 60)
        assert group.procs["engine-0"].returncode == -signal.SIGKILL
        assert scalar(db, members + " AND status = 'batching'") == n  # nothing written
        start_engine(group, "engine-1", 0.2)
        done = members + " AND batch_size IS NULL AND status = 'complete'"
        wait_for(lambda: scalar(db, done) == n, "every member complete", 60)
    sizes = [
        r[0]
        for r in rows(db, members.replace("count(*)", "batch_size") + " AND batch_size IS NOT NULL")
    ]
    assert sorted(sizes) == [MAX_SIZE] * (n // MAX_SIZE)
