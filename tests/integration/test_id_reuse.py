"""Id reuse policies (issue 26, item 8): a new submission of a finished job id starts a
new run of its one instance, the earlier run's history kept and numbered. Every
property is read back from the database."""

from __future__ import annotations

import itertools
import threading
from datetime import UTC, datetime

import jsonschema
import orjson
import sqlalchemy as sa
from fastapi.testclient import TestClient

from console import create_app
from onceflow import failpoints
from onceflow.envelope import JobEnvelope
from onceflow.vocabulary import BulkAction, IdReuse, InstanceStatus
from onceflow_cli.render import render_instance
from tests.integration import reuse_workflows as wf
from tests.integration.events_helpers import event_schemas
from tests.integration.test_flow_control import run_until
from workflow_engine.definitions import REGISTRY
from workflow_engine.engine.webhook_events import deliveries_for, parse_event
from workflow_engine.errors import LeaseLost
from workflow_engine.model import Delivery
from workflow_engine.store import writes
from workflow_engine.store.operations import control
from workflow_engine.store.operations.bulk import run_bulk, start_bulk
from workflow_engine.store.views import InstanceFilter, describe_instance, job_status, list_page
from workflow_engine.store.views.outcomes import job_outcomes
from workflow_engine.store.writes import FinishInstance, create_instances
from workflow_engine.store.writes import execution as store
from workflow_engine.store.writes.maintenance import prune

_OFFSETS = itertools.count()


def delivery(workflow, job_id, params, id_reuse=None, offset=None):
    return Delivery(
        JobEnvelope(job_id, workflow, params, id_reuse=id_reuse),
        "t",
        0,
        next(_OFFSETS) if offset is None else offset,
        version=REGISTRY.version(workflow),
        id_reuse=id_reuse or REGISTRY.id_reuse(workflow),
    )


def submit(db, workflow, job_id, params, **kw):
    return create_instances(db, [delivery(workflow, job_id, params, **kw)])


def instance(db, job_id):
    sql = "SELECT * FROM onceflow_instances WHERE job_id = :j"
    with db.connect() as conn:
        return conn.execute(sa.text(sql), {"j": job_id}).one()


def runs(db, job_id):
    sql = "SELECT * FROM onceflow_runs WHERE job_id = :j ORDER BY run"
    with db.connect() as conn:
        return conn.execute(sa.text(sql), {"j": job_id}).all()


def finished(db, *job_ids):
    sql = (
        "SELECT count(*) FROM onceflow_instances WHERE job_id = ANY(:j) AND finished_at IS NOT NULL"
    )
    with db.connect() as conn:
        return conn.execute(sa.text(sql), {"j": list(job_ids)}).scalar() == len(job_ids)


def events(db, job_id):
    sql = "SELECT type, payload FROM onceflow_outbox_events WHERE aggregateid = :j ORDER BY seq"
    with db.connect() as conn:
        return [
            (t.removeprefix("dev.onceflow."), d)
            for t, d in conn.execute(sa.text(sql), {"j": job_id})
        ]


def valid(kind, data):
    schemas = event_schemas()
    jsonschema.validate(data, schemas["common"])
    jsonschema.validate(data, schemas[f"dev.onceflow.{kind}"])


