"""Debounce (issue 26, item 1): of the jobs of one key within a period only the last
(trailing) or the first (leading) starts; the others are recorded ``debounced`` into the
instance that absorbed them. Decided in the transaction that creates them, under a
per-key lock; the trailing absorb re-checks the pending instance under its row lock, so
an engine's claim and an absorb never both take it. Every property is read back from the
database."""

from __future__ import annotations

import itertools
import threading
import time
from concurrent.futures import ThreadPoolExecutor
from datetime import UTC, datetime, timedelta

import httpx
import jsonschema
import sqlalchemy as sa
from fastapi.testclient import TestClient

from console import create_app
from onceflow import failpoints
from onceflow.envelope import JobEnvelope
from onceflow.vocabulary import LifecycleEvent
from onceflow_cli.render import render_instance
from tests.integration import debounce_workflows as wf
from tests.integration.events_helpers import event_schemas
from tests.integration.wait_helpers import create_events_topic, publish, served, until
from workflow_engine.definitions import REGISTRY
from workflow_engine.model import Delivery
from workflow_engine.store import operations, writes
from workflow_engine.store.views import describe_instance
from workflow_engine.store.writes import create_instances

_OFFSETS = itertools.count()
LATER = datetime.now(UTC) + timedelta(days=1)  # a test clock: every pending one is due


def deliveries(workflow, jobs):
    return [
        Delivery(
            JobEnvelope(job_id, workflow, params),
            "t",
            0,
            next(_OFFSETS),
            lane_path=REGISTRY.lane_path(workflow),
            debounce=REGISTRY.debounce(workflow),
        )
        for job_id, params in jobs
    ]


def create(db, workflow, jobs):
    """``jobs``: (job_id, params) pairs, created in one transaction, in this order."""
    return create_instances(db, deliveries(workflow, jobs))


def instances(db, prefix=""):
    sql = (
        "SELECT job_id, status, debounced_into, debounce_key, debounce_window_start,"
        " run_after, created_at, started_at, error, now() AS now"
        " FROM onceflow_instances WHERE job_id LIKE :p ORDER BY job_id"
    )
    with db.connect() as conn:
        return {r.job_id: r for r in conn.execute(sa.text(sql), {"p": prefix + "%"})}


def events(db, job_id):
    sql = "SELECT type, payload FROM onceflow_outbox_events WHERE aggregateid = :j ORDER BY seq"
    with db.connect() as conn:
        return [
            (t.removeprefix("dev.onceflow."), d)
            for t, d in conn.execute(sa.text(sql), {"j": job_id})
        ]


def valid(kind, data):
    """An outbox row's data against docs/events.md: the common schema and its type's."""
    schemas = event_schemas()
    jsonschema.validate(data, schemas["common"])
    jsonschema.validate(data, schemas[f"dev.onceflow.{kind}"])


def _seconds(delta):
    return delta.total_seconds()


def _until_due(db, job_id, deadline=10.0):
    """Wait until ``job_id``'s start time has passed on the database's clock."""
    end = time.monotonic() + deadline
    sql = sa.text("SELECT run_after <= now() FROM onceflow_instances WHERE job_id = :j")
    while time.monotonic() < end:
        with db.connect() as conn:
            if conn.execute(sql, {"j": job_id}).scalar():
                return
        time.sleep(0.05)
    raise AssertionError(f"{job_id} never came due")


