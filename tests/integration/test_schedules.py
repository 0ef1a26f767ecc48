"""Schedules on real PostgreSQL: each tick starts exactly one instance across two
engines, a SIGKILL and a restart; catch-up and overlap policies; backfill; the CLI (as a
subprocess) and the admin API (over HTTP, from an ingest subprocess)."""

from __future__ import annotations

import json
import signal
import subprocess
import time
from collections import Counter
from datetime import UTC, datetime, timedelta
from pathlib import Path

import httpx
import orjson
import pytest
import sqlalchemy as sa

from onceflow.ticks import TickSpec, tick_job_id
from onceflow.vocabulary import CatchupPolicy, OverlapPolicy, TickSkipReason, TickTrigger
from onceflow_tools.processes import ProcessGroup, free_port, onceflow_command
from producers.models import ErrorBody
from tests.conftest import settings_env
from workflow_engine.model import ScheduleDef
from workflow_engine.store import operations, views, writes

T0 = datetime(2026, 11, 30, 10, 0, tzinfo=UTC)

#: The workflow of tests/integration/scheduled_workflow.py, which only the engine
#: processes load (ONCEFLOW_WORKFLOW_MODULES). Not imported here: imported, it joins the
#: test process's registry at collection, and every in-process engine of every other
#: test would upsert its schedule and fire its ticks in that test's database (seen: a
#: test counting its 300 completions found 419).
TICKED = "tick-workflow"


def _scalar(db, sql: str, **params):
    with db.connect() as conn:
        return conn.execute(sa.text(sql), params).scalar()


def _wait(condition, timeout: float, what: str, group: ProcessGroup | None = None) -> None:
    deadline = time.monotonic() + timeout
    while not condition():
        assert time.monotonic() < deadline, f"timed out waiting for {what}"
        if group is not None:
            group.check_alive()
        time.sleep(0.2)


def _tick_count(db) -> int:
    return _scalar(db, "SELECT count(*) FROM onceflow_schedule_ticks WHERE schedule = :s", s=TICKED)


def _start_engine(group: ProcessGroup, name: str) -> None:
    port = free_port()
    group.start(
        name,
        "engine",
        env={
            "ONCEFLOW_ENGINE_METRICS_PORT": str(port),
            "ONCEFLOW_WORKFLOW_MODULES": json.dumps(["tests.integration.scheduled_workflow"]),
            "ONCEFLOW_ENGINE_LEASE_SECONDS": "3",
            "ONCEFLOW_ENGINE_POLL_INTERVAL_SECONDS": "0.2",
        },
    )
    group.wait_http(f"http://127.0.0.1:{port}/metrics")


def _fired_by(log: Path) -> int:
    return sum(
        1
        for line in log.read_text(errors="replace").splitlines()
        if line.startswith("{") and orjson.loads(line).get("event") == "schedule.tick_fired"
    )