def test_after_failure_starts_run_two_and_keeps_run_one(settings, db):
    submit(db, wf.AFTER_FAILURE, "rf_a", {"attempt": "first", "fail": True})
    run_until(settings, db, lambda: finished(db, "rf_a"), events_relay=False)
    assert instance(db, "rf_a").status == "errored"
    got = submit(db, wf.AFTER_FAILURE, "rf_a", {"attempt": "second"})
    assert got.created == 1 and got.new_runs == ["rf_a"] and got.duplicates == 0
    assert got.id_reuse_decisions == [(wf.AFTER_FAILURE, "new_run")]
    row = instance(db, "rf_a")
    assert (row.run, row.status, row.params) == (2, "queued", {"attempt": "second"})
    # a resubmission while run 2 is live collapses, counted as a duplicate
    live = submit(db, wf.AFTER_FAILURE, "rf_a", {"attempt": "second"})
    assert (live.created, live.duplicates) == (0, 1)
    assert live.id_reuse_decisions == [(wf.AFTER_FAILURE, "live")]
    run_until(settings, db, lambda: finished(db, "rf_a"), events_relay=False)
    row = instance(db, "rf_a")
    assert (row.run, row.status, row.result) == (2, "complete", "two:second")
    (one, two) = runs(db, "rf_a")
    assert (one.run, one.status, one.params) == (1, "errored", {"attempt": "first", "fail": True})
    assert [(s["name"], s["status"]) for s in one.steps] == [("one", "complete"), ("two", "failed")]
    assert "failed as asked (first)" in one.error
    assert (two.run, two.status, two.source_partition) == (2, None, 0)  # the current run
    # after a completed run, after_failure refuses: a duplicate, the history unchanged
    refused = submit(db, wf.AFTER_FAILURE, "rf_a", {"attempt": "third"})
    assert (refused.created, refused.duplicates) == (0, 1)
    assert refused.id_reuse_decisions == [(wf.AFTER_FAILURE, "refused")]
    assert instance(db, "rf_a").run == 2
    # the run is visible: describe, the CLI, the events
    view = describe_instance(db, "rf_a")
    assert view is not None and view.run == 2
    assert [(r.run, r.status) for r in view.earlier_runs] == [(1, "errored")]
    text = render_instance(view)
    assert "run 2 of job rf_a" in text and "run 1: errored" in text
    kinds = [(t, d.get("run")) for t, d in events(db, "rf_a")]
    assert ("instance.created", 2) in kinds and ("instance.complete", 2) in kinds
    assert ("instance.errored", 1) in kinds
    for kind, data in events(db, "rf_a"):
        valid(kind, data)
    # GET /v1/jobs/{id} (job_status), start-and-wait's outcome, the console, the list
    status = job_status(db, "rf_a")
    assert status is not None and status["run"] == 2
    assert [r["status"] for r in status["earlier_runs"]] == ["errored"]
    assert job_outcomes(db, ["rf_a"])["rf_a"].to_dict()["run"] == 2
    with TestClient(create_app(settings, db), base_url="http://testserver") as client:
        page = client.get("/instances/rf_a")
        assert page.status_code == 200 and "run 2 of job rf_a" in page.text
        assert 'class="earlier-run">run 1: <span class="status s-errored">' in page.text
        listing = client.get("/instances?workflow=" + wf.AFTER_FAILURE)
        assert '<span class="muted run">run 2</span>' in listing.text
    [listed] = list_page(db, InstanceFilter(workflow=wf.AFTER_FAILURE)).rows
    assert listed.run == 2
    submit(db, wf.NEVER, "rf_other", {})
    assert [r.job_id for r in list_page(db, InstanceFilter.parse("reused=true")).rows] == ["rf_a"]
    assert [r.job_id for r in list_page(db, InstanceFilter.parse("reused=no")).rows] == ["rf_other"]
    with TestClient(create_app(settings, db), base_url="http://testserver") as client:
        page = client.get("/instances?reused=true")
        assert "rf_a" in page.text and "rf_other" not in page.text
    with db.connect() as conn:
        trace = conn.execute(sa.text("SELECT event, detail FROM job_trace('rf_a')")).all()
    events_of = [e for e, _ in trace]
    assert events_of.index("run 1 ended") < events_of.index("run 2 started")
    assert dict(trace)["run 1 ended"].startswith("errored: ")


def test_after_completion_follows_any_finished_run_and_never_never(settings, db):
    submit(db, wf.AFTER_COMPLETION, "rc_a", {"attempt": "first"})
    submit(db, wf.NEVER, "rn_a", {"attempt": "first", "fail": True})
    run_until(settings, db, lambda: finished(db, "rc_a", "rn_a"))
    again = submit(db, wf.AFTER_COMPLETION, "rc_a", {"attempt": "second"})
    assert again.new_runs == ["rc_a"]
    never = submit(db, wf.NEVER, "rn_a", {"attempt": "second"})
    assert (never.created, never.duplicates, never.id_reuse_decisions) == (0, 1, [])
    # a job may ask for a stricter policy than its workflow's: never, here
    run_until(settings, db, lambda: finished(db, "rc_a"))
    strict = submit(db, wf.AFTER_COMPLETION, "rc_a", {"attempt": "x"}, id_reuse=IdReuse.NEVER)
    assert (strict.created, strict.duplicates) == (0, 1)
    assert [r.status for r in runs(db, "rc_a")] == ["complete", None]
    assert instance(db, "rc_a").run == 2 and instance(db, "rn_a").run == 1


