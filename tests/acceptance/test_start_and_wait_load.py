"""2,000 requests waiting at once on two ingest processes (subprocesses): every one
gets its own true answer, and PostgreSQL never sees more connections from ingest than
its pools allow (a waiting request holds none).

The engine's part is played here, in the relay's order: the instances are made final
in PostgreSQL (one statement), then their events are written to the events topic per
the contract. 1,900 requests wait for jobs that finish (a tenth of them errored);
100 ask for a short wait on jobs that never do, and get their 202 with ``Location``.
The figures (time to register, to answer, connections seen) are printed (``-s``).
"""

from __future__ import annotations

import asyncio
import threading
import time
import uuid

import httpx
import orjson
import pytest
import sqlalchemy as sa

from onceflow.envelope import JobEnvelope
from onceflow_tools.processes import free_port
from onceflow_tools.stack import Stack
from tests.integration.wait_helpers import create_events_topic, event_record, publish_records
from workflow_engine.model import Delivery
from workflow_engine.store.writes import create_instances

pytestmark = pytest.mark.timeout(240)

FINISHING = 1900
NEVER = 100
#: shared_engine's pool: 8 connections and 8 overflow per process (store/db.py).
POOL_BOUND = 16

_FINISH_ALL = sa.text(
    """
UPDATE onceflow_instances i
SET status = f.status, result = f.result, error = f.error, finished_at = now(),
    updated_at = now()
FROM unnest(CAST(:ids AS text[]), CAST(:statuses AS text[]), CAST(:results AS jsonb[]),
            CAST(:errors AS text[])) AS f(job_id, status, result, error)
WHERE i.job_id = f.job_id
RETURNING i.job_id, i.workflow, i.version, i.finished_at
"""
)
_INGEST_CONNECTIONS = sa.text(
    "SELECT application_name, count(*) FROM pg_stat_activity"
    " WHERE application_name LIKE 'onceflow-ingest-load-%' GROUP BY application_name"
)


def _truth(i: int) -> tuple[str, object, str | None]:
    return ("errored", None, f"failed {i}") if i % 10 == 0 else ("complete", {"n": i}, None)


@pytest.fixture
def ingests(base_settings, tmp_path):
    stack = Stack(base_settings, f"waitload-{uuid.uuid4().hex[:8]}", tmp_path / "run").prepare()
    assert stack.settings is not None and stack.group is not None
    create_events_topic(stack.settings)
    urls, metrics = [], []
    for name in ("a", "b"):
        port, metrics_port = free_port(), free_port()
        stack.group.start(
            f"ingest-{name}",
            "ingest",
            env={
                "ONCEFLOW_INGEST_PORT": str(port),
                "ONCEFLOW_INGEST_METRICS_PORT": str(metrics_port),
                "ONCEFLOW_DATABASE_URL": stack.settings.database_url
                + f"?application_name=onceflow-ingest-load-{name}",
                "ONCEFLOW_INGEST_RATE_LIMIT_PER_SECOND": "0",
                "ONCEFLOW_INGEST_MAX_INFLIGHT_PER_CLIENT": "2000",
                "ONCEFLOW_LOG_LEVEL": "WARNING",
            },
        )
        urls.append(f"http://127.0.0.1:{port}")
        metrics.append(f"http://127.0.0.1:{metrics_port}/metrics")
    for url in metrics:
        stack.group.wait_http(url.replace("/metrics", "/readyz"), timeout=60)
        stack.wait_for(
            lambda u=url: _metric(u, "onceflow_ingest_dependency_up", 'dependency="events"') == 1,
            30,
            "events watched",
        )
    yield stack, urls, metrics
    stack.close()


def _metric(url: str, name: str, labels: str = "") -> float:
    text = httpx.get(url, timeout=5).text
    prefix = f"{name}{{{labels}}} " if labels else f"{name} "
    line = next((ln for ln in text.splitlines() if ln.startswith(prefix)), None)
    return float(line.split()[-1]) if line else 0.0


class ConnectionSampler(threading.Thread):
    """The most connections each ingest process held at once, sampled every 50 ms."""

    def __init__(self, db: sa.Engine) -> None:
        super().__init__(daemon=True)
        self.db, self.most, self.stop = db, {}, threading.Event()

    def run(self) -> None:
        with self.db.connect() as conn:
            while not self.stop.is_set():
                for name, count in conn.execute(_INGEST_CONNECTIONS):
                    self.most[name] = max(self.most.get(name, 0), count)
                conn.rollback()
                self.stop.wait(0.05)


