"""Time limits (issue 26, item 4) on the real database and a real engine on the real
clock: ``execution_timeout`` (the deadline set at the first start, kept in
``onceflow_instances.deadline``) and ``start_within`` (``start_by``, expired by the
claim under the row lock).

Every timing is read from the database's own timestamps (the deadline, ``finished_at``),
so a loaded box makes a test slower, not wrong.
"""

from __future__ import annotations

import threading
import time
from datetime import UTC, datetime, timedelta

import jsonschema
import orjson
import pytest
from fastapi.testclient import TestClient

from console import create_app as create_console
from onceflow import failpoints
from onceflow.envelope import JobEnvelope
from onceflow.vocabulary import TimeoutKind
from onceflow_cli.render import render_instance
from onceflow_tools.processes import ProcessGroup
from producers.api import create_app as create_api
from tests.conftest import settings_env
from tests.integration.events_helpers import event_schemas
from tests.integration.interleavings import EngineHarness, rows, scalar, status, wait_for
from tests.integration.kafka_helpers import produce
from tests.integration.test_streams_worker import start_worker
from workflow_engine import workflow
from workflow_engine.clock import SystemClock
from workflow_engine.engine.metrics import TIME_LIMITS
from workflow_engine.model import Delivery
from workflow_engine.store.operations import ControlError, pause, retry
from workflow_engine.store.views import describe_instance
from workflow_engine.store.writes import claim, create_instances, time_limits

SCHEMAS = event_schemas()

#: How late past its deadline a sleeping or waiting instance may be errored: the
#: engine's wait for its next timer, a claim and a finish on a loaded two-core box.
LATE = 1.0


@workflow("test-tl-slow-step", execution_timeout=1.5)
async def slow_step(ctx, params):
    await ctx.step("slow", lambda: time.sleep(2.0) or "done")  # past the deadline
    await ctx.step("after", lambda: "never")
    return "finished"


@workflow("test-tl-in-time", execution_timeout=60)
async def in_time(ctx, params):
    first = await ctx.step("one", lambda: 1)
    return await ctx.step("two", lambda: first + 1)


@workflow("test-tl-sleeps", execution_timeout=2)
async def sleeps(ctx, params):
    await ctx.sleep("nap", timedelta(hours=1))
    return "woke"


@workflow("test-tl-waits", execution_timeout=2)
async def waits(ctx, params):
    await ctx.wait_for_event("approval", type="never-sent")  # no timeout of its own
    return "approved"


@workflow("test-tl-restart", execution_timeout=4)
async def across_restart(ctx, params):
    await ctx.step("first", lambda: 1)
    await ctx.sleep("nap", timedelta(hours=1))
    return "woke"


@workflow("test-tl-busy")
async def busy(ctx, params):
    return await ctx.step("busy", lambda: time.sleep(8.0) or "done")


@workflow("test-tl-start", start_within=1)
async def must_start(ctx, params):
    return await ctx.step("only", lambda: "ran")


@pytest.fixture(autouse=True)
def _disarm():
    yield
    failpoints.disarm_all()


def create(db, job_id, name, start_within=None):
    env = JobEnvelope(job_id, name, {}, start_within=start_within)
    within = 1.0 if name == "test-tl-start" else None  # the registry's, as the worker does
    create_instances(db, [Delivery(env, "t", 0, 0, start_within=within)])


def instance(db, job_id):
    (row,) = rows(
        db,
        "SELECT status, error, timeout_kind, deadline, start_by, started_at, finished_at,"
        " run_after, EXTRACT(epoch FROM finished_at - deadline) AS late"
        " FROM onceflow_instances WHERE job_id = :j",
        j=job_id,
    )
    return row


def events(db, job_id):
    """The instance's lifecycle events, each valid against its schema in docs/events.md:
    (type, the time limit in its data)."""
    found = rows(
        db,
        "SELECT type, payload FROM onceflow_outbox_events WHERE aggregateid = :j ORDER BY seq",
        j=job_id,
    )
    for r in found:
        jsonschema.validate(r.payload, SCHEMAS["common"])
        jsonschema.validate(r.payload, SCHEMAS[r.type])
    return [(r.type.removeprefix("dev.onceflow."), r.payload.get("timeout")) for r in found]


def counted(workflow_name, kind):
    return TIME_LIMITS.labels(workflow_name, kind)._value.get()


def engine(settings, db):
    """An engine on the real clock; its relay off, so the events stay in the outbox to read."""
    return EngineHarness(
        settings, db, clock=SystemClock(), engine_poll_interval_seconds=30, events_relay=False
    )


