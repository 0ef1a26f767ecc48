"""Retry an errored instance from its failed step, and fork one from a position
(issue 26, item 6), on the real database with an engine in process.

Every execution of step code is counted in a table of the test's database (not in the
engine's memory), so "no completed step runs again" is read from rows the step code
itself wrote.
"""

from __future__ import annotations

import threading
from typing import Any

import pytest
import sqlalchemy as sa

from onceflow import failpoints
from onceflow.envelope import JobEnvelope
from onceflow.vocabulary import BulkAction
from tests.integration.interleavings import EngineHarness, check_history, rows, status, wait_for
from workflow_engine import RetryPolicy, StepFailed, workflow
from workflow_engine.model import Delivery
from workflow_engine.store.operations import (
    ControlError,
    ForkExists,
    fork,
    retry,
    run_bulk,
    start_bulk,
    terminate,
)
from workflow_engine.store.views import InstanceFilter, describe_instance
from workflow_engine.store.writes import create_instances

WORKFLOW = "test-retry-steps"
_CREATE_COUNTS = sa.text(
    "CREATE TABLE IF NOT EXISTS test_step_executions"
    " (job_id text NOT NULL, step text NOT NULL, at timestamptz NOT NULL DEFAULT now())"
)
_COUNT = sa.text(
    "WITH run AS (INSERT INTO test_step_executions (job_id, step) VALUES (:j, :s))"
    " SELECT count(*) + 1 FROM test_step_executions WHERE job_id = :j AND step = :s"
)
#: The database the step code counts its executions in (set by the fixture).
_COUNTS: dict[str, sa.Engine] = {}


def _run(job_id: str, step: str, fail_first: int) -> int:
    """Count this execution; fail the first ``fail_first`` executions of the step."""
    with _COUNTS["db"].begin() as conn:
        n = int(conn.execute(_COUNT, {"j": job_id, "s": step}).scalar_one())
    if n <= fail_first:
        raise OSError(f"{step} down (execution {n})")
    return n


@workflow(WORKFLOW)
async def retried(ctx, params):
    one = await ctx.step("one", _run, ctx.job_id, "one", 0)
    two = await ctx.step(
        "two",
        _run,
        ctx.job_id,
        "two",
        params.get("fail_two", 0),
        retries=RetryPolicy(limit=1, delay=0),
    )
    three = await ctx.step("three", _run, ctx.job_id, "three", 0)
    return {"one": one, "two": two, "three": three, "tag": params.get("tag")}


@pytest.fixture
def counted(db):
    with db.begin() as conn:
        conn.execute(_CREATE_COUNTS)
    _COUNTS["db"] = db
    yield db
    _COUNTS.clear()


def _submit(db, job_id: str, **params: Any) -> None:
    create_instances(db, [Delivery(JobEnvelope(job_id, WORKFLOW, params), "t", 0, 0)])


def _executions(db, job_id: str) -> dict[str, int]:
    found = rows(
        db,
        "SELECT step, count(*) FROM test_step_executions WHERE job_id = :j GROUP BY step",
        j=job_id,
    )
    return {step: n for step, n in found}


def _final(db, job_id: str) -> bool:
    return status(db, job_id) in ("complete", "errored", "terminated")


def test_retry_runs_the_failed_step_again_with_a_fresh_budget(settings, counted):
    """Step "two" fails its first three executions. Its budget is two tries (limit=1):
    the instance errors after two. A retry gives it two tries again: the third
    execution fails as a first try (not a final one) and the fourth completes. "one"
    ran once and was never run again."""
    db = counted
    _submit(db, "rt_1", fail_two=3)
    with EngineHarness(settings, db):
        wait_for(lambda: _final(db, "rt_1"), "the first run's end")
        errored = describe_instance(db, "rt_1")
        assert errored is not None and errored.status == "errored"
        assert errored.failed_position == 1, errored.error
        assert _executions(db, "rt_1") == {"one": 1, "two": 2}

        done = retry(db, WORKFLOW, "rt_1")
        assert done.status == "queued"
        assert "step 'two' (position 1) runs again" in done.describe()
        wait_for(lambda: status(db, "rt_1") == "complete", "the retried run's end")
    view = describe_instance(db, "rt_1")
    assert view is not None
    assert view.result == {"one": 1, "two": 4, "three": 1, "tag": None}
    assert (view.retry_count, view.failed_position, view.error) == (1, None, None)
    assert _executions(db, "rt_1") == {"one": 1, "two": 4, "three": 1}
    attempts = rows(
        db,
        "SELECT attempt, outcome FROM onceflow_step_attempts WHERE job_id = 'rt_1'"
        " AND position = 1 ORDER BY attempt",
    )
    assert [tuple(a) for a in attempts] == [
        (1, "retry"),
        (2, "failed"),
        (3, "retry"),
        (4, "complete"),
    ]
    assert check_history(db) == []