@pytest.mark.timeout(180)
def test_two_engines_a_sigkill_and_a_restart_fire_every_tick_exactly_once(
    settings, db, tmp_path, capsys
):
    logs = tmp_path / "logs"
    with ProcessGroup(settings_env(settings), logs) as group:
        _start_engine(group, "engine-a")
        _start_engine(group, "engine-b")  # both upsert the declared schedule, both fire
        _wait(lambda: _tick_count(db) >= 6, 60, "6 ticks from two engines", group)
        group.stop("engine-a", signal.SIGKILL)
        seen = _tick_count(db)
        _wait(lambda: _tick_count(db) >= seen + 3, 30, "3 ticks from the survivor", group)
        group.stop("engine-b", signal.SIGKILL)
        killed_at = _scalar(db, "SELECT now()")
        # No engine: ticks go by unfired (the database's clock is the schedule's clock).
        _wait(lambda: _scalar(db, "SELECT now()") > killed_at + timedelta(seconds=4), 30, "4 s")
        _start_engine(group, "engine-a-again")
        _wait(
            lambda: (
                _scalar(
                    db,
                    "SELECT max(tick_at) FROM onceflow_schedule_ticks WHERE schedule = :s",
                    s=TICKED,
                )
                > killed_at + timedelta(seconds=6)
            ),
            60,
            "ticks after the restart",
            group,
        )
        group.stop("engine-a-again", signal.SIGTERM)
    with db.connect() as conn:
        ticks = conn.execute(
            sa.text(
                "SELECT tick_at, job_id, trigger, lateness_seconds FROM onceflow_schedule_ticks"
                " WHERE schedule = :s ORDER BY tick_at"
            ),
            {"s": TICKED},
        ).all()
        instances = conn.execute(
            sa.text("SELECT job_id FROM onceflow_instances WHERE workflow = :w"), {"w": TICKED}
        ).scalars()
        instance_ids = sorted(instances)
        duplicates = conn.execute(
            sa.text("SELECT count(*) FROM onceflow_duplicate_deliveries")
        ).scalar()
        origins = conn.execute(sa.text("SELECT DISTINCT origin FROM onceflow_jobs")).scalars()
        origin_set = set(origins)
    first, last = ticks[0].tick_at, ticks[-1].tick_at
    expected = [first + timedelta(seconds=k) for k in range(int((last - first).seconds) + 1)]
    triggers = Counter(t.trigger for t in ticks)
    on_time = sorted(t.lateness_seconds for t in ticks if t.trigger == TickTrigger.ON_TIME)
    with capsys.disabled():
        print(
            f"\nschedule ticks {first:%H:%M:%S}..{last:%H:%M:%S}: {len(ticks)} instances,"
            f" by trigger {dict(triggers)}; fired by engine-a {_fired_by(logs / 'engine-a.log')},"
            f" engine-b {_fired_by(logs / 'engine-b.log')},"
            f" after restart {_fired_by(logs / 'engine-a-again.log')}; on-time lateness"
            f" p50 {on_time[len(on_time) // 2]:.3f} s, max {on_time[-1]:.3f} s"
        )
    assert [t.tick_at for t in ticks] == expected  # every second, none missing
    assert [t.job_id for t in ticks] == [tick_job_id(TICKED, t) for t in expected]
    assert instance_ids == sorted(t.job_id for t in ticks)  # one instance per tick
    assert duplicates == 0  # no engine even tried a tick twice (the row lock)
    assert triggers[TickTrigger.CATCH_UP] >= 3  # the ticks missed while none ran
    assert origin_set == {"schedule"}


def _define(name: str, catchup=CatchupPolicy.RUN_ONCE, overlap=OverlapPolicy.ALLOW, **kw):
    spec = kw.pop("spec", TickSpec(cron="*/5 * * * *"))
    return ScheduleDef(name, "noop-workflow", spec, {"n": 1}, catchup, overlap, **kw)


def _instances(db, prefix: str) -> list[str]:
    with db.connect() as conn:
        rows = conn.execute(
            sa.text("SELECT job_id FROM onceflow_instances WHERE job_id LIKE :p ORDER BY 1"),
            {"p": f"{prefix}@%"},
        )
        return list(rows.scalars())


def test_catchup_policies_and_a_clock_jump_with_a_test_clock(db):
    for name, policy in (("skip", "skip"), ("once", "run-once"), ("all", "run-all")):
        operations.create_schedule(db, _define(name, CatchupPolicy(policy), max_catchup=5), now=T0)
    first = T0 + timedelta(minutes=5)
    reports = writes.fire_due(db, now=first + timedelta(seconds=1))
    assert {r.schedule: [f.trigger for f in r.fired] for r in reports} == {
        n: [TickTrigger.ON_TIME] for n in ("skip", "once", "all")
    }
    # The engines were down for an hour: 12 ticks missed, the latest 90 s late.
    back = first + timedelta(hours=1, seconds=90)
    writes.fire_due(db, now=back)
    assert _instances(db, "skip") == [tick_job_id("skip", first)]
    assert _instances(db, "once") == [
        tick_job_id("once", first),
        tick_job_id("once", first + timedelta(hours=1)),
    ]
    assert _instances(db, "all") == [tick_job_id("all", first)] + [
        tick_job_id("all", first + timedelta(minutes=m)) for m in (40, 45, 50, 55, 60)
    ]
    by_name = {v.name: v for v in views.list_schedules(db)}
    assert {n: (v.ticks_fired, v.ticks_skipped) for n, v in by_name.items()} == {
        "skip": (1, 12),
        "once": (2, 11),
        "all": (6, 7),
    }
    assert by_name["all"].next_fire_at == first + timedelta(hours=1, minutes=5)

    # The clock jumps back: nothing is due again.
    assert writes.fire_due(db, now=first + timedelta(minutes=1)) == []
    # A schedule's place is lost (restored from an old backup): the same ticks are
    # planned again, and the unique constraint collapses every one of them.
    before = _scalar(db, "SELECT count(*) FROM onceflow_instances")
    with db.begin() as conn:
        conn.execute(sa.text("UPDATE onceflow_schedules SET next_fire_at = :t"), {"t": first})
    again = writes.fire_due(db, now=back)
    assert again and all(not f.created for r in again for f in r.fired)
    assert _scalar(db, "SELECT count(*) FROM onceflow_instances") == before