def finished(db, job_id, timeout=20.0):
    wait_for(lambda: status(db, job_id) in ("complete", "errored"), f"{job_id} finished", timeout)
    return instance(db, job_id)


def test_a_run_past_its_deadline_errors_at_the_next_step_boundary(settings, db):
    before = counted("test-tl-slow-step", TimeoutKind.TIMED_OUT)
    create(db, "tl_slow", "test-tl-slow-step")
    create(db, "tl_ok", "test-tl-in-time")
    with engine(settings, db):
        row = finished(db, "tl_slow")
        ok = finished(db, "tl_ok")
    assert row.status == "errored" and row.timeout_kind == TimeoutKind.TIMED_OUT
    assert row.error.startswith("timed_out: execution deadline passed before step 'after'")
    # The deadline is the first start plus the limit, stored.
    assert abs((row.deadline - row.started_at).total_seconds() - 1.5) < 0.01
    # The running step was not cut: its checkpoint is recorded; the next never started.
    steps = rows(db, "SELECT name, status FROM onceflow_steps WHERE job_id = 'tl_slow'")
    assert [(s.name, s.status) for s in steps] == [("slow", "complete")]
    assert events(db, "tl_slow")[-1] == ("instance.errored", "timed_out")
    assert counted("test-tl-slow-step", TimeoutKind.TIMED_OUT) == before + 1
    view = describe_instance(db, "tl_slow")
    assert view is not None and view.deadline == row.deadline
    assert view.timeout_kind == "timed_out"
    _shown_everywhere(settings, db, "test-tl-slow-step", "tl_slow", "timed_out")
    # One in time is not touched by its limit.
    assert ok.status == "complete" and ok.timeout_kind is None
    assert abs((ok.deadline - ok.started_at).total_seconds() - 60) < 0.01


def test_a_retry_of_a_timed_out_instance_gets_a_fresh_deadline(settings, db):
    """Retried, the instance replays its completed slow step (it does not run again)
    and its next start sets a new deadline, so the step it stopped before runs."""
    create(db, "tl_retry", "test-tl-slow-step")
    with engine(settings, db):
        first = finished(db, "tl_retry")
        assert first.timeout_kind == TimeoutKind.TIMED_OUT
        assert retry(db, "test-tl-slow-step", "tl_retry").status == "queued"
        again = finished(db, "tl_retry")
    assert again.status == "complete" and again.timeout_kind is None and again.error is None
    assert again.deadline > first.deadline
    steps = rows(
        db,
        "SELECT name, status, attempts FROM onceflow_steps WHERE job_id = 'tl_retry'"
        " ORDER BY position",
    )
    assert [(s.name, s.status, s.attempts) for s in steps] == [
        ("slow", "complete", 1),
        ("after", "complete", 1),
    ]


@pytest.mark.parametrize(
    ("job_id", "name"), [("tl_sleep", "test-tl-sleeps"), ("tl_wait", "test-tl-waits")]
)
def test_a_sleeping_or_waiting_instance_is_woken_and_errored_at_its_deadline(
    settings, db, job_id, name
):
    """A sleep of an hour, a wait with no timeout and no event: the suspension's
    ``run_after`` is the deadline, so the engine's next-timer wait wakes it there (its
    poll interval is 30 s: no busy loop does it)."""
    create(db, job_id, name)
    with engine(settings, db):
        wait_for(lambda: status(db, job_id) in ("sleeping", "waiting"), f"{job_id} suspended")
        suspended = instance(db, job_id)
        assert suspended.run_after == suspended.deadline  # min(an hour, the deadline)
        row = finished(db, job_id)
    assert row.status == "errored" and row.timeout_kind == TimeoutKind.TIMED_OUT
    print(f"{job_id}: errored {float(row.late):+.3f} s from its deadline")  # with -s
    assert 0 <= row.late < LATE, f"errored {row.late} s after its deadline"
    assert events(db, job_id)[-1] == ("instance.errored", "timed_out")


