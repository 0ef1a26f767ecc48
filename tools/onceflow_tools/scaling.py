"""``onceflow bench scale``: how ingest, the queue hop and the engine grow with
processes, and what each job costs in CPU, in WAL and in commits.

* ingest: single-job requests/s under ``wrk`` (64 connections) with 1, 2, 4 ingest
  processes sharing one port (``SO_REUSEPORT``), through :mod:`onceflow_tools.wrkbench`
  (auth, validation, limits, metrics and the job-id trail on; CPU per request is the
  ingest processes'); left out, with a note, where ``wrk`` is not installed;
* queue to instance: every pairing of 1, 2, 4 partitions with 1, 2, 4 streams worker
  processes (no more workers than partitions: a spare one would sit idle), then 8
  partitions with 4 and with 8 workers as extra points (:data:`QUEUE_EXTRA`: on two
  cores they show what more partitions and oversubscribed workers cost, not more
  throughput); the topic is filled once the partition assignment has settled (no
  rebalance mid-run);
* engine: 1, 2 and 4 engine processes, started together, on a pre-filled table of
  three-step no-op workflows; besides the rate over the whole run, the rate from the
  moment every engine is up (``workflows_per_second_all_up``).

CI's smoke run passes smaller grids (the parameters of :func:`scale`).

Each run reports its rate from the database's own timestamps (as the ``queue`` and
``engine`` scenarios do) and what it cost:

* **CPU per job**: CPU seconds (user + system, from ``/proc/<pid>/stat``) of the
  onceflow processes and, separately, of the PostgreSQL backends serving the run's
  database, from the moment every process is ready (start-up and imports excluded) to
  the last job, divided by the jobs done in that window;
* **WAL bytes and commits per job**: the WAL flush position before and after (the
  whole cluster: other databases on the same server add to it) and, attributed to the
  run's database with ``pg_walinspect``, the bytes of the WAL records that touch its
  relations or belong to its transactions, with their full-page images apart (they
  depend on when the last checkpoint ran); commits are ``pg_stat_database.xact_commit``
  (every transaction, read-only ones too) and the commit records in that WAL (the
  transactions that wrote, i.e. the WAL flushes a synchronous commit waits for).

The statements here read PostgreSQL's own statistics, never onceflow's tables (those go
through :mod:`onceflow_tools.figures`).
"""

from __future__ import annotations

import os
import shutil
import signal
import time
from dataclasses import dataclass
from functools import partial
from pathlib import Path
from typing import Any

import click
import httpx
import sqlalchemy as sa
from prometheus_client.parser import text_string_to_metric_families
from sqlalchemy.engine import Engine
from sqlalchemy.pool import NullPool

from onceflow.settings import Settings
from onceflow.vocabulary import InstanceStatus
from onceflow_tools import bench
from onceflow_tools.figures import (
    consumption,
    count_instances,
    receipt_span_seconds,
    run_span_seconds,
)
from onceflow_tools.processes import free_port
from onceflow_tools.stack import Stack

QUEUE_GRID = ((1, 1), (2, 1), (2, 2), (4, 1), (4, 2), (4, 4))  # (partitions, workers)
QUEUE_EXTRA = ((8, 4), (8, 8))  # beyond two cores: 8 partitions, then 8 workers on them
ENGINE_COUNTS = (1, 2, 4)
INGEST_PROCESSES = (1, 2, 4)
INGEST_CONNECTIONS = 64  # issue 16's single-job target is set at 64 connections
INGEST_SECONDS = 10
CLOCK_TICKS = os.sysconf("SC_CLK_TCK")
APP_NAME = "onceflow-bench-scale"  # PGAPPNAME of the run's processes

_WAL_OF_DATABASE = sa.text(
    "WITH r AS (SELECT xid, resource_manager, record_type, record_length, fpi_length,"
    "  block_ref FROM pg_get_wal_records_info(CAST(:start AS pg_lsn), CAST(:end AS pg_lsn))),"
    " touching AS (SELECT DISTINCT xid FROM r WHERE block_ref LIKE :rel AND xid <> '0'),"
    " mine AS (SELECT * FROM r WHERE block_ref LIKE :rel OR xid IN (SELECT xid FROM touching))"
    " SELECT count(*) FILTER (WHERE resource_manager = 'Transaction'"
    "   AND record_type LIKE 'COMMIT%'),"
    " count(*), coalesce(sum(record_length), 0), coalesce(sum(fpi_length), 0) FROM mine"
)