def test_trailing_the_last_job_of_a_key_takes_the_pending_ones_place(db):
    t = {"tenant": "t1"}
    first = create(db, wf.TRAILING, [("tr_1", t), ("tr_2", t), ("tr_other", {"tenant": "t2"})])
    create(db, wf.TRAILING, [("tr_3", t)])
    create(db, wf.TRAILING, [("tr_3", t)])  # a redelivery: not a debounce decision
    got = instances(db, "tr_")
    assert {j: (r.status, r.debounced_into) for j, r in got.items()} == {
        "tr_1": ("debounced", "tr_2"),  # the same batch: consumption order decides
        "tr_2": ("debounced", "tr_3"),  # the pending one, absorbed by the next batch
        "tr_3": ("queued", None),
        "tr_other": ("queued", None),  # another key: its own window
    }
    assert sorted(first.debounce_decisions) == [
        (wf.TRAILING, "debounced"),
        (wf.TRAILING, "opened"),
        (wf.TRAILING, "opened"),
    ]
    # the window's start is carried forward; the start is a period after the last job
    assert got["tr_3"].debounce_window_start == got["tr_1"].created_at
    assert abs(_seconds(got["tr_3"].run_after - got["tr_3"].created_at) - 0.5) < 0.01
    assert got["tr_2"].error == "debounced into tr_3"
    kinds = [k for k, _ in events(db, "tr_2")]
    assert kinds == [str(LifecycleEvent.CREATED), str(LifecycleEvent.DEBOUNCED)]
    data = events(db, "tr_2")[1][1]
    assert data["status"] == "debounced" and data["error"] == "debounced into tr_3"
    assert data["debounce"] == {"key": "t1", "mode": "trailing", "into_job_id": "tr_3"}
    valid("instance.debounced", data)
    view = describe_instance(db, "tr_2")
    assert view is not None and view.debounce_note == "debounced into tr_3 (key 't1')"
    assert view.debounce_note in render_instance(view)  # the CLI's describe
    pending = describe_instance(db, "tr_3")
    assert pending.debounce_note is None
    opened = got["tr_1"].created_at.isoformat()
    assert pending.debounce_window == f"debounce window of key 't1' opened at {opened}"
    assert pending.debounce_window in render_instance(pending)
    chained = describe_instance(db, "tr_1")  # its absorber was absorbed in turn
    assert chained.debounce_note == "debounced into tr_2 (key 't1'); its window runs as tr_3"


def test_trailing_a_job_after_the_period_opens_a_new_window(db):
    t = {"tenant": "t1"}
    create(db, wf.TRAILING, [("tw_1", t)])
    _until_due(db, "tw_1")  # due, not claimed yet: its window is closed, it will run
    decided = create(db, wf.TRAILING, [("tw_2", t)])
    got = instances(db, "tw_")
    assert {j: (r.status, r.debounced_into) for j, r in got.items()} == {
        "tw_1": ("queued", None),
        "tw_2": ("queued", None),
    }
    assert got["tw_2"].debounce_window_start == got["tw_2"].created_at
    assert decided.debounce_decisions == [(wf.TRAILING, "opened")]


def test_leading_the_first_job_starts_and_the_others_in_the_period_are_debounced(db):
    t = {"tenant": "t1"}
    decided = create(db, wf.LEADING, [("ld_1", t), ("ld_2", t)])
    create(db, wf.LEADING, [("ld_3", t), ("ld_other", {"tenant": "t2"})])
    got = instances(db, "ld_")
    assert {j: (r.status, r.debounced_into) for j, r in got.items()} == {
        "ld_1": ("queued", None),
        "ld_2": ("debounced", "ld_1"),
        "ld_3": ("debounced", "ld_1"),
        "ld_other": ("queued", None),
    }
    assert got["ld_1"].run_after <= got["ld_1"].now  # the leader starts at once
    assert sorted(decided.debounce_decisions) == [
        (wf.LEADING, "debounced"),
        (wf.LEADING, "opened"),
    ]
    time.sleep(0.6)  # the leader's period is over (the database's clock, below)
    with db.connect() as conn:
        age = conn.execute(
            sa.text(
                "SELECT now() - debounce_window_start FROM onceflow_instances WHERE job_id = 'ld_1'"
            )
        ).scalar()
    assert _seconds(age) > 0.5
    create(db, wf.LEADING, [("ld_4", t)])
    assert instances(db, "ld_4")["ld_4"].status == "queued"  # a new leader
    data = events(db, "ld_3")[1][1]
    assert data["debounce"] == {"key": "t1", "mode": "leading", "into_job_id": "ld_1"}
    valid("instance.debounced", data)


def test_within_a_batch_consumption_order_decides_not_the_job_ids(db):
    t = {"tenant": "t1"}
    create(db, wf.TRAILING, [("co_z", t), ("co_a", t)])
    create(db, wf.LEADING, [("cl_z", t), ("cl_a", t)])
    got = instances(db, "c")
    assert (got["co_z"].status, got["co_z"].debounced_into) == ("debounced", "co_a")
    assert (got["co_a"].status, got["co_a"].debounced_into) == ("queued", None)
    assert (got["cl_z"].status, got["cl_z"].debounced_into) == ("queued", None)
    assert (got["cl_a"].status, got["cl_a"].debounced_into) == ("debounced", "cl_z")


