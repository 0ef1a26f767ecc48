"""Single-job and batch ingest under ``wrk`` (issue 16, target 1): req/s, p50/p99 and
the ingest process's CPU per request, every guarantee on.

    python -m onceflow_tools.wrkbench --connections 1,16,64 --batch 1 --repeat 2

Starts ``onceflow ingest`` on a fresh topic of the configured Kafka with auth on (one
API key), type validation on (the sample workflows), the per-client limits on but set
high enough not to refuse (``rate 1e6/s``, 1,000 in flight: every wrk connection is the
same client), the job-id log trail at INFO (to a file, as stderr to a collector would
be) and the metrics port. Each run is ``wrk -t2 -cN -dD -s tools/wrk/jobs.lua`` with a
fresh id per job; CPU per request is the ingest processes' user+system time (every
thread, librdkafka's included) over the requests wrk completed, which stays
comparable when other work on the machine makes req/s swing. ``--loadgen`` also runs
the project's own load generator (:mod:`onceflow_tools.loadgen`) at the same settings.
``--profile`` records py-spy (raw, for a flame graph) during each wrk run; ``--raw``
measures ``tools/wrk/raw_app.py`` (no auth, validation, limits, metrics or trail) instead,
the floor under ingest on this machine.
"""

from __future__ import annotations

import argparse
import os
import re
import subprocess
import sys
import time
import uuid
from functools import partial
from pathlib import Path
from typing import Any

import httpx
import orjson
from confluent_kafka.admin import AdminClient

from onceflow.settings import Settings
from onceflow.topics import ensure_topics
from onceflow_tools.processes import free_port, onceflow_command
from onceflow_tools.stack import topic_record_count

LUA = Path(__file__).resolve().parents[1] / "wrk" / "jobs.lua"
RAW_APP = LUA.with_name("raw_app.py")
_TICKS = os.sysconf("SC_CLK_TCK")


def cpu_seconds(pid: int) -> float:
    """User+system CPU of a process (all its threads) and of its reaped children."""
    fields = Path(f"/proc/{pid}/stat").read_text().rsplit(")", 1)[1].split()
    return sum(int(f) for f in fields[11:15]) / _TICKS


class Ingest:
    """One ``onceflow ingest`` on a fresh topic, auth and limits on, trail at INFO."""

    def __init__(
        self, log_dir: Path, processes: int = 1, raw: bool = False, pythonpath: str = ""
    ) -> None:
        from producers.auth import hash_key, new_key

        run = uuid.uuid4().hex[:8]
        self.key = new_key()
        keys = [{"name": "wrk", "sha256": hash_key(self.key), "scopes": ["jobs:submit"]}]
        base = Settings()
        self.settings = base.model_copy(
            update={
                "jobs_topic": f"onceflow.wrk-{run}.jobs",
                "dlq_topic": f"onceflow.wrk-{run}.dlq",
            }
        )
        ensure_topics(self.settings)
        port = free_port()
        self.port = port
        self.url = f"http://127.0.0.1:{port}"
        env = {
            **os.environ,
            "ONCEFLOW_KAFKA_BOOTSTRAP_SERVERS": base.kafka_bootstrap_servers,
            "ONCEFLOW_JOBS_TOPIC": self.settings.jobs_topic,
            "ONCEFLOW_DLQ_TOPIC": self.settings.dlq_topic,
            "ONCEFLOW_INGEST_PORT": str(port),
            "ONCEFLOW_API_KEYS": orjson.dumps(keys).decode(),
            "ONCEFLOW_AUTH_DISABLED": "false",
            "ONCEFLOW_WORKFLOW_MODULES": '["onceflow_examples"]',
            "ONCEFLOW_ADMIN_API_ENABLED": "false",
            "ONCEFLOW_INGEST_RATE_LIMIT_PER_SECOND": "1000000",
            "ONCEFLOW_INGEST_RATE_LIMIT_BURST": "1000000",
            "ONCEFLOW_INGEST_MAX_INFLIGHT_PER_CLIENT": "1000",
            "ONCEFLOW_LOG_LEVEL": "INFO",
            "ONCEFLOW_LOG_FORMAT": "json",
            "KAFKA": base.kafka_bootstrap_servers,  # the raw app's three
            "TOPIC": self.settings.jobs_topic,
            "PORT": str(port),
            "ONCEFLOW_INGEST_REUSE_PORT": "true" if processes > 1 else "false",
        }
        if pythonpath:  # another build of the code, e.g. a copy of the last commit's
            env["PYTHONPATH"] = pythonpath
        # ``python -m`` puts the working directory first on sys.path: started from this
        # checkout, ingest would import this checkout's code whatever PYTHONPATH says.
        cwd = pythonpath.split(os.pathsep)[0] or None
        command = [sys.executable, str(RAW_APP)] if raw else [*onceflow_command(), "ingest"]
        self.procs: list[subprocess.Popen[bytes]] = []
        self.logs = [log_dir / f"ingest-{run}-{i}.log" for i in range(processes)]
        self.metrics_ports: list[int] = []
        for path in self.logs:
            self.metrics_ports.append(free_port())
            env["ONCEFLOW_INGEST_METRICS_PORT"] = str(self.metrics_ports[-1])
            log = open(path, "ab")  # noqa: SIM115 (the child's)
            self.procs.append(
                subprocess.Popen(
                    command,
                    env=env,
                    stdout=log,
                    stderr=subprocess.STDOUT,
                    stdin=subprocess.DEVNULL,
                    start_new_session=True,
                    cwd=cwd,
                )
            )
        try:
            self._wait_ready()
        except BaseException:  # a process that never got ready must not outlive the run
            for p in self.procs:
                p.kill()
            raise

    def _wait_ready(self, timeout: float = 60.0) -> None:
        deadline = time.monotonic() + timeout
        while time.monotonic() < deadline:
            if any(p.poll() is not None for p in self.procs):
                raise RuntimeError("ingest exited; see its log")
            # Every process listening: wrk opens its connections once, at the start.
            if all(b"startup complete" in path.read_bytes() for path in self.logs):
                return
            time.sleep(0.2)
        raise TimeoutError("ingest did not start")

    def cpu(self) -> float:
        return sum(cpu_seconds(p.pid) for p in self.procs)

    def produce_wait(self) -> tuple[float, float]:
        """Sum and count of ``onceflow_ingest_produce_latency_seconds`` (produce to
        the last delivery report of a request) over the processes; zeros for raw."""
        total, count = 0.0, 0.0
        for port in self.metrics_ports:
            try:
                text = httpx.get(f"http://127.0.0.1:{port}/metrics", timeout=5).text
            except httpx.HTTPError:
                continue
            for line in text.splitlines():
                if line.startswith("onceflow_ingest_produce_latency_seconds_sum"):
                    total += float(line.split()[-1])
                elif line.startswith("onceflow_ingest_produce_latency_seconds_count"):
                    count += float(line.split()[-1])
        return total, count

    def records(self) -> int:
        return topic_record_count(self.settings, self.settings.jobs_topic)

    def close(self) -> None:
        for p in self.procs:
            p.terminate()
        for p in self.procs:
            p.wait(timeout=30)
        # The run's topics go too: the dev Kafka is shared and runs are many.
        admin = AdminClient({"bootstrap.servers": self.settings.kafka_bootstrap_servers})
        topics = [self.settings.jobs_topic, self.settings.dlq_topic]
        for done in admin.delete_topics(topics, operation_timeout=30).values():
            done.result(timeout=60)


