"""Start and wait (``Prefer: wait=N``, ``GET /v1/jobs/{id}/result?wait=N``) on real
Kafka and PostgreSQL: ingest's events consumer reads a real events topic, to which
these tests write the final events per the contract, after committing the instance's
final status (the order the outbox relay guarantees; tests/integration/wait_helpers.py).
"""

from __future__ import annotations

import time
from concurrent.futures import ThreadPoolExecutor
from concurrent.futures import TimeoutError as FutureTimeout
from typing import Any

import httpx
import pytest
import sqlalchemy as sa

from onceflow import failpoints
from onceflow.envelope import JobEnvelope
from onceflow_tools.processes import free_port
from tests.integration.kafka_helpers import consume_all
from tests.integration.wait_helpers import (
    create_events_topic,
    create_instance,
    finish,
    metric,
    publish,
    served,
    until,
)
from workflow_engine.model import Delivery
from workflow_engine.store.writes import create_instances

pytestmark = pytest.mark.timeout(90)


@pytest.fixture
def wait_settings(settings):
    s = settings.model_copy(
        update={
            "events_topic": settings.jobs_topic.replace(".jobs", ".events"),
            "ingest_max_wait_seconds": 10,
        }
    )
    create_events_topic(s)
    return s


def _post(url: str, job: dict, prefer: str | None = "wait=10") -> tuple[httpx.Response, float]:
    started = time.monotonic()
    headers = {"Prefer": prefer} if prefer else {}
    r = httpx.post(f"{url}/v1/jobs", json=job, headers=headers, timeout=30)
    return r, time.monotonic() - started


def _job(job_id: str) -> dict:
    return {"job_id": job_id, "workflow": "order-workflow", "params": {}}


def test_a_waiting_request_gets_the_result_of_its_instance(wait_settings, db):
    with served(wait_settings) as (url, app, _), ThreadPoolExecutor(2) as pool:
        waiters = app.state.ingest.waiters
        pending = pool.submit(_post, url, _job("w_ok"), "wait=30")
        until(lambda: waiters.waiting("w_ok") == 1, 10, "the waiter registered")
        create_instance(db, wait_settings, "w_ok")
        finish(db, wait_settings, "w_ok", result={"charged": 42})
        r, took = pending.result(20)
        errored = pool.submit(_post, url, _job("w_err"))
        until(lambda: waiters.waiting("w_err") == 1, 10, "the second waiter registered")
        create_instance(db, wait_settings, "w_err", offset=1)
        finish(db, wait_settings, "w_err", "errored", error="card declined")
        e, _ = errored.result(20)
    assert r.status_code == 200, r.text
    # the request asked for 30 s; the configured maximum (10) is what it was granted
    assert r.headers["preference-applied"] == "wait=10"
    body = r.json()
    assert (body["kind"], body["job_id"], body["status"]) == ("workflow", "w_ok", "complete")
    assert body["result"] == {"charged": 42} and body["error"] is None
    assert took < 10
    # an errored instance is an answer too: 200, its status and error
    assert e.status_code == 200
    assert (e.json()["status"], e.json()["error"]) == ("errored", "card declined")
    # and the job is in Kafka, as a 202 would have said
    keys = {
        m.key()
        for m in consume_all(wait_settings.kafka_bootstrap_servers, wait_settings.jobs_topic, 2)
    }
    assert keys == {b"w_ok", b"w_err"}


def test_a_job_not_final_in_time_gets_the_202_after_the_wait(wait_settings, db):
    before = metric("onceflow_ingest_wait_outcomes_total", outcome="timeout")
    with served(wait_settings) as (url, app, _):
        r, took = _post(url, _job("w_slow"), "wait=1")
        assert app.state.ingest.waiters.waiting("w_slow") == 0  # left the map on its timeout
        # a batch waits under one deadline, and says which of its jobs finished
        create_instance(db, wait_settings, "w_done", offset=1)
        finish(db, wait_settings, "w_done", result=1)
        batch = httpx.post(
            f"{url}/v1/jobs",
            json={"jobs": [_job("w_done"), _job("w_slow")]},
            headers={"Prefer": "wait=1"},
            timeout=30,
        )
    assert r.status_code == 202, r.text
    assert 1.0 <= took < 3.0
    assert r.headers["location"] == "/v1/jobs/w_slow"
    assert r.headers["preference-applied"] == "wait=1"
    assert [a["job_id"] for a in r.json()["accepted"]] == ["w_slow"]
    assert batch.status_code == 202
    assert [j["job_id"] for j in batch.json()["accepted"]] == ["w_done", "w_slow"]
    assert [(j["job_id"], j["result"]) for j in batch.json()["results"]] == [("w_done", 1)]
    assert "location" not in batch.headers
    assert metric("onceflow_ingest_wait_outcomes_total", outcome="timeout") == before + 2