def test_max_wait_bounds_the_wait_under_a_continuous_stream(db):
    """A job every 0.1 s for 2.6 s, period 0.4 s, max_wait 1.0 s: without the bound no
    window would ever close; with it, each window's instance starts at most 1.0 s after
    the window's first job, whatever came after."""
    t = {"tenant": "t1"}
    end = time.monotonic() + 2.6
    for n in itertools.count():
        create(db, wf.BOUNDED, [(f"mw_{n:03d}", t)])
        if time.monotonic() > end:
            break
        time.sleep(0.1)
    got = instances(db, "mw_")
    runs = [r for r in got.values() if r.status != "debounced"]
    assert len(runs) >= 2, "no window closed under the stream"
    for r in runs:
        assert _seconds(r.run_after - r.debounce_window_start) <= 1.0 + 1e-6
    closed = [r for r in runs if r.run_after <= r.now]
    assert closed and all(
        abs(_seconds(r.run_after - r.debounce_window_start) - 1.0) < 1e-6 for r in closed
    ), "a window under the stream was not bounded by max_wait"
    # every other job was debounced into an instance of its key created after it
    for r in got.values():
        if r.status == "debounced":
            into = got[r.debounced_into]
            assert into.debounce_key == r.debounce_key and into.created_at >= r.created_at


def _in_thread(fn, *args):
    done: dict[str, BaseException | None] = {}

    def run():
        try:
            fn(*args)
            done["ok"] = None
        except BaseException as exc:  # reported by the caller's assertion
            done["ok"] = exc

    thread = threading.Thread(target=run)
    thread.start()
    return thread, done


def test_an_engine_does_not_claim_a_pending_instance_being_absorbed(db):
    """The worker paused with the pending instance locked and read, the absorb not
    written: an engine's claim (its clock past the start) skips the row; the absorb then
    commits. Without the row lock, the claim would start an instance being debounced."""
    t = {"tenant": "race"}
    create(db, wf.TRAILING, [("ra_pending", t)])
    point = failpoints.arm("debounce.after_lock", "pause", job_id="ra_new")
    try:
        thread, done = _in_thread(create, db, wf.TRAILING, [("ra_new", t)])
        point.wait_reached(10)
        claimed = [c.job_id for c in writes.claim(db, "E1", 10, 30, now=LATER)]
    finally:
        point.release()
        failpoints.disarm_all()
    thread.join(10)
    assert done == {"ok": None}
    assert claimed == []
    got = instances(db, "ra_")
    assert (got["ra_pending"].status, got["ra_pending"].debounced_into) == (
        "debounced",
        "ra_new",
    )
    assert got["ra_pending"].started_at is None
    assert (got["ra_new"].status, got["ra_new"].debounced_into) == ("queued", None)


def test_a_pending_instance_an_engine_is_claiming_is_not_absorbed(db):
    """The reverse: an engine paused with the pending instance picked and locked, not
    leased; a new job of its key waits for that lock, re-reads the row as running and
    opens a new window: both run, neither is debounced."""
    t = {"tenant": "race"}
    create(db, wf.TRAILING, [("rb_pending", t)])
    point = failpoints.arm("claim.before_lease", "pause", job_id="rb_pending")
    claimed: list[str] = []
    try:
        engine, engine_done = _in_thread(
            lambda: claimed.extend(c.job_id for c in writes.claim(db, "E1", 10, 30, now=LATER))
        )
        point.wait_reached(10)
        worker, worker_done = _in_thread(create, db, wf.TRAILING, [("rb_new", t)])
        worker.join(1.0)
        waited = worker.is_alive()  # on the row's lock (without it: debounced now)
    finally:
        point.release()
        failpoints.disarm_all()
    engine.join(10)
    worker.join(10)
    assert engine_done == {"ok": None} and worker_done == {"ok": None}
    assert claimed == ["rb_pending"]
    got = instances(db, "rb_")
    assert (got["rb_pending"].status, got["rb_pending"].debounced_into) == ("running", None)
    assert (got["rb_new"].status, got["rb_new"].debounced_into) == ("queued", None)
    assert got["rb_new"].debounce_window_start == got["rb_new"].created_at  # a new window
    assert waited, "the absorb did not wait for the claim's row lock"