def cpu_seconds(pid: int) -> float:
    """User + system CPU of a live process (and of its reaped children), in seconds."""
    try:
        fields = Path(f"/proc/{pid}/stat").read_text().rsplit(")", 1)[1].split()
    except OSError:
        return 0.0
    return sum(int(f) for f in fields[11:15]) / CLOCK_TICKS  # utime stime cutime cstime


def _backend_pids(db: Engine) -> list[int]:
    """The backends of the run's processes (libpq names them from ``PGAPPNAME``), not
    the harness's own connections."""
    with db.connect() as conn:
        rows = conn.execute(
            sa.text(
                "SELECT pid FROM pg_stat_activity"
                " WHERE datname = current_database() AND application_name = :app"
            ),
            {"app": APP_NAME},
        )
        return [int(pid) for (pid,) in rows]


def _wait_backends_gone(db: Engine, timeout: float = 15.0) -> None:
    """A backend reports its commit counts to pg_stat_database as it exits: wait for
    the run's backends to be gone before reading them."""
    deadline = time.monotonic() + timeout
    while _backend_pids(db) and time.monotonic() < deadline:
        time.sleep(0.1)


@dataclass
class CpuWindow:
    """CPU of the onceflow processes and of the run database's backends since start."""

    stack: Stack
    procs: dict[int, float]
    backends: dict[int, float]

    @classmethod
    def start(cls, stack: Stack) -> CpuWindow:
        assert stack.group is not None and stack.db is not None
        procs = {p.pid: cpu_seconds(p.pid) for p in stack.group.procs.values()}
        return cls(stack, procs, {pid: cpu_seconds(pid) for pid in _backend_pids(stack.db)})

    def finish(self) -> dict[str, float]:
        """CPU seconds since :meth:`start` (backends opened since then count in full)."""
        assert self.stack.db is not None
        ours = sum(cpu_seconds(pid) - t0 for pid, t0 in self.procs.items())
        pids = _backend_pids(self.stack.db)
        pg = sum(cpu_seconds(pid) - self.backends.get(pid, 0.0) for pid in pids)
        return {"onceflow_cpu_seconds": ours, "postgres_cpu_seconds": pg}


class PgCounters:
    """WAL position and commit count of the run's database, taken around a run.

    Other engineers' databases come and go on the same server (each DROP DATABASE is a
    checkpoint), so the WAL of a run may be recycled before it is read: a temporary
    physical replication slot, held by this object's own session, keeps it until
    :meth:`finish` has read it, and goes with the session even if the run fails."""

    def __init__(self, db: Engine) -> None:
        self.db = db
        self._db = sa.create_engine(db.url, poolclass=NullPool)
        self._conn: sa.Connection | None = None
        self.lsn, self.xact_commit, self.oid = "0/0", 0, 0

    def __enter__(self) -> PgCounters:
        with self.db.begin() as conn:
            conn.execute(sa.text("CREATE EXTENSION IF NOT EXISTS pg_walinspect"))
        self._conn = self._db.connect().execution_options(isolation_level="AUTOCOMMIT")
        self._conn.execute(
            sa.text("SELECT pg_create_physical_replication_slot(:n, true, true)"),
            {"n": f"onceflow_bench_{os.getpid()}_{int(time.time() * 1000)}"},
        )
        self.lsn, self.xact_commit, self.oid = self._read()
        return self

    def __exit__(self, *exc: object) -> None:
        if self._conn is not None:
            self._conn.close()  # the session ends: its temporary slot is dropped
        self._db.dispose()

    def _read(self) -> tuple[str, int, int]:
        """(WAL flushed up to, commits so far, database oid). The flush position: the
        run's commits are flushed (synchronous commit), and pg_walinspect reads no
        further than it."""
        assert self._conn is not None
        self._conn.execute(sa.text("SELECT pg_stat_clear_snapshot()"))
        row = self._conn.execute(
            sa.text(
                "SELECT pg_current_wal_flush_lsn()::text, xact_commit, datid FROM"
                " pg_stat_database WHERE datname = current_database()"
            )
        ).one()
        return str(row[0]), int(row[1]), int(row[2])

    def finish(self, jobs: int) -> dict[str, Any]:
        """Per-job figures since entering; call once the run's processes have exited."""
        assert self._conn is not None
        _wait_backends_gone(self.db)
        lsn, commits, _ = self._read()
        cluster = self._conn.execute(
            sa.text("SELECT CAST(:e AS pg_lsn) - CAST(:s AS pg_lsn)"), {"s": self.lsn, "e": lsn}
        ).scalar()
        n = max(jobs, 1)
        figures: dict[str, Any] = {
            "wal_bytes_cluster_per_job": float(cluster or 0) / n,
            "xact_commits_per_job": (commits - self.xact_commit) / n,
        }
        params = {"start": self.lsn, "end": lsn, "rel": f"%/{self.oid}/%"}
        try:
            row = self._conn.execute(_WAL_OF_DATABASE, params).one()
        except sa.exc.DBAPIError as exc:  # keep the run's other figures
            return figures | {"wal_error": str(exc.orig)}
        commit_records, records, wal, fpi = (float(v) for v in row)
        return figures | {
            "wal_bytes_per_job": wal / n,
            "wal_fpi_bytes_per_job": fpi / n,
            "wal_records_per_job": records / n,
            "wal_commit_records_per_job": commit_records / n,
        }