def test_retry_refuses_an_instance_that_did_not_error(settings, counted):
    db = counted
    _submit(db, "rt_ok")
    with pytest.raises(ControlError, match="rt_ok is queued; only an errored or terminated"):
        retry(db, WORKFLOW, "rt_ok")
    with EngineHarness(settings, db):
        wait_for(lambda: _final(db, "rt_ok"), "the run's end")
    with pytest.raises(ControlError, match="rt_ok is complete; only an errored or terminated"):
        retry(db, WORKFLOW, "rt_ok")
    assert _executions(db, "rt_ok") == {"one": 1, "two": 1, "three": 1}


@pytest.mark.parametrize("racer", ["terminate", "retry"])
def test_retry_and_a_second_operator_serialize_on_the_row_lock(settings, counted, racer):
    """The retry stops after it locked the errored instance and read its status, not yet
    changed (failpoint ``operations.after_lock``). A second operator acts on the same
    instance meanwhile: it waits for the lock and then sees the retry's result, queued
    (a terminate applies to it; a second retry is refused), instead of acting on the
    "errored" the first one read (a terminate would be refused "already errored", a
    second retry would reset the step twice)."""
    db = counted
    _submit(db, "rt_race", fail_two=2)
    with EngineHarness(settings, db):
        wait_for(lambda: _final(db, "rt_race"), "the first run's end")
    assert status(db, "rt_race") == "errored"
    point = failpoints.arm("operations.after_lock", job_id="rt_race")
    outcome: dict[str, Any] = {}

    def first() -> None:
        outcome["first"] = retry(db, WORKFLOW, "rt_race")

    def second() -> None:
        action = terminate if racer == "terminate" else retry
        try:
            outcome["second"] = action(db, WORKFLOW, "rt_race")
        except ControlError as exc:
            outcome["second"] = exc

    one = threading.Thread(target=first)
    one.start()
    try:
        point.wait_reached()
        two = threading.Thread(target=second)
        two.start()
        # The second operator is blocked on the row lock the first one holds.
        wait_for(
            lambda: rows(
                db,
                "SELECT 1 FROM pg_stat_activity WHERE datname = current_database()"
                " AND wait_event_type = 'Lock'",
            ),
            "the second operator waiting for the row lock",
        )
        assert "second" not in outcome
    finally:
        point.release()
        failpoints.disarm_all()
    one.join(10)
    two.join(10)
    assert outcome["first"].status == "queued"
    if racer == "terminate":
        assert outcome["second"].status == "terminated"
        assert status(db, "rt_race") == "terminated"
    else:
        assert isinstance(outcome["second"], ControlError)
        assert "rt_race is queued" in str(outcome["second"])
        assert status(db, "rt_race") == "queued"
    view = describe_instance(db, "rt_race")
    assert view is not None and view.retry_count == 1


def _history(db, job_id: str) -> list[tuple[Any, ...]]:
    return [
        tuple(r)
        for r in rows(
            db,
            "SELECT position, name, status, attempts, result FROM onceflow_steps"
            " WHERE job_id = :j ORDER BY position",
            j=job_id,
        )
    ]