def test_two_creators_of_one_key_at_once_decide_one_after_the_other(db):
    """The first creator paused after its read (key locked): the second waits for the
    key's lock, then absorbs the first's job, never both pending. (A period longer than
    the pause: the first's start is still ahead when the second reads it.)"""
    t = {"tenant": "race"}
    point = failpoints.arm("debounce.after_lock", "pause", job_id="rc_first")
    try:
        one, one_done = _in_thread(create, db, wf.SLOW, [("rc_first", t)])
        point.wait_reached(10)
        two, two_done = _in_thread(create, db, wf.SLOW, [("rc_second", t)])
        two.join(1.0)
        waited = two.is_alive()
    finally:
        point.release()
        failpoints.disarm_all()
    one.join(10)
    two.join(10)
    assert one_done == {"ok": None} and two_done == {"ok": None}
    got = instances(db, "rc_")
    assert (got["rc_first"].status, got["rc_first"].debounced_into) == (
        "debounced",
        "rc_second",
    )
    assert (got["rc_second"].status, got["rc_second"].debounced_into) == ("queued", None)
    assert waited, "the second creator did not wait for the key's lock"


def test_console_shows_the_decision_and_filters_by_debounced(settings, db):
    t = {"tenant": "t1"}
    create(db, wf.TRAILING, [("cd_a", t), ("cd_b", t)])
    with TestClient(create_app(settings, db), base_url="http://testserver") as client:
        page = client.get("/instances/cd_a")
        assert page.status_code == 200
        assert 'id="debounce"' in page.text
        assert 'debounced into <a href="/instances/cd_b">cd_b</a>' in page.text
        listed = client.get("/instances", params={"status": "debounced"})
        assert listed.status_code == 200
        assert 'href="/instances/cd_a"' in listed.text
        assert 'href="/instances/cd_b"' not in listed.text  # queued, not debounced
        assert ">debounced</option>" in listed.text  # the filter offers the new status


def test_start_and_wait_answers_a_debounced_job_with_what_happened(settings, db):
    """A waiter on a job that gets debounced is answered at once with 200, status
    ``debounced`` and the error naming the instance that runs instead: the event is the
    one the decision wrote in the outbox, published as the relay would (after commit)."""
    wait_settings = settings.model_copy(
        update={
            "events_topic": settings.jobs_topic.replace(".jobs", ".events"),
            "ingest_max_wait_seconds": 10,
        }
    )
    create_events_topic(wait_settings)
    job = {"job_id": "sw_a", "workflow": wf.TRAILING, "params": {"tenant": "t1"}}
    with served(wait_settings) as (url, app, _), ThreadPoolExecutor(1) as pool:
        waiters = app.state.ingest.waiters
        pending = pool.submit(
            httpx.post, f"{url}/v1/jobs", json=job, headers={"Prefer": "wait=10"}, timeout=30
        )
        until(lambda: waiters.waiting("sw_a") == 1, 10, "the waiter registered")
        create(db, wf.TRAILING, [("sw_a", {"tenant": "t1"}), ("sw_b", {"tenant": "t1"})])
        ((kind, data),) = [e for e in events(db, "sw_a") if e[0] == "instance.debounced"]
        publish(
            wait_settings,
            "sw_a",
            kind,
            data["sequence"],
            data["workflow"],
            data["version"],
            data["status"],
            datetime.fromisoformat(data["time"]),
            {"debounce": data["debounce"], "error": data["error"]},
        )
        r = pending.result(20)
    assert r.status_code == 200, r.text
    body = r.json()
    assert (body["job_id"], body["status"]) == ("sw_a", "debounced")
    assert body["error"] == "debounced into sw_b"


def test_a_duplicate_of_another_workflow_decides_nothing(db):
    """The first delivery of an id makes the instance (here a plain workflow's); a later
    one of the same id naming a debounced workflow is a duplicate (a workflow mismatch),
    not a debounce decision."""
    plain = Delivery(JobEnvelope("mx_1", "order-workflow", {}), "t", 0, next(_OFFSETS))
    result = create_instances(db, [plain, *deliveries(wf.TRAILING, [("mx_1", {"tenant": "t"})])])
    assert result.debounce_decisions == [] and result.workflow_mismatches == 1
    got = instances(db, "mx_")["mx_1"]
    assert (got.status, got.debounce_key, got.debounced_into) == ("queued", None, None)