def test_overlap_policies_while_the_previous_tick_runs(db):
    every = TickSpec(every_seconds=60)
    for name in ("skip", "allow", "buffer"):
        policy = OverlapPolicy("buffer-one" if name == "buffer" else name)
        operations.create_schedule(db, _define(name, overlap=policy, spec=every), now=T0)

    def fire_at(seconds: float) -> dict[str, writes.TickReport]:
        return {r.schedule: r for r in writes.fire_due(db, now=T0 + timedelta(seconds=seconds))}

    def tick(n: int) -> datetime:
        return T0 + timedelta(minutes=n)

    fire_at(61)  # tick 1 of each: no engine runs, so each instance stays queued
    second = fire_at(121)
    assert second["skip"].fired == () and second["skip"].skipped[TickSkipReason.OVERLAP] == 1
    assert [f.tick_at for f in second["allow"].fired] == [tick(2)]
    assert second["buffer"].fired == ()
    assert views.get_schedule(db, "buffer").buffered_tick_at == tick(2)
    third = fire_at(181)
    assert third["buffer"].skipped[TickSkipReason.OVERLAP] == 1  # one is buffered already
    for name in ("skip", "buffer"):
        operations.terminate(db, "noop-workflow", tick_job_id(name, tick(1)))
    released = fire_at(182)  # not a tick: the buffered one starts as its predecessor ended
    assert [(f.tick_at, f.trigger) for f in released["buffer"].fired] == [
        (tick(2), TickTrigger.BUFFERED)
    ]
    fire_at(241)
    assert _instances(db, "skip") == [tick_job_id("skip", tick(n)) for n in (1, 4)]
    assert _instances(db, "allow") == [tick_job_id("allow", tick(n)) for n in (1, 2, 3, 4)]
    assert _instances(db, "buffer") == [tick_job_id("buffer", tick(n)) for n in (1, 2)]
    assert views.get_schedule(db, "buffer").buffered_tick_at == tick(4)
    # Resuming starts from the first tick after now: the tick buffered before the pause
    # is dropped, not fired at once.
    operations.pause_schedule(db, "buffer")
    operations.resume_schedule(db, "buffer", now=T0 + timedelta(seconds=250))
    assert views.get_schedule(db, "buffer").buffered_tick_at is None


def test_declared_schedules_are_upserted_keeping_their_place(db):
    declared = _define("nightly")
    assert writes.upsert_declared(db, [declared], now=T0) == []
    first = views.get_schedule(db, "nightly")
    assert first.declared and first.next_fire_at == T0 + timedelta(minutes=5)
    operations.pause_schedule(db, "nightly")
    # A restart an hour later keeps its place (missed ticks are caught up) and its pause.
    writes.upsert_declared(db, [declared], now=T0 + timedelta(hours=1))
    kept = views.get_schedule(db, "nightly")
    assert (kept.next_fire_at, kept.paused) == (first.next_fire_at, True)
    changed = _define("nightly", spec=TickSpec(cron="0 * * * *"))
    writes.upsert_declared(db, [changed], now=T0 + timedelta(hours=1))
    assert views.get_schedule(db, "nightly").next_fire_at == T0 + timedelta(hours=2)
    # A schedule made by the CLI or the API keeps its name from a declared one.
    operations.create_schedule(db, _define("manual"), now=T0)
    assert writes.upsert_declared(db, [_define("manual", spec=changed.spec)], now=T0) == ["manual"]
    assert views.get_schedule(db, "manual").cron == "*/5 * * * *"


def _cli(db_url: str, *args: str) -> subprocess.CompletedProcess[str]:
    return subprocess.run(
        [*onceflow_command(), *args],
        env={"PATH": "/usr/bin:/bin", "ONCEFLOW_DATABASE_URL": db_url},
        capture_output=True,
        text=True,
        timeout=60,
    )