def test_a_redelivery_never_starts_a_run(settings, db):
    """Idempotent per Kafka position: the record that created run 1, or started run 2,
    delivered again after that run failed, starts nothing."""
    first = delivery(wf.AFTER_FAILURE, "rr_a", {"attempt": "first", "fail": True})
    create_instances(db, [first])
    run_until(settings, db, lambda: finished(db, "rr_a"))
    assert create_instances(db, [first]).new_runs == []  # run 1's record again
    second = delivery(wf.AFTER_FAILURE, "rr_a", {"attempt": "second", "fail": True})
    assert create_instances(db, [second]).new_runs == ["rr_a"]
    run_until(settings, db, lambda: finished(db, "rr_a"))
    again = create_instances(db, [second])  # run 2's record again, run 2 failed
    assert (again.created, again.duplicates, again.already_recorded) == (0, 0, 1)
    assert instance(db, "rr_a").run == 2 and len(runs(db, "rr_a")) == 2
    # two resubmissions in one batch: the first starts run 3, the second collapses on it
    batch = [
        delivery(wf.AFTER_FAILURE, "rr_a", {"attempt": "third"}),
        delivery(wf.AFTER_FAILURE, "rr_a", {"attempt": "fourth"}),
    ]
    got = create_instances(db, batch)
    assert (got.new_runs, got.duplicates) == (["rr_a"], 1)
    assert instance(db, "rr_a").params == {"attempt": "third"}


def test_concurrent_resubmissions_start_one_new_run(settings, db):
    """Two workers resubmit one failed id at once; the first is paused after reading the
    finished run, before locking it: the second starts run 2, and the first, once let
    go, re-reads the row under its lock and collapses as a duplicate of run 2."""
    submit(db, wf.AFTER_FAILURE, "rw_a", {"attempt": "first", "fail": True})
    run_until(settings, db, lambda: finished(db, "rw_a"))
    point = failpoints.arm("reuse.after_read", "pause", job_id="rw_a")
    results = {}
    paused = threading.Thread(
        target=lambda: results.update(a=submit(db, wf.AFTER_FAILURE, "rw_a", {"attempt": "a"}))
    )
    paused.start()
    try:
        assert point.reached.wait(10)
        results["b"] = submit(db, wf.AFTER_FAILURE, "rw_a", {"attempt": "b"})
    finally:
        point.release()
        paused.join(10)
    assert results["b"].new_runs == ["rw_a"]
    assert results["a"].new_runs == [] and results["a"].duplicates == 1
    assert results["a"].id_reuse_decisions == [(wf.AFTER_FAILURE, "live")]
    row = instance(db, "rw_a")
    assert (row.run, row.params) == (2, {"attempt": "b"})
    assert [r.run for r in runs(db, "rw_a")] == [1, 2]


def test_a_zombie_of_run_one_cannot_write_into_run_two(db):
    """Engine E claims run 1 and stalls past its lease (a zombie); F rescues it and it
    errors; the id is resubmitted and E itself claims run 2. E's stale write of run 1
    (same owner, run 1's claim number) misses run 2: claim_count went on counting."""
    versions = REGISTRY.versions()
    submit(db, wf.AFTER_FAILURE, "rz_a", {"attempt": "first"})
    [zombie] = writes.claim(db, "E", 10, 30, versions=versions)
    with db.begin() as conn:
        conn.execute(
            sa.text(
                "UPDATE onceflow_instances SET lease_expires_at = now() - interval '1 second'"
                " WHERE job_id = 'rz_a'"
            )
        )
    assert writes.rescue_expired(db) == ["rz_a"]
    [taker] = writes.claim(db, "F", 10, 30, versions=versions)
    failed = FinishInstance("rz_a", taker.claim_count, InstanceStatus.ERRORED, error="boom")
    assert store.write_batch(db, "F", [failed]) == [None]
    assert submit(db, wf.AFTER_FAILURE, "rz_a", {"attempt": "second"}).new_runs == ["rz_a"]
    [run2] = writes.claim(db, "E", 10, 30, versions=versions)
    stale = FinishInstance("rz_a", zombie.claim_count, InstanceStatus.COMPLETE, result=b'"zombie"')
    [answer] = store.write_batch(db, "E", [stale])
    assert isinstance(answer, LeaseLost), "the zombie of run 1 wrote into run 2"
    assert run2.claim_count > zombie.claim_count and (zombie.run, run2.run) == (1, 2)
    row = instance(db, "rz_a")
    assert (row.run, row.status, row.result) == (2, "running", None)
    # the same write under run 2's own claim applies: the fence, not the write, refused
    own = FinishInstance("rz_a", run2.claim_count, InstanceStatus.COMPLETE, result=b'"run 2"')
    assert store.write_batch(db, "E", [own]) == [None]
    row = instance(db, "rz_a")
    assert (row.run, row.status, row.result) == (2, "complete", "run 2")
    assert [(r.run, r.status) for r in runs(db, "rz_a")] == [(1, "errored"), (2, None)]