def test_a_batch_whose_jobs_all_finish_gets_200_with_every_result(wait_settings, db):
    with served(wait_settings) as (url, app, _), ThreadPoolExecutor(1) as pool:
        waiters = app.state.ingest.waiters
        jobs = {"jobs": [_job("b_1"), _job("b_2")]}
        pending = pool.submit(
            lambda: httpx.post(f"{url}/v1/jobs", json=jobs, headers={"Prefer": "wait=5"})
        )
        until(lambda: waiters.waiting("b_2") == 1, 10, "the batch's waiters registered")
        for i, job_id in enumerate(("b_2", "b_1")):
            create_instance(db, wait_settings, job_id, offset=i)
            finish(db, wait_settings, job_id, result={"n": job_id})
        r = pending.result(20)
    assert r.status_code == 200, r.text
    assert [(j["job_id"], j["result"]) for j in r.json()["results"]] == [
        ("b_1", {"n": "b_1"}),
        ("b_2", {"n": "b_2"}),
    ]


def test_a_result_final_before_the_waiter_registered_is_not_missed(wait_settings, db):
    """The lost-wakeup window: Kafka acknowledged the job, the waiter is not registered
    yet. The instance finishes and its event is published *and consumed* right there;
    the waiter, registered after, must still answer 200 (from its one status read)."""
    with served(wait_settings) as (url, _, _), ThreadPoolExecutor(1) as pool:
        paused = failpoints.arm("ingest.before_wait_register", "pause", job_id="w_race")
        try:
            pending = pool.submit(_post, url, _job("w_race"), "wait=5")
            paused.wait_reached(10)
            consumed = metric("onceflow_ingest_events_consumed_total")
            create_instance(db, wait_settings, "w_race")
            finish(db, wait_settings, "w_race", result="early")
            until(
                lambda: metric("onceflow_ingest_events_consumed_total") > consumed,
                10,
                "the event consumed by ingest",
            )
        finally:
            failpoints.disarm_all()
        r, took = pending.result(20)
    assert r.status_code == 200, r.text
    assert r.json()["result"] == "early"
    assert took < 5  # answered from the read, not after the wait ran out


def test_a_second_submission_of_the_same_id_waits_on_the_same_instance(wait_settings, db):
    with served(wait_settings) as (url, app, _), ThreadPoolExecutor(2) as pool:
        waiters = app.state.ingest.waiters
        first = pool.submit(_post, url, _job("w_dup"))
        second = pool.submit(_post, url, {**_job("w_dup"), "params": {"other": True}})
        until(lambda: waiters.waiting("w_dup") == 2, 10, "both waiters registered")
        create_instance(db, wait_settings, "w_dup")
        finish(db, wait_settings, "w_dup", result="once")
        answers = [first.result(20)[0], second.result(20)[0]]
        # and once final, a later duplicate is answered at once from the status read
        late, took = _post(url, _job("w_dup"))
    assert [a.status_code for a in answers] == [200, 200]
    assert [a.json()["result"] for a in answers] == ["once", "once"]
    assert late.status_code == 200 and late.json()["result"] == "once" and took < 2


def test_past_the_bound_a_submission_is_answered_202_at_once(wait_settings, db):
    bounded = wait_settings.model_copy(update={"ingest_max_waiters": 1})
    refused = metric("onceflow_ingest_wait_outcomes_total", outcome="refused")
    with served(bounded) as (url, app, _), ThreadPoolExecutor(1) as pool:
        waiting = pool.submit(_post, url, _job("w_first"))
        until(lambda: app.state.ingest.waiters.waiting("w_first") == 1, 10, "first waiting")
        r, took = _post(url, _job("w_over"))
        create_instance(db, bounded, "w_first")
        finish(db, bounded, "w_first", result=1)
        assert waiting.result(20)[0].status_code == 200
        # the place is free again: the next request is waited for (answered from its read)
        again, _ = _post(url, _job("w_first"))
        assert again.status_code == 200 and again.headers["preference-applied"] == "wait=10"
        # the bound counts the jobs waited for, not requests: a batch of two is over it
        started = time.monotonic()
        batch = httpx.post(
            f"{url}/v1/jobs",
            json={"jobs": [_job("w_b1"), _job("w_b2")]},
            headers={"Prefer": "wait=10"},
            timeout=30,
        )
        batch_took = time.monotonic() - started
    assert r.status_code == 202 and took < 2
    assert "preference-applied" not in r.headers
    assert batch.status_code == 202 and batch_took < 2
    assert "preference-applied" not in batch.headers
    assert metric("onceflow_ingest_wait_outcomes_total", outcome="refused") == refused + 2


