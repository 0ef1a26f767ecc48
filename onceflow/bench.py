"""``onceflow bench``: figures from the real processes on the local services.

Scenarios (each prints a table and writes JSON):

* ``burst``: N jobs posted as fast as a separate load process can, far above what the
  engine completes: ingest latency during the burst, peak consumer lag, time for the
  lag to drain after the burst, peak RSS of every process, and that every accepted job
  got its instance (nothing lost).
* ``ingest``: jobs/s accepted and request latency at batch sizes 100 and 1, with
  increasing client concurrency.
* ``queue``: instances created per second by one streams worker from a pre-filled
  topic, without and with 30% duplicates (from the first to the last database row).
* ``engine``: three-step workflows completed per second with 1 and 2 engine processes.

Benchmarks are not tests: CI runs only a tiny smoke size to keep the harness working.
"""

from __future__ import annotations

import os
import subprocess
import sys
import threading
import time
import uuid
from pathlib import Path
from typing import Any

import click
import orjson

from onceflow.lag import consumer_lag
from onceflow.settings import Settings
from onceflow.stack import Stack


def rss_mb(pid: int) -> float:
    try:
        for line in Path(f"/proc/{pid}/status").read_text().splitlines():
            if line.startswith("VmRSS:"):
                return int(line.split()[1]) / 1024
    except OSError:
        pass
    return 0.0


class Sampler:
    """Samples consumer lag and each process's RSS twice a second, keeping peaks."""

    def __init__(self, stack: Stack) -> None:
        self.stack = stack
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
            for name, proc in list(self.stack.group.procs.items()):
                self.peak_rss[name] = max(self.peak_rss.get(name, 0.0), rss_mb(proc.pid))
            self._stop.wait(0.5)


def _loadgen(
    stack: Stack, jobs: int, batch: int, concurrency: int, prefix: str, out: Path, rate: float = 0.0
) -> dict[str, Any]:
    subprocess.run(
        [
            sys.executable,
            "-m",
            "onceflow.loadgen",
            "--url",
            stack.ingest_url,
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
            "--out",
            str(out),
        ],
        check=True,
        env={**os.environ, "ONCEFLOW_LOADGEN_KEY": stack.api_key},
    )
    return orjson.loads(out.read_bytes())


def _stack(base: Settings, log_dir: Path, name: str, **env: str) -> Stack:
    stack = Stack(base, f"bench-{name}-{uuid.uuid4().hex[:6]}", log_dir).prepare()
    stack.env.update(
        {"ONCEFLOW_INGEST_RATE_LIMIT_PER_SECOND": "0", "ONCEFLOW_LOG_LEVEL": "WARNING", **env}
    )
    if stack.group is not None:
        stack.group.env.update(stack.env)
    return stack


def burst(base: Settings, jobs: int, log_dir: Path, concurrency: int = 8) -> dict[str, Any]:
    stack = _stack(base, log_dir, "burst")
    try:
        stack.start_ingest()
        stack.start_worker()
        stack.start_engine()
        with Sampler(stack) as sampler:
            load = _loadgen(stack, jobs, 100, concurrency, "burst_", log_dir / "load.json")
            burst_end = time.monotonic()
            deadline = burst_end + 600
            while time.monotonic() < deadline:
                created = stack.scalar("SELECT count(*) FROM onceflow_instances")
                if created >= load["accepted"] and sampler.lag == 0:
                    break
                time.sleep(0.25)
            drain = time.monotonic() - burst_end
            complete = stack.scalar(
                "SELECT count(*) FROM onceflow_instances WHERE status = 'complete'"
            )
        created = stack.scalar("SELECT count(*) FROM onceflow_instances")
        return {
            "scenario": "burst",
            "jobs": jobs,
            "load": load,
            "peak_lag": sampler.peak_lag,
            "drain_seconds_after_burst": drain,
            "instances_created": created,
            "lost": load["accepted"] - created,
            "complete_at_drain": complete,
            "peak_rss_mb": sampler.peak_rss,
            "lag_series": sampler.series,
        }
    finally:
        stack.close()