def test_the_deadline_is_kept_across_an_engine_restart(settings, db):
    """Stop the engine while the instance sleeps, wait, start another: it is errored at
    the deadline the first start set, not at a deadline counted from the second engine."""
    create(db, "tl_restart", "test-tl-restart")
    with engine(settings, db):
        wait_for(lambda: status(db, "tl_restart") == "sleeping", "tl_restart sleeping")
    deadline = instance(db, "tl_restart").deadline
    time.sleep(1.0)  # no engine at all for a while
    with engine(settings, db):
        row = finished(db, "tl_restart")
    assert row.deadline == deadline
    print(f"tl_restart: errored {float(row.late):+.3f} s from its deadline")  # with -s
    assert row.status == "errored" and row.timeout_kind == TimeoutKind.TIMED_OUT
    assert 0 <= row.late < LATE, f"errored {row.late} s after its deadline"


def test_an_instance_not_started_within_its_limit_is_errored_not_run(settings, db):
    """``tl_late`` waits 1.5 s for an engine with ``start_within=1`` (the workflow's);
    ``tl_override`` has its own ``start_within=60`` and runs; ``tl_prompt`` is created
    while an engine runs and starts in time."""
    before = counted("test-tl-start", TimeoutKind.START_TIMEOUT)
    create(db, "tl_late", "test-tl-start")
    create(db, "tl_override", "test-tl-start", start_within=60)
    assert describe_instance(db, "tl_late").start_by is not None
    time.sleep(1.5)
    with engine(settings, db):
        late = finished(db, "tl_late")
        override = finished(db, "tl_override")
        create(db, "tl_prompt", "test-tl-start")
        prompt = finished(db, "tl_prompt")
    assert late.status == "errored" and late.timeout_kind == TimeoutKind.START_TIMEOUT
    assert late.started_at is None and late.error.startswith("start_timeout: not started by")
    assert scalar(db, "SELECT count(*) FROM onceflow_steps WHERE job_id = 'tl_late'") == 0
    assert [e for e, _ in events(db, "tl_late")] == ["instance.created", "instance.errored"]
    assert events(db, "tl_late")[-1] == ("instance.errored", "start_timeout")
    assert counted("test-tl-start", TimeoutKind.START_TIMEOUT) == before + 1
    assert override.status == "complete" and prompt.status == "complete"
    assert prompt.started_at < prompt.start_by
    view = describe_instance(db, "tl_late")
    assert view.timeout_kind == "start_timeout" and view.start_by is not None
    _shown_everywhere(settings, db, "test-tl-start", "tl_late", "start_timeout")


def _shown_everywhere(settings, db, workflow_name, job_id, kind):
    """The CLI's describe, the admin API's and the console's instance page show the
    limit and what it did."""
    view = describe_instance(db, job_id)
    text = render_instance(view)
    assert f"time limit reached: {kind}" in text
    limit = "execution deadline: " if kind == "timed_out" else "must start by: "
    assert limit in text
    with TestClient(create_api(settings)) as api:
        doc = api.get(f"/v1/instances/{workflow_name}/{job_id}").json()
    assert doc["timeout_kind"] == kind
    assert (doc["deadline"] if kind == "timed_out" else doc["start_by"]) is not None
    page = TestClient(create_console(settings, db), base_url="http://testserver")
    html = page.get(f"/instances/{job_id}").text
    assert 'id="timeout-kind"' in html and kind in html
    assert ('id="deadline"' if kind == "timed_out" else 'id="start-by"') in html


def _claim_in_thread(db, owner):
    got: list = []
    thread = threading.Thread(target=lambda: got.append(claim(db, owner, 10, 30)), daemon=True)
    thread.start()
    return thread, got


def test_a_claim_that_locked_it_in_time_wins_over_the_expiry(db):
    """The claim picks and locks the instance before its start limit, then pauses
    (``claim.before_lease``) until the limit has passed; the expiry, run by another
    claim meanwhile, skips the locked row (it does not wait for it, and does not error
    it after the claim commits). Exactly one wins: the claim."""
    create(db, "tl_race_claim", "test-tl-start")
    paused = failpoints.arm("claim.before_lease", "pause", job_id="tl_race_claim")
    first, got = _claim_in_thread(db, "engine-a")
    paused.wait_reached()
    wait_for(
        lambda: scalar(
            db, "SELECT start_by < now() FROM onceflow_instances WHERE job_id = 'tl_race_claim'"
        ),
        "the start limit passed",
    )
    second, other = _claim_in_thread(db, "engine-b")
    second.join(10)
    assert not second.is_alive(), "the expiry waited for the claim's row lock"
    assert other == [[]]
    assert status(db, "tl_race_claim") == "queued"  # not errored under the claim
    paused.release()
    first.join(10)
    assert [c.job_id for c in got[0]] == ["tl_race_claim"]
    row = instance(db, "tl_race_claim")
    assert row.status == "running" and row.timeout_kind is None
    assert row.started_at < row.start_by
    assert claim(db, "engine-b", 10, 30) == []  # and no later expiry takes it
    assert instance(db, "tl_race_claim").status == "running"