def test_postgresql_unreachable_answers_the_plain_202_and_keeps_the_job(wait_settings):
    closed = f"postgresql://postgres@127.0.0.1:{free_port()}/nowhere"
    down = wait_settings.model_copy(update={"database_url": closed, "admin_api_enabled": False})
    degraded = metric("onceflow_ingest_wait_outcomes_total", outcome="degraded")
    with served(down) as (url, _, _):
        r, took = _post(url, _job("w_nodb"), "wait=5")
    assert r.status_code == 202, r.text
    assert took < 4 and "preference-applied" not in r.headers
    assert r.headers["location"] == "/v1/jobs/w_nodb"
    assert metric("onceflow_ingest_wait_outcomes_total", outcome="degraded") == degraded + 1
    records = consume_all(down.kafka_bootstrap_servers, down.jobs_topic, 1)
    assert [m.key() for m in records] == [b"w_nodb"]


def test_a_missing_events_topic_answers_the_plain_202(settings):
    missing = settings.model_copy(
        update={"events_topic": settings.jobs_topic + ".no-events", "ingest_max_wait_seconds": 10}
    )
    degraded = metric("onceflow_ingest_wait_outcomes_total", outcome="degraded")
    with served(missing, watchable=False) as (url, app, _):
        time.sleep(1.5)  # the consumer has looked for the topic (every second) and not found it
        assert not app.state.ingest.waiters.watchable
        r, took = _post(url, _job("w_notopic"), "wait=5")
    assert r.status_code == 202 and took < 2
    assert "preference-applied" not in r.headers
    assert metric("onceflow_ingest_wait_outcomes_total", outcome="degraded") == degraded + 1


def test_get_result_long_polls(wait_settings, db):
    create_instance(db, wait_settings, "r_1")
    with served(wait_settings) as (url, app, _), ThreadPoolExecutor(1) as pool:
        started = time.monotonic()
        not_yet = httpx.get(f"{url}/v1/jobs/r_1/result", params={"wait": 1}, timeout=10)
        took = time.monotonic() - started
        pending = pool.submit(
            httpx.get, f"{url}/v1/jobs/r_1/result", params={"wait": 10}, timeout=20
        )
        until(lambda: app.state.ingest.waiters.waiting("r_1") == 1, 10, "the poll waiting")
        finish(db, wait_settings, "r_1", "terminated")
        done = pending.result(20)
        unknown = httpx.get(f"{url}/v1/jobs/nope/result", timeout=10)
    assert not_yet.status_code == 202 and 1.0 <= took < 3
    assert not_yet.headers["location"] == "/v1/jobs/r_1"
    assert not_yet.json()["status"] == "queued"
    assert done.status_code == 200 and done.json()["status"] == "terminated"
    assert unknown.status_code == 404 and unknown.json()["error"] == "not_found"


def test_the_python_client_submits_and_waits(wait_settings, db):
    from producers.client import IngestClient

    with (
        served(wait_settings) as (url, app, _),
        IngestClient(url) as client,
        ThreadPoolExecutor(1) as pool,
    ):
        pending = pool.submit(client.submit_and_wait, _job("c_1"), 10)
        until(lambda: app.state.ingest.waiters.waiting("c_1") == 1, 10, "the client waiting")
        create_instance(db, wait_settings, "c_1")
        finish(db, wait_settings, "c_1", result={"total": 3})
        done = pending.result(20)
        not_done = client.submit_and_wait(_job("c_2"), wait=1)
        again = client.result("c_1", wait=1)
    assert (done.done, done.status, done.result) == (True, "complete", {"total": 3})
    assert not not_done.done and not_done.location == "/v1/jobs/c_2"
    assert again.done and again.result == {"total": 3}


