"""Losing the PostgreSQL primary while jobs flow and workflows run steps.

A pg_auto_failover formation of its own (monitor, primary, synchronous standby; see
``onceflow_tools.dev.postgres_ha``) on free ports; the three onceflow processes connect
with the multi-host URL (``target_session_attrs=read-write``). Single-job submissions at
a steady pace; after ``KILL_AFTER`` are accepted, the primary node (supervisor, keeper,
postgres) is SIGKILLed and the standby promoted. Then:

* every job answered 202 has exactly one instance, and every instance completes;
* no step checkpoint is written twice; a step whose checkpoint was lost with the
  primary runs again, but its idempotency key absorbs it (applied once per job and
  step; the re-executions are counted and printed);
* the worker's committed offsets never pass a record whose create is not committed:
  sampled all along, every position below a committed offset is in the database;
* the timeline (kill, promotion, first write, caught up) and the 202s during the
  outage are printed (figures, not assertions).
"""

from __future__ import annotations

import shutil
import threading
import time
import uuid
from collections.abc import Iterator
from dataclasses import dataclass, field
from datetime import UTC, datetime

import httpx
import pytest
import sqlalchemy as sa

from onceflow.lag import consumer_lag
from onceflow.vocabulary import InstanceStatus
from onceflow_examples import applied_effect_counts, side_effect_counts
from onceflow_tools.dev.postgres_ha import NODES, PostgresHA
from onceflow_tools.figures import checkpoints_written_twice, count_instances
from onceflow_tools.processes import free_port
from onceflow_tools.stack import Stack
from workflow_engine.store import is_transient, make_engine

pytestmark = pytest.mark.timeout(240)

THREADS = 2
JOBS_PER_THREAD = 400
RATE_PER_THREAD = 25.0  # submissions a second: 800 jobs over ~16 s
KILL_AFTER = 250


@dataclass
class Submissions:
    accepted: list[str] = field(default_factory=list)
    answers: list[tuple[float, int]] = field(default_factory=list)  # (started, status)
    lock: threading.Lock = field(default_factory=threading.Lock)


@pytest.fixture(scope="module")
def formation(tmp_path_factory) -> Iterator[PostgresHA]:
    ha = PostgresHA(
        tmp_path_factory.mktemp("ha"),
        monitor_port=free_port(),
        node_ports=(free_port(), free_port()),
    )
    try:
        ha.up()
        yield ha
    finally:
        ha.down(timeout=10)
        shutil.rmtree(ha.root, ignore_errors=True)


def _submit(stack: Stack, thread: int, out: Submissions, deadline: float) -> None:
    """Single-job submissions at a steady pace; anything but 202 is retried (same id)."""
    with httpx.Client(base_url=stack.ingest_url, headers=stack.auth_headers, timeout=30) as http:
        start = time.monotonic()
        for i in range(JOBS_PER_THREAD):
            pause = start + i / RATE_PER_THREAD - time.monotonic()
            if pause > 0:
                time.sleep(pause)
            job_id = f"pgf_{thread}_{i:04d}"
            job = {"job_id": job_id, "workflow": "order-workflow", "params": {"step_seconds": 0.02}}
            while time.monotonic() < deadline:
                t0 = time.monotonic()
                try:
                    status = http.post("/v1/jobs", json=job).status_code
                except httpx.HTTPError:
                    status = 0
                with out.lock:
                    out.answers.append((t0, status))
                    if status == 202:
                        out.accepted.append(job_id)
                if status == 202:
                    break
                time.sleep(0.2)