@pytest.mark.timeout(120)
def test_cli_backfill_dry_run_counts_what_it_creates_and_describe_shows_the_tick(db_url, db):
    created = _cli(db_url, "schedules", "create", "hourly", "--workflow", "noop-workflow",
                   "--cron", "0 * * * *", "--catchup", "run-all")  # fmt: skip
    assert created.returncode == 0, created.stderr
    window = ("--from", "2026-01-01T00:00:00Z", "--to", "2026-01-02T00:00:00Z")
    dry = _cli(db_url, "schedules", "backfill", "hourly", *window, "--dry-run")
    assert dry.returncode == 0, dry.stderr
    assert dry.stdout.strip() == (
        "hourly: 25 ticks, first 2026-01-01T00:00:00Z, last 2026-01-02T00:00:00Z"
    )
    assert _instances(db, "hourly") == []
    real = _cli(db_url, "schedules", "backfill", "hourly", *window)
    assert "created 25 instances (0 existed already)" in real.stdout, real.stderr
    assert len(_instances(db, "hourly")) == 25
    again = _cli(db_url, "schedules", "backfill", "hourly", *window)
    assert "created 0 instances (25 existed already)" in again.stdout
    assert len(_instances(db, "hourly")) == 25

    job = "hourly@2026-01-01T05:00:00Z"
    described = _cli(db_url, "instances", "describe", "noop-workflow", job)
    assert described.returncode == 0, described.stderr
    assert "schedule: hourly, tick 2026-01-01T05:00:00Z (backfill" in described.stdout
    assert "(a schedule's tick)" in described.stdout
    traced = _cli(db_url, "trace", job)
    assert "schedule hourly, tick 2026-01-01 05:00:00+00" in traced.stdout, traced.stdout

    assert _cli(db_url, "schedules", "pause", "hourly").returncode == 0
    listed = _cli(db_url, "schedules", "list", "--json")
    row = orjson.loads(listed.stdout.splitlines()[0])
    assert (row["name"], row["paused"], row["catchup"]) == ("hourly", True, "run-all")
    assert _cli(db_url, "schedules", "resume", "hourly").returncode == 0
    table = _cli(db_url, "schedules", "list").stdout
    assert "hourly\tnoop-workflow\tcron '0 * * * *' (UTC)\tactive" in table
    bad = _cli(db_url, "schedules", "create", "bad", "--workflow", "w", "--cron", "* *")
    assert bad.returncode == 1 and bad.stderr.startswith("onceflow: cron '* *'")
    assert _cli(db_url, "schedules", "delete", "hourly").returncode == 0
    gone = _cli(db_url, "schedules", "pause", "hourly")
    assert gone.returncode == 1 and "no schedule named 'hourly'" in gone.stderr


@pytest.mark.timeout(120)
def test_admin_api_over_http(settings, tmp_path):
    from onceflow.settings import ApiKey
    from producers.auth import SCOPES, hash_key, new_key

    admin, reader = new_key(), new_key()
    keys = [
        ApiKey(name="admin", sha256=hash_key(admin), scopes=list(SCOPES)).model_dump(),
        ApiKey(name="reader", sha256=hash_key(reader), scopes=["jobs:read"]).model_dump(),
    ]
    port = free_port()
    env = {
        **settings_env(settings),
        "ONCEFLOW_INGEST_PORT": str(port),
        "ONCEFLOW_INGEST_METRICS_PORT": str(free_port()),
        "ONCEFLOW_API_KEYS": orjson.dumps(keys).decode(),
    }
    base = f"http://127.0.0.1:{port}/v1/schedules"
    with ProcessGroup(env, tmp_path / "logs") as group:
        group.start("ingest", "ingest")
        group.wait_http(f"http://127.0.0.1:{port}/healthz")
        a = httpx.Client(headers={"Authorization": f"Bearer {admin}"}, timeout=10)
        r = httpx.Client(headers={"Authorization": f"Bearer {reader}"}, timeout=10)
        body = {"name": "api", "workflow": "noop-workflow", "cron": "*/15 * * * *",
                "overlap": "buffer-one"}  # fmt: skip
        created = a.post(base, json=body)
        assert created.status_code == 201, created.text
        assert created.json()["overlap"] == "buffer-one"
        refused = [
            a.post(base, json=body),  # 409: the name is taken
            a.post(base, json={**body, "name": "api2", "cron": "*/15 * *"}),  # 400
            a.post(base, json={**body, "name": "a b"}),  # 422
            r.post(base, json={**body, "name": "api3"}),  # 403: a reader
            a.get(f"{base}/nope"),  # 404
        ]
        assert [x.status_code for x in refused] == [409, 400, 422, 403, 404]
        assert [x.json()["error"] for x in refused[:2]] == ["conflict", "invalid_schedule"]
        for x in refused:
            assert set(x.json()) == set(ErrorBody.model_fields), x.json()

        assert [s["name"] for s in r.get(base).json()] == ["api"]
        assert a.post(f"{base}/api/pause").json()["paused"] is True
        assert a.post(f"{base}/api/resume").json()["paused"] is False
        window = {"start": "2026-01-01T00:00:00Z", "end": "2026-01-01T02:00:00Z"}
        dry = a.post(f"{base}/api/backfill", json={**window, "dry_run": True}).json()
        assert (dry["count"], dry["created"]) == (9, 0)
        assert dry["first"].startswith("2026-01-01T00:00:00") and dry["last"].startswith(
            "2026-01-01T02:00:00"
        )
        real = a.post(f"{base}/api/backfill", json=window).json()
        assert (real["count"], real["created"], real["existing"]) == (9, 9, 0)
        tick = a.get(
            f"http://127.0.0.1:{port}/v1/instances/noop-workflow/api@2026-01-01T00:15:00Z"
        ).json()
        assert tick["origin"] == "schedule" and tick["provenance"] == "a schedule's tick"
        assert tick["schedule_tick"]["schedule"] == "api"
        assert tick["schedule_tick"]["trigger"] == "backfill"
        assert a.delete(f"{base}/api").status_code == 204
        assert r.get(f"{base}/api").status_code == 404


