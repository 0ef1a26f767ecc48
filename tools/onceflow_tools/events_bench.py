"""The cost of lifecycle events (issue 25): the engine with events on and off, in
interleaved pairs, and the event delay from the change's transaction to the topic.

``python -m onceflow_tools.events_bench --jobs 10000 --pairs 4 --out r.json``: each run
is ``bench._engine_run``'s setup (a fresh database and topics, ``jobs`` pre-filled
three-step no-op workflows, one engine at ``--concurrency``), with
``ONCEFLOW_LIFECYCLE_EVENTS`` on (the engine runs the relay, or ``--relay process``:
``onceflow relay`` beside it) or off, strictly alternating (on, off, on, off ...; the
``--workflow`` modes, threaded and inline steps by default, interleaved too) so that a
noisy neighbour hits both; the summary gives each pair's on/off ratio. Per run:
workflows/s (first start to last finish, the database's clock), the engine process's CPU
per workflow (``/proc``, with the relay process's when it runs), the CPU of the
PostgreSQL backends of the run's database per workflow (:class:`DatabaseCpu`), the
load average; with events on, the delay from each event's time (its
transaction's ``now()``) to its record's timestamp on the topic (the producer's create
time, set when the relay sends it), p50 and p99."""

from __future__ import annotations

import os
import statistics
import threading
import time
import uuid
from datetime import datetime
from pathlib import Path
from typing import Any

import click
import orjson

from onceflow.settings import Settings, get_settings
from onceflow_tools.bench import _prefill, _stack, _wait_complete
from onceflow_tools.figures import run_span_seconds
from onceflow_tools.processes import free_port

_TICKS = os.sysconf("SC_CLK_TCK")


def _cpu_seconds(pid: int) -> float:
    fields = Path(f"/proc/{pid}/stat").read_text().rsplit(")", 1)[1].split()
    return (int(fields[11]) + int(fields[12])) / _TICKS  # utime + stime


class DatabaseCpu:
    """The CPU of the PostgreSQL processes working for one database (its backends and
    autovacuum workers, found by their process title, ``postgres: user db ...``), read
    from ``/proc`` twice a second so that a backend that exits during the run still
    counts up to its last sample. The server's shared processes (WAL writer,
    checkpointer) serve every database on the box and are not counted."""

    def __init__(self, database: str) -> None:
        self.database = database
        self.start: dict[int, float] = {}
        self.last: dict[int, float] = {}
        self._stop = threading.Event()
        self._thread = threading.Thread(target=self._run, daemon=True)

    def _sample(self) -> dict[int, float]:
        found: dict[int, float] = {}
        for entry in Path("/proc").iterdir():
            if not entry.name.isdigit():
                continue
            try:
                title = (entry / "cmdline").read_bytes().replace(b"\0", b" ").decode()
                if title.startswith("postgres:") and f" {self.database} " in f"{title} ":
                    found[int(entry.name)] = _cpu_seconds(int(entry.name))
            except (OSError, ValueError):
                continue
        return found

    def _run(self) -> None:
        while not self._stop.wait(0.5):
            self.last.update(self._sample())

    def __enter__(self) -> DatabaseCpu:
        self.start = self._sample()
        self.last = dict(self.start)
        self._thread.start()
        return self

    def __exit__(self, *exc: object) -> None:
        self._stop.set()
        self._thread.join(5)
        self.last.update(self._sample())

    def seconds(self) -> float:
        return sum(cpu - self.start.get(pid, 0.0) for pid, cpu in self.last.items())


def _delays_ms(settings: Settings) -> list[float]:
    """Event time -> record timestamp, per record of the events topic."""
    from confluent_kafka import OFFSET_BEGINNING, Consumer, TopicPartition

    topic = settings.events_topic
    consumer = Consumer(
        {
            "bootstrap.servers": settings.kafka_bootstrap_servers,
            "group.id": f"bench-{uuid.uuid4().hex[:6]}",
            "enable.auto.commit": False,
        }
    )
    try:
        parts = consumer.list_topics(topic, timeout=10).topics[topic].partitions
        ends = {p: consumer.get_watermark_offsets(TopicPartition(topic, p))[1] for p in parts}
        consumer.assign([TopicPartition(topic, p, OFFSET_BEGINNING) for p in parts])
        left = {p: e for p, e in ends.items() if e > 0}
        delays: list[float] = []
        deadline = time.monotonic() + 120
        while left and time.monotonic() < deadline:
            msg = consumer.poll(0.5)
            if msg is None or msg.error() is not None:
                continue
            value = msg.value() or b"{}"
            at = datetime.fromisoformat(orjson.loads(value)["time"].replace("Z", "+00:00"))
            delays.append(msg.timestamp()[1] - at.timestamp() * 1000)
            offset, partition = msg.offset() or 0, msg.partition() or 0
            if offset + 1 >= left.get(partition, 0):
                left.pop(partition, None)
        return delays
    finally:
        consumer.close()


def _pct(values: list[float], q: float) -> float:
    ordered = sorted(values)
    return ordered[min(len(ordered) - 1, int(q * len(ordered)))] if ordered else float("nan")


