"""Batching (issue 26, item 2): the jobs of a batched workflow wait as members, each its
own instance, until an engine forms a batch run of up to max_size of one key (max_size
waiting, or the oldest max_wait old); the run's outcome becomes every member's. Every
property is read back from the database."""

from __future__ import annotations

import itertools
import threading
import time
from concurrent.futures import ThreadPoolExecutor

import httpx
import jsonschema
import pytest
import sqlalchemy as sa
from fastapi.testclient import TestClient

from console import create_app
from onceflow import failpoints
from onceflow.envelope import JobEnvelope
from onceflow_cli.render import render_instance
from tests.integration import batch_workflows as wf
from tests.integration.events_helpers import event_schemas
from tests.integration.test_flow_control import run_until
from tests.integration.wait_helpers import create_events_topic, served, until
from workflow_engine.definitions import REGISTRY
from workflow_engine.model import Delivery
from workflow_engine.store.operations import control
from workflow_engine.store.operations.control import ControlError
from workflow_engine.store.views import describe_instance
from workflow_engine.store.writes import create_instances, form_due

_OFFSETS = itertools.count()


def create(db, workflow, jobs):
    """``jobs``: (job_id, params) pairs, created in one transaction."""
    return create_instances(
        db,
        [
            Delivery(
                JobEnvelope(job_id, workflow, params),
                "t",
                0,
                next(_OFFSETS),
                version=REGISTRY.version(workflow),
                batch_key=REGISTRY.batch_key(workflow),
            )
            for job_id, params in jobs
        ],
    )