def test_an_expiry_that_locked_it_first_wins_over_a_claim(db):
    """The expiry errors the instance and pauses before its transaction commits
    (``claim.after_expiry``); a claim meanwhile does not take it (the row is locked and
    skipped), nor after the expiry commits (it is errored)."""
    create(db, "tl_race_expiry", "test-tl-start")
    wait_for(
        lambda: scalar(
            db, "SELECT start_by < now() FROM onceflow_instances WHERE job_id = 'tl_race_expiry'"
        ),
        "the start limit passed",
    )
    paused = failpoints.arm("claim.after_expiry", "pause", job_id="tl_race_expiry")
    first, got = _claim_in_thread(db, "engine-a")
    paused.wait_reached()
    second, other = _claim_in_thread(db, "engine-b")
    second.join(10)
    assert not second.is_alive() and other == [[]]
    paused.release()
    first.join(10)
    assert got == [[]]
    row = instance(db, "tl_race_expiry")
    assert row.status == "errored" and row.timeout_kind == TimeoutKind.START_TIMEOUT
    assert row.started_at is None
    assert claim(db, "engine-b", 10, 30) == []
    assert "instance.started" not in [e for e, _ in events(db, "tl_race_expiry")]


def test_a_claim_never_starts_an_instance_past_its_limit(db):
    """A claim of one picks one of two expired instances, which it must not start (the
    lease, before the expiry, tests the start limit on the row it locked); its expiry
    is not limited to the claim's one free slot (``EXPIRY_BATCH``): it errors both."""
    create(db, "tl_left_1", "test-tl-start")
    create(db, "tl_left_2", "test-tl-start")
    wait_for(
        lambda: scalar(
            db,
            "SELECT bool_and(start_by < now()) FROM onceflow_instances"
            " WHERE job_id LIKE 'tl_left_%'",
        ),
        "both start limits passed",
    )
    assert claim(db, "engine-a", 1, 30) == []
    assert status(db, "tl_left_1") == status(db, "tl_left_2") == "errored"
    assert (
        scalar(
            db,
            "SELECT count(*) FROM onceflow_instances WHERE job_id LIKE 'tl_left_%'"
            " AND started_at IS NOT NULL",
        )
        == 0
    )


def test_a_jobs_own_start_within_goes_through_ingest_kafka_and_the_worker(settings, db, tmp_path):
    """The whole path, no engine: HTTP ingest, real Kafka, the real worker as a
    subprocess. A job's ``start_within`` counts from its start time (after a delayed
    start, from that); bad ones are refused by ingest (422 naming the field) and
    dead-lettered by the worker (``invalid_start_within``), as is one on a plain task."""
    bad = {
        b"tl_bad_text": {"start_within": "soon", "workflow": "noop-workflow"},
        b"tl_bad_zero": {"start_within": 0, "workflow": "noop-workflow"},
        b"tl_bad_task": {"start_within": 5, "workflow": "send-welcome-email"},
        b"tl_kafka": {"start_within": 5, "workflow": "noop-workflow"},
    }
    records = [
        (key, orjson.dumps({"job_id": key.decode(), "params": {}, **doc}), [])
        for key, doc in bad.items()
    ]
    produce(settings.kafka_bootstrap_servers, settings.jobs_topic, records)
    with ProcessGroup(settings_env(settings), tmp_path / "logs") as group:
        start_worker(group)
        with TestClient(create_api(settings)) as client:
            job = {"workflow": "noop-workflow", "params": {}}
            ok = client.post(
                "/v1/jobs", json={**job, "job_id": "tl_http", "start_within": 30, "start_after": 60}
            )
            refused = [
                client.post("/v1/jobs", json={**job, "start_within": value})
                for value in (0, 2 * 365 * 86400, "60", True)
            ]
        assert ok.status_code == 202, ok.text
        wait_for(
            lambda: (
                scalar(db, "SELECT count(*) FROM onceflow_dead_letters") == 3
                and status(db, "tl_http") == status(db, "tl_kafka") == "queued"
            ),
            "the dead letters and the instances",
            60,
        )
    for answer in refused:
        assert answer.status_code == 422, answer.text
        assert answer.json()["fields"][0]["field"] == "start_within"
    reasons = rows(db, "SELECT job_id, reason FROM onceflow_dead_letters ORDER BY job_id")
    assert [(r.job_id, r.reason) for r in reasons] == [
        ("tl_bad_task", "invalid_start_within"),
        ("tl_bad_text", "invalid_start_within"),
        ("tl_bad_zero", "invalid_start_within"),
    ]
    got = {
        r.job_id: (float(r.delay), float(r.within))
        for r in rows(
            db,
            "SELECT i.job_id, extract(epoch FROM i.run_after - j.submitted_at) AS delay,"
            " extract(epoch FROM i.start_by - i.run_after) AS within"
            " FROM onceflow_instances i JOIN onceflow_jobs j USING (job_id)",
        )
    }
    assert got["tl_http"][0] == pytest.approx(60, abs=0.001)  # the delayed start
    assert got["tl_http"][1] == pytest.approx(30, abs=0.001)  # the limit, from it
    assert got["tl_kafka"][1] == pytest.approx(5, abs=0.001)  # from its creation