def test_fork_from_a_step_copies_what_came_before_and_runs_the_rest(settings, counted):
    """A fork from step "two" keeps "one" as the origin recorded it (not run in the
    fork), runs "two" and "three" under its own id, and leaves the origin as it was.
    The same fork asked for twice collides; another number with new params is a second
    fork whose copied step still shows what the origin's run returned."""
    db = counted
    _submit(db, "fk_1", tag="a")
    with EngineHarness(settings, db) as engine:
        wait_for(lambda: status(db, "fk_1") == "complete", "the origin's run")
        before = _history(db, "fk_1")

        made = fork(db, WORKFLOW, "fk_1", from_step="two")
        assert (made.job_id, made.position, made.copied) == ("fk_1~fork1", 1, 1)
        with pytest.raises(ForkExists, match="fk_1~fork1 already exists: forked from fk_1"):
            fork(db, WORKFLOW, "fk_1", from_step="two")
        again = fork(db, WORKFLOW, "fk_1", from_position=2, number=2, params={"tag": "b"})
        assert again.job_id == "fk_1~fork2"
        wait_for(
            lambda: status(db, "fk_1~fork1") == "complete" == status(db, "fk_1~fork2"),
            "the forks' runs",
        )
        engine.stop()
    first = describe_instance(db, "fk_1~fork1")
    second = describe_instance(db, "fk_1~fork2")
    origin = describe_instance(db, "fk_1")
    assert first is not None and second is not None and origin is not None
    assert (first.forked_from, first.forked_at_position, first.origin) == ("fk_1", 1, "fork")
    assert first.result == {"one": 1, "two": 1, "three": 1, "tag": "a"}
    # "one" and "two" copied from the origin; "three" ran with the new params.
    assert second.result == {"one": 1, "two": 1, "three": 1, "tag": "b"}
    assert origin.forks == ["fk_1~fork1", "fk_1~fork2"]
    assert _executions(db, "fk_1") == {"one": 1, "two": 1, "three": 1}
    assert _executions(db, "fk_1~fork1") == {"two": 1, "three": 1}
    assert _executions(db, "fk_1~fork2") == {"three": 1}
    assert _history(db, "fk_1") == before
    assert check_history(db) == []


def test_bulk_retry_by_filter(settings, counted):
    db = counted
    for i in range(3):
        _submit(db, f"rb_{i}", fail_two=2)
    _submit(db, "rb_fine")
    with EngineHarness(settings, db):
        wait_for(lambda: all(_final(db, f"rb_{i}") for i in range(3)), "the first runs")
        wait_for(lambda: _final(db, "rb_fine"), "the run that completes")
        op = start_bulk(db, BulkAction.RETRY, InstanceFilter(job_id_prefix="rb_"))
        finished = run_bulk(db, op.id)
        assert (finished.done, finished.skipped) == (3, 1)  # the complete one is skipped
        # three instances, each retrying step two with its backoff: more than the default
        # 20 s on a loaded box (seen once beside a CI run)
        wait_for(
            lambda: all(status(db, f"rb_{i}") == "complete" for i in range(3)), "retries", 60.0
        )
    for i in range(3):
        assert _executions(db, f"rb_{i}") == {"one": 1, "two": 3, "three": 1}
    assert check_history(db) == []


