"""Output streams end to end on real Kafka and PostgreSQL: the real ingest, worker and
engine processes, a workflow emitting 1,000 values read over Server-Sent Events by
``curl -N`` and by a Python reader that disconnects and resumes with ``Last-Event-ID``,
a SIGKILL of the engine mid-run, and the per-instance bounds."""

from __future__ import annotations

import asyncio
import signal
import subprocess
import threading
import time
import uuid
from typing import Any

import httpx
import orjson
import pytest
import sqlalchemy as sa

from onceflow.envelope import JobEnvelope
from onceflow_cli.render import render_instance
from onceflow_tools.processes import free_port
from onceflow_tools.stack import Stack, drop_database
from producers.models import ErrorBody
from tests.integration import stream_workflows  # noqa: F401 (registers the workflows)
from workflow_engine.definitions import REGISTRY
from workflow_engine.engine.runner import EngineRunner
from workflow_engine.model import Delivery
from workflow_engine.store import operations
from workflow_engine.store.views import describe_instance, read_values
from workflow_engine.store.writes import Appended, AppendValue, create_instances
from workflow_engine.store.writes.stream_values import append_values

MODULE = "tests.integration.stream_workflows"
#: 10 rounds of 50 values from the body and 50 from a step's thread: 1,000 values.
MAX_READERS = 3
THOUSAND = {"rounds": 10, "body": 50, "per_step": 50, "step_seconds": 0.3}


@pytest.fixture(scope="module")
def stack(base_settings, tmp_path_factory):
    base = base_settings.model_copy(
        update={"workflow_modules": [*base_settings.workflow_modules, MODULE]}
    )
    run = f"streams-{uuid.uuid4().hex[:8]}"
    s = Stack(base, run, tmp_path_factory.mktemp("streams")).prepare()
    s.env.update(
        {
            "ONCEFLOW_ENGINE_LEASE_SECONDS": "3",
            "ONCEFLOW_ENGINE_POLL_INTERVAL_SECONDS": "0.2",
            "ONCEFLOW_INGEST_STREAM_POLL_SECONDS": "0.5",
            "ONCEFLOW_INGEST_STREAM_WAIT_SECONDS": "30",
            "ONCEFLOW_INGEST_STREAM_MAX_READERS": str(MAX_READERS),
        }
    )
    group = s.group
    assert group is not None
    group.env.update(s.env)
    try:
        # All three at once (each takes seconds to import and connect), then wait.
        ports = {name: str(free_port()) for name in ("worker", "engine")}
        group.start("ingest", "ingest")
        group.start("streams", "worker", env={"ONCEFLOW_STREAMS_METRICS_PORT": ports["worker"]})
        group.start("engine", "engine", env={"ONCEFLOW_ENGINE_METRICS_PORT": ports["engine"]})
        group.wait_http(f"{s.ingest_url}/readyz", timeout=60)
        for port in ports.values():
            group.wait_http(f"http://127.0.0.1:{port}/metrics", timeout=60)
        yield s
    finally:
        for name in list(group.procs):  # nothing to drain: the database is this test's
            group.stop(name, signal.SIGKILL)
        s.close()
        drop_database(base.database_url, f"onceflow_{run}".replace("-", "_"))


def _submit(stack: Stack, job_id: str, workflow: str, params: dict[str, Any]) -> None:
    answer = httpx.post(
        f"{stack.ingest_url}/v1/jobs",
        json={"job_id": job_id, "workflow": workflow, "params": params},
        headers=stack.auth_headers,
        timeout=10,
    )
    assert answer.status_code == 202, answer.text


def parse_sse(text: str) -> list[dict[str, str]]:
    """The events of an SSE body (comments and pings dropped)."""
    events = []
    for block in text.replace("\r\n", "\n").split("\n\n"):
        event: dict[str, str] = {}
        for line in block.split("\n"):
            if not line or line.startswith(":"):
                continue
            name, _, value = line.partition(":")
            event[name] = value[1:] if value.startswith(" ") else value
        if "data" in event:
            events.append(event)
    return events