class OffsetWatch:
    """Samples the group's committed offsets and checks, each time the database
    answers, that every position below them is recorded (created or collapsed)."""

    def __init__(self, stack: Stack) -> None:
        self.stack = stack
        self.samples = 0
        self.violations: list[str] = []
        self._stop = threading.Event()
        self._thread = threading.Thread(target=self._run, daemon=True)

    def __enter__(self) -> OffsetWatch:
        self._thread.start()
        return self

    def __exit__(self, *exc: object) -> None:
        self._stop.set()
        self._thread.join(10)

    def _run(self) -> None:
        while not self._stop.wait(0.5):
            try:
                self.check()
            except Exception:
                continue  # the database is failing over: the next sample checks

    def check(self) -> None:
        s, db = self.stack.settings, self.stack.db
        assert s is not None and db is not None
        lags = consumer_lag(s.kafka_bootstrap_servers, s.consumer_group, s.jobs_topic)
        with db.connect() as conn:
            for p in lags:
                if not p.committed:
                    continue
                recorded = conn.execute(
                    sa.text(
                        "SELECT count(DISTINCT o) FROM ("
                        " SELECT source_offset o FROM onceflow_jobs"
                        "  WHERE source_topic = :t AND source_partition = :p AND source_offset < :c"
                        " UNION ALL SELECT source_offset FROM onceflow_duplicate_deliveries"
                        "  WHERE source_topic = :t AND source_partition = :p AND source_offset < :c"
                        ") x"
                    ),
                    {"t": s.jobs_topic, "p": p.partition, "c": p.committed},
                ).scalar()
                if recorded != p.committed - p.low:
                    self.violations.append(
                        f"partition {p.partition}: committed {p.committed}, but only"
                        f" {recorded} positions below it are in the database"
                    )
        self.samples += 1


def _first_write_after(stack: Stack, wall: datetime) -> datetime | None:
    """The first commit of the system after ``wall``: a job recorded by the worker or an
    instance row written by the engine."""
    return _scalar_at(
        stack,
        "SELECT least((SELECT min(received_at) FROM onceflow_jobs WHERE received_at > :w),"
        " (SELECT min(updated_at) FROM onceflow_instances WHERE updated_at > :w))",
        wall,
    )


def _scalar_at(stack: Stack, sql: str, wall: datetime) -> datetime | None:
    assert stack.db is not None
    with stack.db.connect() as conn:
        return conn.execute(sa.text(sql), {"w": wall}).scalar()


def _wait(predicate, timeout: float, what: str, interval: float = 0.1) -> float:
    deadline = time.monotonic() + timeout
    while time.monotonic() < deadline:
        try:
            if predicate():
                return time.monotonic()
        except Exception:
            pass  # the database or the monitor is failing over
        time.sleep(interval)
    raise TimeoutError(f"timed out after {timeout:.0f}s waiting for {what}")


def test_a_write_refused_by_a_standby_is_transient_and_drops_the_connection(
    formation: PostgresHA,
):
    """What a pooled connection meets when its server was demoted but lives on: reads
    (and the pool's pre-ping) work, writes are refused; that must mean "retry elsewhere"."""
    standby = next(n for n in NODES if n != formation.primary())
    db = make_engine(
        f"postgresql://postgres@127.0.0.1:{formation.port(standby)}/{formation.database}",
        pool_size=1,
    )
    try:
        with db.connect() as conn:
            assert conn.exec_driver_sql("SELECT pg_is_in_recovery()").scalar() is True
        with pytest.raises(sa.exc.DBAPIError) as caught, db.begin() as conn:
            conn.exec_driver_sql("CREATE TABLE onceflow_ha_probe (x int)")
        assert getattr(caught.value.orig, "pgcode", None) == "25006"
        assert caught.value.connection_invalidated
        assert is_transient(caught.value)
    finally:
        db.dispose()