def engine_run(
    base: Settings,
    jobs: int,
    log_dir: Path,
    events: bool,
    concurrency: int,
    relay: bool = True,
    relay_process: bool = False,
    workflow: str = "noop-workflow",
) -> dict[str, Any]:
    """One run; ``relay_process``: the relay as its own process (``onceflow relay``)
    beside an engine without one, its CPU counted with the engine's."""
    env = {
        "ONCEFLOW_ENGINE_CONCURRENCY": str(concurrency),
        "ONCEFLOW_LIFECYCLE_EVENTS": str(events).lower(),
        "ONCEFLOW_EVENTS_RELAY": str(relay and not relay_process).lower(),
    }
    stack = _stack(base, log_dir, f"events-{'on' if events else 'off'}", 4, **env)
    try:
        if not events:
            assert stack.settings is not None
            # the pre-fill too: no outbox row at all in an "off" run
            from workflow_engine.store import make_engine

            url = stack.settings.database_url
            stack.db = make_engine(url, pool_size=2, lifecycle_events=False)
        _prefill(stack, jobs, workflow, "e")
        assert stack.group is not None
        if relay_process:
            port = free_port()
            stack.group.start("relay", "relay", env={"ONCEFLOW_RELAY_METRICS_PORT": str(port)})
            stack.group.wait_http(f"http://127.0.0.1:{port}/metrics", timeout=60)
        assert stack.settings is not None
        database = stack.settings.database_url.rsplit("/", 1)[1].split("?")[0]
        with DatabaseCpu(database) as pg:
            stack.start_engine("engine")
            pids = {name: proc.pid for name, proc in stack.group.procs.items()}
            cpu0 = {name: _cpu_seconds(pid) for name, pid in pids.items()}
            _wait_complete(stack, jobs, 600)
            if events and relay:
                while stack.scalar("SELECT count(*) FROM onceflow_outbox") > 0:
                    time.sleep(0.05)
            used = {name: _cpu_seconds(pid) - cpu0[name] for name, pid in pids.items()}
            cpu = sum(used.values())
        assert stack.db is not None
        span = max(run_span_seconds(stack.db), 1e-3)
        row: dict[str, Any] = {
            "workflow": workflow,
            "events": events,
            "relay": "process" if relay_process else relay,
            "concurrency": concurrency,
            "workflows": jobs,
            "workflows_per_second": jobs / span,
            "engine_cpu_ms_per_workflow": 1000 * cpu / jobs,
            "postgres_cpu_ms_per_workflow": 1000 * pg.seconds() / jobs,
            # the "relay" process's share of engine_cpu (0 with the relay in the engine)
            "relay_process_cpu_ms_per_workflow": 1000 * used.get("relay", 0.0) / jobs,
            "load_average": os.getloadavg()[0],
        }
        if events and relay:
            while stack.scalar("SELECT count(*) FROM onceflow_outbox") > 0:
                time.sleep(0.2)
            assert stack.settings is not None
            delays = _delays_ms(stack.settings)
            row.update(
                events_on_topic=len(delays),
                delay_p50_ms=_pct(delays, 0.5),
                delay_p99_ms=_pct(delays, 0.99),
            )
        return row
    finally:
        stack.close()


def _summary(runs: list[dict[str, Any]]) -> dict[str, Any]:
    """Per pair (an "on" run and the "off" run right after it) the ratio on/off of
    workflows/s; means of the rest. Ratios, not absolute rates, are what a noisy box
    can compare."""
    on = [r for r in runs if r["events"]]
    off = [r for r in runs if not r["events"]]
    ratios = [
        a["workflows_per_second"] / b["workflows_per_second"] for a, b in zip(on, off, strict=True)
    ]
    summary: dict[str, Any] = {"pair_ratios": ratios, "throughput_ratio": statistics.mean(ratios)}
    for key in (
        "workflows_per_second",
        "engine_cpu_ms_per_workflow",
        "postgres_cpu_ms_per_workflow",
        "load_average",
    ):
        summary[f"on_{key}"] = statistics.mean(r[key] for r in on)
        summary[f"off_{key}"] = statistics.mean(r[key] for r in off)
    return summary


@click.command()
@click.option("--jobs", type=int, default=10000)
@click.option("--pairs", type=int, default=4)
@click.option("--concurrency", type=int, default=64)
@click.option(
    "--workflow",
    "workflows",
    multiple=True,
    default=("noop-workflow", "noop-inline-workflow"),
    help="Workflows to run (threaded and inline steps by default), interleaved.",
)
@click.option(
    "--relay",
    "relay_mode",
    type=click.Choice(["engine", "process"]),
    default="engine",
    help="Events on: the relay in the engine (the default) or as its own process.",
)
@click.option("--out", type=click.Path(path_type=Path), default=Path("events-bench.json"))
def main(
    jobs: int,
    pairs: int,
    concurrency: int,
    workflows: tuple[str, ...],
    relay_mode: str,
    out: Path,
) -> None:
    base = get_settings()
    log_dir = (base.state_dir / "bench" / f"events-{int(time.time())}").resolve()
    log_dir.mkdir(parents=True, exist_ok=True)
    runs: list[dict[str, Any]] = []
    for _ in range(pairs):
        for workflow in workflows:
            for events in (True, False):
                row = engine_run(
                    base,
                    jobs,
                    log_dir,
                    events,
                    concurrency,
                    relay_process=events and relay_mode == "process",
                    workflow=workflow,
                )
                click.echo(orjson.dumps(row).decode())
                runs.append(row)
    summary = {w: _summary([r for r in runs if r["workflow"] == w]) for w in workflows}
    click.echo(orjson.dumps(summary, option=orjson.OPT_INDENT_2).decode())
    out.write_bytes(orjson.dumps({"runs": runs, "summary": summary}, option=orjson.OPT_INDENT_2))


if __name__ == "__main__":
    main()