class Reader(threading.Thread):
    """A Python SSE reader that reads ``stop_after`` value events, disconnects, and
    resumes from the last id it saw with ``Last-Event-ID``, until ``end``."""

    def __init__(self, url: str, headers: dict[str, str], stop_after: int | None) -> None:
        super().__init__(daemon=True)
        self.url, self.headers, self.stop_after = url, headers, stop_after
        self.events: list[dict[str, str]] = []
        self.connections = 0
        self.error: BaseException | None = None

    def run(self) -> None:
        try:
            while not self.events or self.events[-1].get("event") != "end":
                self._connect()
        except BaseException as exc:
            self.error = exc

    def _connect(self) -> None:
        headers = dict(self.headers)
        ids = [e["id"] for e in self.events if "id" in e]
        if ids:
            headers["Last-Event-ID"] = ids[-1]
        self.connections += 1
        timeout = httpx.Timeout(10, read=40)
        with httpx.stream("GET", self.url, headers=headers, timeout=timeout) as answer:
            assert answer.status_code == 200, answer.read()
            assert answer.headers["content-type"].startswith("text/event-stream")
            block: list[str] = []
            for line in answer.iter_lines():
                if line:
                    block.append(line)
                    continue
                events = parse_sse("\n".join(block))
                block = []
                self.events += events
                if any(e.get("event") == "end" for e in events):
                    return
                if self.stop_after is not None and self._values() >= self.stop_after:
                    self.stop_after = None  # disconnect once, mid-way
                    return

    def _values(self) -> int:
        return sum(1 for e in self.events if e.get("event") != "end")


def _expected_thousand() -> list[dict[str, Any]]:
    values: list[dict[str, Any]] = []
    for r in range(THOUSAND["rounds"]):
        values += [{"round": r, "b": b} for b in range(THOUSAND["body"])]
        values += [{"step": r, "attempt": 1, "k": k} for k in range(THOUSAND["per_step"])]
    return values


def _check_complete_stream(events: list[dict[str, str]], expected: list[Any]) -> None:
    assert events[-1]["event"] == "end", events[-3:]
    assert orjson.loads(events[-1]["data"])["status"] == "complete"
    values = events[:-1]
    seqs = [int(e["id"]) for e in values]
    assert seqs == sorted(seqs) and len(set(seqs)) == len(seqs), "ids not increasing"
    assert [orjson.loads(e["data"]) for e in values] == expected  # once each, in order
    assert {e["event"] for e in values} == {"body", "steps"}


@pytest.mark.timeout(90)
def test_a_thousand_values_read_before_during_and_after_the_run(stack):
    job = f"st-{uuid.uuid4().hex[:8]}"
    url = f"{stack.ingest_url}/v1/jobs/{job}/stream"
    early = Reader(url, stack.auth_headers, stop_after=400)
    early.start()  # before the job exists: it waits for the instance
    time.sleep(0.5)
    assert early.is_alive() and early.events == []
    _submit(stack, job, "stream-values", THOUSAND)
    early.join(60)
    assert not early.is_alive() and early.error is None, early.error
    assert early.connections == 2  # it disconnected once and resumed
    _check_complete_stream(early.events, _expected_thousand())

    # After the run: curl (a client nobody here wrote), everything and the end event.
    auth = stack.auth_headers["Authorization"]
    out = subprocess.run(
        ["curl", "-sSN", "--max-time", "30", "-H", f"Authorization: {auth}", url],
        capture_output=True,
        text=True,
        timeout=40,
        check=True,
    )
    _check_complete_stream(parse_sse(out.stdout), _expected_thousand())

    # ?after and ?stream: the body's values past seq 900 only.
    out = subprocess.run(
        ["curl", "-sSN", "--max-time", "30", "-H", f"Authorization: {auth}",
         f"{url}?after=900&stream=body"],
        capture_output=True, text=True, timeout=40, check=True,
    )  # fmt: skip
    tail = parse_sse(out.stdout)
    assert tail[-1]["event"] == "end"
    assert tail[:-1] and all(int(e["id"]) > 900 and e["event"] == "body" for e in tail[:-1])
    ids = [int(e["id"]) for e in early.events[:-1] if e["event"] == "body"]
    assert [int(e["id"]) for e in tail[:-1]] == [i for i in ids if i > 900]

    view = describe_instance(stack.db, job)
    assert view is not None and view.streams == {"body": 500, "steps": 500}
    assert "output streams: body 500, steps 500" in render_instance(view)


