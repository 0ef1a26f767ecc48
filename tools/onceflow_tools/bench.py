"""``onceflow bench``: figures from the real processes on the local services.

Scenarios (each prints a table, shows progress on stderr and writes JSON):

* ``burst`` / ``burst-paced``: N jobs posted as fast as a separate load process can (or
  at 5,000 jobs/s), far above what the engine completes: ingest latency during the
  burst, peak consumer lag, time for the lag to drain, end-to-end latency, peak RSS of
  every process, and that every accepted job got its instance (nothing lost).
* ``ingest``: jobs/s accepted and request latency at batch sizes 100 and 1 with
  increasing client concurrency, then at increasing offered load until saturation.
* ``queue``: instances created per second by one streams worker from a pre-filled
  topic, without and with 30% duplicates (from the first to the last database row).
* ``engine``: three-step no-op workflows completed per second by engine concurrency,
  with 1 and 2 engine processes (from the first claim to the last completion).
* ``e2e``: submit-to-first-step and submit-to-complete latency at light load.
* ``scale``: single-job ingest by ingest processes (1/2/4, under ``wrk``),
  queue-to-instance by partitions x workers (1/2/4, then 8 x 4 and 8 x 8), engine by
  engines (1/2/4), each with CPU, WAL bytes and commits per job
  (:mod:`onceflow_tools.scaling`).
* ``nobuffer`` / ``nobuffer-outage``: the same burst against onceflow and against HTTP
  handlers writing straight into PostgreSQL (:mod:`onceflow_tools.baselines.direct_http`),
  optionally through a 5 s PostgreSQL outage.
* ``dbos``: DBOS Transact running the same workflow on the same PostgreSQL
  (:mod:`onceflow_tools.baselines.dbos_bench`, in its own virtualenv), with the ratios.
* ``engine-flow-control``: workflows/s with every flow control on against the plain
  claim, and a small tenant's submit -> first step behind a big tenant's burst, with
  and without fairness (:mod:`onceflow_tools.flowbench`).
* ``engine-policies``: created/s and workflows/s of the plain workflow against one each
  with a singleton policy, time limits, attributes (:mod:`onceflow_tools.policy_bench`).
* ``claim``: one claim of 32 on a backlog of plain and per-key-limited workflows
  queued together (median, p90; :mod:`onceflow_tools.claimbench`).
* ``soak``: every process's RSS after each tenth of ``--jobs`` (a million for target 6)
  went through ingest, the worker and the engine (:mod:`onceflow_tools.soak`).
* ``console-list``: the console's queries on 50 instances per ``--jobs`` (1,000,000 at
  the default) in a scratch database: first and deep keyset pages, filtered pages,
  counts (median of 5 runs each, in ms).

Benchmarks are not tests: CI runs only a tiny smoke size to keep the harness working.
"""

from __future__ import annotations

import contextlib
import os
import subprocess
import sys
import threading
import time
import uuid
from collections.abc import Callable
from dataclasses import asdict
from pathlib import Path
from typing import Any

import click
import orjson
import sqlalchemy as sa

from onceflow.lag import consumer_lag
from onceflow.settings import Settings
from onceflow.vocabulary import InstanceStatus
from onceflow_tools.benchsql import add_rare_old_tenant, seed_for_bench
from onceflow_tools.figures import (
    consumption,
    count_instances,
    latency,
    receipt_span_seconds,
    run_span_seconds,
)
from onceflow_tools.processes import free_port
from onceflow_tools.stack import Stack


def memory_mb(pid: int) -> tuple[float, float]:
    """(VmRSS, VmHWM: resident now and its peak) of ``pid`` in MB; zeros if it is gone."""
    values = {"VmRSS:": 0.0, "VmHWM:": 0.0}
    try:
        for line in Path(f"/proc/{pid}/status").read_text().splitlines():
            fields = line.split()
            if fields and fields[0] in values:
                values[fields[0]] = int(fields[1]) / 1024
    except OSError:
        pass
    return values["VmRSS:"], values["VmHWM:"]


def rss_mb(pid: int) -> float:
    return memory_mb(pid)[0]


class Sampler:
    """Samples consumer lag and each process's RSS twice a second, keeping peaks."""

    def __init__(self, stack: Stack, progress: bool = False) -> None:
        self.stack = stack
        self.progress = progress
        self.peak_lag = 0
        self.peak_rss: dict[str, float] = {}
        self.lag = 0
        self.series: list[tuple[float, int]] = []
        self._stop = threading.Event()
        self._thread = threading.Thread(target=self._run, daemon=True)
        self._t0 = time.monotonic()

    def __enter__(self) -> Sampler:
        self._thread.start()
        return self

    def __exit__(self, *exc: object) -> None:
        self._stop.set()
        self._thread.join(5)

    def _run(self) -> None:
        s = self.stack.settings
        assert s is not None and self.stack.group is not None
        while not self._stop.is_set():
            try:
                lags = consumer_lag(s.kafka_bootstrap_servers, s.consumer_group, s.jobs_topic)
                self.lag = sum(p.lag for p in lags)
                self.peak_lag = max(self.peak_lag, self.lag)
                self.series.append((time.monotonic() - self._t0, self.lag))
            except Exception:
                pass
            rss = {name: rss_mb(proc.pid) for name, proc in list(self.stack.group.procs.items())}
            for name, mb in rss.items():
                self.peak_rss[name] = max(self.peak_rss.get(name, 0.0), mb)
            if self.progress and len(self.series) % 4 == 0:
                memory = ", ".join(f"{k} {v:.0f} MB" for k, v in sorted(rss.items()))
                click.echo(
                    f"  … t={time.monotonic() - self._t0:.0f}s lag {self.lag}; {memory}", err=True
                )
            self._stop.wait(0.5)