def test_a_stopping_ingest_lets_its_waiters_go_with_their_202(wait_settings):
    with served(wait_settings) as (url, app, server), ThreadPoolExecutor(1) as pool:
        pending = pool.submit(_post, url, _job("w_stop"), "wait=10")
        until(lambda: app.state.ingest.waiters.waiting("w_stop") == 1, 10, "waiting")
        server.should_exit = True  # what SIGTERM does
        r, took = pending.result(20)
    assert r.status_code == 202 and took < 5
    assert r.headers["location"] == "/v1/jobs/w_stop"


def test_a_restarted_instance_is_not_answered_with_its_earlier_run(wait_settings, db):
    """An operator restarted a complete instance; the relay (at least once) publishes
    the earlier run's ``instance.complete`` again after a caller started waiting for the
    new run. That event must not answer the caller: only the new run's end does."""
    from workflow_engine.store.operations import control

    create_instance(db, wait_settings, "w_again")
    finish(db, wait_settings, "w_again", result="first run")
    control.restart(db, "order-workflow", "w_again")
    with served(wait_settings) as (url, app, _), ThreadPoolExecutor(1) as pool:
        waiters = app.state.ingest.waiters
        pending = pool.submit(
            httpx.get, f"{url}/v1/jobs/w_again/result", params={"wait": 10}, timeout=20
        )
        until(lambda: waiters.waiting("w_again") == 1, 10, "the poll waiting")
        consumed = metric("onceflow_ingest_events_consumed_total")
        outcomes = metric("onceflow_ingest_wait_outcomes_total", outcome="final")
        publish(
            wait_settings,
            "w_again",
            "instance.complete",
            3,
            "order-workflow",
            None,
            "complete",
            extra={"result": "first run"},
        )
        until(
            lambda: metric("onceflow_ingest_events_consumed_total") > consumed,
            10,
            "the republished event consumed by ingest",
        )
        # the stale event is checked against the status, and the poll waits on: given a
        # second, it is not answered (without the check it was, at once, "first run")
        with pytest.raises(FutureTimeout):
            pending.result(1.0)
        assert waiters.waiting("w_again") == 1
        assert metric("onceflow_ingest_wait_outcomes_total", outcome="final") == outcomes
        finish(db, wait_settings, "w_again", result="second run", sequence=6)
        done = pending.result(20)
    assert done.status_code == 200, done.text
    assert done.json()["result"] == "second run"


def test_a_key_without_jobs_read_is_not_answered_an_outcome(wait_settings, db):
    """A job's outcome is what ``jobs:read`` guards (``GET /v1/jobs/{id}``): a key that
    may only submit must not read another caller's result by resubmitting its id."""
    from onceflow.keys import hash_key
    from onceflow.settings import ApiKey

    keys = [
        ApiKey(name="submitter", sha256=hash_key("submit-only"), scopes=["jobs:submit"]),
        ApiKey(name="both", sha256=hash_key("submit-read"), scopes=["jobs:submit", "jobs:read"]),
    ]
    guarded = wait_settings.model_copy(update={"auth_disabled": False, "api_keys": keys})
    create_instance(db, guarded, "w_secret")
    finish(db, guarded, "w_secret", result={"card": "4242"})
    answers = {}
    with served(guarded) as (url, _, _):
        for key in ("submit-only", "submit-read"):
            answers[key] = httpx.post(
                f"{url}/v1/jobs",
                json=_job("w_secret"),
                headers={"Prefer": "wait=5", "X-Api-Key": key},
                timeout=30,
            )
    submit_only, both = answers["submit-only"], answers["submit-read"]
    assert submit_only.status_code == 202, submit_only.text
    assert "result" not in submit_only.json() and "preference-applied" not in submit_only.headers
    assert submit_only.headers["location"] == "/v1/jobs/w_secret"
    assert both.status_code == 200 and both.json()["result"] == {"card": "4242"}


def _delete_events_topic(settings) -> None:
    from confluent_kafka.admin import AdminClient

    admin = AdminClient({"bootstrap.servers": settings.kafka_bootstrap_servers})
    admin.delete_topics([settings.events_topic])[settings.events_topic].result(30)


def _create_events_topic_again(settings) -> None:
    """Create the deleted events topic once Kafka lets it (the deletion may lag)."""
    deadline = time.monotonic() + 30
    while True:
        try:
            create_events_topic(settings)
            return
        except Exception:
            assert time.monotonic() < deadline, "the events topic could not be created again"
            time.sleep(0.2)