def test_what_counts_as_a_failure(db):
    """after_failure follows an operator's terminate and a start_timeout (errored by a
    time limit), not a skip (a singleton decision: it never ran); after_completion
    follows a skip too."""
    submit(db, wf.AFTER_FAILURE, "rt_term", {"attempt": "first"})
    control.terminate(db, wf.AFTER_FAILURE, "rt_term")
    assert instance(db, "rt_term").status == "terminated"
    assert submit(db, wf.AFTER_FAILURE, "rt_term", {"attempt": "b"}).new_runs == ["rt_term"]
    for job_id, workflow in (
        ("rt_slow", wf.AFTER_FAILURE),
        ("rt_skip", wf.AFTER_FAILURE),
        ("rt_skip2", wf.AFTER_COMPLETION),
    ):
        submit(db, workflow, job_id, {"attempt": "first"})
    with db.begin() as conn:
        conn.execute(
            sa.text(
                "UPDATE onceflow_instances SET status = 'errored', timeout_kind = 'start_timeout',"
                " error = 'not started in time', finished_at = now() WHERE job_id = 'rt_slow'"
            )
        )
        conn.execute(
            sa.text(
                "UPDATE onceflow_instances SET status = 'skipped', skipped_for = 'other',"
                " finished_at = now() WHERE job_id IN ('rt_skip', 'rt_skip2')"
            )
        )
    assert submit(db, wf.AFTER_FAILURE, "rt_slow", {"attempt": "b"}).new_runs == ["rt_slow"]
    assert [(r.status, r.timeout_kind) for r in runs(db, "rt_slow")] == [
        ("errored", "start_timeout"),
        (None, None),
    ]
    skipped = submit(db, wf.AFTER_FAILURE, "rt_skip", {"attempt": "b"})
    assert skipped.id_reuse_decisions == [(wf.AFTER_FAILURE, "refused")]
    assert submit(db, wf.AFTER_COMPLETION, "rt_skip2", {"attempt": "b"}).new_runs == ["rt_skip2"]
    row = instance(db, "rt_skip2")
    assert (row.run, row.status, row.skipped_for) == (2, "queued", None)


def _relayed(db, job_id, kind):
    """The outbox row of ``job_id``'s latest ``kind`` event, as the webhook dispatcher
    reads it off the events topic."""
    sql = (
        "SELECT aggregateid, seq, type, workflow, payload FROM onceflow_outbox_events"
        " WHERE aggregateid = :j AND type = :t ORDER BY seq DESC LIMIT 1"
    )
    with db.connect() as conn:
        row = conn.execute(sa.text(sql), {"j": job_id, "t": "dev.onceflow." + kind}).one()
    headers = [
        ("ce_type", row.type.encode()),
        ("ce_id", f"{row.aggregateid}:{row.seq}".encode()),
        ("ce_jobid", row.aggregateid.encode()),
        ("ce_workflow", row.workflow.encode()),
        ("ce_sequence", str(row.seq).encode()),
    ]
    event = parse_event(headers, orjson.dumps(row.payload))
    assert event is not None
    return event