def _loadgen(
    stack: Stack,
    jobs: int,
    batch: int,
    concurrency: int,
    prefix: str,
    out: Path,
    rate: float = 0.0,
    url: str | None = None,
    workflow: str = "noop-workflow",
) -> dict[str, Any]:
    subprocess.run(
        [
            sys.executable,
            "-m",
            "onceflow_tools.loadgen",
            "--url",
            url or stack.ingest_url,
            "--jobs",
            str(jobs),
            "--batch",
            str(batch),
            "--concurrency",
            str(concurrency),
            "--prefix",
            prefix,
            "--rate",
            str(rate),
            "--workflow",
            workflow,
            "--out",
            str(out),
        ],
        check=True,
        env={**os.environ, "ONCEFLOW_LOADGEN_KEY": stack.api_key},
    )
    return orjson.loads(out.read_bytes())


def _stack(base: Settings, log_dir: Path, name: str, partitions: int = 4, **env: str) -> Stack:
    run_id = f"bench-{name}-{uuid.uuid4().hex[:6]}"
    stack = Stack(base, run_id, log_dir, partitions=partitions).prepare()
    stack.env.update(
        {"ONCEFLOW_INGEST_RATE_LIMIT_PER_SECOND": "0", "ONCEFLOW_LOG_LEVEL": "WARNING", **env}
    )
    if stack.group is not None:
        stack.group.env.update(stack.env)
    return stack


def e2e_latency(stack: Stack, prefix: str) -> dict[str, float]:
    """Submit-to-first-step and submit-to-complete percentiles (ms) of finished jobs,
    from the database's own timestamps (one clock: every process runs here)."""
    assert stack.db is not None
    return asdict(latency(stack.db, prefix))


def _wait_for(what: str, current: Callable[[], int], target: int, timeout: float) -> float:
    """Wait (bounded) until ``current()`` reaches ``target``, showing progress on stderr
    every second; return the seconds waited. Polls twice a second: each poll is a count
    on the database being measured, and the rates come from its timestamps anyway."""
    t0 = last = time.monotonic()
    while time.monotonic() - t0 < timeout:
        value = current()
        if value >= target:
            break
        if time.monotonic() - last >= 1.0:
            last = time.monotonic()
            click.echo(f"  … {what}: {value}/{target} after {last - t0:.0f}s", err=True)
        time.sleep(0.5)
    return time.monotonic() - t0


def _wait_complete(stack: Stack, count: int, timeout: float) -> float:
    """Wait (bounded) until ``count`` instances are complete; return the seconds waited."""
    assert stack.db is not None
    db = stack.db
    return _wait_for(
        "instances complete",
        lambda: count_instances(db, InstanceStatus.COMPLETE),
        count,
        timeout,
    )


def e2e(base: Settings, jobs: int, log_dir: Path, rate: float = 50.0) -> dict[str, Any]:
    """End-to-end latency at light load: ``rate`` jobs/s, one job per request, through
    ingest, Kafka, the streams worker and the engine (three no-op steps)."""
    stack = _stack(base, log_dir, "e2e")
    try:
        stack.start_ingest()
        stack.start_worker()
        stack.start_engine()
        # Warm up (first connections, the consumer group's first assignment).
        _loadgen(stack, 20, 1, 1, "warm_", log_dir / "warm.json", rate=20)
        _wait_complete(stack, 20, 60)
        load = _loadgen(stack, jobs, 1, 4, "light_", log_dir / "light.json", rate=rate)
        _wait_complete(stack, 20 + load["accepted"], 120)
        return {
            "scenario": "e2e",
            "rate": rate,
            "load": load,
            "latency": e2e_latency(stack, "light_"),
        }
    finally:
        stack.close()


class PostgresOutage:
    """Stops the local dev PostgreSQL ``after`` seconds into a run, for ``seconds``."""

    def __init__(self, base: Settings, after: float = 2.0, seconds: float = 5.0) -> None:
        from onceflow_tools.dev import local_dev_services

        dev = local_dev_services(base)
        if dev is None:
            raise click.ClickException("the outage runs need the local dev PostgreSQL")
        self.dev = dev
        self.after, self.seconds = after, seconds
        self._thread = threading.Thread(target=self._run, daemon=True)

    def _run(self) -> None:
        time.sleep(self.after)
        click.echo(f"  … stopping PostgreSQL for {self.seconds:.0f}s", err=True)
        self.dev.postgres.down()
        time.sleep(self.seconds)
        self.dev.postgres.up()
        click.echo("  … PostgreSQL is back", err=True)

    def __enter__(self) -> PostgresOutage:
        self._thread.start()
        return self

    def __exit__(self, *exc: object) -> None:
        self._thread.join(120)