def test_an_expired_backlog_does_not_hold_back_the_work_behind_it(settings, db):
    """Six instances past their start limit come first in the claim order, before one
    in time; the engine claims two at a time and polls every 30 s. Its picks take the
    expired ones and lease none of them (the lease refuses a start past the limit), so
    a claim answers nothing though work is due: an engine that then waited for its
    poll, as for an empty queue, left the job behind them for a poll interval per
    claim. It claims again at once when its expiry errored some, so the backlog is
    errored and the job behind it runs within seconds."""
    for n in range(6):
        create(db, f"tl_backlog_{n}", "test-tl-start")
    wait_for(
        lambda: scalar(
            db,
            "SELECT bool_and(start_by < now()) FROM onceflow_instances"
            " WHERE job_id LIKE 'tl_backlog_%'",
        ),
        "the start limits passed",
    )
    create(db, "tl_behind", "test-tl-in-time")
    began = time.monotonic()
    with EngineHarness(
        settings,
        db,
        clock=SystemClock(),
        engine_poll_interval_seconds=30,
        engine_claim_batch=2,
        events_relay=False,
    ):
        behind = finished(db, "tl_behind", timeout=25)
    took = time.monotonic() - began
    assert behind.status == "complete"
    assert took < 10, f"the job behind the expired backlog waited {took:.1f} s"
    expired = scalar(
        db,
        "SELECT count(*) FROM onceflow_instances WHERE job_id LIKE 'tl_backlog_%'"
        " AND timeout_kind = 'start_timeout' AND started_at IS NULL",
    )
    assert expired == 6


def test_an_engine_with_no_free_slot_still_expires_what_it_cannot_start(settings, db):
    """One slot, held by an 8 s step; an instance with ``start_within=1`` queued behind
    it. The engine claims nothing while full, but it still runs the expiry every poll
    interval: the instance is errored (its event written, a waiter told) within a poll
    interval of its limit, not when the slot frees."""
    create(db, "tl_full_busy", "test-tl-busy")
    with EngineHarness(
        settings,
        db,
        clock=SystemClock(),
        engine_poll_interval_seconds=0.5,
        engine_concurrency=1,
        events_relay=False,
    ):
        wait_for(lambda: status(db, "tl_full_busy") == "running", "the slot taken")
        create(db, "tl_full_late", "test-tl-start")
        late = finished(db, "tl_full_late", timeout=20)
        assert status(db, "tl_full_busy") == "running", "expired only when the slot freed"
    assert late.timeout_kind == TimeoutKind.START_TIMEOUT and late.started_at is None
    behind = float(
        scalar(
            db,
            "SELECT extract(epoch FROM finished_at - start_by) FROM onceflow_instances"
            " WHERE job_id = 'tl_full_late'",
        )
    )
    print(f"tl_full_late: errored {behind:+.3f} s from its start limit")  # with -s
    assert 0 <= behind < 0.5 + LATE