def _costs(cpu: dict[str, float], jobs_in_window: int) -> dict[str, float]:
    n = max(jobs_in_window, 1)
    return {
        **cpu,
        "jobs_in_cpu_window": jobs_in_window,
        "onceflow_cpu_ms_per_job": 1000 * cpu["onceflow_cpu_seconds"] / n,
        "postgres_cpu_ms_per_job": 1000 * cpu["postgres_cpu_seconds"] / n,
    }


def _assignment(port: int) -> tuple[frozenset[str], float]:
    """(partitions held, rebalances seen) from one streams worker's /metrics."""
    text = httpx.get(f"http://127.0.0.1:{port}/metrics", timeout=5).text
    held: set[str] = set()
    rebalances = 0.0
    for family in text_string_to_metric_families(text):
        for sample in family.samples:
            if sample.name == "onceflow_streams_assigned_partition" and sample.value == 1:
                held.add(sample.labels["partition"])
            elif sample.name == "onceflow_streams_rebalances_total":
                rebalances = sample.value
    return frozenset(held), rebalances


def _wait_assignment_settled(ports: list[int], partitions: int, timeout: float = 60) -> None:
    """Wait until the workers hold every partition between them, each holds one, and no
    rebalance has come for 3 s: a group that is only "stable" may still rebalance once
    more, and a rebalance mid-run redelivers records (and slows the run)."""
    deadline = time.monotonic() + timeout
    last, settled_since = None, time.monotonic()
    while time.monotonic() < deadline:
        state = [_assignment(port) for port in ports]
        held = [h for h, _ in state]
        complete = len(frozenset().union(*held)) == partitions and all(held)
        if state != last or not complete:
            last, settled_since = state, time.monotonic()
        elif time.monotonic() - settled_since >= 3.0:
            return
        time.sleep(0.25)
    raise TimeoutError(f"partition assignment never settled: {last}")


def _kill_all(stack: Stack) -> None:
    """End the workers without a goodbye. Stopped one by one (SIGTERM), each leaves the
    group, the next takes its partitions over and re-reads them from the last committed
    offset (committed every 2.8 s): a 5,000-record run re-read up to 2,869 records after
    it had finished, which added to its span, its WAL and its commits."""
    assert stack.group is not None
    for name in list(stack.group.procs):
        stack.group.stop(name, signal.SIGKILL)