def burst(
    base: Settings,
    jobs: int,
    log_dir: Path,
    concurrency: int = 8,
    rate: float = 0.0,
    outage: bool = False,
) -> dict[str, Any]:
    """``jobs`` posted in batches of 100, flat out (or at ``rate`` jobs/s), while one
    streams worker and one engine run: ingest latency, lag, drain, memory, nothing lost.
    ``outage``: PostgreSQL is stopped for 5 s two seconds into the burst."""
    stack = _stack(base, log_dir, "burst")
    assert stack.db is not None
    db = stack.db
    try:
        stack.start_ingest()
        stack.start_worker()
        stack.start_engine()
        with Sampler(stack, progress=True) as sampler:
            with PostgresOutage(base) if outage else contextlib.nullcontext():
                load = _loadgen(
                    stack, jobs, 100, concurrency, "burst_", log_dir / "load.json", rate=rate
                )
            burst_end = time.monotonic()
            _wait_for(
                "instances created, lag 0",
                lambda: count_instances(db) if sampler.lag == 0 else 0,
                load["accepted"],
                600,
            )
            drain = time.monotonic() - burst_end
            complete = count_instances(db, InstanceStatus.COMPLETE)
            all_done = drain + _wait_complete(stack, load["accepted"], 600)
        created = count_instances(db)
        return {
            "scenario": "burst-paced" if rate else "burst",
            "jobs": jobs,
            "rate": rate,
            "load": load,
            "peak_lag": sampler.peak_lag,
            "drain_seconds_after_burst": drain,
            "instances_created": created,
            "lost": load["accepted"] - created,
            "complete_at_drain": complete,
            "all_complete_seconds_after_burst": all_done,
            "latency": e2e_latency(stack, "burst_"),
            "peak_rss_mb": sampler.peak_rss,
            "lag_series": sampler.series,
        }
    finally:
        stack.close()