def test_the_expiry_probe_reads_no_retained_expired_instance(db):
    """Every claim's pick probes for an instance due to expire (``EXPIRY_DUE``). The
    instances it errored stay (``started_at`` NULL, ``start_by`` passed) until
    retention removes them: the probe's index holds only queued ones, so it reads none
    of them, however deep the queue. Indexing every never-started instance with a
    limit, with a backlog queued, the probe read all of them or all the backlog: 20,000
    retained start_timeouts and 20,000 queued made each claim's probe a 12-16 ms
    sequential scan (0.014 ms now)."""
    envs = [
        JobEnvelope(f"tl_kept_{n}", "test-tl-start", {}, start_within=0.001) for n in range(3000)
    ]
    create_instances(db, [Delivery(env, "t", 0, n) for n, env in enumerate(envs)])
    create_instances(db, [Delivery(JobEnvelope("tl_kept_live", "test-tl-in-time", {}), "t", 0, 0)])
    # and a backlog, queued (a delayed start an hour ahead: none of it is claimed)
    later = datetime.now(UTC) + timedelta(hours=1)
    backlog = [
        JobEnvelope(f"tl_queued_{n}", "test-tl-in-time", {}, run_at=later) for n in range(3000)
    ]
    create_instances(db, [Delivery(env, "t", 1, n) for n, env in enumerate(backlog)])
    claimed = [c.job_id for _ in range(35) for c in claim(db, "engine-a", 1, 30)]
    assert claimed == ["tl_kept_live"]  # and the expiry errored the rest, 100 a claim
    assert (
        scalar(db, "SELECT count(*) FROM onceflow_instances WHERE timeout_kind IS NOT NULL") == 3000
    )
    with db.connect() as conn:
        conn.execution_options(isolation_level="AUTOCOMMIT").exec_driver_sql(
            "VACUUM ANALYZE onceflow_instances"
        )
        plan = conn.exec_driver_sql(
            f"EXPLAIN (ANALYZE, BUFFERS, FORMAT JSON) SELECT 1 WHERE {time_limits.EXPIRY_DUE}"
        ).scalar_one()
    probe = plan[0]["Plan"]["Plans"][0]
    read = probe["Shared Hit Blocks"] + probe["Shared Read Blocks"]
    assert read <= 3, f"the probe read {read} blocks ({probe['Node Type']})"


def test_an_operator_pause_in_the_expiry_window_sees_it_errored(db):
    """The expiry has errored the instance, not committed (``claim.after_expiry``);
    an operator pauses it meanwhile. The pause waits for the row and then finds it
    errored (refused): never a paused instance with a start_timeout, nor two events."""
    create(db, "tl_pause_window", "test-tl-start")
    wait_for(
        lambda: scalar(
            db, "SELECT start_by < now() FROM onceflow_instances WHERE job_id = 'tl_pause_window'"
        ),
        "the start limit passed",
    )
    paused = failpoints.arm("claim.after_expiry", "pause", job_id="tl_pause_window")
    first, got = _claim_in_thread(db, "engine-a")
    paused.wait_reached()
    answer: list = []

    def operator():
        try:
            answer.append(pause(db, "test-tl-start", "tl_pause_window"))
        except ControlError as exc:
            answer.append(exc)

    thread = threading.Thread(target=operator, daemon=True)
    thread.start()
    thread.join(1.0)
    assert thread.is_alive(), "the pause did not wait for the expiry's row lock"
    paused.release()
    first.join(10)
    thread.join(10)
    assert got == [[]]
    assert isinstance(answer[0], ControlError) and "errored" in str(answer[0])
    row = instance(db, "tl_pause_window")
    assert row.status == "errored" and row.timeout_kind == TimeoutKind.START_TIMEOUT
    assert [e for e, _ in events(db, "tl_pause_window")] == [
        "instance.created",
        "instance.errored",
    ]


def test_on_a_test_clock_a_woken_overdue_instance_is_errored_not_spun(settings, db):
    """On an engine's test clock (the interleaving harness, ``onceflow chaos``) the claim
    takes what is due by that clock, so the claim's ``overdue`` reads the same clock:
    a sleep capped at its deadline, the clock moved past it, is errored by the claim
    that wakes it. Reading the server's clock instead, the claim found it due but not
    overdue, replayed it into the same capped sleep, runnable at once, and claimed it
    again and again until the real deadline came (tens of claims a second)."""
    create(db, "tl_fake", "test-tl-sleeps")  # execution_timeout=2, sleeps an hour
    with EngineHarness(settings, db, events_relay=False) as harness:
        wait_for(lambda: status(db, "tl_fake") == "sleeping", "tl_fake sleeping")
        harness.clock.advance(600)  # past the deadline, not past the hour
        row = finished(db, "tl_fake", timeout=10)
        spent = scalar(db, "SELECT claim_count FROM onceflow_instances WHERE job_id = 'tl_fake'")
    assert row.timeout_kind == TimeoutKind.TIMED_OUT
    assert spent == 2, f"claimed {spent} times"