def run_wrk(ingest: Ingest, connections: int, batch: int, seconds: int) -> dict[str, Any]:
    env = {**os.environ, "RUN": f"r{uuid.uuid4().hex[:8]}", "BATCH": str(batch)}
    env["API_KEY"] = ingest.key
    threads = str(min(2, connections))
    # A 10 s timeout (wrk's default is 2 s): a slow answer counts in the latencies
    # rather than vanishing from them as a timeout.
    command = ["wrk", f"-t{threads}", f"-c{connections}", f"-d{seconds}s", "--timeout", "10s"]
    out = subprocess.run(
        [*command, "-s", str(LUA), ingest.url],
        env=env,
        capture_output=True,
        text=True,
        check=True,
        timeout=seconds + 60,
    ).stdout
    match = re.search(r"^WRK_JSON (.*)$", out, re.M)
    if match is None:
        raise RuntimeError(f"no summary from wrk:\n{out}")
    raw = orjson.loads(match.group(1))
    seconds_run = raw["duration_us"] / 1e6
    return {
        "tool": "wrk",
        "requests": raw["requests"],
        "jobs": raw["requests"] * batch,
        "errors": raw["non_2xx"] + raw["socket_errors"],
        "timeouts": raw["timeouts"],
        "req_per_s": raw["requests"] / seconds_run,
        "p50_ms": raw["p50_us"] / 1000,
        "p99_ms": raw["p99_us"] / 1000,
        "max_ms": raw["max_us"] / 1000,
    }


def run_loadgen(ingest: Ingest, connections: int, batch: int, jobs: int, log_dir: Path) -> dict:
    out = log_dir / f"loadgen-{uuid.uuid4().hex[:8]}.json"
    subprocess.run(
        [
            *(sys.executable, "-m", "onceflow_tools.loadgen", "--url", ingest.url),
            *("--jobs", str(jobs), "--batch", str(batch), "--concurrency", str(connections)),
            *("--prefix", f"lg{uuid.uuid4().hex[:6]}_", "--out", str(out)),
        ],
        env={**os.environ, "ONCEFLOW_LOADGEN_KEY": ingest.key},
        check=True,
        timeout=600,
    )
    s = orjson.loads(out.read_bytes())
    ok = s["statuses"].get("202", 0)
    return {
        "tool": "loadgen",
        "requests": s["requests"],
        "jobs": s["accepted"],
        "errors": s["requests"] - ok,
        "timeouts": 0,
        "req_per_s": s["requests"] / s["wall_seconds"],
        "p50_ms": s["latency_p50"] * 1000,
        "p99_ms": s["latency_p99"] * 1000,
        "max_ms": s["latency_max"] * 1000,
    }