@pytest.mark.timeout(90)
def test_a_replay_after_sigkill_adds_no_duplicate_value(stack):
    job = f"sk-{uuid.uuid4().hex[:8]}"
    params = {"rounds": 8, "body": 20, "per_step": 10, "step_seconds": 0.5}
    _submit(stack, job, "stream-values", params)
    count = "SELECT count(*) FROM onceflow_stream_values WHERE job_id = :j"
    stack.wait_for(lambda: stack.scalar(count, j=job) >= 3 * 30 + 5, 30, "values of 3 rounds")
    stack.group.stop("engine", signal.SIGKILL)
    killed_at = stack.scalar(count, j=job)
    stack.start_engine("engine-2")  # claims it once the dead engine's lease expires
    done = "SELECT count(*) FROM onceflow_instances WHERE job_id = :j AND status = 'complete'"
    stack.wait_for(lambda: stack.scalar(done, j=job) == 1, 45, "the job to complete")
    assert stack.scalar("SELECT claim_count FROM onceflow_instances WHERE job_id = :j", j=job) >= 2

    reader = Reader(f"{stack.ingest_url}/v1/jobs/{job}/stream", stack.auth_headers, None)
    reader.run()
    assert reader.error is None, reader.error
    values = [orjson.loads(e["data"]) for e in reader.events[:-1]]
    assert reader.events[-1]["event"] == "end"
    # The body ran again from the top on replay: each of its values is there once.
    body = [(v["round"], v["b"]) for v in values if "b" in v]
    wanted = [(r, b) for r in range(params["rounds"]) for b in range(params["body"])]
    assert body == wanted
    # A step value is never repeated within its attempt; the attempt the kill cut off
    # (if any) was run again as a new attempt, whose values all follow.
    steps = [(v["step"], v["attempt"], v["k"]) for v in values if "step" in v]
    assert len(set(steps)) == len(steps)
    for r in range(params["rounds"]):
        last = max(a for s, a, _ in steps if s == r)
        assert [k for s, a, k in steps if (s, a) == (r, last)] == list(range(params["per_step"]))
    assert len(values) >= killed_at


@pytest.mark.timeout(60)
def test_past_the_instance_bounds_emit_raises_and_nothing_is_dropped(settings, db):
    limited = settings.model_copy(
        update={
            "stream_max_values": 5,
            "stream_max_bytes": 4000,
            "engine_poll_interval_seconds": 0.1,
        }
    )
    create_instances(
        db,
        [
            Delivery(JobEnvelope("by-count", "stream-bounded", {"try": 20}), "t", 0, 0),
            Delivery(
                JobEnvelope("by-bytes", "stream-bounded", {"try": 20, "pad": 1500}), "t", 0, 1
            ),
        ],
    )

    async def run() -> None:
        runner = EngineRunner(limited, REGISTRY, db=db)
        task = asyncio.create_task(runner.run())
        final = "SELECT count(*) FROM onceflow_instances WHERE status IN ('errored', 'complete')"
        deadline = time.monotonic() + 30
        while _scalar(db, final) < 2:
            assert time.monotonic() < deadline, "the instances did not finish"
            await asyncio.sleep(0.1)
        runner.stop()
        await task

    asyncio.run(run())
    with db.connect() as conn:
        rows = conn.execute(
            sa.text(
                "SELECT i.job_id, i.status, i.error, s.result, (SELECT count(*) FROM"
                " onceflow_stream_values v WHERE v.job_id = i.job_id) FROM onceflow_instances i"
                " JOIN onceflow_steps s ON s.job_id = i.job_id AND s.name = 'summary'"
            )
        ).all()
    found = {job: (status, error, result, n) for job, status, error, result, n in rows}
    # 5 values, then the bound: the workflow caught the refusal and went on; the step
    # that emitted past it failed at once (not retried) and errored the instance.
    status, error, summary, n = found["by-count"]
    assert status == "errored" and n == 5 and summary["sent"] == 5
    assert "ONCEFLOW_STREAM_MAX_VALUES=5" in summary["refused"]
    assert error.startswith("emit to stream 'fill' refused") and "nothing was written" in error
    over = "SELECT status || '/' || attempts FROM onceflow_steps WHERE name = 'over the bound'"
    with db.connect() as conn:
        assert conn.execute(sa.text(over + " AND job_id = 'by-count'")).scalar() == "failed/1"
    # Each padded value is ~1.5 kB: two fit in 4000 bytes, the third does not; the
    # step's small value still fits (the bound is on bytes), so that instance completes.
    status, error, summary, n = found["by-bytes"]
    assert summary["sent"] == 2 and "ONCEFLOW_STREAM_MAX_BYTES=4000" in summary["refused"]
    assert (status, error, n) == ("complete", None, 3)

    # A restart forgets the values with the history; the seq goes on past them, so a
    # reader that saw seq 3 is never handed a new value under an id it already has.
    operations.restart(db, "stream-bounded", "by-bytes")
    state = "SELECT last_seq || '/' || value_count || '/' || value_bytes FROM onceflow_streams"
    with db.connect() as conn:
        assert conn.execute(sa.text(state + " WHERE job_id = 'by-bytes'")).scalar() == "3/0/0"
        assert (
            _scalar(db, "SELECT count(*) FROM onceflow_stream_values WHERE job_id = 'by-bytes'")
            == 0
        )