def test_run_one_final_event_goes_to_run_one_callback(db):
    """A dispatcher behind the relay reads run 1's final event after run 2 started with
    another callback: the event goes to run 1's callback, never run 2's."""
    first = Delivery(
        JobEnvelope("rcb_a", wf.AFTER_FAILURE, {"attempt": "first"}, callback="hook-one"),
        "t",
        0,
        next(_OFFSETS),
        version=REGISTRY.version(wf.AFTER_FAILURE),
        id_reuse=REGISTRY.id_reuse(wf.AFTER_FAILURE),
    )
    create_instances(db, [first])
    control.terminate(db, wf.AFTER_FAILURE, "rcb_a")
    ended = _relayed(db, "rcb_a", "instance.terminated")
    second = Delivery(
        JobEnvelope("rcb_a", wf.AFTER_FAILURE, {"attempt": "second"}, callback="hook-two"),
        "t",
        0,
        next(_OFFSETS),
        version=REGISTRY.version(wf.AFTER_FAILURE),
        id_reuse=REGISTRY.id_reuse(wf.AFTER_FAILURE),
    )
    assert create_instances(db, [second]).new_runs == ["rcb_a"]
    with db.connect() as conn:
        callbacks = writes.webhook_callbacks(conn, [(ended.job_id, ended.run)])
    rows = deliveries_for([ended], callbacks, REGISTRY, {})
    assert [r.endpoint for r in rows] == ["hook-one"], "run 1's end went to run 2's callback"
    control.terminate(db, wf.AFTER_FAILURE, "rcb_a")
    ended_two = _relayed(db, "rcb_a", "instance.terminated")
    assert ended_two.sequence > ended.sequence
    with db.connect() as conn:
        callbacks = writes.webhook_callbacks(conn, [(e.job_id, e.run) for e in (ended, ended_two)])
    rows = deliveries_for([ended, ended_two], callbacks, REGISTRY, {})
    assert [(r.sequence, r.endpoint) for r in rows] == [
        (ended.sequence, "hook-one"),
        (ended_two.sequence, "hook-two"),
    ]


def test_a_bulk_operation_applies_to_the_run_it_selected(db):
    """A bulk restart of the terminated instances snapshots run 1 of an id; before its
    batch runs, a resubmission starts run 2 (queued): the batch skips run 2, which the
    operator's filter never matched, instead of restarting it."""
    submit(db, wf.AFTER_FAILURE, "rb_a", {"attempt": "first"})
    control.terminate(db, wf.AFTER_FAILURE, "rb_a")
    op = start_bulk(db, BulkAction.RESTART, InstanceFilter.parse("status=terminated"))
    assert op.total == 1
    assert submit(db, wf.AFTER_FAILURE, "rb_a", {"attempt": "second"}).new_runs == ["rb_a"]
    done = run_bulk(db, op.id)
    assert (done.done, done.skipped) == (0, 1), "the bulk restart applied to run 2"
    row = instance(db, "rb_a")
    assert (row.run, row.status, row.restart_count) == (2, "queued", 0)
    assert ("instance.restarted", 2) not in [(t, d.get("run")) for t, d in events(db, "rb_a")]


def test_a_new_run_is_claimed_with_its_own_submission(db):
    """The engine's submission-to-completion histogram and the spans' parent come from
    the claim (submitted_at, traceparent): run 2's are its resubmission's, not run 1's."""
    versions = REGISTRY.versions()

    def envelope(params, at, trace):
        return JobEnvelope("rs_a", wf.AFTER_FAILURE, params, submitted_at=at, traceparent=trace)

    first_at = datetime(2026, 1, 1, tzinfo=UTC)
    one = "00-0af7651916cd43dd8448eb211c80319c-b7ad6b7169203331-01"
    two = "00-1bf7651916cd43dd8448eb211c80319c-c7ad6b7169203331-01"
    create_instances(db, [Delivery(envelope({"attempt": "a"}, first_at, one), "t", 0, 900)])
    control.terminate(db, wf.AFTER_FAILURE, "rs_a")
    second_at = datetime.now(UTC).replace(microsecond=0)
    again = Delivery(
        envelope({"attempt": "b"}, second_at, two),
        "t",
        0,
        901,
        version=REGISTRY.version(wf.AFTER_FAILURE),
        id_reuse=REGISTRY.id_reuse(wf.AFTER_FAILURE),
    )
    assert create_instances(db, [again]).new_runs == ["rs_a"]
    [claimed] = writes.claim(db, "E", 10, 30, versions=versions)
    assert claimed.run == 2
    assert (claimed.submitted_at, claimed.traceparent) == (second_at, two), "run 1's submission"


def test_retention_removes_earlier_runs_past_it(db):
    """An id reused again and again keeps a live instance, which retention never
    deletes: its earlier runs (their steps, results, params) go on their own once past
    the job-id retention, the current run's row (its starting record) stays."""
    submit(db, wf.AFTER_FAILURE, "rp_a", {"attempt": "first"})
    control.terminate(db, wf.AFTER_FAILURE, "rp_a")
    assert submit(db, wf.AFTER_FAILURE, "rp_a", {"attempt": "second"}).new_runs == ["rp_a"]
    with db.begin() as conn:
        conn.execute(
            sa.text(
                "UPDATE onceflow_runs SET finished_at = now() - interval '400 days'"
                " WHERE job_id = 'rp_a' AND run = 1"
            )
        )
    pruned = prune(db, 7 * 86400, 30 * 86400)
    assert [r.run for r in runs(db, "rp_a")] == [2], "run 1's history outlived retention"
    assert pruned["earlier_runs"] == 1
    assert instance(db, "rp_a").run == 2