def queue_run(
    base: Settings, jobs: int, log_dir: Path, partitions: int, workers: int
) -> dict[str, Any]:
    """Instances created per second from ``jobs`` records by ``workers`` streams workers
    on ``partitions`` partitions. The workers join the group first (no rebalance
    mid-run), then the topic is filled while they consume."""
    stack = bench._stack(
        base, log_dir, f"scale-p{partitions}w{workers}", partitions, PGAPPNAME=APP_NAME
    )
    assert stack.db is not None and stack.settings is not None and stack.group is not None
    db = stack.db
    try:
        ports = [stack.start_worker(f"streams-{w}") for w in range(workers)]
        bench._wait_group(stack.settings, workers)
        _wait_assignment_settled(ports, partitions)
        with PgCounters(db) as counters:
            cpu = CpuWindow.start(stack)
            bench._fill_topic(stack.settings, jobs, 0.0)
            bench._wait_for("records consumed", lambda: consumption(db).records, jobs, 600)
            spent = cpu.finish()
            _kill_all(stack)
            pg = counters.finish(jobs)
        span = receipt_span_seconds(db)
        return {
            "partitions": partitions,
            "workers": workers,
            "records": jobs,
            "instances": count_instances(db),
            # Records read twice (a rebalance mid-run redelivers them): none expected.
            "redeliveries": consumption(db).duplicates,
            "seconds": span,
            "records_per_second": jobs / span if span else 0.0,
            **_costs(spent, jobs),
            **pg,
        }
    finally:
        stack.close()


def _start_engines(stack: Stack, engines: int) -> None:
    """Start every engine before waiting for any: started one after the other, the first
    ran alone for the seconds the next took to import, and a 4-engine rate was partly
    a 1-engine rate."""
    assert stack.group is not None
    ports = [free_port() for _ in range(engines)]
    for i, port in enumerate(ports):
        env = {"ONCEFLOW_ENGINE_METRICS_PORT": str(port)}
        stack.group.start(f"engine-{i}", "engine", env=env)
    for port in ports:
        stack.group.wait_http(f"http://127.0.0.1:{port}/metrics", timeout=60)


def engine_run(
    base: Settings, jobs: int, log_dir: Path, engines: int, concurrency: int
) -> dict[str, Any]:
    """Three-step no-op workflows completed per second by ``engines`` engine processes
    from a pre-filled table, with what they cost."""
    stack = bench._stack(
        base,
        log_dir,
        f"scale-engine{engines}",
        ONCEFLOW_ENGINE_CONCURRENCY=str(concurrency),
        PGAPPNAME=APP_NAME,
    )
    assert stack.db is not None and stack.group is not None
    db = stack.db
    try:
        bench._prefill(stack, jobs, "noop-workflow", "e")
        with PgCounters(db) as counters:
            _start_engines(stack, engines)
            cpu = CpuWindow.start(stack)  # every engine is up (metrics answer); some ran
            done_at_start = count_instances(db, InstanceStatus.COMPLETE)
            all_up = bench._wait_complete(stack, jobs, 600)
            spent = cpu.finish()
            stack.group.stop_all()
            pg = counters.finish(jobs)
        span = max(run_span_seconds(db), 1e-3)
        return {
            "workflow": "noop-workflow",
            "concurrency": concurrency,
            "engines": engines,
            "workflows": jobs,
            "seconds": span,
            "workflows_per_second": jobs / span,
            "checkpoints_per_second": 3 * jobs / span,
            # From every engine up to the last completion seen (polled twice a second).
            "workflows_per_second_all_up": (jobs - done_at_start) / max(all_up, 1e-3),
            **_costs(spent, jobs - done_at_start),
            **pg,
        }
    finally:
        stack.close()


def ingest_run(log_dir: Path, processes: int, connections: int, seconds: int) -> dict[str, Any]:
    """Single-job requests/s answered by ``processes`` ingest processes on one port under
    ``wrk``, and the ingest processes' CPU per request (every thread, librdkafka's
    included; not wrk's nor the shared broker's). A 2 s wrk run first warms the
    processes and their producers up; it is not counted."""
    from onceflow_tools import wrkbench  # needs `wrk`; the rest of the scenario does not

    ingest = wrkbench.Ingest(log_dir, processes)
    try:
        wrkbench.run_wrk(ingest, connections, 1, 2)
        go = partial(wrkbench.run_wrk, ingest, connections, 1, seconds)
        row = wrkbench.measured(ingest, go, None)
    finally:
        ingest.close()
    return {
        "processes": processes,
        "connections": connections,
        "batch": 1,
        **row,
        "onceflow_cpu_ms_per_job": row["cpu_ms_per_request"],
    }