def test_a_waiter_is_not_lost_when_the_consumer_assigns_its_partitions_again(
    wait_settings, db, monkeypatch
):
    """The consumer lost its partitions (here: the topic deleted, seen missing, then
    created again; a broker that does not answer a metadata request does the same) and
    assigns them again at their high watermark. An event published before that
    watermark was read, while the consumer was not assigned, is never consumed; the
    request already waiting must still get its outcome (it re-reads the status)."""
    from producers import events_watch

    monkeypatch.setattr(events_watch, "REFRESH_SECONDS", 0.5)  # the topic looked up often
    create_instance(db, wait_settings, "w_gap")
    with served(wait_settings) as (url, app, _), ThreadPoolExecutor(1) as pool:
        waiters = app.state.ingest.waiters
        pending = pool.submit(
            httpx.get, f"{url}/v1/jobs/w_gap/result", params={"wait": 10}, timeout=20
        )
        until(lambda: waiters.waiting("w_gap") == 1, 10, "the poll waiting")
        _delete_events_topic(wait_settings)
        until(lambda: not waiters.watchable, 10, "the consumer sees the topic missing")
        paused = failpoints.arm("ingest.events_before_reassign", "pause")
        try:
            _create_events_topic_again(wait_settings)
            paused.wait_reached(20)
            # the consumer found the topic again and has not read its watermarks yet
            finish(db, wait_settings, "w_gap", result="in the gap")
        finally:
            failpoints.disarm_all()
        done = pending.result(20)
    assert done.status_code == 200, done.text
    assert done.json()["result"] == "in the gap"


def test_a_caller_that_hangs_up_stops_waiting(wait_settings, db):
    """A client gone (its connection closed) is waited for no more: its waiter leaves
    the map and its place under ``ingest_max_waiters`` is free at once, not when the
    wait it asked for runs out."""
    create_instance(db, wait_settings, "w_gone_get")
    with served(wait_settings) as (url, app, _):
        waiters = app.state.ingest.waiters
        before = metric("onceflow_ingest_waiting_requests")
        for job_id, call in (
            ("w_gone_post", lambda: _post_briefly(url, _job("w_gone_post"))),
            ("w_gone_get", lambda: _get_briefly(url, "w_gone_get")),
        ):
            with pytest.raises(httpx.ReadTimeout):
                call()  # the client gives up after 0.5 s and closes its connection
            until(lambda j=job_id: waiters.waiting(j) == 0, 3, f"{job_id} unregistered")
            until(lambda: metric("onceflow_ingest_waiting_requests") == before, 3, "slot freed")


def _post_briefly(url: str, job: dict) -> None:
    httpx.post(f"{url}/v1/jobs", json=job, headers={"Prefer": "wait=10"}, timeout=0.5)


def _get_briefly(url: str, job_id: str) -> None:
    httpx.get(f"{url}/v1/jobs/{job_id}/result", params={"wait": 10}, timeout=0.5)


def test_a_skipped_job_answers_its_waiter(wait_settings, db):
    """``instance.skipped`` (a singleton policy's) is final: the waiter gets 200 with the
    status at once, not the 202 after the wait."""
    with served(wait_settings) as (url, app, _), ThreadPoolExecutor(1) as pool:
        waiters = app.state.ingest.waiters
        pending = pool.submit(_post, url, _job("w_skip"))
        until(lambda: waiters.waiting("w_skip") == 1, 10, "the waiter registered")
        create_instance(db, wait_settings, "w_skip")
        with db.begin() as conn:
            row = conn.execute(
                sa.text(
                    "UPDATE onceflow_instances SET status = 'skipped', finished_at = now(),"
                    " skipped_for = 'w_live' WHERE job_id = 'w_skip'"
                    " RETURNING workflow, version, finished_at"
                )
            ).one()
        singleton = {"key": "k", "mode": "skip", "active_job_id": "w_live"}
        publish(
            wait_settings,
            "w_skip",
            "instance.skipped",
            2,
            row.workflow,
            row.version,
            "skipped",
            row.finished_at,
            {"singleton": singleton},
        )
        r, took = pending.result(20)
    assert r.status_code == 200, r.text
    assert (r.json()["status"], r.json()["job_id"]) == ("skipped", "w_skip")
    assert took < 10


