"""Traces on a real backend: Jaeger (built by scripts/install-tools.sh) receives OTLP
from the three real processes; one job's trace is read back from Jaeger's query API.

The job fails one attempt, sleeps, times out on an event wait and is claimed five
times: every span is present once, children of the right parent, and no replayed step
adds one. Its duplicate (a second request with the same job id) is a ``process`` span
in the duplicate request's trace, with a ``duplicate collapsed`` event.

``ONCEFLOW_TEST_TRACE_DOC=1`` writes the trace's JSON to docs/tracing/one-job-trace.json.
"""

from __future__ import annotations

import collections
import os
import shutil
import subprocess
import time
import uuid
from pathlib import Path

import httpx
import orjson
import pytest
import sqlalchemy as sa

from onceflow_tools.processes import free_port
from onceflow_tools.stack import Stack
from tests.integration.traced_workflow import NAME

MODULE = "tests.integration.traced_workflow"

pytestmark = pytest.mark.integration
DOC = Path(__file__).resolve().parents[2] / "docs" / "tracing" / "one-job-trace.json"

JAEGER_CONFIG = """
service:
  extensions: [jaeger_storage, jaeger_query]
  pipelines:
    traces:
      receivers: [otlp]
      processors: [batch]
      exporters: [jaeger_storage_exporter]
  telemetry:
    metrics:
      level: none
    logs:
      level: info
extensions:
  jaeger_query:
    storage:
      traces: memstore
    http:
      endpoint: 127.0.0.1:{query}
    grpc:
      endpoint: 127.0.0.1:{query_grpc}
  jaeger_storage:
    backends:
      memstore:
        memory:
          max_traces: 10000
receivers:
  otlp:
    protocols:
      http:
        endpoint: 127.0.0.1:{otlp}
processors:
  batch:
    timeout: 100ms
exporters:
  jaeger_storage_exporter:
    trace_storage: memstore
"""


def jaeger_binary() -> str | None:
    found = shutil.which("jaeger")
    if found:
        return found
    gopath = subprocess.run(
        ["go", "env", "GOPATH"], capture_output=True, text=True, check=False
    ).stdout.strip()
    candidate = Path(gopath or Path.home() / "go") / "bin" / "jaeger"
    return str(candidate) if candidate.is_file() else None


@pytest.fixture
def jaeger(tmp_path):
    binary = jaeger_binary()
    assert binary is not None, "no jaeger binary: run scripts/install-tools.sh (go builds it)"
    ports = {"query": free_port(), "query_grpc": free_port(), "otlp": free_port()}
    config = tmp_path / "jaeger.yaml"
    config.write_text(JAEGER_CONFIG.format(**ports))
    log = open(tmp_path / "jaeger.log", "wb")  # noqa: SIM115 (kept open for the child)
    proc = subprocess.Popen(
        [binary, "--config", f"file:{config}"], stdout=log, stderr=subprocess.STDOUT
    )
    query = f"http://127.0.0.1:{ports['query']}"
    try:
        deadline = time.monotonic() + 60
        while True:
            assert proc.poll() is None, (tmp_path / "jaeger.log").read_text()[-3000:]
            try:
                if httpx.get(f"{query}/api/services", timeout=1).status_code == 200:
                    break
            except httpx.HTTPError:
                pass
            assert time.monotonic() < deadline, "jaeger's query API did not come up"
            time.sleep(0.2)
        yield {"otlp": f"http://127.0.0.1:{ports['otlp']}", "query": query}
    finally:
        # Jaeger drains its pipelines on SIGTERM and sometimes takes longer than a test
        # should wait: give it a moment, then kill it.
        proc.terminate()
        try:
            proc.wait(timeout=10)
        except subprocess.TimeoutExpired:
            proc.kill()
            proc.wait(timeout=10)
        log.close()


@pytest.fixture
def stack(base_settings, jaeger, tmp_path):
    base = base_settings.model_copy(
        update={
            "workflow_modules": [
                *base_settings.workflow_modules,
                "tests.integration.traced_workflow",
            ],
            "otel_exporter_otlp_endpoint": jaeger["otlp"],
        }
    )
    s = Stack(base, f"otel-{uuid.uuid4().hex[:8]}", tmp_path / "run").prepare()
    assert s.group is not None
    s.group.env.update(
        {
            "OTEL_BSP_SCHEDULE_DELAY": "100",  # export within 0.1 s, not 5 s
            "ONCEFLOW_ENGINE_POLL_INTERVAL_SECONDS": "0.2",
        }
    )
    s.start_ingest()
    s.start_worker()
    s.start_engine()
    yield s
    s.close()


def fetch_trace(query: str, trace_id: str, want: int, timeout: float = 60) -> dict:
    """The trace once it has at least ``want`` spans (spans arrive in batches)."""
    deadline = time.monotonic() + timeout
    found: dict = {}
    while time.monotonic() < deadline:
        r = httpx.get(f"{query}/api/traces/{trace_id}", timeout=5)
        if r.status_code == 200 and r.json().get("data"):
            found = r.json()["data"][0]
            if len(found["spans"]) >= want:
                time.sleep(1.0)  # anything extra (a duplicate span) would arrive by now
                return httpx.get(f"{query}/api/traces/{trace_id}", timeout=5).json()["data"][0]
        time.sleep(0.3)
    raise AssertionError(f"trace {trace_id} has {len(found.get('spans', []))} of {want} spans")


def tags(span: dict) -> dict:
    return {t["key"]: t["value"] for t in span["tags"]}


def parent_of(span: dict) -> str | None:
    refs = [r for r in span.get("references", []) if r["refType"] == "CHILD_OF"]
    return refs[0]["spanID"] if refs else None


