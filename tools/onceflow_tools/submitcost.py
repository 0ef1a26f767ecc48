"""The CPU a ``POST /v1/jobs`` (one job, or ``--batch`` jobs) costs inside the ingest
app, without the HTTP server or Kafka: the app called as uvicorn would call it, auth
and limits on, the job-id trail at INFO (to /dev/null), and a producer double that
encodes each record as the real one does and acknowledges it at once.

    python -m onceflow_tools.submitcost [--requests 20000] [--batch 100]

The figure (µs of process CPU per request) moves much less than req/s when other work
shares the machine, which makes it the one to compare two builds by; run it twice
(BENCHMARKS.md, "Single-job requests: where the time goes").
"""

from __future__ import annotations

import argparse
import asyncio
import logging
import os
import sys
import time
from collections.abc import Sequence
from typing import Any

from onceflow.envelope import JobEnvelope
from onceflow.logs import setup_logging
from onceflow.settings import ApiKey, Settings
from producers.api import create_app
from producers.auth import hash_key, new_key
from producers.kafka import Ack


class InstantProducer:
    """Encodes each record (value and headers, as ``JobProducer`` does) and acks it."""

    def __init__(self) -> None:
        self.offset = 0

    async def send(self, envelopes: Sequence[JobEnvelope]) -> list[Ack]:
        acks = []
        for env in envelopes:
            env.encode(), env.headers()
            self.offset += 1
            acks.append(Ack(env.job_id, 0, self.offset))
        return acks

    def ready(self) -> bool:
        return True

    def close(self) -> int:
        return 0


def _body(i: int, batch: int) -> bytes:
    """Request ``i``: one job, or ``{"jobs": [...]}`` of ``batch`` (ids unique per run)."""
    if batch == 1:
        return b'{"job_id":"c_%d","workflow":"noop-workflow","params":{"n":1}}' % i
    jobs = b",".join(
        b'{"job_id":"c_%d_%d","workflow":"noop-workflow","params":{"n":1}}' % (i, j)
        for j in range(batch)
    )
    return b'{"jobs":[%s]}' % jobs


async def _run(app: Any, key: str, requests: int, batch: int = 1) -> float:
    headers = [
        (b"host", b"127.0.0.1:8080"),
        (b"content-type", b"application/json"),
        (b"authorization", f"Bearer {key}".encode()),
    ]
    statuses: list[int] = []

    async def send(message: dict[str, Any]) -> None:
        if message["type"] == "http.response.start":
            statuses.append(message["status"])

    started = time.process_time()
    for i in range(requests):
        body = _body(i, batch)
        messages = [{"type": "http.request", "body": body, "more_body": False}]

        async def receive(messages: list[dict[str, Any]] = messages) -> dict[str, Any]:
            return messages.pop()

        scope = {
            "type": "http",
            "method": "POST",
            "path": "/v1/jobs",
            "query_string": b"",
            "headers": [*headers, (b"content-length", b"%d" % len(body))],
            "client": ("127.0.0.1", 40000),
            "server": ("127.0.0.1", 8080),
            "scheme": "http",
            "root_path": "",
            "http_version": "1.1",
        }
        await app(scope, receive, send)
    spent = time.process_time() - started
    if set(statuses) != {202}:
        raise RuntimeError(f"not every answer was 202: {sorted(set(statuses))}")
    return spent / requests


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--requests", type=int, default=20000)
    parser.add_argument("--batch", type=int, default=1, help="jobs per request")
    args = parser.parse_args()
    key = new_key()
    settings = Settings(
        api_keys=[ApiKey(name="cost", sha256=hash_key(key), scopes=["jobs:submit"])],
        auth_disabled=False,
        workflow_modules=["onceflow_examples"],
        ingest_rate_limit_per_second=1e6,
        ingest_rate_limit_burst=1_000_000,
        ingest_max_inflight_per_client=1000,
        log_level="INFO",
    )
    setup_logging("INFO", "json", "ingest")
    devnull = open(os.devnull, "w")  # noqa: SIM115 (for the process's life)
    for handler in logging.getLogger().handlers:
        if isinstance(handler, logging.StreamHandler):
            handler.setStream(devnull)
    app = create_app(settings, InstantProducer())
    asyncio.run(_run(app, key, max(1, 2000 // args.batch), args.batch))  # warm up
    per_request = asyncio.run(_run(app, key, args.requests, args.batch))
    if args.batch == 1:
        print(f"{per_request * 1e6:.1f} us CPU per single-job request (in process)")
    else:
        print(
            f"{per_request * 1e6:.1f} us CPU per request of {args.batch} jobs,"
            f" {per_request * 1e6 / args.batch:.2f} us per job (in process)"
        )
    sys.stdout.flush()


if __name__ == "__main__":
    main()