def _record_of(settings, job_id: str, expected: int) -> tuple[int, int]:
    """The (partition, offset) of the newest record of ``job_id`` on the jobs topic."""
    found = [
        m
        for m in consume_all(settings.kafka_bootstrap_servers, settings.jobs_topic, expected)
        if m.key() == job_id.encode()
    ]
    assert len(found) >= expected, f"{len(found)} records of {job_id}"
    newest = max(found, key=lambda m: m.offset())
    return newest.partition(), newest.offset()


def test_a_resubmission_that_starts_a_new_run_is_answered_with_that_run(wait_settings, db):
    """Id reuse: run 1 of ``p_again`` errored, and ``payment-workflow`` runs an id again
    after a failure. A resubmission waiting for its outcome must be answered with the run
    *its* record starts, never with run 1's end, which the first status read finds
    final while the worker has not yet taken the record (here: no worker at all until
    the test plays it). Before the fix it was answered at once, ``errored``, run 1."""
    from onceflow.vocabulary import IdReuse

    run1 = Delivery(
        JobEnvelope("p_again", "payment-workflow", {"amount": 1}),
        wait_settings.jobs_topic,
        0,
        10**9,  # a position no record of the topic has
        id_reuse=IdReuse.AFTER_FAILURE,
    )
    create_instances(db, [run1])
    finish(db, wait_settings, "p_again", "errored", error="card declined")
    with served(wait_settings) as (url, app, _), ThreadPoolExecutor(1) as pool:
        waiters = app.state.ingest.waiters
        job = {"job_id": "p_again", "workflow": "payment-workflow", "params": {"amount": 2}}
        pending = pool.submit(_post, url, job, "wait=10")
        # run 1 is final and the record is not written down: no answer (before the fix:
        # 200 at once, run 1's "errored")
        with pytest.raises(FutureTimeout):
            pending.result(2.0)
        assert waiters.records.get("p_again") == 1 and waiters.waiting("p_again") == 1
        # the worker takes the record: run 2 starts (its instance.created wakes the waiter,
        # which reads run 2, queued: not final)
        partition, offset = _record_of(wait_settings, "p_again", 1)
        run2 = Delivery(
            JobEnvelope("p_again", "payment-workflow", {"amount": 2}),
            wait_settings.jobs_topic,
            partition,
            offset,
            id_reuse=IdReuse.AFTER_FAILURE,
        )
        assert create_instances(db, [run2]).new_runs == ["p_again"]
        consumed = metric("onceflow_ingest_events_consumed_total")
        publish(wait_settings, "p_again", "instance.created", 5, "payment-workflow", None, "queued")
        until(
            lambda: metric("onceflow_ingest_events_consumed_total") > consumed,
            10,
            "the created event consumed by ingest",
        )
        with pytest.raises(FutureTimeout):
            pending.result(0.5)
        finish(db, wait_settings, "p_again", result={"charged": 2}, sequence=8)
        r, _ = pending.result(20)
    assert r.status_code == 200, r.text
    body = r.json()
    assert (body["status"], body["result"], body["run"]) == ("complete", {"charged": 2}, 2)
    assert waiters.records == {}