def test_a_restarted_debounced_instance_runs_and_is_out_of_the_decision(db):
    """An operator's restart of a debounced instance queues it to run now; it no longer
    names an absorber, and it is not a pending one a next job of its key absorbs (its
    start is now, not ahead)."""
    t = {"tenant": "t1"}
    create(db, wf.TRAILING, [("rs_a", t), ("rs_b", t)])
    assert operations.restart(db, wf.TRAILING, "rs_a").status == "queued"
    create(db, wf.TRAILING, [("rs_c", t)])
    got = instances(db, "rs_")
    assert {j: (r.status, r.debounced_into) for j, r in got.items()} == {
        "rs_a": ("queued", None),
        "rs_b": ("debounced", "rs_c"),
        "rs_c": ("queued", None),
    }
    assert got["rs_a"].run_after <= got["rs_a"].now
    assert describe_instance(db, "rs_a").debounce_note is None


def _hold_key(db, workflow, key):
    """A connection holding ``key``'s debounce lock (a creator of that key waits on it
    with its transaction, and its clock, already started); release with ``.close()``."""
    conn = db.connect()
    conn.begin()
    conn.execute(
        sa.text("SELECT pg_advisory_xact_lock(:space, hashtext(:w || chr(1) || :k))"),
        {"space": writes.debounce.LOCK_SPACE, "w": workflow, "k": key},
    )
    return conn


def _until_waiting_on_lock(db, deadline=10.0):
    sql = sa.text("SELECT count(*) FROM pg_locks WHERE locktype = 'advisory' AND NOT granted")
    end = time.monotonic() + deadline
    while time.monotonic() < end:
        with db.connect() as conn:
            if conn.execute(sql).scalar():
                return
        time.sleep(0.02)
    raise AssertionError("the creator never waited on the key's lock")


def test_an_instance_restarted_while_a_creator_waits_for_the_key_is_not_absorbed(db):
    """An operator restarts a debounced instance (its start: now) while a creator of its
    key, its transaction started earlier, waits for the key's lock: the restarted one is
    due, not pending, and runs; the creator must not absorb it by its older clock."""
    t = {"tenant": "rw"}
    create(db, wf.TRAILING, [("rw_a", t), ("rw_b", t)])
    held = _hold_key(db, wf.TRAILING, "rw")
    try:
        thread, done = _in_thread(create, db, wf.TRAILING, [("rw_c", t)])
        _until_waiting_on_lock(db)
        time.sleep(0.05)  # the creator's clock well before the restart's
        assert operations.restart(db, wf.TRAILING, "rw_a").status == "queued"
    finally:
        held.close()
    thread.join(10)
    assert done == {"ok": None}
    got = instances(db, "rw_")
    assert (got["rw_a"].status, got["rw_a"].debounced_into) == ("queued", None)
    assert (got["rw_b"].status, got["rw_b"].debounced_into) == ("debounced", "rw_c")