def test_describe_shows_the_current_run_submission(db):
    """describe names run 2's submission (its request, time and record), not run 1's;
    run 1's stays in its earlier run's entry."""

    def sent(params, request_id, offset):
        env = JobEnvelope("rd_a", wf.AFTER_FAILURE, params, request_id=request_id)
        return Delivery(
            env,
            "t",
            0,
            offset,
            version=REGISTRY.version(wf.AFTER_FAILURE),
            id_reuse=REGISTRY.id_reuse(wf.AFTER_FAILURE),
        )

    create_instances(db, [sent({"attempt": "a"}, "req_one", 7001)])
    control.terminate(db, wf.AFTER_FAILURE, "rd_a")
    again = sent({"attempt": "b"}, "req_two", 7002)
    assert create_instances(db, [again]).new_runs == ["rd_a"]
    view = describe_instance(db, "rd_a")
    assert view is not None and view.run == 2
    assert (view.request_id, view.source) == ("req_two", "t/0@7002"), "run 1's submission"
    assert view.submitted_at == again.envelope.submitted_at
    [one] = view.earlier_runs
    assert one.source == "t/0@7001"


def test_an_operator_retry_meanwhile_makes_the_resubmission_a_duplicate(db):
    """A worker reads run 1 terminated, then is paused before its lock; an operator's
    retry queues run 1 again meanwhile: the worker, once let go, decides on the locked
    row (live) and collapses as a duplicate, run 1 goes on with its history."""
    submit(db, wf.AFTER_FAILURE, "ro_a", {"attempt": "first"})
    control.terminate(db, wf.AFTER_FAILURE, "ro_a")
    point = failpoints.arm("reuse.after_read", "pause", job_id="ro_a")
    results = {}
    paused = threading.Thread(
        target=lambda: results.update(a=submit(db, wf.AFTER_FAILURE, "ro_a", {"attempt": "b"}))
    )
    paused.start()
    try:
        assert point.reached.wait(10)
        assert control.retry(db, wf.AFTER_FAILURE, "ro_a").status == InstanceStatus.QUEUED
    finally:
        point.release()
        paused.join(10)
    assert (results["a"].new_runs, results["a"].duplicates) == ([], 1)
    assert results["a"].id_reuse_decisions == [(wf.AFTER_FAILURE, "live")]
    row = instance(db, "ro_a")
    assert (row.run, row.status, row.params) == (1, "queued", {"attempt": "first"})
    assert runs(db, "ro_a") == []


def test_a_new_run_starts_its_own_children(settings, db):
    """A parent's run 2 (after_failure: its child failed, so it errored) starts its
    child again, as its own (``<parent>__charge~run2``), and takes that child's result;
    it does not adopt run 1's failed child (before: run 2 collapsed on ``rf_p__charge``,
    errored at once with run 1's failure, and the child never ran again)."""
    submit(db, wf.PARENT, "rf_p", {"attempt": "first", "fail": True})
    run_until(settings, db, lambda: finished(db, "rf_p", "rf_p__charge"), events_relay=False)
    assert (instance(db, "rf_p").status, instance(db, "rf_p__charge").status) == (
        "errored",
        "errored",
    )
    assert submit(db, wf.PARENT, "rf_p", {"attempt": "second"}).new_runs == ["rf_p"]
    run_until(settings, db, lambda: finished(db, "rf_p"), events_relay=False)
    row = instance(db, "rf_p")
    assert (row.run, row.status, row.result) == (2, "complete", "work:second")
    again = instance(db, "rf_p__charge~run2")
    assert (again.status, again.parent_job_id, again.params) == (
        "complete",
        "rf_p",
        {"attempt": "second"},
    )
    # run 1's child is as it ended; the history names each run's own
    assert instance(db, "rf_p__charge").status == "errored"
    with db.connect() as conn:
        children = conn.execute(
            sa.text("SELECT child_job_id FROM onceflow_steps WHERE job_id = 'rf_p'")
        ).scalars()
        assert list(children) == ["rf_p__charge~run2"]