def test_a_record_is_answered_with_the_run_it_belongs_to(wait_settings, db):
    """The read behind it: a record that started run 2 is answered run 2's outcome even
    after run 3 started (from the archived run); the record that started the current
    run, and a duplicate, the current run; a record not written down, pending."""
    from onceflow.vocabulary import IdReuse
    from workflow_engine.store.views import Record, job_outcomes, submission_outcomes

    topic = wait_settings.jobs_topic

    def deliver(offset: int) -> None:
        env = JobEnvelope("p_runs", "payment-workflow", {"n": offset})
        create_instances(db, [Delivery(env, topic, 1, offset, id_reuse=IdReuse.AFTER_FAILURE)])

    deliver(10**9 + 1)
    finish(db, wait_settings, "p_runs", "errored", error="one")
    deliver(10**9 + 2)
    finish(db, wait_settings, "p_runs", "errored", error="two")
    deliver(10**9 + 3)  # run 3, queued
    deliver(10**9 + 4)  # a duplicate of run 3 (it is not finished)

    def read(offset: int):
        mine = ("p_runs", Record(topic, 1, offset))
        return submission_outcomes(db, ["p_runs"], [mine])[1][mine]

    first, second, third, dup = (read(10**9 + k) for k in (1, 2, 3, 4))
    # several submissions of one id in one statement, each by its own record
    both = [("p_runs", Record(topic, 1, 10**9 + 2)), ("p_runs", Record(topic, 1, 10**9 + 3))]
    current, answered = submission_outcomes(db, ["p_runs"], both)
    assert [answered[b].run for b in both] == [2, 3] and current["p_runs"].run == 3
    assert (first.run, first.status, first.error, first.final) == (1, "errored", "one", True)
    assert (second.run, second.status, second.error, second.final) == (2, "errored", "two", True)
    assert (third.run, third.status, third.final, third.pending) == (3, "queued", False, False)
    assert (dup.run, dup.status, dup.pending) == (3, "queued", False)
    unknown = read(10**9 + 5)
    assert (unknown.run, unknown.pending, unknown.final) == (3, True, False)
    # without a record: the current run, as GET /v1/jobs/{id}/result reads it
    assert job_outcomes(db, ["p_runs"])["p_runs"].run == 3
    # run 3 errors and a resubmission starts run 4: the duplicate is still answered the
    # run it collapsed into, 3, from its archive (migration 0031; before: run 4's queued)
    finish(db, wait_settings, "p_runs", "errored", error="three")
    deliver(10**9 + 6)
    assert job_outcomes(db, ["p_runs"])["p_runs"].run == 4
    late_dup = read(10**9 + 4)
    assert (late_dup.run, late_dup.status, late_dup.error, late_dup.final) == (
        3,
        "errored",
        "three",
        True,
    )


def _gated(settings, db, job_id: str, status: str, **finished) -> None:
    """Run 1 of ``job_id`` (payment-workflow: a new run after a failure), made final."""
    from onceflow.vocabulary import IdReuse

    env = JobEnvelope(job_id, "payment-workflow", {"amount": 1})
    delivery = Delivery(env, settings.jobs_topic, 0, 10**9, id_reuse=IdReuse.AFTER_FAILURE)
    create_instances(db, [delivery])
    finish(db, settings, job_id, status, **finished)


def _play_worker(settings, db, job_id: str, params: dict) -> Any:
    """What the worker does with the newest record of ``job_id``: the batch result."""
    from onceflow.vocabulary import IdReuse

    partition, offset = _record_of(settings, job_id, 1)
    env = JobEnvelope(job_id, "payment-workflow", params)
    delivery = Delivery(env, settings.jobs_topic, partition, offset, id_reuse=IdReuse.AFTER_FAILURE)
    return create_instances(db, [delivery])


def test_a_resubmission_that_collapses_on_a_final_run_is_woken_by_its_duplicate(wait_settings, db):
    """Run 1 is complete, and ``payment-workflow`` runs an id again only after a failure:
    the resubmission collapses as a duplicate of run 1. Its first read finds the record
    not written down; nothing final is coming any more, so only the record-written event
    (``instance.duplicate``) can wake it to read again and answer run 1's end. Without
    that wakeup it sat out its wait and got the 202."""
    _gated(wait_settings, db, "p_dup", "complete", result={"charged": 1})
    with served(wait_settings) as (url, app, _), ThreadPoolExecutor(1) as pool:
        waiters = app.state.ingest.waiters
        job = {"job_id": "p_dup", "workflow": "payment-workflow", "params": {"amount": 1}}
        pending = pool.submit(_post, url, job, "wait=10")
        until(lambda: waiters.records.get("p_dup") == 1, 10, "the waiter gated on its record")
        result = _play_worker(wait_settings, db, "p_dup", {"amount": 1})
        assert result.duplicates == 1 and result.new_runs == []
        started = time.monotonic()
        publish(
            wait_settings, "p_dup", "instance.duplicate", 4, "payment-workflow", None, "complete"
        )
        r, _ = pending.result(20)
        took = time.monotonic() - started
    assert r.status_code == 200, r.text
    assert (r.json()["result"], r.json()["run"]) == ({"charged": 1}, 1)
    assert took < 5  # woken by the event, not by the end of the 10 s wait
    assert waiters.records == {}