def _scalar(db, sql: str) -> int:
    with db.connect() as conn:
        return int(conn.execute(sa.text(sql)).scalar() or 0)


@pytest.mark.timeout(60)
def test_readers_past_the_bound_get_503_until_a_slot_is_free(stack):
    url = f"{stack.ingest_url}/v1/jobs/nobody-{uuid.uuid4().hex[:6]}/stream"

    async def main() -> None:
        async with httpx.AsyncClient(headers=stack.auth_headers, timeout=30) as client:
            # Readers of an id with no instance wait for it, each in a slot.
            waiting = [asyncio.create_task(client.get(url)) for _ in range(MAX_READERS)]
            await asyncio.sleep(1.0)
            assert not any(t.done() for t in waiting)
            refused = await client.get(url)
            assert refused.status_code == 503, refused.text
            assert refused.json()["error"] == "too_many_streams"
            assert set(refused.json()) == set(ErrorBody.model_fields)
            for task in waiting:  # their clients go away: the slots come back
                task.cancel()
            await asyncio.gather(*waiting, return_exceptions=True)
        deadline = time.monotonic() + 15
        while True:
            async with httpx.AsyncClient(headers=stack.auth_headers, timeout=1.5) as client:
                try:
                    answer = await client.get(url)
                except httpx.ReadTimeout:
                    return  # admitted: waiting for the instance
            assert answer.status_code == 503, answer.text
            assert time.monotonic() < deadline, "the slots were not given back"
            await asyncio.sleep(0.5)

    asyncio.run(main())
    port = stack.env["ONCEFLOW_INGEST_METRICS_PORT"]
    metrics = httpx.get(f"http://127.0.0.1:{port}/metrics", timeout=5).text
    assert "onceflow_ingest_stream_listening 1.0" in metrics  # its LISTEN connection
    refused = [
        line
        for line in metrics.splitlines()
        if line.startswith("onceflow_ingest_stream_refused_total ")
    ]
    assert refused and float(refused[0].split()[1]) >= 1


@pytest.mark.timeout(30)
def test_a_second_append_waits_for_the_first_to_commit_so_seqs_commit_in_order(db):
    """Two appends to one instance at once (as gather branches or a step thread could
    send, were the engine's writes not one at a time): the second takes its seq only
    once the first has committed, so a reader past seq 0 never sees 2 before 1."""
    create_instances(db, [Delivery(JobEnvelope("race", "stream-values", {}), "t", 0, 0)])
    with db.begin() as conn:  # leased to engine e1 under claim 1, as a claim leaves it
        conn.execute(
            sa.text(
                "UPDATE onceflow_instances SET status = 'running', lease_owner = 'e1',"
                " claim_count = 1, lease_expires_at = now() + interval '1 minute'"
                " WHERE job_id = 'race'"
            )
        )

    def append(conn, key):
        write = AppendValue("race", 1, key, "s", orjson.dumps(key), 100, 10_000)
        return append_values(conn, "e1", [write])[0]

    first = db.connect()
    assert append(first, "one") == Appended(1)  # not committed yet
    second: dict[str, Any] = {}

    def run_second() -> None:
        with db.begin() as conn:
            second["pid"] = conn.execute(sa.text("SELECT pg_backend_pid()")).scalar()
            second["answer"] = append(conn, "two")

    thread = threading.Thread(target=run_second, daemon=True)
    thread.start()
    waiting = "SELECT count(*) FROM pg_stat_activity WHERE pid = :p AND wait_event_type = 'Lock'"
    deadline = time.monotonic() + 10
    while "pid" not in second or _scalar_p(db, waiting, p=second["pid"]) == 0:
        assert time.monotonic() < deadline, "the second append did not wait on a lock"
        time.sleep(0.02)
    assert read_values(db, "race", 0).values == []  # neither is visible yet
    first.commit()
    first.close()
    thread.join(10)
    assert second["answer"] == Appended(2)
    assert [v.seq for v in read_values(db, "race", 0).values] == [1, 2]


def _scalar_p(db, sql: str, **params: Any) -> int:
    with db.connect() as conn:
        return int(conn.execute(sa.text(sql), params).scalar() or 0)