def test_retry_and_fork_from_the_admin_api_the_cli_and_the_console(settings, counted):
    """The three front ends call the same store operations: a retry answers what it
    runs again, a refused one is a 409 / one CLI line, a fork is 201 and the same fork
    again a 409; the console's fork form goes through its confirmation page."""
    import re
    import subprocess
    import sys

    from fastapi.testclient import TestClient

    import console
    from producers.api import create_app
    from tests.conftest import settings_env
    from tests.integration.test_admin_http import NoKafka

    db = counted
    _submit(db, "fe_1", fail_two=2)
    with EngineHarness(settings, db):
        wait_for(lambda: _final(db, "fe_1"), "the first run's end")
    base = f"/v1/instances/{WORKFLOW}/fe_1"
    with TestClient(create_app(settings, NoKafka())) as client:
        retried = client.post(f"{base}/retry")
        assert retried.status_code == 200, retried.text
        assert retried.json()["status"] == "queued"
        assert "step 'two' (position 1) runs again" in retried.json()["note"]
        refused = client.post(f"{base}/retry")
        assert refused.status_code == 409 and "fe_1 is queued" in refused.json()["message"]
        made = client.post(f"{base}/fork", json={"from_step": "two"})
        assert made.status_code == 201, made.text
        assert made.json() == {
            "job_id": "fe_1~fork1",
            "forked_from": "fe_1",
            "position": 1,
            "copied": 1,
        }
        again = client.post(f"{base}/fork", json={"from_step": "two"})
        assert again.status_code == 409 and "already exists" in again.json()["message"]
        shown = client.get(f"/v1/instances/{WORKFLOW}/fe_1~fork1").json()
        assert (shown["forked_from"], shown["provenance"]) == (
            "fe_1",
            "fork of fe_1 from position 1",
        )
    cli = [sys.executable, "-c", "from onceflow_cli.main import main; main()", "instances"]
    forked = subprocess.run(
        [*cli, "fork", WORKFLOW, "fe_1", "--from-position", "2", "--number", "2"],
        env=settings_env(settings),
        capture_output=True,
        text=True,
        timeout=60,
    )
    assert forked.returncode == 0, forked.stderr
    assert forked.stdout.startswith("fe_1~fork2: queued, forked from fe_1 at position 2")
    bad = subprocess.run(
        [*cli, "retry", WORKFLOW, "fe_1"],
        env=settings_env(settings),
        capture_output=True,
        text=True,
        timeout=60,
    )
    assert bad.returncode != 0 and bad.stderr.count("\n") == 1, bad.stderr
    assert "fe_1 is queued; only an errored or terminated instance" in bad.stderr
    page = TestClient(console.create_app(settings, db), base_url="http://testserver")
    token = re.search(r'name="csrf_token" value="([^"]+)"', page.get("/instances/fe_1").text)
    assert token is not None
    form = {"csrf_token": token.group(1), "from_step": "two", "number": "3"}
    asked = page.post("/instances/fe_1/fork", data=form)
    assert asked.status_code == 200 and 'id="confirm"' in asked.text
    done = page.post("/instances/fe_1/fork", data={**form, "confirm": "yes"})
    assert done.status_code == 200 and "fe_1~fork3: queued" in done.text
    view = describe_instance(db, "fe_1")
    assert view is not None
    assert view.forks == ["fe_1~fork1", "fe_1~fork2", "fe_1~fork3"]
    audited = rows(
        db,
        "SELECT action, result, front_end FROM onceflow_operator_actions WHERE job_id = 'fe_1'"
        " ORDER BY id",
    )
    assert [tuple(a) for a in audited] == [
        ("retry", "ok", "admin_api"),
        ("retry", "refused", "admin_api"),
        ("fork", "ok", "admin_api"),
        ("fork", "refused", "admin_api"),
        ("fork", "ok", "cli"),
        ("retry", "refused", "cli"),
        ("fork", "ok", "console"),
    ]


CAUGHT = "test-retry-caught"


@workflow(CAUGHT)
async def caught(ctx, params):
    """A saga step: "charge" fails once; the workflow catches it, records "alert" (its
    handling of the failure), and raises it again. "ship" runs only after a charge."""
    try:
        await ctx.step(
            "charge", _run, ctx.job_id, "charge", 1, retries=RetryPolicy(limit=0, delay=0)
        )
    except StepFailed:
        await ctx.step("alert", _run, ctx.job_id, "alert", 0)
        raise
    return await ctx.step("ship", _run, ctx.job_id, "ship", 0)


def test_retry_does_not_rerun_a_failure_the_workflow_already_handled(settings, counted):
    """The run ended with "charge"'s failure, but only after the workflow had handled it
    ("alert" recorded at the next position). Running "charge" again would execute its
    side effect a second time under a history that says its failure was handled: the
    charge succeeds, the workflow takes the other branch, meets "alert" where it asks for
    "ship", and errors with a nondeterminism (found in review). Such a run records no
    failed position: a retry replays it as recorded and the charge is not run again."""
    db = counted
    create_instances(db, [Delivery(JobEnvelope("rt_caught", CAUGHT, {}), "t", 0, 0)])
    with EngineHarness(settings, db):
        wait_for(lambda: _final(db, "rt_caught"), "the first run's end")
        errored = describe_instance(db, "rt_caught")
        assert errored is not None and errored.status == "errored"
        assert errored.failed_position is None, errored.failed_position
        done = retry(db, CAUGHT, "rt_caught")
        assert "no failed step to run again" in done.describe()
        wait_for(lambda: _final(db, "rt_caught"), "the retried run's end")
    view = describe_instance(db, "rt_caught")
    assert view is not None and view.status == "errored"
    assert "but the history has" not in (view.error or ""), view.error
    assert _executions(db, "rt_caught") == {"charge": 1, "alert": 1}
    assert check_history(db) == []