def test_a_first_submission_of_a_reusable_workflow_is_answered_from_its_events(wait_settings, db):
    """A new id of a workflow that may reuse ids: no instance at the first read; its
    record written down (``instance.created``) tells the run, and that run's final
    event is then the answer as it is, with no gate left behind."""
    with served(wait_settings) as (url, app, _), ThreadPoolExecutor(1) as pool:
        waiters = app.state.ingest.waiters
        job = {"job_id": "p_new", "workflow": "payment-workflow", "params": {"amount": 3}}
        pending = pool.submit(_post, url, job, "wait=10")
        until(lambda: waiters.records.get("p_new") == 1, 10, "the waiter gated on its record")
        assert _play_worker(wait_settings, db, "p_new", {"amount": 3}).created == 1
        publish(wait_settings, "p_new", "instance.created", 1, "payment-workflow", None, "queued")
        until(lambda: "p_new" not in waiters.records, 10, "the record known written down")
        finish(db, wait_settings, "p_new", result={"charged": 3}, sequence=2)
        r, _ = pending.result(20)
    assert r.status_code == 200, r.text
    assert (r.json()["status"], r.json()["result"], r.json()["run"]) == (
        "complete",
        {"charged": 3},
        1,
    )


def test_a_record_read_in_one_snapshot_with_its_run(wait_settings, db):
    """The two statements of a submission's read (the id's run, then where its record
    is) see one snapshot. Between them (the failpoint) the worker commits one batch that
    starts run 2 of ``p_snap`` from one record and records a retry of it, our record, as
    run 2's duplicate. Read apart, the second statement saw the duplicate and the first
    run 1's end, and answered run 1's ``errored`` (found in review)."""
    from onceflow.vocabulary import IdReuse
    from workflow_engine.store.views import Record, submission_outcomes

    _gated(wait_settings, db, "p_snap", "errored", error="declined")
    topic = wait_settings.jobs_topic
    ours = ("p_snap", Record(topic, 1, 10**9 + 8))
    paused = failpoints.arm("outcomes.between_reads", "pause", job_id="p_snap")
    try:
        with ThreadPoolExecutor(1) as pool:
            reading = pool.submit(submission_outcomes, db, ["p_snap"], [ours])
            paused.wait_reached(10)
            both = [
                Delivery(
                    JobEnvelope("p_snap", "payment-workflow", {"amount": 2}),
                    topic,
                    1,
                    offset,
                    id_reuse=IdReuse.AFTER_FAILURE,
                )
                for offset in (10**9 + 7, 10**9 + 8)
            ]
            result = create_instances(db, both)
            assert result.new_runs == ["p_snap"] and result.duplicates == 1
            paused.release()
            _, answered = reading.result(20)
    finally:
        failpoints.disarm_all()
    got = answered[ours]
    # the snapshot before the worker's commit: run 1's end, our record not written down
    assert (got.run, got.pending, got.final) == (1, True, False)
    # read again (as the record-written event makes it): run 2, which it collapsed into
    again = submission_outcomes(db, ["p_snap"], [ours])[1][ours]
    assert (again.run, again.status, again.pending, again.final) == (2, "queued", False, False)


def test_duplicates_around_a_new_run_in_one_batch_name_the_run_each_joined(wait_settings, db):
    """One worker batch: a resubmission with its own ``never`` policy, then one that
    starts run 2 (run 1 errored), then another ``never``. The first collapsed into run 1,
    the last into run 2; each is answered that run, whatever the instance reads when the
    waiter asks (found in review: the first was written down as run 2's)."""
    from onceflow.vocabulary import IdReuse
    from workflow_engine.store.views import Record, submission_outcomes

    _gated(wait_settings, db, "p_batch", "errored", error="declined")
    topic = wait_settings.jobs_topic

    def job(offset: int, own: IdReuse | None) -> Delivery:
        env = JobEnvelope("p_batch", "payment-workflow", {"n": offset}, id_reuse=own)
        return Delivery(env, topic, 1, 10**9 + offset, id_reuse=own or IdReuse.AFTER_FAILURE)

    batch = [job(20, IdReuse.NEVER), job(21, None), job(22, IdReuse.NEVER)]
    result = create_instances(db, batch)
    assert result.new_runs == ["p_batch"] and result.duplicates == 2
    finish(db, wait_settings, "p_batch", "complete", result="two", sequence=9)
    mine = [("p_batch", Record(topic, 1, 10**9 + k)) for k in (20, 22)]
    _, answered = submission_outcomes(db, ["p_batch"], mine)
    before, after = (answered[m] for m in mine)
    assert (before.run, before.status, before.error) == (1, "errored", "declined")
    assert (after.run, after.status, after.result) == (2, "complete", "two")