def traceparent_of(stack: Stack, job_id: str) -> str:
    assert stack.db is not None
    with stack.db.connect() as conn:
        return conn.execute(
            sa.text("SELECT traceparent FROM onceflow_jobs WHERE job_id = :j"), {"j": job_id}
        ).scalar_one()


def instance_status(stack: Stack, job_id: str) -> str | None:
    assert stack.db is not None
    with stack.db.connect() as conn:
        return conn.execute(
            sa.text("SELECT status FROM onceflow_instances WHERE job_id = :j"), {"j": job_id}
        ).scalar()


@pytest.mark.timeout(240)
def test_one_jobs_trace_in_jaeger(stack, jaeger):
    job_id = f"traced_{uuid.uuid4().hex[:10]}"
    job = {"job_id": job_id, "workflow": NAME, "params": {"n": 1}}
    with stack.client() as client:
        client.submit([job])
        stack.wait_for(lambda: instance_status(stack, job_id) is not None, 60, "the instance")
        client.submit([job])  # the duplicate: a second request, its own trace
    stack.wait_for(
        lambda: (
            stack.scalar(
                "SELECT count(*) FROM onceflow_duplicate_deliveries WHERE job_id = :j", j=job_id
            )
            == 1
        ),
        60,
        "the duplicate collapsed",
    )
    stack.wait_for(lambda: instance_status(stack, job_id) == "complete", 90, "completion")
    claims = stack.scalar("SELECT claim_count FROM onceflow_instances WHERE job_id = :j", j=job_id)
    assert claims >= 4  # retry delay, sleep, event wait: each a new claim that replays

    topic = stack.settings.jobs_topic if stack.settings else ""
    expected = {  # name -> (count, parent's name)
        "POST /v1/jobs": (1, None),
        f"send {topic}": (1, "POST /v1/jobs"),
        f"process {topic}": (1, f"send {topic}"),
        "step prepare": (2, f"send {topic}"),  # attempt 1 failed, attempt 2
        "sleep cool off": (1, f"send {topic}"),
        "step work": (1, f"send {topic}"),
        "wait approval": (1, f"send {topic}"),
        "step finish": (1, f"send {topic}"),
        "instance complete": (1, f"send {topic}"),
    }
    trace_id = traceparent_of(stack, job_id).split("-")[1]
    data = fetch_trace(jaeger["query"], trace_id, sum(c for c, _ in expected.values()))
    if os.environ.get("ONCEFLOW_TEST_TRACE_DOC"):
        DOC.parent.mkdir(parents=True, exist_ok=True)
        DOC.write_bytes(orjson.dumps(data, option=orjson.OPT_INDENT_2 | orjson.OPT_SORT_KEYS))

    spans = data["spans"]
    names = collections.Counter(s["operationName"] for s in spans)
    assert names == {name: count for name, (count, _) in expected.items()}, names
    by_id = {s["spanID"]: s for s in spans}
    for s in spans:
        want_parent = expected[s["operationName"]][1]
        parent = parent_of(s)
        got = by_id[parent]["operationName"] if parent in by_id else parent
        assert got == want_parent, (s["operationName"], got)
        assert s["traceID"] == trace_id
    services = {p["serviceName"] for p in data["processes"].values()}
    assert services == {"onceflow-ingest", "onceflow-worker", "onceflow-engine"}

    named = {s["operationName"]: s for s in spans}
    attempts = sorted(
        tags(s)["onceflow.attempt"] for s in spans if s["operationName"] == "step prepare"
    )
    assert attempts == [1, 2]
    for name in ("step work", "sleep cool off", "instance complete", f"process {topic}"):
        assert tags(named[name])["onceflow.job_id"] == job_id
        assert tags(named[name])["onceflow.workflow"] == NAME
    process = tags(named[f"process {topic}"])
    assert process["onceflow.outcome"] == "created"
    assert {"messaging.kafka.destination.partition", "messaging.kafka.message.offset"} <= set(
        process
    )
    assert tags(named["wait approval"]).get("otel.status_code") == "ERROR"  # timed out

    # The duplicate's own request trace: its process span says it collapsed.
    assert stack.db is not None
    with stack.db.connect() as conn:
        dup_request = conn.execute(
            sa.text("SELECT request_id FROM onceflow_duplicate_deliveries WHERE job_id = :j"),
            {"j": job_id},
        ).scalar_one()
    dup_trace = find_trace_with(jaeger["query"], f"process {topic}", job_id, exclude=trace_id)
    dup = next(s for s in dup_trace["spans"] if s["operationName"] == f"process {topic}")
    assert tags(dup)["onceflow.outcome"] == "duplicate"
    events = [f["value"] for log in dup["logs"] for f in log["fields"] if f["key"] == "event"]
    assert events == ["duplicate collapsed"]
    assert {s["operationName"] for s in dup_trace["spans"]} == {
        "POST /v1/jobs",
        f"send {topic}",
        f"process {topic}",
    }
    assert dup_request  # recorded with the duplicate delivery


def find_trace_with(query: str, operation: str, job_id: str, exclude: str) -> dict:
    """The trace (other than ``exclude``) holding ``operation`` for ``job_id``."""
    deadline = time.monotonic() + 30
    while time.monotonic() < deadline:
        r = httpx.get(
            f"{query}/api/traces",
            params={
                "service": "onceflow-worker",
                "operation": operation,
                "tags": orjson.dumps({"onceflow.job_id": job_id}).decode(),
                "lookback": "1h",
                "limit": 20,
            },
            timeout=5,
        )
        for t in r.json().get("data") or []:
            if t["traceID"] != exclude and len(t["spans"]) >= 3:
                return t
        time.sleep(0.3)
    raise AssertionError(f"no second trace with {operation} for {job_id}")
