"""Singleton policies (issue 26, item 3): at most one live instance per key. The decision
for a new instance (skip, cancel_in_progress) is taken in the transaction that creates
it, under a per-key lock; running is bounded by the claim's per-key limit. Every
property is read back from the database."""

from __future__ import annotations

import itertools
import threading

import jsonschema
import sqlalchemy as sa
from fastapi.testclient import TestClient

from console import create_app
from onceflow import failpoints
from onceflow.envelope import JobEnvelope
from onceflow.vocabulary import LifecycleEvent
from onceflow_cli.render import render_instance
from tests.integration import singleton_workflows as wf
from tests.integration.events_helpers import event_schemas
from tests.integration.test_flow_control import run_until
from workflow_engine.definitions import REGISTRY
from workflow_engine.model import Delivery
from workflow_engine.store.operations import control
from workflow_engine.store.views import describe_instance
from workflow_engine.store.writes import create_instances

_OFFSETS = itertools.count()


def deliveries(workflow, jobs):
    return [
        Delivery(
            JobEnvelope(job_id, workflow, params),
            "t",
            0,
            next(_OFFSETS),
            lane_path=REGISTRY.lane_path(workflow),
            singleton=REGISTRY.singleton(workflow),
        )
        for job_id, params in jobs
    ]


def create(db, workflow, jobs):
    """``jobs``: (job_id, params) pairs, created in one transaction."""
    return create_instances(db, deliveries(workflow, jobs))