def scale(
    base: Settings,
    jobs: int,
    log_dir: Path,
    *,
    queue_grid: tuple[tuple[int, int], ...] = QUEUE_GRID + QUEUE_EXTRA,
    engine_counts: tuple[int, ...] = ENGINE_COUNTS,
    ingest_processes: tuple[int, ...] = INGEST_PROCESSES,
    ingest_seconds: int = INGEST_SECONDS,
) -> dict[str, Any]:
    """The ingest series, every queue pairing of ``queue_grid``, then each engine count
    (at the default engine concurrency), ``jobs`` records or workflows each. Ingest
    reads its Kafka from the environment (:class:`onceflow_tools.wrkbench.Ingest`), as
    the CLI's settings do."""
    result: dict[str, Any] = {"scenario": "scale", "ingest": []}
    if ingest_processes and shutil.which("wrk") is None:
        result["ingest_skipped"] = "wrk is not installed (apt-get install wrk)"
        click.echo(f"  scale: ingest series left out: {result['ingest_skipped']}", err=True)
    elif ingest_processes:
        result["ingest"] = [
            ingest_run(log_dir, n, INGEST_CONNECTIONS, ingest_seconds) for n in ingest_processes
        ]
    result["queue"] = [queue_run(base, jobs, log_dir, p, w) for p, w in queue_grid]
    result["engine"] = [
        engine_run(base, jobs, log_dir, n, base.engine_concurrency) for n in engine_counts
    ]
    return result


def _cost_columns() -> list[bench.Column]:
    return [
        ("cpu ms/job", lambda r: _fmt(r, "onceflow_cpu_ms_per_job", ".2f")),
        ("pg cpu ms/job", lambda r: _fmt(r, "postgres_cpu_ms_per_job", ".2f")),
        ("WAL B/job", lambda r: _fmt(r, "wal_bytes_per_job", ".0f")),
        ("FPI B/job", lambda r: _fmt(r, "wal_fpi_bytes_per_job", ".0f")),
        ("cluster WAL B/job", lambda r: _fmt(r, "wal_bytes_cluster_per_job", ".0f")),
        ("commits/job", lambda r: _fmt(r, "xact_commits_per_job", ".3f")),
        ("WAL commits/job", lambda r: _fmt(r, "wal_commit_records_per_job", ".3f")),
    ]


def _fmt(row: dict[str, Any], key: str, spec: str) -> str:
    """A cost column's cell; ``-`` where it was not measured."""
    return "-" if row.get(key) is None else format(row[key], spec)


def _render_ingest(result: dict[str, Any]) -> list[str]:
    """The ingest series' table; none for result files written before it existed."""
    if "ingest_skipped" in result:
        return [f"scale (ingest): left out, {result['ingest_skipped']}"]
    if not result.get("ingest"):
        return []
    return bench._table(
        "scale (ingest, single-job requests under wrk)",
        [
            ("processes", lambda r: str(r["processes"])),
            ("connections", lambda r: str(r["connections"])),
            ("requests", lambda r: str(r["requests"])),
            ("req/s", lambda r: f"{r['req_per_s']:.0f}"),
            ("p50 ms", lambda r: f"{r['p50_ms']:.1f}"),
            ("p99 ms", lambda r: f"{r['p99_ms']:.1f}"),
            ("errors", lambda r: str(r["errors"] + r["timeouts"])),
            ("cpu ms/req", lambda r: f"{r['cpu_ms_per_request']:.3f}"),
        ],
        result["ingest"],
    )


def render(result: dict[str, Any]) -> list[str]:
    costs = _cost_columns()
    return [
        *_render_ingest(result),
        *bench._table(
            "scale (queue to instance)",
            [
                ("partitions", lambda r: str(r["partitions"])),
                ("workers", lambda r: str(r["workers"])),
                ("records", lambda r: str(r["records"])),
                ("records/s", lambda r: f"{r['records_per_second']:.0f}"),
                ("redelivered", lambda r: _fmt(r, "redeliveries", "d")),
                *costs,
            ],
            result["queue"],
        ),
        *bench._table(
            "scale (engine)",
            [
                ("engines", lambda r: str(r["engines"])),
                ("concurrency", lambda r: str(r["concurrency"])),
                ("workflows", lambda r: str(r["workflows"])),
                ("workflows/s", lambda r: f"{r['workflows_per_second']:.0f}"),
                ("all up wf/s", lambda r: _fmt(r, "workflows_per_second_all_up", ".0f")),
                *costs,
            ],
            result["engine"],
        ),
    ]