def test_an_operator_and_an_absorb_on_one_pending_instance_take_turns(db):
    """Both orders, under the row lock: an operator pausing the pending instance (its
    row locked, the pause not written) makes a creator of its key wait, then open a new
    window beside the paused one; a creator absorbing it (locked, not written) makes an
    operator's terminate wait, then refuse it as debounced, with one final event."""
    t = {"tenant": "op"}
    create(db, wf.SLOW, [("op_paused", t)])
    point = failpoints.arm("operations.after_lock", "pause", job_id="op_paused")
    try:
        op, op_done = _in_thread(operations.pause, db, wf.SLOW, "op_paused")
        point.wait_reached(10)
        worker, worker_done = _in_thread(create, db, wf.SLOW, [("op_new", t)])
        worker.join(1.0)
        waited = worker.is_alive()
    finally:
        point.release()
        failpoints.disarm_all()
    op.join(10)
    worker.join(10)
    assert op_done == {"ok": None} and worker_done == {"ok": None}
    assert waited, "the absorb did not wait for the operator's row lock"
    got = instances(db, "op_")
    assert (got["op_paused"].status, got["op_paused"].debounced_into) == ("paused", None)
    assert (got["op_new"].status, got["op_new"].debounced_into) == ("queued", None)
    assert got["op_new"].debounce_window_start == got["op_new"].created_at  # a new window

    point = failpoints.arm("debounce.after_lock", "pause", job_id="op_next")
    try:
        worker, worker_done = _in_thread(create, db, wf.SLOW, [("op_next", t)])
        point.wait_reached(10)
        op, op_done = _in_thread(operations.terminate, db, wf.SLOW, "op_new")
        op.join(1.0)
        waited = op.is_alive()
    finally:
        point.release()
        failpoints.disarm_all()
    op.join(10)
    worker.join(10)
    assert worker_done == {"ok": None} and waited
    assert isinstance(op_done["ok"], operations.ControlError)
    assert "debounced" in str(op_done["ok"])
    got = instances(db, "op_")
    assert (got["op_new"].status, got["op_new"].debounced_into) == ("debounced", "op_next")
    kinds = [k for k, _ in events(db, "op_new")]
    assert kinds == [str(LifecycleEvent.CREATED), str(LifecycleEvent.DEBOUNCED)]
    seqs = [d["sequence"] for _, d in events(db, "op_new")]
    assert seqs == [1, 2]


def test_a_terminated_survivor_leaves_the_next_job_a_new_window(db):
    """The trailing survivor terminated by an operator: the next job of its key does not
    attach to it, it opens a window of its own (its start a period from now)."""
    t = {"tenant": "ts"}
    create(db, wf.SLOW, [("ts_a", t), ("ts_b", t)])
    operations.terminate(db, wf.SLOW, "ts_b")
    create(db, wf.SLOW, [("ts_c", t)])
    got = instances(db, "ts_")
    assert (got["ts_b"].status, got["ts_b"].debounced_into) == ("terminated", None)
    assert (got["ts_c"].status, got["ts_c"].debounced_into) == ("queued", None)
    assert got["ts_c"].debounce_window_start == got["ts_c"].created_at
    assert abs(_seconds(got["ts_c"].run_after - got["ts_c"].created_at) - 10.0) < 0.01


def test_a_restarted_debounced_instance_does_not_lead_a_window_it_never_opened(db):
    """Leading: a job debounced into the leader, then restarted by an operator, runs, out
    of the decision; it is not a leader either. Once the leader's period is over (its
    window start moved back here), the next job leads a new window instead of being
    debounced into the restarted one (whose creation is still within the period)."""
    t = {"tenant": "lr"}
    create(db, wf.LEADING, [("lr_leader", t), ("lr_late", t)])
    assert operations.restart(db, wf.LEADING, "lr_late").status == "queued"
    with db.begin() as conn:
        conn.execute(
            sa.text(
                "UPDATE onceflow_instances SET debounce_window_start = now() - interval '10 s'"
                " WHERE job_id = 'lr_leader'"
            )
        )
    create(db, wf.LEADING, [("lr_next", t)])
    got = instances(db, "lr_")
    assert (got["lr_late"].status, got["lr_late"].debounced_into) == ("queued", None)
    assert (got["lr_next"].status, got["lr_next"].debounced_into) == ("queued", None)


def test_an_instance_retried_while_a_creator_waits_for_the_key_is_not_absorbed(db):
    """The same with a retry (its start: now) of a pending instance an operator had
    terminated: it is due, not pending, whatever the waiting creator's clock says."""
    t = {"tenant": "rx"}
    create(db, wf.TRAILING, [("rx_a", t)])
    operations.terminate(db, wf.TRAILING, "rx_a")
    held = _hold_key(db, wf.TRAILING, "rx")
    try:
        thread, done = _in_thread(create, db, wf.TRAILING, [("rx_b", t)])
        _until_waiting_on_lock(db)
        time.sleep(0.05)  # the creator's clock well before the retry's
        assert operations.retry(db, wf.TRAILING, "rx_a").status == "queued"
    finally:
        held.close()
    thread.join(10)
    assert done == {"ok": None}
    got = instances(db, "rx_")
    assert (got["rx_a"].status, got["rx_a"].debounced_into) == ("queued", None)
    assert (got["rx_b"].status, got["rx_b"].debounced_into) == ("queued", None)