def rows(db, prefix):
    sql = (
        "SELECT job_id, status, batch_key, batch_id, batch_index, batch_size, result, error,"
        " params FROM onceflow_instances WHERE job_id LIKE :p ORDER BY job_id"
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
    schemas = event_schemas()
    jsonschema.validate(data, schemas["common"])
    jsonschema.validate(data, schemas[f"dev.onceflow.{kind}"])


def members_and_runs(found):
    members = {j: r for j, r in found.items() if r.batch_size is None}
    runs = {j: r for j, r in found.items() if r.batch_size is not None}
    return members, runs


def test_size_trigger_groups_by_key_and_gives_every_member_its_result(settings, db):
    jobs = [(f"sz_a{i:02}", {"tenant": "a", "n": i}) for i in range(12)]
    jobs += [(f"sz_b{i:02}", {"tenant": "b", "n": i}) for i in range(3)]
    create(db, wf.SIZE, jobs)
    assert {r.status for r in rows(db, "sz_").values()} == {"batching"}

    def done():
        members, _ = members_and_runs(rows(db, "sz_a"))
        return sum(r.status == "complete" for r in members.values()) == 10

    run_until(settings, db, done, events_relay=False)
    members, runs = members_and_runs(rows(db, "sz_"))
    # two full batches of tenant a; two of a's and all of b's still wait (size only)
    assert sorted(r.batch_size for r in runs.values()) == [5, 5]
    assert all(r.status == "complete" for r in runs.values())
    waiting = sorted(j for j, r in members.items() if r.status == "batching")
    assert waiting == ["sz_a10", "sz_a11", "sz_b00", "sz_b01", "sz_b02"]
    for job_id, r in members.items():
        if r.status != "complete":
            continue
        run = runs[r.batch_id]
        assert run.params["key"] == "a"
        assert run.params["members"][r.batch_index] == {"job_id": job_id, "params": r.params}
        assert r.result == {"double": r.params["n"] * 2, "tenant": "a"}
    # oldest first: the first batch is a00..a04, named after its first member
    assert set(runs) == {"sz_a00~batch", "sz_a05~batch"}
    kinds = [k for k, _ in events(db, "sz_a03")]
    assert kinds == ["instance.created", "instance.batched", "instance.complete"]
    for kind, data in events(db, "sz_a03") + events(db, "sz_a00~batch"):
        valid(kind, data)
    batched = dict(events(db, "sz_a03"))["instance.batched"]
    assert batched["batch"] == {"batch_id": "sz_a00~batch", "index": 3, "size": 5}


def test_wait_trigger_forms_a_partial_batch_and_a_dict_result(settings, db):
    create(db, wf.WAIT, [(f"wt_{i}", {"n": i}) for i in range(7)])

    def done():
        return all(r.status == "complete" for r in rows(db, "wt_").values())

    run_until(settings, db, done, events_relay=False)
    members, runs = members_and_runs(rows(db, "wt_"))
    assert len(runs) == 1 and next(iter(runs.values())).batch_size == 7
    assert {j: r.result for j, r in members.items()} == {f"wt_{i}": i + 1 for i in range(7)}


def test_a_failed_batch_fails_every_member_and_a_wrong_result_errors_it(settings, db):
    create(db, wf.FAILING, [(f"fl_{i}", {"n": i}) for i in range(3)])
    create(db, wf.WRONG, [(f"wr_{i}", {"n": i}) for i in range(3)])

    def done():
        found = rows(db, "fl_") | rows(db, "wr_")
        return len(found) == 8 and all(r.status == "errored" for r in found.values())

    run_until(settings, db, done, events_relay=False)
    failed = rows(db, "fl_")
    assert {r.error for j, r in failed.items() if j != "fl_0~batch"} == {
        f"batch fl_0~batch errored: {failed['fl_0~batch'].error}"
    }
    assert "the whole batch failed" in failed["fl_0~batch"].error
    wrong = rows(db, "wr_")
    assert "a list of 2 results for 3 members" in wrong["wr_0~batch"].error
    assert wrong["wr_1"].error.startswith("batch wr_0~batch errored: batch result:")
    kinds = [k for k, _ in events(db, "wr_2")]
    assert kinds[-1] == "instance.errored"
    for kind, data in events(db, "wr_2") + events(db, "fl_1"):
        valid(kind, data)
    assert events(db, "fl_1")[-1][1]["batch"] == {"batch_id": "fl_0~batch", "index": 1, "size": 3}


def test_a_member_is_never_in_two_batches_when_two_formers_race(db):
    """One former paused with the pool's oldest five locked; a second forms meanwhile:
    it skips the locked ones and takes the next five; the first then commits its own."""
    policy = REGISTRY.batches()[wf.SIZE]
    create(db, wf.SIZE, [(f"rc_{i:02}", {"tenant": "r", "n": i}) for i in range(10)])
    point = failpoints.arm("batch.after_lock", "pause", job_id="rc_00")
    formed = {}

    def first():
        formed["first"] = form_due(db, wf.SIZE, policy)

    one = threading.Thread(target=first)
    one.start()
    try:
        point.wait_reached()
        formed["second"] = form_due(db, wf.SIZE, policy)
        assert [b.members for b in formed["second"]] == [tuple(f"rc_{i:02}" for i in range(5, 10))]
    finally:
        point.release()
        one.join(30)
        failpoints.disarm_all()
    assert [b.members for b in formed["first"]] == [tuple(f"rc_{i:02}" for i in range(5))]
    members, _ = members_and_runs(rows(db, "rc_"))
    assert {r.status for r in members.values()} == {"batched"}
    assert {j: r.batch_id for j, r in members.items()} == {
        f"rc_{i:02}": "rc_00~batch" if i < 5 else "rc_05~batch" for i in range(10)
    }


def test_a_locked_pool_short_of_max_size_and_not_due_forms_nothing(db):
    """The re-check under the lock: a pool read as full, of which another former holds
    some, is not formed short (the oldest is not due)."""
    policy = REGISTRY.batches()[wf.SIZE]
    create(db, wf.SIZE, [(f"sh_{i}", {"tenant": "s", "n": i}) for i in range(6)])
    point = failpoints.arm("batch.after_lock", "pause", job_id="sh_0")
    formed = {}
    one = threading.Thread(target=lambda: formed.setdefault("first", form_due(db, wf.SIZE, policy)))
    one.start()
    try:
        point.wait_reached()
        assert form_due(db, wf.SIZE, policy) == []  # one left unlocked: not five, not due
    finally:
        point.release()
        one.join(30)
        failpoints.disarm_all()
    found = rows(db, "sh_")
    assert [j for j, r in found.items() if r.status == "batching"] == ["sh_5"]


def test_operator_actions_on_members(settings, db):
    policy = REGISTRY.batches()[wf.SIZE]
    create(db, wf.SIZE, [(f"op_{i}", {"tenant": "o", "n": i}) for i in range(6)])
    with pytest.raises(ControlError, match="waiting to be batched"):
        control.pause(db, wf.SIZE, "op_0")
    assert control.terminate(db, wf.SIZE, "op_0").status == "terminated"
    with pytest.raises(ControlError, match="never ran"):
        control.restart(db, wf.SIZE, "op_0")
    [batch] = form_due(db, wf.SIZE, policy)  # op_0 left the pool: op_1..op_5
    assert batch.members == tuple(f"op_{i}" for i in range(1, 6))
    with pytest.raises(ControlError, match=r"in batch op_1~batch \(member 2 of 5\)"):
        control.terminate(db, wf.SIZE, "op_2")
    # the batch run is the one to act on: its members follow it
    control.terminate(db, wf.SIZE, "op_1~batch")
    found = rows(db, "op_")
    assert {found[f"op_{i}"].status for i in range(1, 6)} == {"terminated"}
    assert found["op_3"].error.startswith("batch op_1~batch terminated")
    for kind, data in events(db, "op_3"):
        valid(kind, data)
    with pytest.raises(ControlError, match="retry the batch run instead"):
        control.retry(db, wf.SIZE, "op_3")
    control.restart(db, wf.SIZE, "op_1~batch")  # live again: its members are in it again
    found = rows(db, "op_")
    assert {found[f"op_{i}"].status for i in range(1, 6)} == {"batched"}
    run_until(
        settings, db, lambda: rows(db, "op_5")["op_5"].status == "complete", events_relay=False
    )
    assert rows(db, "op_4")["op_4"].result == {"double": 8, "tenant": "o"}
    assert [k for k, _ in events(db, "op_4")][-2:] == ["instance.batched", "instance.complete"]


def test_describe_cli_and_console_say_where_a_member_is(settings, db):
    policy = REGISTRY.batches()[wf.SIZE]
    create(db, wf.SIZE, [(f"ds_{i}", {"tenant": "d", "n": i}) for i in range(6)])
    form_due(db, wf.SIZE, policy)
    member = describe_instance(db, "ds_3")
    assert member.batch_note == "in batch ds_0~batch, member 4 of 5"
    assert "in batch ds_0~batch, member 4 of 5" in render_instance(member)
    assert describe_instance(db, "ds_5").batch_note == "waiting to be batched (key 'd')"
    run = describe_instance(db, "ds_0~batch")
    assert run.batch_members == [f"ds_{i}" for i in range(5)]
    assert run.provenance.startswith("a batch run")
    with TestClient(create_app(settings, db), base_url="http://testserver") as client:
        page = client.get("/instances/ds_3").text
        assert 'in batch <a href="/instances/ds_0~batch">ds_0~batch</a>, member 4 of 5' in page
        assert '<a href="/instances/ds_4">ds_4</a>' in client.get("/instances/ds_0~batch").text
        listed = client.get("/instances", params={"status": "batching"})
        assert "ds_5" in listed.text and "ds_3" not in listed.text
        assert ">batched</option>" in listed.text


@pytest.mark.timeout(90)
def test_start_and_wait_and_get_of_a_member_answer_its_own_outcome(settings, db):
    """``Prefer: wait`` on a member's POST is answered by the member's own final event
    (the relay publishes what the batch run's finish wrote for it); ``GET /v1/jobs/{id}``
    says which batch it was in."""
    s = settings.model_copy(
        update={
            "events_topic": settings.jobs_topic.replace(".jobs", ".events"),
            "ingest_max_wait_seconds": 20,
        }
    )
    create_events_topic(s)
    job = {"job_id": "sw_1", "workflow": wf.WAIT, "params": {"n": 41}}
    with served(s) as (url, app, _), ThreadPoolExecutor(1) as pool:
        headers = {"Prefer": "wait=20"}
        pending = pool.submit(httpx.post, f"{url}/v1/jobs", json=job, headers=headers, timeout=30)
        until(lambda: app.state.ingest.waiters.waiting("sw_1") == 1, 10, "the waiter registered")
        create(db, wf.WAIT, [("sw_1", {"n": 41}), ("sw_2", {"n": 1})])
        run_until(s, db, pending.done)
        answered = pending.result()
        got = httpx.get(f"{url}/v1/jobs/sw_1", timeout=10)
    assert answered.status_code == 200, answered.text
    body = answered.json()
    assert (body["job_id"], body["status"], body["result"]) == ("sw_1", "complete", 42)
    assert got.status_code == 200
    assert (got.json()["batch_id"], got.json()["batch_index"]) == ("sw_1~batch", 0)


def test_a_terminate_and_a_formation_of_one_member_are_ordered_by_its_row_lock(db):
    """A former holding a member's lock makes an operator's terminate wait and then see
    it batched (refused); an operator holding the lock makes the former skip it."""
    policy = REGISTRY.batches()[wf.SIZE]
    create(db, wf.SIZE, [(f"ol_{i}", {"tenant": "l", "n": i}) for i in range(5)])
    outcome = {}

    def terminate(job_id):
        try:
            outcome[job_id] = control.terminate(db, wf.SIZE, job_id).status
        except ControlError as exc:
            outcome[job_id] = str(exc)

    point = failpoints.arm("batch.after_lock", "pause", job_id="ol_0")
    former = threading.Thread(target=lambda: form_due(db, wf.SIZE, policy))
    former.start()
    try:
        point.wait_reached()
        operator = threading.Thread(target=terminate, args=("ol_2",))
        operator.start()
        operator.join(0.5)
        assert operator.is_alive()  # waits for the former's row lock
    finally:
        point.release()
        former.join(30)
        operator.join(30)
        failpoints.disarm_all()
    assert "is in batch ol_0~batch (member 3 of 5)" in outcome["ol_2"]
    assert rows(db, "ol_2")["ol_2"].status == "batched"

    create(db, wf.SIZE, [(f"om_{i}", {"tenant": "m", "n": i}) for i in range(5)])
    point = failpoints.arm("operations.after_lock", "pause", job_id="om_2")
    operator = threading.Thread(target=terminate, args=("om_2",))
    operator.start()
    try:
        point.wait_reached()
        assert form_due(db, wf.SIZE, policy) == []  # four unlocked, not due: nothing formed
    finally:
        point.release()
        operator.join(30)
        failpoints.disarm_all()
    assert outcome["om_2"] == "terminated"
    assert {r.status for j, r in rows(db, "om_").items()} == {"batching", "terminated"}


def test_retention_keeps_a_batch_run_while_a_member_names_it(db):
    from workflow_engine.store.writes import prune

    policy = REGISTRY.batches()[wf.SIZE]
    create(db, wf.SIZE, [(f"rt_{i}", {"tenant": "r", "n": i}) for i in range(5)])
    form_due(db, wf.SIZE, policy)
    control.terminate(db, wf.SIZE, "rt_0~batch")  # the run and its members final
    with db.begin() as conn:
        conn.execute(
            sa.text(
                "UPDATE onceflow_instances SET finished_at = now() - interval '30 days'"
                " WHERE job_id LIKE 'rt_%'"
            )
        )
    assert prune(db, instance_seconds=0.0, job_id_seconds=0.0)["instances"] == 5
    assert list(rows(db, "rt_")) == ["rt_0~batch"]  # its members went first
    assert prune(db, instance_seconds=0.0, job_id_seconds=0.0)["instances"] == 1
    assert rows(db, "rt_") == {}


def test_a_batched_workflow_cannot_be_started_as_a_child(settings, db):
    from workflow_engine.store.writes import create_instances as plain_create

    plain_create(db, [Delivery(JobEnvelope("pc_1", wf.PARENT, {}), "t", 0, next(_OFFSETS))])
    run_until(settings, db, lambda: rows(db, "pc_")["pc_1"].status == "errored")
    assert (
        "runs its jobs in batches: it cannot be started as a child" in rows(db, "pc_")["pc_1"].error
    )
    assert list(rows(db, "pc_")) == ["pc_1"]  # no child instance


def test_a_job_created_without_its_batch_policy_errors_with_the_reason(settings, db):
    """A worker that does not load the workflow's module creates a plain instance: an
    engine that has the workflow errors it instead of running a member as a batch."""
    from workflow_engine.store.writes import create_instances as plain_create

    plain_create(db, [Delivery(JobEnvelope("np_1", wf.WAIT, {"n": 1}), "t", 0, next(_OFFSETS))])
    assert rows(db, "np_")["np_1"].status == "queued"
    run_until(settings, db, lambda: rows(db, "np_")["np_1"].status == "errored")
    assert "runs its jobs in batches, but this job was created" in rows(db, "np_")["np_1"].error


def test_a_job_id_submitted_again_after_retention_cannot_wedge_the_former(db):
    """A member's job-id record is kept while its batch run's (``<member>~batch``) is: a
    job submitted again under that id collapses as a duplicate instead of becoming a
    member whose batch run's id is taken (every formation of its pool refused)."""
    from workflow_engine.store.writes import prune

    policy = REGISTRY.batches()[wf.SIZE]
    jobs = [(f"ru_{i}", {"tenant": "u", "n": i}) for i in range(5)]
    create(db, wf.SIZE, jobs)
    form_due(db, wf.SIZE, policy)
    control.terminate(db, wf.SIZE, "ru_0~batch")
    with db.begin() as conn:
        conn.execute(
            sa.text(
                "UPDATE onceflow_instances SET finished_at = now() - interval '30 days'"
                " WHERE job_id LIKE 'ru_%'"
            )
        )
        conn.execute(
            sa.text(
                "UPDATE onceflow_jobs SET received_at = now() - interval '30 days'"
                " WHERE job_id LIKE 'ru_%'"
            )
        )
    prune(db, instance_seconds=0.0, job_id_seconds=0.0)
    assert list(rows(db, "ru_")) == ["ru_0~batch"]
    create(db, wf.SIZE, [*jobs, ("ru_5", {"tenant": "u", "n": 5})])  # the same ids again
    [batch] = form_due(db, wf.SIZE, policy)  # was: BatchIdTaken, "ru_0~batch" taken
    assert batch.members == tuple(f"ru_{i}" for i in range(1, 6))  # ru_0 collapsed
    assert "ru_0" not in rows(db, "ru_")
    control.terminate(db, wf.SIZE, "ru_1~batch")
    with db.begin() as conn:
        conn.execute(
            sa.text(
                "UPDATE onceflow_instances SET finished_at = now() - interval '30 days'"
                " WHERE job_id LIKE 'ru_%'"
            )
        )
        conn.execute(
            sa.text(
                "UPDATE onceflow_jobs SET received_at = now() - interval '30 days'"
                " WHERE job_id LIKE 'ru_%'"
            )
        )
    for _ in range(3):  # members; then their runs; then the first members' records
        prune(db, instance_seconds=0.0, job_id_seconds=0.0)
    with db.connect() as conn:  # and every record goes in the end
        left = conn.execute(sa.text("SELECT count(*) FROM onceflow_jobs WHERE job_id LIKE 'ru_%'"))
        assert left.scalar_one() == 0


def test_a_member_or_a_batch_run_cannot_be_forked(db):
    """A fork is an instance run on its own: a member's (one job's params) or a batch
    run's (no member takes its outcome) would be errored by the engine when claimed, so
    the fork is refused with the reason, and nothing is created."""
    from workflow_engine.store.operations import fork

    policy = REGISTRY.batches()[wf.SIZE]
    create(db, wf.SIZE, [(f"fk_{i}", {"tenant": "f", "n": i}) for i in range(6)])
    form_due(db, wf.SIZE, policy)
    for job_id in ("fk_2", "fk_5", "fk_0~batch"):  # batched, batching, the batch run
        with pytest.raises(ControlError, match="runs its jobs in batches"):
            fork(db, wf.SIZE, job_id, from_position=0)
    assert not [j for j in rows(db, "fk_") if "~fork" in j]


def test_a_member_whose_params_hold_a_large_number_is_batched_as_stored(db):
    """jsonb prints 1e30 as 31 digits, which the driver reads as a Python int that
    orjson cannot write (over 64 bits): the batch run's params are built from the
    members' stored JSON, not from the values the driver made of it, so such a member
    is batched like any other instead of failing its pool's every formation."""
    policy = REGISTRY.batches()[wf.SIZE]
    create(
        db, wf.SIZE, [(f"bn_{i}", {"tenant": "n", "n": 1e30 if i == 2 else i}) for i in range(5)]
    )
    [batch] = form_due(db, wf.SIZE, policy)  # was: JSONEncodeError, nothing formed
    assert batch.members == tuple(f"bn_{i}" for i in range(5))
    with db.connect() as conn:
        same = conn.execute(
            sa.text(
                "SELECT bool_and(r.params -> 'members' -> m.batch_index"
                " = jsonb_build_object('job_id', m.job_id, 'params', m.params))"
                " FROM onceflow_instances m JOIN onceflow_instances r ON r.job_id = m.batch_id"
                " WHERE m.job_id LIKE 'bn_%' AND m.batch_size IS NULL"
            )
        ).scalar_one()
    assert same is True


def test_a_pool_that_cannot_be_formed_holds_up_no_other_pool_or_workflow(db, caplog):
    """A formation that fails (here a failpoint raising in the first pool's, every time)
    is logged with its pool and rolled back, and the pass goes on: the other key's pool
    of that workflow and the next workflow's are formed (they were not: the error left
    form_due and the pass)."""
    from workflow_engine.clock import SystemClock
    from workflow_engine.engine.batch_former import BatchFormer

    policies = REGISTRY.batches()
    create(db, wf.SIZE, [(f"iso_a{i}", {"tenant": "ia", "n": i}) for i in range(5)])
    create(db, wf.SIZE, [(f"iso_b{i}", {"tenant": "ib", "n": i}) for i in range(5)])
    create(db, wf.WAIT, [("iso_w0", {"n": 0})])
    time.sleep(policies[wf.WAIT].max_wait + 0.2)  # the wait pool due
    former = BatchFormer(
        db, SystemClock(), {wf.SIZE: policies[wf.SIZE], wf.WAIT: policies[wf.WAIT]}
    )
    failpoints.arm("batch.after_lock", "raise", job_id="iso_a0", times=100)
    try:
        formed = former.form_once()
    finally:
        failpoints.disarm_all()
    found = rows(db, "iso_")
    assert {found[f"iso_a{i}"].status for i in range(5)} == {"batching"}  # rolled back
    assert {found[f"iso_b{i}"].status for i in range(5)} == {"batched"}
    assert found["iso_w0"].status == "batched"
    assert formed == 2
    assert caplog.text.count("test-batch-size key 'ia' could not be formed") == 1  # once a pass


def test_an_event_sent_to_a_member_is_refused_not_stored(db):
    """A member never runs (its batch run does), so an event sent to it could never be
    read: refused with the reason, nothing stored (it was stored, silently unread)."""
    policy = REGISTRY.batches()[wf.SIZE]
    create(db, wf.SIZE, [(f"ev_{i}", {"tenant": "e", "n": i}) for i in range(6)])
    form_due(db, wf.SIZE, policy)
    for job_id in ("ev_1", "ev_5"):  # batched, batching
        with pytest.raises(ControlError, match="takes no events"):
            control.send_event(db, wf.SIZE, job_id, "go", {"x": 1})
    with db.connect() as conn:
        stored = conn.execute(
            sa.text("SELECT count(*) FROM onceflow_events WHERE job_id LIKE 'ev_%'")
        ).scalar_one()
    assert stored == 0
    assert control.send_event(db, wf.SIZE, "ev_0~batch", "go") > 0  # the run takes them


def test_bulk_operations_over_members_and_their_run(db):
    """A bulk terminate, then retry, by a filter matching waiting members, batched
    members and their batch run alike: the waiting leave their pool, the batched refuse
    (skipped) and follow their run, each member ends with one final event per end."""
    from onceflow.vocabulary import BulkAction
    from workflow_engine.store.operations import run_bulk, start_bulk
    from workflow_engine.store.views.listing import InstanceFilter

    policy = REGISTRY.batches()[wf.SIZE]
    create(db, wf.SIZE, [(f"bk_{i}", {"tenant": "k", "n": i}) for i in range(7)])
    form_due(db, wf.SIZE, policy)  # bk_0..bk_4 in bk_0~batch; bk_5, bk_6 waiting
    f = InstanceFilter(job_id_prefix="bk_")
    done = run_bulk(db, start_bulk(db, BulkAction.TERMINATE, f).id)
    assert (done.total, done.done, done.skipped) == (8, 3, 5)  # the run and the waiting
    found = rows(db, "bk_")
    assert {r.status for r in found.values()} == {"terminated"}
    done = run_bulk(db, start_bulk(db, BulkAction.RETRY, f).id)
    assert (done.done, done.skipped) == (1, 7)  # the run only
    found = rows(db, "bk_")
    assert {found[f"bk_{i}"].status for i in range(5)} == {"batched"}
    assert found["bk_0~batch"].status == "queued"
    assert {found[f"bk_{i}"].status for i in (5, 6)} == {"terminated"}
    kinds = [k for k, _ in events(db, "bk_3")]
    assert kinds == [
        "instance.created",
        "instance.batched",
        "instance.terminated",
        "instance.batched",
    ]