def measured(ingest: Ingest, go: Any, profile: Path | None, gil: bool = False) -> dict[str, Any]:
    """Run ``go()`` and add the ingest CPU per request and the records it added."""
    records, cpu, (wait0, n0) = ingest.records(), ingest.cpu(), ingest.produce_wait()
    spy = None
    if profile is not None:
        spy = subprocess.Popen(
            [
                *(str(Path(sys.executable).with_name("py-spy")), "record", "--nonblocking"),
                *("--format", "raw", "-r", "200", "--duration", "6", "-o", str(profile)),
                *("--pid", str(ingest.procs[0].pid)),
                # only the thread holding the GIL: where Python's CPU goes, not the
                # poll thread's wait to take the GIL back
                *(("--gil",) if gil else ()),
            ],
            stdout=subprocess.DEVNULL,
            stderr=subprocess.DEVNULL,
        )
    row = go()
    cpu = ingest.cpu() - cpu
    if spy is not None:
        spy.wait(timeout=60)
    row["cpu_ms_per_request"] = 1000 * cpu / max(1, row["requests"])
    row["ingest_cpu_percent"] = 100 * cpu * row["req_per_s"] / max(1, row["requests"])
    row["records_added"] = ingest.records() - records
    wait1, n1 = ingest.produce_wait()
    # Of a request's time, how much was the wait for Kafka's acks (mean, ms).
    row["kafka_wait_ms"] = 1000 * (wait1 - wait0) / (n1 - n0) if n1 > n0 else None
    return row


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--connections", default="1,16,64")
    parser.add_argument("--batch", default="1", help="jobs per request, e.g. 1 or 1,100")
    parser.add_argument("--seconds", type=int, default=10)
    parser.add_argument("--repeat", type=int, default=2)
    parser.add_argument("--processes", type=int, default=1, help="ingest processes, one port")
    parser.add_argument("--loadgen", type=int, default=0, help="jobs per loadgen run (0: none)")
    parser.add_argument("--profile", type=Path, help="py-spy raw output prefix")
    parser.add_argument(
        "--profile-gil", action="store_true", help="profile only the thread holding the GIL"
    )
    parser.add_argument("--raw", action="store_true", help="tools/wrk/raw_app.py, not ingest")
    parser.add_argument("--pythonpath", default="", help="run ingest from this code first")
    parser.add_argument("--label", default="", help="names the build in the output")
    parser.add_argument("--log-dir", type=Path, default=Path("/tmp/onceflow-wrkbench"))
    parser.add_argument("--out", type=Path)
    args = parser.parse_args()
    args.log_dir.mkdir(parents=True, exist_ok=True)
    ingest = Ingest(args.log_dir, args.processes, args.raw, args.pythonpath)
    rows = []
    try:
        for rep in range(args.repeat):
            for batch in (int(b) for b in args.batch.split(",")):
                for conns in (int(c) for c in args.connections.split(",")):
                    tag = f"b{batch}-c{conns}-{rep}"
                    prof = Path(f"{args.profile}-{tag}.txt") if args.profile else None
                    runs = [partial(run_wrk, ingest, conns, batch, args.seconds)]
                    if args.loadgen:  # --loadgen requests of `batch` jobs
                        n = args.loadgen * batch
                        runs.append(partial(run_loadgen, ingest, conns, batch, n, args.log_dir))
                    for go in runs:
                        row = {"batch": batch, "connections": conns, "processes": args.processes}
                        row["app"] = args.label or ("raw" if args.raw else "ingest")
                        row |= measured(ingest, go, prof, args.profile_gil)
                        prof = None
                        rows.append(row)
                        print(_line(row), flush=True)
    finally:
        ingest.close()
    if args.out:
        args.out.write_bytes(orjson.dumps(rows, option=orjson.OPT_INDENT_2))


def _line(r: dict[str, Any]) -> str:
    return (
        f"{r['app']:6} {r['tool']:7} batch {r['batch']:3} conns {r['connections']:2}"
        f" procs {r['processes']}:"
        f" {r['req_per_s']:8.0f} req/s {r['req_per_s'] * r['batch']:8.0f} jobs/s"
        f"  p50 {r['p50_ms']:6.1f} p99 {r['p99_ms']:6.1f} ms"
        f" (kafka wait {r['kafka_wait_ms'] or 0:5.1f})"
        f"  cpu {r['cpu_ms_per_request']:.3f} ms/req ({r['ingest_cpu_percent']:.0f}%)"
        f"  errors {r['errors']} timeouts {r['timeouts']}  records +{r['records_added']}"
    )


if __name__ == "__main__":
    main()