def ingest(base: Settings, jobs: int, log_dir: Path) -> dict[str, Any]:
    stack = _stack(base, log_dir, "ingest", ONCEFLOW_ADMIN_API_ENABLED="false")
    rows = []
    try:
        stack.start_ingest()
        for batch in (100, 1):
            for concurrency in (1, 4, 16):
                n = jobs if batch == 100 else max(200, jobs // 20)
                out = log_dir / f"ingest-{batch}-{concurrency}.json"
                rows.append(_loadgen(stack, n, batch, concurrency, f"i{batch}_{concurrency}_", out))
        return {"scenario": "ingest", "runs": rows}
    finally:
        stack.close()


def engine(base: Settings, jobs: int, log_dir: Path) -> dict[str, Any]:
    from onceflow.envelope import JobEnvelope
    from workflow_engine.instances import Delivery, create_instances

    rows = []
    for engines in (1, 2):
        stack = _stack(base, log_dir, f"engine{engines}")
        try:
            assert stack.db is not None
            for start in range(0, jobs, 1000):
                create_instances(
                    stack.db,
                    [
                        Delivery(
                            JobEnvelope(f"e{i:07d}", "order-workflow", {"step_seconds": 0}),
                            "t",
                            0,
                            i,
                        )
                        for i in range(start, min(jobs, start + 1000))
                    ],
                )
            t0 = time.monotonic()
            for i in range(engines):
                stack.start_engine(f"engine-{i}")
            while (
                stack.scalar("SELECT count(*) FROM onceflow_instances WHERE status = 'complete'")
                < jobs
            ):
                time.sleep(0.2)
            wall = time.monotonic() - t0
            rows.append(
                {
                    "engines": engines,
                    "workflows": jobs,
                    "wall_seconds": wall,
                    "workflows_per_second": jobs / wall,
                    "checkpoints_per_second": 3 * jobs / wall,
                }
            )
        finally:
            stack.close()
    return {"scenario": "engine", "runs": rows}


def queue(base: Settings, jobs: int, log_dir: Path) -> dict[str, Any]:
    """Instances created per second by one streams worker from a pre-filled topic."""
    from confluent_kafka import Producer

    from onceflow.envelope import JobEnvelope

    rows = []
    for dup_fraction in (0.0, 0.3):
        stack = _stack(base, log_dir, f"queue{int(dup_fraction * 100)}")
        try:
            assert stack.settings is not None
            producer = Producer(
                {
                    "bootstrap.servers": stack.settings.kafka_bootstrap_servers,
                    "partitioner": "murmur2_random",
                    "linger.ms": 20,
                    "enable.idempotence": True,
                    "acks": "all",
                }
            )
            distinct = int(jobs * (1 - dup_fraction))
            for i in range(jobs):
                n = i if i < distinct else (i * 7919) % distinct  # re-sends of earlier ids
                env = JobEnvelope(f"q{n:08d}", "order-workflow", {"n": n})
                while True:
                    try:
                        producer.produce(
                            stack.settings.jobs_topic,
                            key=env.key(),
                            value=env.encode(),
                            headers=env.headers(),
                        )
                        break
                    except BufferError:
                        producer.poll(0.1)
            producer.flush(60)
            stack.start_worker()
            deadline = time.monotonic() + 600
            consumed = 0
            while time.monotonic() < deadline:
                consumed = stack.scalar(
                    "SELECT (SELECT count(*) FROM onceflow_instances)"
                    " + (SELECT count(*) FROM onceflow_duplicate_deliveries)"
                )
                if consumed >= jobs:
                    break
                time.sleep(0.25)
            span = (
                float(
                    stack.scalar(
                        "SELECT 1000 * extract(epoch FROM max(t) - min(t)) FROM ("
                        " SELECT received_at AS t FROM onceflow_jobs UNION ALL"
                        " SELECT received_at FROM onceflow_duplicate_deliveries) x"
                    )
                )
                / 1000
            )
            rows.append(
                {
                    "records": jobs,
                    "duplicate_fraction": dup_fraction,
                    "instances": stack.scalar("SELECT count(*) FROM onceflow_instances"),
                    "seconds": span,
                    "records_per_second": jobs / span if span else 0.0,
                }
            )
        finally:
            stack.close()
    return {"scenario": "queue", "runs": rows}


def render(result: dict[str, Any]) -> str:
    kind = result["scenario"]
    if kind == "burst":
        load = result["load"]
        rss = ", ".join(f"{k} {v:.0f} MB" for k, v in sorted(result["peak_rss_mb"].items()))
        return "\n".join(
            [
                f"burst: {result['jobs']} jobs, batches of 100, {load['concurrency']} clients",
                f"  accepted {load['accepted']} in {load['wall_seconds']:.1f}s"
                f" ({load['accepted_per_second']:.0f} jobs/s); statuses {load['statuses']}",
                f"  ingest latency p50 {load['latency_p50'] * 1000:.1f} ms, p99"
                f" {load['latency_p99'] * 1000:.1f} ms, max {load['latency_max'] * 1000:.1f} ms",
                f"  peak consumer lag {result['peak_lag']}; drained"
                f" {result['drain_seconds_after_burst']:.1f}s after the burst",
                f"  instances created {result['instances_created']} (lost: {result['lost']});"
                f" complete when the lag drained: {result['complete_at_drain']}",
                f"  peak RSS: {rss}",
            ]
        )
    if kind == "ingest":
        lines = ["ingest: batch  clients   jobs/s   p50 ms   p99 ms   max ms"]
        for r in result["runs"]:
            lines.append(
                f"        {r['batch']:>5}  {r['concurrency']:>7}  "
                f"{r['accepted_per_second']:>7.0f}  {r['latency_p50'] * 1000:>7.1f}  "
                f"{r['latency_p99'] * 1000:>7.1f}  {r['latency_max'] * 1000:>7.1f}"
            )
        return "\n".join(lines)
    if kind == "queue":
        lines = ["queue: records  duplicates  instances  seconds  records/s"]
        for r in result["runs"]:
            lines.append(
                f"       {r['records']:>7}  {r['duplicate_fraction']:>10.0%}  "
                f"{r['instances']:>9}  {r['seconds']:>7.2f}  "
                f"{r['records_per_second']:>9.0f}"
            )
        return "\n".join(lines)
    lines = ["engine: engines  workflows  workflows/s  checkpoints/s"]
    for r in result["runs"]:
        lines.append(
            f"        {r['engines']:>7}  {r['workflows']:>9}  "
            f"{r['workflows_per_second']:>11.0f}  {r['checkpoints_per_second']:>13.0f}"
        )
    return "\n".join(lines)


SCENARIOS = {"burst": burst, "ingest": ingest, "queue": queue, "engine": engine}


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