def instances(db, prefix=""):
    sql = (
        "SELECT job_id, status, skipped_for, cancelled_by, requested_action, error"
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


def test_skip_keeps_the_live_one_and_records_the_new_one_skipped(db):
    first = create(db, wf.SKIP, [("sk_a", {"customer": "c1"}), ("sk_b", {"customer": "c1"})])
    create(db, wf.SKIP, [("sk_c", {"customer": "c1"}), ("sk_other", {"customer": "c2"})])
    create(db, wf.NEWEST, [("sk_n1", {"customer": "c1"})])  # another workflow: its own key
    create(db, wf.NEWEST, [("sk_n2", {"customer": "c1"})])
    create(db, wf.SKIP, [("sk_a", {"customer": "c1"})])  # a redelivery of the live one
    got = instances(db, "sk_")
    assert {j: (r.status, r.skipped_for) for j, r in got.items()} == {
        "sk_a": ("queued", None),
        "sk_b": ("skipped", "sk_a"),  # the same batch: consumption order decides
        "sk_c": ("skipped", "sk_a"),
        "sk_other": ("queued", None),
        "sk_n1": ("queued", None),
        "sk_n2": ("skipped", "sk_n1"),  # cancel_newest is skip under Hatchet's name
    }
    assert sorted(first.singleton_decisions) == [(wf.SKIP, "active"), (wf.SKIP, "skipped")]
    kinds = [t for t, _ in events(db, "sk_b")]
    assert kinds == [str(LifecycleEvent.CREATED), str(LifecycleEvent.SKIPPED)]
    data = events(db, "sk_b")[1][1]
    assert data["status"] == "skipped"
    assert data["singleton"] == {"key": "c1", "mode": "skip", "active_job_id": "sk_a"}
    valid(LifecycleEvent.SKIPPED, data)
    view = describe_instance(db, "sk_b")
    assert view is not None and view.status == "skipped"
    assert view.singleton_note == "skipped: another instance sk_a of key 'c1' was active"
    assert view.singleton_note in render_instance(view)  # the CLI's describe


def test_cancel_in_progress_terminates_the_older_live_ones(db):
    create(db, wf.CANCEL, [("cc_a", {"customer": "c1"}), ("cc_x", {"customer": "c2"})])
    create(db, wf.CANCEL, [("cc_b", {"customer": "c1"}), ("cc_c", {"customer": "c1"})])
    got = instances(db, "cc_")
    assert {j: (r.status, r.cancelled_by) for j, r in got.items()} == {
        "cc_a": ("terminated", "cc_b"),  # each superseded by its successor
        "cc_b": ("terminated", "cc_c"),
        "cc_c": ("queued", None),
        "cc_x": ("queued", None),
    }
    assert got["cc_a"].error == "cancelled by cc_b (singleton)"
    # cc_a committed before (the terminate rule, per instance), cc_b in the same batch as
    # its successor (one statement for the batch): the same record either way
    assert got["cc_b"].error == "cancelled by cc_c (singleton)"
    for job_id in ("cc_a", "cc_b"):
        assert [t for t, _ in events(db, job_id)] == [
            str(LifecycleEvent.CREATED),
            str(LifecycleEvent.SUPERSEDED),
            str(LifecycleEvent.TERMINATED),
        ]
    for job_id, successor in (("cc_a", "cc_b"), ("cc_b", "cc_c")):
        kinds = events(db, job_id)
        assert kinds[1][1]["singleton"]["by_job_id"] == successor
        valid(LifecycleEvent.SUPERSEDED, kinds[1][1])
        valid(LifecycleEvent.TERMINATED, kinds[2][1])
    note = describe_instance(db, "cc_a").singleton_note
    assert note == "cancelled by cc_b, a newer instance of key 'c1'"


def _race(db, workflow, first_id, second_id):
    """Create ``first_id`` in a thread paused at ``singleton.after_decide`` (its key
    locked, its live instances read, not committed), then ``second_id`` of the same key
    in another; the second must wait for the first's commit and see its instance."""
    point = failpoints.arm("singleton.after_decide", "pause", job_id=first_id)
    done: dict[str, BaseException | None] = {}

    def run(job_id):
        try:
            create(db, workflow, [(job_id, {"customer": "race"})])
            done[job_id] = None
        except BaseException as exc:  # reported by the assertion below
            done[job_id] = exc

    one = threading.Thread(target=run, args=(first_id,))
    two = threading.Thread(target=run, args=(second_id,))
    try:
        one.start()
        point.wait_reached(10)
        two.start()
        two.join(1.0)
        # the second creator waits for the first's lock (without it, it commits now)
        waited = two.is_alive()
    finally:
        point.release()
        one.join(10)
        two.join(10)
        failpoints.disarm_all()
    assert done == {first_id: None, second_id: None}
    return waited


def test_skip_two_creators_of_one_key_at_once_cannot_both_be_the_live_one(db):
    waited = _race(db, wf.SKIP, "rs_first", "rs_second")
    got = instances(db, "rs_")
    assert (got["rs_first"].status, got["rs_first"].skipped_for) == ("queued", None)
    assert (got["rs_second"].status, got["rs_second"].skipped_for) == ("skipped", "rs_first")
    assert waited, "the second creator did not wait for the key's lock"


def test_cancel_two_creators_of_one_key_at_once_the_later_cancels_the_earlier(db):
    waited = _race(db, wf.CANCEL, "rc_first", "rc_second")
    got = instances(db, "rc_")
    assert (got["rc_first"].status, got["rc_first"].cancelled_by) == ("terminated", "rc_second")
    assert (got["rc_second"].status, got["rc_second"].cancelled_by) == ("queued", None)
    assert waited, "the second creator did not wait for the key's lock"


def test_console_shows_the_decision_and_filters_by_skipped(settings, db):
    create(db, wf.SKIP, [("cs_a", {"customer": "c1"}), ("cs_b", {"customer": "c1"})])
    create(db, wf.CANCEL, [("cs_c", {"customer": "c1"})])
    create(db, wf.CANCEL, [("cs_d", {"customer": "c1"})])
    with TestClient(create_app(settings, db), base_url="http://testserver") as client:
        page = client.get("/instances/cs_b")
        assert page.status_code == 200
        assert 'id="singleton"' in page.text
        assert 'skipped: another instance <a href="/instances/cs_a">cs_a</a>' in page.text
        cancelled = client.get("/instances/cs_c").text
        assert 'cancelled by <a href="/instances/cs_d">cs_d</a>' in cancelled
        listed = client.get("/instances", params={"status": "skipped"})
        assert listed.status_code == 200
        assert "cs_b" in listed.text and "cs_a" not in listed.text
        assert ">skipped</option>" in listed.text  # the filter offers the new status


def test_cancel_of_a_waiting_parent_closes_its_child_by_the_terminate_rule(settings, db):
    """An older instance that is not running but has a live child goes through the
    operator's terminate rule itself: terminated at once, its child closed."""
    create(db, wf.PARENT, [("cp_old", {"customer": "c1"})])

    def waiting() -> bool:
        got = instances(db, "cp_old")
        return "cp_old__kid" in got and got["cp_old"].status == "waiting"

    run_until(settings, db, waiting)
    create(db, wf.PARENT, [("cp_new", {"customer": "c1"})])
    got = instances(db, "cp_")
    assert (got["cp_old"].status, got["cp_old"].cancelled_by) == ("terminated", "cp_new")
    assert got["cp_old"].error == "cancelled by cp_new (singleton)"
    assert got["cp_old__kid"].status == "terminated"  # closed by the parent's policy
    assert got["cp_new"].status == "queued"


def test_skip_against_a_live_one_being_terminated_waits_for_its_finisher(db):
    """A skip names a live instance read under the key's lock, but the key's lock is not
    one its finisher takes: an operator's terminate that has locked the live instance
    (paused at ``operations.after_lock``) and commits while the creator decides must
    not leave the new job skipped for an instance that is no longer live (then nothing
    of the key runs). The creator's read locks the live rows (FOR SHARE), so it waits
    for the finisher and re-reads the row as committed."""
    create(db, wf.SKIP, [("sf_live", {"customer": "c1"})])
    point = failpoints.arm("operations.after_lock", "pause", job_id="sf_live")
    done: dict[str, BaseException | None] = {}

    def run(name, fn):
        try:
            fn()
            done[name] = None
        except BaseException as exc:  # reported by the assertion below
            done[name] = exc

    finisher = threading.Thread(
        target=run, args=("terminate", lambda: control.terminate(db, wf.SKIP, "sf_live"))
    )
    creator = threading.Thread(
        target=run, args=("create", lambda: create(db, wf.SKIP, [("sf_new", {"customer": "c1"})]))
    )
    try:
        finisher.start()
        point.wait_reached(10)
        creator.start()
        creator.join(1.0)
    finally:
        point.release()
        finisher.join(10)
        creator.join(10)
        failpoints.disarm_all()
    assert done == {"terminate": None, "create": None}
    got = instances(db, "sf_")
    assert got["sf_live"].status == "terminated"
    # the live one was no longer live when the decision committed: the new one runs
    assert (got["sf_new"].status, got["sf_new"].skipped_for) == ("queued", None)


def test_a_retried_cancelled_instance_is_live_again_and_cancelled_by_the_next_one(db):
    """A retry makes a superseded (terminated) instance live again: out of the decision
    that stopped it, like a restart. Kept, its ``cancelled_by`` would mark it as being
    stopped already, and the next new instance of its key would not cancel it."""
    create(db, wf.CANCEL, [("rt_a", {"customer": "c1"})])
    create(db, wf.CANCEL, [("rt_b", {"customer": "c1"})])
    control.retry(db, wf.CANCEL, "rt_a")
    got = instances(db, "rt_a")["rt_a"]
    assert (got.status, got.cancelled_by) == ("queued", None)
    assert describe_instance(db, "rt_a").singleton_note is None
    create(db, wf.CANCEL, [("rt_c", {"customer": "c1"})])
    got = instances(db, "rt_")
    assert {j: r.status for j, r in got.items()} == {
        "rt_a": "terminated",
        "rt_b": "terminated",
        "rt_c": "queued",
    }
    assert got["rt_a"].cancelled_by is not None


def test_skip_does_not_give_way_to_an_instance_being_cancelled(db):
    """An instance already superseded (``cancelled_by`` set while its engine stops it: the
    workflow was ``cancel_in_progress`` until a deploy made it ``skip``) is not the key's
    live one: a new job skipped for it would leave nothing of the key running once it
    stops. Its running state is set directly: the engine's part is not what is tested."""
    create(db, wf.SKIP, [("ss_dying", {"customer": "c1"})])
    with db.begin() as conn:
        conn.execute(
            sa.text(
                "UPDATE onceflow_instances SET status = 'running', started_at = now(),"
                " lease_owner = 'e1', lease_expires_at = now() + interval '1 minute',"
                " cancelled_by = 'ss_newer', requested_action = 'terminate'"
                " WHERE job_id = 'ss_dying'"
            )
        )
    create(db, wf.SKIP, [("ss_new", {"customer": "c1"}), ("ss_after", {"customer": "c1"})])
    got = instances(db, "ss_")
    assert (got["ss_new"].status, got["ss_new"].skipped_for) == ("queued", None)
    assert (got["ss_after"].status, got["ss_after"].skipped_for) == ("skipped", "ss_new")


def test_within_a_batch_consumption_order_decides_not_the_job_ids(db):
    create(db, wf.SKIP, [("co_z", {"customer": "c1"}), ("co_a", {"customer": "c1"})])
    create(db, wf.CANCEL, [("cq_z", {"customer": "c1"}), ("cq_a", {"customer": "c1"})])
    got = instances(db, "c")
    assert (got["co_z"].status, got["co_z"].skipped_for) == ("queued", None)
    assert (got["co_a"].status, got["co_a"].skipped_for) == ("skipped", "co_z")
    assert (got["cq_z"].status, got["cq_z"].cancelled_by) == ("terminated", "cq_a")
    assert (got["cq_a"].status, got["cq_a"].cancelled_by) == ("queued", None)