def ingest(base: Settings, jobs: int, log_dir: Path) -> dict[str, Any]:
    """Closed loop (each client waits for its answer) at 1, 4 and 16 clients, batches of
    100 and of 1; then open loop at increasing offered load until saturation."""
    # The job-id trail on, as in production (the other scenarios log at WARNING).
    stack = _stack(
        base, log_dir, "ingest", ONCEFLOW_ADMIN_API_ENABLED="false", ONCEFLOW_LOG_LEVEL="INFO"
    )
    rows = []
    try:
        stack.start_ingest()
        for batch in (100, 1):
            for concurrency in (1, 4, 16):
                n = jobs if batch == 100 else max(200, jobs // 20)
                out = log_dir / f"ingest-{batch}-{concurrency}.json"
                rows.append(_loadgen(stack, n, batch, concurrency, f"i{batch}_{concurrency}_", out))
        for rate in (2000, 5000, 10000, 15000, 20000, 30000):
            n = max(1000, min(jobs, rate * 4))  # about four seconds at each step
            out = log_dir / f"ingest-rate-{rate}.json"
            rows.append(_loadgen(stack, n, 100, 32, f"r{rate}_", out, rate=rate))
        return {"scenario": "ingest", "runs": rows}
    finally:
        stack.close()


def _prefill(stack: Stack, jobs: int, workflow: str, prefix: str) -> None:
    """Create ``jobs`` queued instances directly (as the streams worker would)."""
    from onceflow.envelope import JobEnvelope
    from workflow_engine.model import Delivery
    from workflow_engine.store.writes import create_instances

    assert stack.db is not None
    for start in range(0, jobs, 1000):
        create_instances(
            stack.db,
            [
                Delivery(JobEnvelope(f"{prefix}{i:07d}", workflow, {"step_seconds": 0}), "t", 0, i)
                for i in range(start, min(jobs, start + 1000))
            ],
        )
    # Statistics that describe the backlog, as autovacuum's analyze gives a live table
    # within a minute: a run measures the engine, not the planner's guesses about a
    # table it has never seen. (The engine's statements no longer depend on them, but
    # PostgreSQL's other plans may: BENCHMARKS.md, "Lease checks by job id, claims sized
    # to the engine", has runs both ways.)
    with stack.db.begin() as conn:
        conn.execute(sa.text("ANALYZE onceflow_instances"))
        conn.execute(sa.text("ANALYZE onceflow_jobs"))


def engine(
    base: Settings,
    jobs: int,
    log_dir: Path,
    workflow: str = "noop-workflow",
    concurrencies: tuple[int, ...] = (16, 64, 128, 256, 512),
    engine_counts: tuple[int, ...] = (1, 2),
    inline_concurrencies: tuple[int, ...] = (64, 128, 256, 512),
) -> dict[str, Any]:
    """Three-step workflows completed per second from a pre-filled instances table, at
    each engine concurrency with each number of engine processes; then, with one engine,
    the same workflow with its steps run inline (``noop-inline-workflow``: no thread hop)
    at ``inline_concurrencies``."""
    grid = [(workflow, c, e) for c in concurrencies for e in engine_counts]
    grid += [("noop-inline-workflow", c, 1) for c in inline_concurrencies]
    rows = []
    for name, concurrency, engines in grid:
        rows.append(_engine_run(base, jobs, log_dir, name, concurrency, engines))
    return {"scenario": "engine", "runs": rows}


def _engine_run(
    base: Settings, jobs: int, log_dir: Path, workflow: str, concurrency: int, engines: int
) -> dict[str, Any]:
    stack = _stack(
        base,
        log_dir,
        f"engine{engines}c{concurrency}",
        ONCEFLOW_ENGINE_CONCURRENCY=str(concurrency),
    )
    try:
        _prefill(stack, jobs, workflow, "e")
        t0 = time.monotonic()
        for i in range(engines):
            stack.start_engine(f"engine-{i}")
        _wait_complete(stack, jobs, 600)
        wall = time.monotonic() - t0
        # The rate from the first claim to the last completion (engine start-up,
        # about a second, is not the engine's throughput).
        assert stack.db is not None
        span = max(run_span_seconds(stack.db), 1e-3)
        return {
            "workflow": workflow,
            "concurrency": concurrency,
            "engines": engines,
            "workflows": jobs,
            "wall_seconds": wall,
            "seconds": span,
            "workflows_per_second": jobs / span,
            "checkpoints_per_second": 3 * jobs / span,
        }
    finally:
        stack.close()


def _fill_topic(settings: Settings, jobs: int, dup_fraction: float) -> None:
    """Write ``jobs`` records straight to the jobs topic, ``dup_fraction`` of them
    re-sends of earlier ids."""
    from confluent_kafka import Producer

    from onceflow.envelope import JobEnvelope
    from producers.kafka import producer_config

    # Ingest's own producer settings (idempotent, acks=all, murmur2), batched harder.
    producer = Producer({**producer_config(settings), "linger.ms": 20})
    distinct = int(jobs * (1 - dup_fraction))
    for i in range(jobs):
        n = i if i < distinct else (i * 7919) % distinct  # re-sends of earlier ids
        env = JobEnvelope(f"q{n:08d}", "order-workflow", {"n": n})
        while True:
            try:
                producer.produce(
                    settings.jobs_topic, key=env.key(), value=env.encode(), headers=env.headers()
                )
                break
            except BufferError:
                producer.poll(0.1)
    producer.flush(60)


def _wait_group(settings: Settings, members: int, timeout: float = 120) -> None:
    """Wait until the consumer group is stable with ``members`` members."""
    from confluent_kafka import ConsumerGroupState
    from confluent_kafka.admin import AdminClient

    admin = AdminClient({"bootstrap.servers": settings.kafka_bootstrap_servers})
    deadline = time.monotonic() + timeout
    while time.monotonic() < deadline:
        try:
            group = admin.describe_consumer_groups([settings.consumer_group])[
                settings.consumer_group
            ].result(timeout=5)
            if group.state == ConsumerGroupState.STABLE and len(group.members) == members:
                return
        except Exception:
            pass
        time.sleep(0.5)
    raise TimeoutError(f"consumer group never had {members} stable members")


def _queue_run(
    base: Settings,
    jobs: int,
    log_dir: Path,
    dup_fraction: float,
    partitions: int = 4,
    workers: int = 1,
) -> dict[str, Any]:
    """One queue-to-instance measurement. With one worker the topic is filled first;
    with several, they join the group first (no rebalances mid-run), then it is filled."""
    name = f"queue{int(dup_fraction * 100)}-p{partitions}w{workers}"
    stack = _stack(base, log_dir, name, partitions)
    assert stack.db is not None
    db = stack.db
    try:
        assert stack.settings is not None
        if workers == 1:
            _fill_topic(stack.settings, jobs, dup_fraction)
        for w in range(workers):
            stack.start_worker(f"streams-{w}")
        if workers > 1:
            _wait_group(stack.settings, workers)
            _fill_topic(stack.settings, jobs, dup_fraction)
        _wait_for("records consumed", lambda: consumption(db).records, jobs, 600)
        span = receipt_span_seconds(db)
        return {
            "records": jobs,
            "duplicate_fraction": dup_fraction,
            "partitions": partitions,
            "workers": workers,
            "instances": count_instances(db),
            "seconds": span,
            "records_per_second": jobs / span if span else 0.0,
        }
    finally:
        stack.close()


def queue(base: Settings, jobs: int, log_dir: Path) -> dict[str, Any]:
    """Instances created per second by one streams worker from a pre-filled topic,
    without and with 30% duplicates."""
    return {
        "scenario": "queue",
        "runs": [_queue_run(base, jobs, log_dir, dup) for dup in (0.0, 0.3)],
    }


def scale(base: Settings, jobs: int, log_dir: Path) -> dict[str, Any]:
    """How the partition-bound hop and the engine grow with processes, with CPU, WAL
    and commits per job (:mod:`onceflow_tools.scaling`, which builds on this module)."""
    from onceflow_tools import scaling

    return scaling.scale(base, jobs, log_dir)


# DBOS lives in its own virtualenv: dbos >= 3.3 needs croniter >= 6, which faust's
# ``mode`` refuses (croniter < 6), so it never enters onceflow's own environment.
DBOS_REQUIREMENT = "dbos==3.4.0"
DBOS_TUNED_POLL = 0.05
# (label, --mode, queue poll s, name in the table): the queue at its default poll and
# tuned, then DBOS's no-queue paths (DBOS.start_workflow, a direct workflow call).
DBOS_RUNS = (
    ("dbos_default", "queue", 1.0, "DBOS queue, 1 s poll"),
    ("dbos_tuned", "queue", DBOS_TUNED_POLL, "DBOS queue, 0.05 s poll"),
    ("dbos_start", "start", 1.0, "DBOS start_workflow"),
    ("dbos_direct", "direct", 1.0, "DBOS direct call"),
)


def dbos_python(state_dir: Path) -> Path:
    """The interpreter of a virtualenv holding DBOS Transact (made on first use)."""
    venv = (state_dir / "dbos-venv").resolve()
    python = venv / "bin" / "python"
    stamp = venv / ".installed"
    if not stamp.exists() or stamp.read_text() != DBOS_REQUIREMENT:
        click.echo(f"installing {DBOS_REQUIREMENT} into {venv}…", err=True)
        subprocess.run([sys.executable, "-m", "venv", "--clear", str(venv)], check=True)
        subprocess.run(
            [str(python), "-m", "pip", "install", "-q", DBOS_REQUIREMENT, "orjson"], check=True
        )
        stamp.write_text(DBOS_REQUIREMENT)
    return python


def _run_dbos(
    base: Settings,
    jobs: int,
    concurrency: int,
    poll: float,
    light: int,
    rate: float,
    out: Path,
    mode: str = "queue",
) -> dict[str, Any]:
    script = Path(__file__).parent / "baselines" / "dbos_bench.py"
    subprocess.run(
        [
            str(dbos_python(base.state_dir)),
            str(script),
            "--database-url",
            base.database_url,
            "--mode",
            mode,
            "--jobs",
            str(jobs),
            "--concurrency",
            str(concurrency),
            "--polling-interval",
            str(poll),
            "--light-jobs",
            str(light),
            "--light-rate",
            str(rate),
            "--out",
            str(out),
        ],
        check=True,
        stdout=subprocess.DEVNULL,
    )
    return orjson.loads(out.read_bytes())


def dbos(
    base: Settings,
    jobs: int,
    log_dir: Path,
    concurrencies: tuple[int, ...] = (16, 64),
    light: int = 100,
    rate: float = 10.0,
) -> dict[str, Any]:
    """DBOS Transact and onceflow side by side in one run on the same PostgreSQL: the
    same three no-op steps, the same number of workflows, the same concurrency. DBOS
    runs through its queue at the default poll (1 s) and tuned (0.05 s), then without a
    queue (``DBOS.start_workflow`` and a direct call, workflow id = job id), with at most
    ``concurrency`` workflows in flight. Light-load latency (at the first concurrency
    only): DBOS submits in-process; onceflow's figure is end to end (HTTP, Kafka, worker,
    engine)."""
    rows = []
    for concurrency in concurrencies:
        light_here = light if concurrency == concurrencies[0] else 0
        ours = engine(
            base,
            jobs,
            log_dir / f"ours-{concurrency}",
            concurrencies=(concurrency,),
            engine_counts=(1,),
        )
        row: dict[str, Any] = {"concurrency": concurrency, "onceflow": ours["runs"][0]}
        for label, mode, poll, _ in DBOS_RUNS:
            out = log_dir / f"{label}-{concurrency}.json"
            theirs = _run_dbos(base, jobs, concurrency, poll, light_here, rate, out, mode)
            row[label] = theirs
            row[f"ratio_vs_{label}"] = ours["runs"][0]["workflows_per_second"] / max(
                theirs["processing_workflows_per_second"], 1e-9
            )
        rows.append(row)
    ours_e2e = e2e(base, light, log_dir / "e2e", rate=rate)
    return {"scenario": "dbos", "jobs": jobs, "runs": rows, "onceflow_e2e": ours_e2e}


def _error_rate(load: dict[str, Any]) -> float:
    total = sum(load["statuses"].values())
    errors = sum(n for status, n in load["statuses"].items() if int(status) != 202)
    return errors / total if total else 0.0


def nobuffer(
    base: Settings, jobs: int, log_dir: Path, concurrency: int = 8, outage: bool = False
) -> dict[str, Any]:
    """The same burst, in the same run, against onceflow and against the no-buffer
    baseline (:mod:`onceflow_tools.baselines.direct_http`: the HTTP handler writes each job
    straight into PostgreSQL). While the baseline takes its burst an engine works
    through a backlog of as many workflows, so PostgreSQL is as busy as in onceflow's
    run, where the same engine runs the burst's own workflows. ``outage``: both bursts
    meet the same PostgreSQL outage (stopped for 5 s, two seconds in)."""
    from onceflow_tools.baselines.direct_http import stored_jobs

    ours = burst(base, jobs, log_dir / "ours", concurrency, outage=outage)
    stack = _stack(base, log_dir, "nobuffer")
    try:
        assert stack.settings is not None and stack.group is not None and stack.db is not None
        _prefill(stack, jobs, "noop-workflow", "backlog_")
        port = free_port()
        stack.group.start(
            "direct-http",
            "--database-url",
            stack.settings.database_url,
            "--port",
            str(port),
            module="onceflow_tools.baselines.direct_http",
        )
        url = f"http://127.0.0.1:{port}"
        stack.group.wait_http(f"{url}/healthz", timeout=60)
        stack.start_engine()
        with (
            Sampler(stack) as sampler,
            PostgresOutage(base) if outage else contextlib.nullcontext(),
        ):
            load = _loadgen(stack, jobs, 100, concurrency, "nb_", log_dir / "nb.json", url=url)
        stored = stored_jobs(stack.db, "nb")
        theirs = {
            "load": load,
            "stored": stored,
            "error_rate": _error_rate(load),
            "peak_rss_mb": sampler.peak_rss,
        }
    finally:
        stack.close()
    return {
        "scenario": "nobuffer-outage" if outage else "nobuffer",
        "jobs": jobs,
        "postgres_outage": outage,
        "onceflow": {
            "load": ours["load"],
            "error_rate": _error_rate(ours["load"]),
            "lost": ours["lost"],
        },
        "nobuffer": theirs,
    }


def _ms(seconds: float) -> str:
    return f"{seconds * 1000:.1f} ms"


def _latency_line(lat: dict[str, float]) -> str:
    return (
        f"submit-to-first-step p50 {lat['first_step_p50_ms']:.0f} ms, p99"
        f" {lat['first_step_p99_ms']:.0f} ms; submit-to-complete p50"
        f" {lat['complete_p50_ms']:.0f} ms, p99 {lat['complete_p99_ms']:.0f} ms"
        f" ({lat['jobs']:.0f} jobs)"
    ) + _parts(lat)


def _parts(lat: dict[str, float]) -> str:
    """The first step's path in parts, p50 / p99 (older result files lack them)."""
    if "to_worker_p50_ms" not in lat:
        return ""
    part = "\n    {}: p50 {:.1f} ms, p99 {:.1f} ms"
    return "".join(
        part.format(name, lat[f"{key}_p50_ms"], lat[f"{key}_p99_ms"])
        for name, key in (
            ("submit -> Kafka record time (ingest to its produce call)", "to_kafka"),
            ("-> the worker's transaction (linger, acks, fetch, batch)", "to_worker"),
            ("-> first step (commit, engine wake-up, claim)", "to_step"),
        )
    )


def _render_burst(result: dict[str, Any]) -> list[str]:
    load = result["load"]
    rss = ", ".join(f"{k} {v:.0f} MB" for k, v in sorted(result["peak_rss_mb"].items()))
    offered = f"{result['rate']:.0f} jobs/s" if result.get("rate") else "flat out"
    return [
        f"burst: {result['jobs']} jobs, batches of 100, {load['concurrency']} clients,"
        f" offered {offered}",
        f"  accepted {load['accepted']} in {load['wall_seconds']:.1f}s"
        f" ({load['accepted_per_second']:.0f} jobs/s); statuses {load['statuses']}",
        f"  ingest latency p50 {_ms(load['latency_p50'])}, p99 {_ms(load['latency_p99'])},"
        f" max {_ms(load['latency_max'])}",
        f"  peak consumer lag {result['peak_lag']}; drained"
        f" {result['drain_seconds_after_burst']:.1f}s after the burst",
        f"  instances created {result['instances_created']} (lost: {result['lost']});"
        f" complete when the lag drained: {result['complete_at_drain']}; all complete"
        f" {result['all_complete_seconds_after_burst']:.1f}s after the burst",
        f"  {_latency_line(result['latency'])}",
        f"  peak RSS: {rss}",
    ]


Column = tuple[str, Callable[[dict[str, Any]], str]]


def _table(title: str, columns: list[Column], rows: list[dict[str, Any]]) -> list[str]:
    """A right-aligned text table, each column as wide as its header or widest cell."""
    cells = [[cell(row) for _, cell in columns] for row in rows]
    widths = [max([len(h)] + [len(c[i]) for c in cells]) for i, (h, _) in enumerate(columns)]
    line = "  ".join
    return [
        f"{title}: " + line(h.rjust(w) for (h, _), w in zip(columns, widths, strict=True)),
        *(
            " " * (len(title) + 2) + line(c.rjust(w) for c, w in zip(cs, widths, strict=True))
            for cs in cells
        ),
    ]


def _render_ingest(result: dict[str, Any]) -> list[str]:
    return _table(
        "ingest",
        [
            ("batch", lambda r: str(r["batch"])),
            ("clients", lambda r: str(r["concurrency"])),
            ("offered/s", lambda r: f"{r['rate']:.0f}" if r.get("rate") else "max"),
            ("jobs/s", lambda r: f"{r['accepted_per_second']:.0f}"),
            ("p50 ms", lambda r: f"{r['latency_p50'] * 1000:.1f}"),
            ("p99 ms", lambda r: f"{r['latency_p99'] * 1000:.1f}"),
            ("max ms", lambda r: f"{r['latency_max'] * 1000:.1f}"),
        ],
        result["runs"],
    )


def _render_queue(result: dict[str, Any]) -> list[str]:
    return _table(
        "queue",
        [
            ("records", lambda r: str(r["records"])),
            ("duplicates", lambda r: f"{r['duplicate_fraction']:.0%}"),
            ("instances", lambda r: str(r["instances"])),
            ("seconds", lambda r: f"{r['seconds']:.2f}"),
            ("records/s", lambda r: f"{r['records_per_second']:.0f}"),
        ],
        result["runs"],
    )


def _render_engine(result: dict[str, Any]) -> list[str]:
    return _table(
        "engine",
        [
            ("workflow", lambda r: r["workflow"]),
            ("concurrency", lambda r: str(r["concurrency"])),
            ("engines", lambda r: str(r["engines"])),
            ("workflows", lambda r: str(r["workflows"])),
            ("workflows/s", lambda r: f"{r['workflows_per_second']:.0f}"),
            ("checkpoints/s", lambda r: f"{r['checkpoints_per_second']:.0f}"),
        ],
        result["runs"],
    )


def _render_e2e(result: dict[str, Any]) -> list[str]:
    return [
        f"e2e: {result['load']['accepted']} jobs at {result['rate']:.0f}/s, one per request",
        f"  {_latency_line(result['latency'])}",
    ]


def _render_nobuffer(result: dict[str, Any]) -> list[str]:
    outage = ", PostgreSQL stopped for 5 s during it" if result.get("postgres_outage") else ""
    lines = [f"nobuffer: the same burst of {result['jobs']} jobs, batches of 100{outage}"]
    lines.append("  system      jobs/s   p50 ms   p99 ms   max ms  error rate")
    for name in ("onceflow", "nobuffer"):
        load = result[name]["load"]
        lines.append(
            f"  {name:<9} {load['accepted_per_second']:>8.0f} {load['latency_p50'] * 1000:>8.1f}"
            f" {load['latency_p99'] * 1000:>8.1f} {load['latency_max'] * 1000:>8.1f}"
            f"  {result[name]['error_rate']:>9.1%}"
        )
    return lines


def _render_dbos(result: dict[str, Any]) -> list[str]:
    lines = [f"dbos: {result['jobs']} three-step no-op workflows, same PostgreSQL"]
    lines.append("  concurrency  system                    workflows/s  ratio (onceflow / it)")
    for r in result["runs"]:
        ours = r["onceflow"]["workflows_per_second"]
        lines.append(f"  {r['concurrency']:>11}  {'onceflow engine':<24}  {ours:>11.0f}")
        for label, _, _, name in DBOS_RUNS:
            if label not in r:  # older result files lack the no-queue runs
                continue
            theirs = r[label]["processing_workflows_per_second"]
            lines.append(
                f"  {r['concurrency']:>11}  {name:<24}  {theirs:>11.0f}"
                f"  {r[f'ratio_vs_{label}']:>6.1f}x"
            )
    lat = result["onceflow_e2e"]["latency"]
    lines.append(f"  light load, onceflow end to end: {_latency_line(lat)}")
    for label, _, _, _ in DBOS_RUNS:
        if label not in result["runs"][0]:
            continue
        lt = result["runs"][0][label]["light"]
        lines.append(
            f"  light load, {label} (in-process submit): submit-to-first-step p50"
            f" {lt['first_step_p50_ms'] or 0:.0f} ms, p99 {lt['first_step_p99_ms'] or 0:.0f} ms;"
            f" submit-to-complete p50 {lt['complete_p50_ms'] or 0:.0f} ms,"
            f" p99 {lt['complete_p99_ms'] or 0:.0f} ms"
        )
    return lines


def _render_scale(result: dict[str, Any]) -> list[str]:
    from onceflow_tools import scaling

    return scaling.render(result)


RENDERERS = {
    "burst": _render_burst,
    "burst-paced": _render_burst,
    "ingest": _render_ingest,
    "queue": _render_queue,
    "engine": _render_engine,
    "e2e": _render_e2e,
    "nobuffer": _render_nobuffer,
    "nobuffer-outage": _render_nobuffer,
    "dbos": _render_dbos,
    "scale": _render_scale,
}


def console_list(base: Settings, jobs: int, log_dir: Path) -> dict[str, Any]:
    """Time the console's list and count queries on a big table (no processes)."""
    import statistics
    from datetime import UTC, datetime, timedelta

    from onceflow_tools.stack import database_url_for, recreate_database
    from workflow_engine.store import make_engine, migrate, views

    rows = jobs * 50
    name = f"onceflow_bench_console_{uuid.uuid4().hex[:6]}"
    db = make_engine(recreate_database(base.database_url, name), pool_size=1)
    try:
        migrate(db)
        started = time.perf_counter()
        seed_for_bench(db, rows, tenants=1000)
        add_rare_old_tenant(db)
        seed_seconds = time.perf_counter() - started
        everything = views.InstanceFilter()
        half = views.list_page(
            db, views.InstanceFilter(created_to=datetime.now(UTC) - timedelta(days=15)), limit=1
        ).rows
        deep = views.encode_cursor("created", half[0].created_at, half[0].job_id) if half else None
        errored = views.InstanceFilter(workflow="bench-wf-1", status=InstanceStatus.ERRORED)
        # searchable attributes (migration 0022): one tenant in 1000, and with a tier
        tenant = views.InstanceFilter.parse("attr.tenant=t7")
        tenant_tier = views.InstanceFilter.parse("attr.tenant=t7,attr.tier=gold")
        tier = views.InstanceFilter.parse("attr.tier=gold")  # a third of them
        rare = views.InstanceFilter.parse("attr.tenant=rare")  # the 5 oldest
        queries: list[tuple[str, Callable[[], object]]] = [
            ("list first page", lambda: views.list_page(db, everything)),
            ("list deep page (middle)", lambda: views.list_page(db, everything, cursor=deep)),
            ("list first page, sort=updated", lambda: views.list_page(db, everything, "updated")),
            ("list workflow+status page", lambda: views.list_page(db, errored)),
            ("count all", lambda: views.count_matching(db, everything)),
            ("count all, cap 10000", lambda: views.count_matching(db, everything, cap=10000)),
            ("count workflow+status", lambda: views.count_matching(db, errored)),
            ("list attr tenant (1 in 1000) page", lambda: views.list_page(db, tenant)),
            ("list attr tenant+tier page", lambda: views.list_page(db, tenant_tier)),
            ("list attr tier (1 in 3) page", lambda: views.list_page(db, tier)),
            ("list attr rare old tenant (5) page", lambda: views.list_page(db, rare)),
            ("count attr tenant", lambda: views.count_matching(db, tenant)),
            ("count attr tier (1 in 3)", lambda: views.count_matching(db, tier)),
        ]
        timings = []
        for label, query in queries:
            runs = []
            for _ in range(5):
                t0 = time.perf_counter()
                query()
                runs.append((time.perf_counter() - t0) * 1000)
            timings.append(
                {"query": label, "median_ms": statistics.median(runs), "max_ms": max(runs)}
            )
        return {
            "scenario": "console-list",
            "rows": rows,
            "seed_seconds": seed_seconds,
            "timings": timings,
        }
    finally:
        db.dispose()
        admin = make_engine(database_url_for(base.database_url, "postgres"), pool_size=1)
        with admin.connect().execution_options(isolation_level="AUTOCOMMIT") as conn:
            conn.exec_driver_sql(f'DROP DATABASE IF EXISTS "{name}" WITH (FORCE)')
        admin.dispose()


def _render_console_list(result: dict[str, Any]) -> list[str]:
    return [
        f"console-list: {result['rows']} instances seeded in {result['seed_seconds']:.1f}s",
        *_table(
            "  queries",
            [
                ("query", lambda r: r["query"]),
                ("median ms", lambda r: f"{r['median_ms']:.1f}"),
                ("max ms", lambda r: f"{r['max_ms']:.1f}"),
            ],
            result["timings"],
        ),
    ]


RENDERERS["console-list"] = _render_console_list


def _engine_flow_control(base: Settings, jobs: int, log_dir: Path) -> dict[str, Any]:
    from onceflow_tools import flowbench  # imports this module: loaded late

    return flowbench.engine_flow_control(base, jobs, log_dir)


def _render_engine_flow_control(result: dict[str, Any]) -> list[str]:
    from onceflow_tools import flowbench

    return flowbench.render(result)


RENDERERS["engine-flow-control"] = _render_engine_flow_control


def _engine_policies(base: Settings, jobs: int, log_dir: Path) -> dict[str, Any]:
    from onceflow_tools import policy_bench  # imports this module: loaded late

    return policy_bench.engine_policies(base, jobs, log_dir)


def _render_engine_policies(result: dict[str, Any]) -> list[str]:
    from onceflow_tools import policy_bench

    return policy_bench.render(result)


RENDERERS["engine-policies"] = _render_engine_policies


def _history(base: Settings, jobs: int, log_dir: Path) -> dict[str, Any]:
    """History before/after partitioning (onceflow_tools.history_bench), ``jobs`` rows."""
    from onceflow_tools import history_bench

    return history_bench.history(base.database_url, jobs)


def _render_history(result: dict[str, Any]) -> list[str]:
    from onceflow_tools import history_bench

    return history_bench.render(result)


RENDERERS["history"] = _render_history


def _soak(base: Settings, jobs: int, log_dir: Path) -> dict[str, Any]:
    """Each process's memory round by round through ``jobs`` (onceflow_tools.soak)."""
    from onceflow_tools import soak

    return soak.soak(base, jobs, log_dir)


def _render_soak(result: dict[str, Any]) -> list[str]:
    from onceflow_tools import soak

    return soak.render(result)


RENDERERS["soak"] = _render_soak


def _claim(base: Settings, jobs: int, log_dir: Path) -> dict[str, Any]:
    """One claim's cost on a mixed backlog (onceflow_tools.claimbench)."""
    from onceflow_tools import claimbench

    return claimbench.measure(base.database_url, jobs, rounds=100)


def _render_claim(result: dict[str, Any]) -> list[str]:
    from onceflow_tools import claimbench

    return claimbench.render(result)


RENDERERS["claim"] = _render_claim


def render(result: dict[str, Any]) -> str:
    return "\n".join(RENDERERS[result["scenario"]](result))


SCENARIOS = {
    "burst": burst,
    "ingest": ingest,
    "queue": queue,
    "engine": engine,
    "e2e": e2e,
    "nobuffer": nobuffer,
    "dbos": dbos,
    "scale": scale,
    "burst-paced": lambda base, jobs, log_dir: burst(base, jobs, log_dir, rate=5000),
    "nobuffer-outage": lambda base, jobs, log_dir: nobuffer(base, jobs, log_dir, outage=True),
    "console-list": console_list,
    "engine-flow-control": _engine_flow_control,
    "engine-policies": _engine_policies,
    "history": _history,
    "claim": _claim,
    "soak": _soak,
}


def run_bench(base: Settings, scenarios: list[str], jobs: int, out: Path) -> list[dict]:
    results = []
    for name in scenarios:
        log_dir = (base.state_dir / "bench" / f"{name}-{int(time.time())}").resolve()
        log_dir.mkdir(parents=True, exist_ok=True)
        click.echo(f"running {name} ({jobs} jobs)…", err=True)
        result = SCENARIOS[name](base, jobs, log_dir)
        click.echo(render(result))
        results.append(result)
    out.write_bytes(orjson.dumps(results, option=orjson.OPT_INDENT_2))
    return results