async def _all_requests(urls: list[str], headers: dict[str, str], on_registered) -> list:
    limits = httpx.Limits(max_connections=1100, max_keepalive_connections=1100)
    clients = [
        httpx.AsyncClient(base_url=u, limits=limits, timeout=90, headers=headers) for u in urls
    ]

    async def one(i: int) -> httpx.Response:
        prefer = "wait=3" if i >= FINISHING else "wait=45"
        job = {"job_id": f"load_{i}", "workflow": "order-workflow", "params": {}}
        return await clients[i % 2].post("/v1/jobs", json=job, headers={"Prefer": prefer})

    try:
        started = time.monotonic()
        tasks = [asyncio.create_task(one(i)) for i in range(FINISHING + NEVER)]
        await asyncio.to_thread(on_registered, started)
        return await asyncio.gather(*tasks)
    finally:
        for client in clients:
            await client.aclose()


def test_2000_waiting_requests_on_two_ingests_hold_no_connection_each(ingests):
    stack, urls, metrics = ingests
    settings, db = stack.settings, stack.db
    assert settings is not None and db is not None
    sampler = ConnectionSampler(db)
    sampler.start()
    figures: dict[str, float] = {}

    def play_the_engine(started: float) -> None:
        stack.wait_for(
            lambda: (
                sum(_metric(m, "onceflow_ingest_waiting_requests") for m in metrics) >= FINISHING
            ),
            90,
            "the finishing jobs' requests all waiting",
            interval=0.2,
        )
        figures["all waiting after s"] = time.monotonic() - started
        deliveries = [
            Delivery(JobEnvelope(f"load_{i}", "order-workflow", {}), settings.jobs_topic, 0, i)
            for i in range(FINISHING + NEVER)
        ]
        create_instances(db, deliveries)
        truths = [_truth(i) for i in range(FINISHING)]
        with db.begin() as conn:
            rows = conn.execute(
                _FINISH_ALL,
                {
                    "ids": [f"load_{i}" for i in range(FINISHING)],
                    "statuses": [t[0] for t in truths],
                    "results": [
                        None if t[1] is None else orjson.dumps(t[1]).decode() for t in truths
                    ],
                    "errors": [t[2] for t in truths],
                },
            ).all()
        finished = time.monotonic()
        records = []
        for row in rows:
            status, result, error = _truth(int(row.job_id.split("_")[1]))
            extra = {"result": result} if status == "complete" else {"error": error}
            records.append(
                event_record(
                    settings,
                    row.job_id,
                    f"instance.{status}",
                    3,
                    row.workflow,
                    row.version,
                    status,
                    row.finished_at,
                    extra,
                )
            )
        publish_records(settings, records)
        figures["committed+published in s"] = time.monotonic() - finished
        figures["published at"] = time.monotonic()

    answers = asyncio.run(_all_requests(urls, stack.auth_headers, play_the_engine))
    figures["answered after publish s"] = time.monotonic() - figures.pop("published at")
    sampler.stop.set()
    sampler.join(5)

    wrong = []
    for i, r in enumerate(answers):
        if i >= FINISHING:
            ok = r.status_code == 202 and r.headers["location"] == f"/v1/jobs/load_{i}"
        else:
            status, result, error = _truth(i)
            body = r.json()
            ok = r.status_code == 200 and (
                body["job_id"],
                body["status"],
                body["result"],
                body["error"],
            ) == (f"load_{i}", status, result, error)
        if not ok:
            wrong.append((i, r.status_code, r.text[:200]))
    print(f"\nstart-and-wait load: {figures}, most ingest connections {sampler.most}")
    assert wrong == [], wrong[:5]
    assert sampler.most, "no ingest connection was ever seen: the sampler saw nothing"
    assert all(n <= POOL_BOUND for n in sampler.most.values()), sampler.most
    finals = sum(
        _metric(m, "onceflow_ingest_wait_outcomes_total", 'outcome="final"') for m in metrics
    )
    timeouts = sum(
        _metric(m, "onceflow_ingest_wait_outcomes_total", 'outcome="timeout"') for m in metrics
    )
    assert (finals, timeouts) == (FINISHING, NEVER)