def test_the_audit_counts_tick_instances_as_started_inside_not_as_retention(db):
    """A tick has no record in the jobs topic; the audit must not put it with the
    instances whose records retention removed."""
    from workflow_engine.store.views import stored_job_ids

    operations.create_schedule(db, _define("audited"), now=T0)
    writes.fire_due(db, now=T0 + timedelta(minutes=5, seconds=1))
    ticks = set(_instances(db, "audited"))
    assert len(ticks) == 1
    stored = stored_job_ids(db)
    assert stored.started_inside == ticks
    assert ticks <= stored.instances


def test_an_engine_fires_only_the_schedules_of_workflows_it_has(db):
    """So a tick always records its definition version and no engine without the
    workflow (a fleet split by workflow modules) ever creates it."""
    operations.create_schedule(db, _define("split"), now=T0)
    due = T0 + timedelta(minutes=5, seconds=1)
    assert writes.fire_due(db, now=due, versions={"another-workflow": "v1"}) == []
    assert _instances(db, "split") == []
    fired = writes.fire_due(db, now=due, versions={"noop-workflow": "v7"})
    assert [r.schedule for r in fired] == ["split"]
    with db.connect() as conn:
        version = conn.execute(
            sa.text("SELECT version FROM onceflow_instances WHERE job_id = :j"),
            {"j": tick_job_id("split", T0 + timedelta(minutes=5))},
        ).scalar()
    assert version == "v7"


def test_a_tick_is_created_with_its_workflows_definition(db):
    """An engine fires a tick as the worker creates a Kafka record's job: with its
    workflow's singleton and fairness lane (``Registry.delivery``). Before, a tick
    carried its version only: a schedule of a singleton workflow started a second live
    instance of the key beside one still running. A tick still never joins a batch (as
    documented): a batched workflow's tick is created on its own."""
    from onceflow.envelope import JobEnvelope
    from workflow_engine.definitions import load_workflow_modules
    from workflow_engine.store.writes import create_instances

    registry = load_workflow_modules(["onceflow_examples"])
    # a live report of account "a", created from a record
    live = JobEnvelope("report_a", "report-workflow", {"account": "a"})
    create_instances(db, [registry.delivery(live, "t", 0, 1)])
    for name, workflow, params in (
        ("reports", "report-workflow", {"account": "a"}),
        ("digests", "digest-workflow", {"tenant": "t1"}),
    ):
        spec = TickSpec(cron="*/5 * * * *")
        operations.create_schedule(
            db,
            ScheduleDef(name, workflow, spec, params, CatchupPolicy.RUN_ONCE, OverlapPolicy.ALLOW),
            now=T0,
        )
    fired = writes.fire_due(db, now=T0 + timedelta(minutes=5, seconds=1), registry=registry)
    assert sorted(r.schedule for r in fired) == ["digests", "reports"]
    with db.connect() as conn:
        status = dict(
            conn.execute(
                sa.text("SELECT job_id, status FROM onceflow_instances WHERE job_id LIKE '%@%'")
            ).all()
        )
    tick = T0 + timedelta(minutes=5)
    # the singleton's decision: the live report of "a" stands, the tick is skipped
    assert status[tick_job_id("reports", tick)] == "skipped"
    # the batched workflow's tick is no member of its tenant's pool
    assert status[tick_job_id("digests", tick)] == "queued"