def test_nothing_acknowledged_is_lost_when_the_primary_dies(
    base_settings, formation: PostgresHA, tmp_path, capsys
):
    began = time.monotonic()
    base = base_settings.model_copy(update={"database_url": formation.url})
    stack = Stack(base, f"pgfail-{uuid.uuid4().hex[:8]}", tmp_path / "run").prepare()
    stack.env.update(
        # A lease longer than the outage: runs cut by the failover are given back as
        # soon as the new primary answers, not re-queued when their lease expires.
        {"ONCEFLOW_ENGINE_LEASE_SECONDS": "12", "ONCEFLOW_ENGINE_POLL_INTERVAL_SECONDS": "0.5"}
    )
    assert stack.group is not None and stack.db is not None and stack.settings is not None
    stack.group.env.update(stack.env)
    s = stack.settings
    try:
        old = formation.primary()
        assert old in NODES and formation.ready()
        with stack.db.connect() as conn:
            sync = conn.exec_driver_sql("SHOW synchronous_standby_names").scalar()
        assert sync and sync.startswith("ANY 1"), sync
        stack.start_ingest()
        stack.start_worker()
        stack.start_engine()

        out = Submissions()
        deadline = time.monotonic() + 120
        threads = [
            threading.Thread(target=_submit, args=(stack, t, out, deadline), daemon=True)
            for t in range(THREADS)
        ]
        with OffsetWatch(stack) as watch:
            for thread in threads:
                thread.start()
            stack.wait_for(lambda: len(out.accepted) >= KILL_AFTER, 60, f"{KILL_AFTER} jobs")
            complete_at_kill = count_instances(stack.db, InstanceStatus.COMPLETE)
            t0, t0_wall = time.monotonic(), datetime.now(UTC)
            formation.kill(old)

            t1 = _wait(lambda: formation.primary() not in (None, old), 60, "a promotion")
            t1_probe = _wait(formation.writable, 60, "a write through the multi-host URL")
            first = _wait(lambda: _first_write_after(stack, t0_wall) is not None, 60, "a commit")
            first_wall = _first_write_after(stack, t0_wall)
            assert first_wall is not None and first > 0
            t2 = t0 + (first_wall - t0_wall).total_seconds()

            for thread in threads:
                thread.join(max(0.0, deadline - time.monotonic()))
            assert not any(t.is_alive() for t in threads), "the submitters did not finish"
            submitted = time.monotonic()
            accepted = sorted(set(out.accepted))
            assert len(accepted) == THREADS * JOBS_PER_THREAD

            def caught_up() -> bool:
                if count_instances(stack.db, InstanceStatus.COMPLETE) < len(accepted):
                    return False
                lags = consumer_lag(s.kafka_bootstrap_servers, s.consumer_group, s.jobs_topic)
                return sum(p.lag for p in lags) == 0

            t3 = _wait(caught_up, 90, "every instance complete and no consumer lag", 0.25)
            watch.check()  # one last sample, with everything committed

        assert watch.violations == [], watch.violations[:5]
        assert watch.samples > 10
        with stack.db.connect() as conn:
            rows, distinct, complete = conn.execute(
                sa.text(
                    "SELECT count(*), count(DISTINCT job_id),"
                    " count(*) FILTER (WHERE status = :complete) FROM onceflow_instances"
                ),
                {"complete": str(InstanceStatus.COMPLETE)},
            ).one()
            have = set(conn.execute(sa.text("SELECT job_id FROM onceflow_instances")).scalars())
        assert have == set(accepted)
        assert (rows, distinct, complete) == (len(accepted),) * 3
        assert checkpoints_written_twice(stack.db) == 0
        applied = applied_effect_counts(stack.db)
        assert applied.not_exactly_once(accepted) == 0
        executions = side_effect_counts(stack.db)
        new_primary = formation.primary()
    finally:
        stack.close()
    engine_log = (tmp_path / "run" / "engine.log").read_text()
    gave_back = engine_log.count('"event":"engine.gave_back"')
    rescued = engine_log.count('"event":"engine.lease_rescued"')

    in_outage = [status for started, status in out.answers if t0 <= started <= t3]
    with capsys.disabled():
        print(
            f"\npostgres failover: SIGKILL {old} at t0; {new_primary} promoted at"
            f" t1 = t0 + {t1 - t0:.1f} s (a write through the multi-host URL at"
            f" t0 + {t1_probe - t0:.1f} s); first commit by onceflow at t2 = t0 +"
            f" {t2 - t0:.1f} s; caught up (all {len(accepted)} complete, lag 0) at"
            f" t3 = t0 + {t3 - t0:.1f} s (the last job was accepted at t0 +"
            f" {submitted - t0:.1f} s). {complete_at_kill} instances complete at the kill."
            f" Answers between t0 and t3: {len(in_outage)}, of which"
            f" {sum(st == 202 for st in in_outage)} were 202, {sum(st == 503 for st in in_outage)}"
            f" 503, {sum(st == 0 for st in in_outage)} without answer. Step side effects:"
            f" {executions.rows} executions for {applied.rows} (job, step) pairs, i.e."
            f" {applied.re_executions} re-executions absorbed by their idempotency key."
            f" Runs cut by the failover: {gave_back} given back, {rescued} re-queued at"
            f" lease expiry. Offsets sampled {watch.samples} times, never past an"
            " uncommitted create."
            f" Test took {time.monotonic() - began:.0f} s."
        )
